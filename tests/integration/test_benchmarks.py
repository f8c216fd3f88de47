"""The benchmark scripts' own arithmetic (FLOP counts, growth fits) and a short oprl side of the TRL benchmark.

The full benchmarks need an idle machine (and TRL / SmolLM2); their figures are in docs/performance.md.
"""

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import LlamaConfig, LlamaForCausalLM

from conftest import SMALL

ROOT = Path(__file__).resolve().parents[2]


def load(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_growth_fit_recovers_a_power_law():
    growth = load("growth")
    xs = [4, 8, 16, 32]
    assert growth.fit_exponent(xs, [3.0 * x**1.5 for x in xs]) == pytest.approx(1.5)
    assert growth.fit_exponent(xs, [2.0 for _ in xs]) == pytest.approx(0.0)


def test_mfu_flop_count_matches_a_hand_count():
    mfu = load("mfu")
    config = LlamaConfig(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    s = mfu.shape(LlamaForCausalLM(config))
    kv = 64 // 4 * 2  # key/value width with 2 of 4 heads
    per_layer = 64 * 64 * 2 + 64 * kv * 2 + 3 * 64 * 160  # q, o; k, v; gate, up, down
    assert s["n_dense"] == 3 * per_layer and s["layers"] == 3 and s["d"] == 64 and s["vocab"] == 1000
    batch, prompt, response = 2, 5, 7
    forward = 2 * 3 * per_layer * batch * 12 + 2 * 3 * 64 * batch * 12**2 + 2 * 64 * 1000 * batch * response
    assert mfu.train_step_flops(s, batch, prompt, response) == 3 * forward
    assert mfu.peak_matmul_flops(n=64, repeats=1) > 0


def test_vs_trl_oprl_side_runs_and_reports(tmp_path, monkeypatch):
    vs_trl = load("vs_trl")
    monkeypatch.setenv("OPRL_CACHE_DIR", str(tmp_path / "cache"))
    from oprl.config import load_config
    from oprl.runtime.launch import model_path
    from oprl.tasks import build_task

    config = load_config(None, [*SMALL, "runtime.torch_threads=1"])
    path = model_path(config, build_task(config.task), log=lambda *_: None)
    monkeypatch.setattr(vs_trl, "PROMPTS", 4)
    result = vs_trl.child_oprl(path, steps=4, seed=0, threads=1, skip=1)
    assert result["step_s"] > 0 and result["tokens_per_s"] > 0
    assert 0.0 <= result["reward_last5"] <= 1.0 and 0.0 <= result["eval_accuracy"] <= 1.0
    assert not math.isnan(result["eval_accuracy"])


def test_vs_trl_counts_the_memory_of_worker_processes():
    """The driver's own peak RSS misses oprl's worker processes (runtime.workers=processes); the workers' figure
    must be zero before any child and see a joined child's memory after. (A fresh process's own peak RSS starts
    at its parent's RSS on Linux, which is why the workers' figure is read before and after, not against it.)"""
    script = (
        "import json, resource, subprocess, sys\n"
        f"sys.path.insert(0, {str(ROOT / 'benchmarks')!r})\n"
        "import vs_trl\n"
        "before = vs_trl.peak_rss_mib(resource.RUSAGE_CHILDREN)\n"
        "subprocess.run([sys.executable, '-c', 'b = bytearray(400 * 2**20); b[::4096] = b\"x\" * len(b[::4096])'],"
        " check=True)\n"
        "print(json.dumps({'before': before, 'after': vs_trl.peak_rss_mib(resource.RUSAGE_CHILDREN)}))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    rss = json.loads(out.stdout.strip().splitlines()[-1])
    assert rss["before"] == 0
    assert rss["after"] >= 390  # the 400 MiB child, touched page by page


def test_ess_warning_drift_counts_a_run_by_hand(tmp_path):
    """--drift's counts come from the run's rows: KL past 1 / 100, its max, the mean and max clip fraction."""
    ess_warning = load("ess_warning")
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text("{}")
    rows = [
        {"step": 0, "eval/accuracy": 0.5, "rho/ess": 1.0, "kl/behavior_k3": 0.5, "loss/clip_frac": 0.0},
        {"step": 1, "rho/ess": 0.9, "kl/behavior_k3": 2.0, "loss/clip_frac": 0.1},
        {"step": 2, "rho/ess": 0.8, "kl/behavior_k3": 300.0, "loss/clip_frac": 0.2},
        {"step": 3, "rho/ess": 0.9, "kl/behavior_k3": 1.0, "loss/clip_frac": 0.3},
        {"step": 4, "eval/accuracy": 0.3, "rho/ess": 1.0},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (r,) = [ess_warning.summarize(p) for p in ess_warning.runs_under(tmp_path, [])]
    assert (r["kl_steps_over_1"], r["kl_steps_over_100"], r["kl_max"]) == (2, 1, 300.0)
    assert r["clip_frac_mean"] == pytest.approx(0.15) and r["clip_frac_max"] == 0.3
    assert r["first_eval_10_below"] == 4 and r["series"] == [0.5, 0.3]
    assert ess_warning._num(None, ".3g") == "-"
