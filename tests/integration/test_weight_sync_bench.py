"""benchmarks/weight_sync.py's own parts that need no SmolLM2 or vLLM: ``--targets`` as peft takes it, the
tables (targets named per row; rows of JSON files from before ``--targets`` read as all-linear), and the one-line
refusal of a bad ``--targets``. The measurement itself needs SmolLM2 and vLLM: docs/performance.md section 13."""

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]


def load():
    spec = importlib.util.spec_from_file_location("bench_weight_sync", ROOT / "benchmarks" / "weight_sync.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def row(mode: str, engine_mb: float, sync_s: float, **extra) -> dict:
    base = {"rank": 16, "backend": "processes", "sampler": "vllm", "mode": mode, "sync_s": sync_s, "engine_s": 0.1}
    base |= {"wire_bytes": 2**20, "engine_bytes": int(engine_mb * 2**20), "sample_s": 1.0, "gap": 1e-5}
    return base | extra


def test_targets_pass_all_linear_as_peft_s_string_and_names_as_a_list():
    bench = load()
    assert bench.targets(SimpleNamespace(targets=["all-linear"])) == "all-linear"
    assert bench.targets(SimpleNamespace(targets=["q_proj", "v_proj"])) == ["q_proj", "v_proj"]


def test_tables_name_the_targets_and_old_rows_read_as_all_linear():
    bench = load()
    named = " ".join(["q_proj", "k_proj", "v_proj", "o_proj"])
    rows = [row("merged", 621.0, 9.0, targets=named), row("adapter", 7.0, 0.2, targets=named)]
    assert f"LoRA r=16 {named} | merged" in bench.table(rows)
    ratios = bench.ratios(rows).splitlines()
    assert ratios[-1] == f"| processes | vllm | 16 | {named} | 45.0x | 88.7x |"
    old = [row("merged", 621.0, 9.0), row("adapter", 18.6, 0.3)]  # benchmarks/results/weight_sync.json's rows
    assert "LoRA r=16 all-linear | adapter" in bench.table(old)
    assert bench.ratios(old).splitlines()[-1] == "| processes | vllm | 16 | all-linear | 30.0x | 33.4x |"


def test_all_linear_with_module_names_is_refused_in_one_line():
    script = ROOT / "benchmarks" / "weight_sync.py"
    done = subprocess.run(
        [sys.executable, str(script), "--targets", "all-linear", "q_proj"], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith("--targets: all-linear stands alone (or name modules such as q_proj k_proj)")
    )
