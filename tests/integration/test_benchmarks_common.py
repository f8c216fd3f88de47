"""benchmarks/_common.py, the set-up the benchmark scripts share, and the scripts that use it: each still imports
and parses its arguments, the report file and the seed loop keep their format, and a job runs both ways (in this
process, and as ``oprl`` in a fresh process with a fresh cache)."""

import importlib
import json
import re
import sys
from pathlib import Path

import pytest

from conftest import SMALL

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

USERS = [
    "default_job",
    "own_data_example",
    "restart_explorer",
    "grpo_step",
    "lora_step",
    "lora_sync_learning",
    "vcpo_score",
    "trainer_precision",
    "top_k_cost",
    "engines",
    "startup",
]
"""The scripts that import ``_common``."""


@pytest.fixture
def common(monkeypatch):
    """``_common`` imported as a script imports it: benchmarks/ first on ``sys.path``."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("_common")


@pytest.mark.parametrize("name", USERS)
def test_every_script_that_shares_the_set_up_imports_it_and_answers_help(name, common, monkeypatch, capsys):
    """A name a script takes from ``_common`` that is not there fails the import; ``--help`` parses the arguments
    (from ``sys.argv``: every ``main`` reads it when given no arguments; default_job and own_data_example run
    ``seed_runs``)."""
    assert "from _common import" in (BENCHMARKS / f"{name}.py").read_text()
    module = importlib.import_module(name)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", "--help"])
    with pytest.raises(SystemExit) as done:
        if hasattr(module, "main"):
            module.main()
        else:
            common.seed_runs(module.__doc__.splitlines()[0], module.run_once, seeds=[0])
    assert done.value.code == 0 and "usage:" in capsys.readouterr().out


def test_machine_facts(common):
    assert re.fullmatch(r"\S+, \d+ cores", common.machine())
    assert common.machine(3).endswith(" cores, 3 threads")
    assert re.fullmatch(r"[0-9a-f]{7,}", common.commit())  # the tests run in a git checkout
    cpu = common.cpu()
    assert set(cpu) == {"model", "cores", "avx512_bf16", "amx"} and isinstance(cpu["avx512_bf16"], bool)
    assert common.load_average() >= 0


def test_write_json_makes_its_folder_and_writes_nothing_without_a_path(common, tmp_path):
    path = tmp_path / "deep" / "er" / "report.json"
    common.write_json(path, {"b": 1, "a": [1.5]})
    assert path.read_text() == '{\n  "b": 1,\n  "a": [\n    1.5\n  ]\n}\n'  # key order kept, indent 2
    common.write_json(None, {"x": 1})  # no --json: no file, no error
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == ["report.json"]


def test_seed_runs_gives_each_seed_a_fresh_folder_and_writes_the_report(common, tmp_path, monkeypatch, capsys):
    folders = []

    def run_once(seed, workdir):
        assert workdir.is_dir() and not any(workdir.iterdir())  # fresh and empty
        folders.append(workdir)
        return {"seed": seed, "wall_seconds": 0.5}

    out = tmp_path / "out.json"
    monkeypatch.setattr(sys, "argv", ["x.py", "--seeds", "3", "4", "--out", str(out)])
    assert common.seed_runs("x", run_once, seeds=[0], command="oprl train x") == 0
    assert len(set(folders)) == 2 and not any(f.exists() for f in folders)  # removed after each seed
    assert [json.loads(line)["seed"] for line in capsys.readouterr().out.splitlines()] == [3, 4]
    report = json.loads(out.read_text())
    assert list(report) == ["command", "machine", "cpu", "commit", "runs"]
    assert report["command"] == "oprl train x" and [r["seed"] for r in report["runs"]] == [3, 4]
    monkeypatch.setattr(sys, "argv", ["x.py", "--out", str(out)])
    common.seed_runs("x", run_once, seeds=[7])  # the default seeds; no command: no "command" key (default_job)
    report = json.loads(out.read_text())
    assert list(report) == ["machine", "cpu", "commit", "runs"] and report["runs"][0]["seed"] == 7


@pytest.mark.slow  # 26 s alone on the loaded 2-core machine, most of it the session's first warm start
def test_run_job_runs_the_job_in_this_process_and_returns_its_rows(common, tmp_path):
    rows = common.run_job(None, [*SMALL, "steps=1", "eval.interval=0"], tmp_path, "job")
    assert (tmp_path / "job" / "summary.json").is_file()
    assert [r["step"] for r in rows if "perf/train_s" in r] == [1]


@pytest.mark.slow  # 36 s on the loaded 2-core machine: a fresh process and a fresh cache's warm start
def test_cli_job_runs_oprl_in_a_fresh_process_with_a_fresh_cache(common, tmp_path):
    """The path of default_job.py and own_data_example.py: the warm start is paid in the run (its record lands
    in the fresh cache), the run's files under ``workdir/runs/<name>``."""
    wall = common.cli_job(["train", *SMALL, "steps=1", "eval.interval=0"], tmp_path, "fresh")
    assert wall > 0 and (tmp_path / "runs" / "fresh" / "summary.json").is_file()
    warm = common.warm_start(tmp_path / "cache")
    assert warm["steps"] > 0 and 0.0 <= warm["val_accuracy"] <= 1.0


def test_lora_sync_learning_compares_behaviour_logprobs_over_each_common_prefix(common):
    """The adapter-vs-merged log-prob gap is read only where both runs sampled the same token in the same context:
    each response's common prefix of token ids; past the first differing token the contexts differ."""
    gap = importlib.import_module("lora_sync_learning").logprob_gap
    merged = [([1, 2, 3], [-0.1, -0.2, -0.3]), ([4, 5], [-1.0, -2.0])]
    adapter = [([1, 2, 9], [-0.1, -0.25, -7.0]), ([4, 5], [-1.001, -2.0])]  # row 0 parts at its 3rd token
    got = gap(merged, adapter)
    assert got["max_abs"] == pytest.approx(0.05) and got["tokens"] == 4  # the -0.3 / -7.0 pair is not compared
    assert (got["same_responses"], got["responses"]) == (1, 2)
    assert gap(merged, merged) == {"max_abs": 0.0, "tokens": 5, "same_responses": 2, "responses": 2}


def test_lora_sync_learning_refuses_a_missing_config_in_one_line(common, tmp_path, capsys):
    module = importlib.import_module("lora_sync_learning")
    with pytest.raises(SystemExit) as done:
        module.main(["--config", str(tmp_path / "nope.yaml")])
    assert done.value.code == 2 and "--config: no file" in capsys.readouterr().err
