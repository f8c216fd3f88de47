"""What `make demo` installs is what the default job needs (#71): `datasets` and scipy are extras, the default
job runs without them, whatever needs them says which extra in one line, and the default recipe's warm start is
the committed one (``oprl.trainer.warmstart.SHIPPED``), so a fresh machine starts RL at once.

The extras are hidden from a subprocess by wrapping every ``sys.meta_path`` finder (``HIDE`` below): for those
names ``importlib.util.find_spec`` answers None, ``import`` fails and ``importlib.metadata`` finds no
distribution, as in a venv that lacks them (transformers probes scipy with ``find_spec`` and carries on without
it there).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from oprl.config import load_config
from oprl.tasks import build_task
from oprl.trainer import warmstart

ROOT = Path(__file__).resolve().parents[2]
EXTRAS = ("datasets", "scipy", "pandas")  # pandas: only `datasets` brings it (pyarrow imports it when present)

HIDE = """
import sys
HIDDEN = set(sys.argv[1].split(","))
class Hide:
    def __init__(self, inner):
        self.inner = inner
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            return None
        return self.inner.find_spec(name, path, target) if hasattr(self.inner, "find_spec") else None
    def find_distributions(self, *args, **kwargs):  # importlib.metadata asks the finders too
        found = getattr(self.inner, "find_distributions", lambda *a, **k: ())(*args, **kwargs)
        return (d for d in found if (d.metadata["Name"] or "").lower() not in HIDDEN)
    def __getattr__(self, name):
        return getattr(self.inner, name)
sys.meta_path[:] = [Hide(f) for f in sys.meta_path]
del sys.argv[1]
"""


def _without(extras, code: str, *args: str, cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, OPRL_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT / "src"))
    return subprocess.run(
        [sys.executable, "-c", HIDE + code, ",".join(extras), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )


def test_the_default_job_runs_without_the_extras(tmp_path):
    """One step of the default job (its config, a shorter eval) in a process where the extras cannot be
    imported: it trains, never loads them or oprl's statistics, and takes the committed warm start (no
    training before RL)."""
    code = """
import json, sys
from oprl.cli import main
rc = main(sys.argv[1:])
loaded = sorted(m for m in sys.modules if m.partition(".")[0] in HIDDEN or m.startswith("oprl.experiments"))
print("LOADED " + json.dumps(loaded))
sys.exit(rc)
"""
    run = ["train", "steps=1", "eval.num_problems=16", "progress=false", f"output_dir={tmp_path / 'runs'}"]
    out = _without(EXTRAS, code, *run, cache=tmp_path / "cache")
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.split("LOADED ", 1)[1]) == []
    text = out.stdout + out.stderr
    assert "warm start: the committed one of this recipe" in text and "warm-starting" not in text
    summary = json.loads(next((tmp_path / "runs").glob("*/summary.json")).read_text())
    assert summary["eval_accuracy_after"] is not None


@pytest.mark.parametrize(
    ("extra", "code", "hint"),
    [
        ("scipy", "from oprl.cli import main; sys.exit(main(['report', sys.argv[1]]))", "pip install 'oprl[stats]'"),
        ("scipy", "from oprl.cli import main; sys.exit(main(['sweep', sys.argv[1]]))", "pip install 'oprl[stats]'"),
        (
            "datasets",
            "from oprl.cli import main; sys.exit(main(['train', 'task.name=dataset', 'task.hf_name='+sys.argv[1]]))",
            "pip install 'oprl[data]'",
        ),
        (
            "datasets",
            "from oprl.cli import main; sys.exit(main(['train', 'task.name=gsm8k']))",
            "pip install 'oprl[data]'",
        ),
    ],
    ids=["report", "sweep", "hf-dataset-dir", "gsm8k-hub"],
)
def test_what_needs_an_extra_names_it_in_one_line(extra, code, hint, tmp_path):
    """Before: scipy and datasets were base dependencies. Without them, the commands that need them stop with
    one line naming the extra, exit 2 (a user's fix), no traceback."""
    target = tmp_path / "thing"
    target.mkdir()
    (target / "dataset_dict.json").write_text('{"splits": ["train"]}')  # a save_to_disk directory, for datasets
    out = _without([extra], "import sys\n" + code, str(target), cache=tmp_path / "cache")
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and hint in lines[0], out.stderr
    assert out.stdout.strip() == "", out.stdout  # before the run's headline (#71 item 6): nothing printed first


def test_pyproject_keeps_the_extras_out_of_the_demo_and_in_the_test_stack():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {d.split(">")[0].split("=")[0].split("<")[0] for d in project["dependencies"]}
    assert not base & {"datasets", "scipy", "pandas"}
    assert "oprl[stats,data]" in project["optional-dependencies"]["test"]


def test_the_committed_warm_start_is_the_default_recipes(tmp_path, monkeypatch):
    """The default recipe gets the committed weights, copied into the cache without a step of training; any
    other recipe, or OPRL_SHIPPED_WARM_START=0, does not. When this fails, a default that enters the recipe
    changed: rebuild with ``python -m oprl.trainer.warmstart --ship`` (minutes) and commit
    src/oprl/models/tiny_default."""
    config = load_config()
    task = build_task(config.task)
    spec = warmstart.recipe(config.model, config.task, config.warmstart, task)
    assert warmstart.shipped_for(spec) == warmstart.SHIPPED, "the committed warm start is not the default recipe's"
    logged: list[str] = []
    monkeypatch.setenv("OPRL_CACHE_DIR", str(tmp_path))
    path = warmstart.warm_started_model(config.model, config.task, config.warmstart, task, log=logged.append)
    assert path.parent == tmp_path / "models" and len(logged) == 1 and "committed" in logged[0]
    for name in ("model.safetensors", "config.json", "tokenizer.json", "oprl_recipe.json"):
        assert (path / name).read_bytes() == (warmstart.SHIPPED / name).read_bytes()
    assert sum(f.stat().st_size for f in warmstart.SHIPPED.iterdir()) < 3e6
    other = load_config(overrides=["warmstart.seed=1"])
    assert warmstart.shipped_for(warmstart.recipe(other.model, other.task, other.warmstart, task)) is None
    monkeypatch.setenv("OPRL_SHIPPED_WARM_START", "0")
    assert warmstart.shipped_for(spec) is None


def test_the_committed_weights_score_as_their_record_says():
    """The committed weights are the warm start their record describes: its last check (pass@1 at temperature 1
    on the held-out train problems, the same seed and one torch thread, as it ran) gives the recorded
    accuracy: exactly on the CPU that built it, within sampling noise of float rounding elsewhere."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from oprl.rollout import LeanEngine
    from oprl.trainer.warmstart_sft import _held_out, _validate, examples

    record = json.loads((warmstart.SHIPPED / "oprl_recipe.json").read_text())
    config = load_config()
    task = build_task(config.task)
    model = AutoModelForCausalLM.from_pretrained(warmstart.SHIPPED).eval()
    tokenizer = AutoTokenizer.from_pretrained(warmstart.SHIPPED)
    validation, training = _held_out(task, config.warmstart, print)
    limits = examples(tokenizer, task, training)[3]
    engine = LeanEngine(model, tokenizer, max_new_tokens=limits["max_new_tokens"])
    previous = torch.get_num_threads()
    torch.set_num_threads(record["shipped"]["torch_threads"])
    try:
        seed = config.warmstart.seed + record["result"]["steps"]
        accuracy = _validate(engine, task, validation, tokenizer, seed, limits)
    finally:
        torch.set_num_threads(previous)
    assert record["result"]["val_accuracy"] >= config.warmstart.target_accuracy
    assert abs(accuracy - record["result"]["val_accuracy"]) <= 0.05, (accuracy, record["result"])


def test_ship_builds_in_a_fresh_cache_with_the_runs_threads_and_records_them(tmp_path, monkeypatch):
    """``ship`` without its minutes of training (``warm_started_model`` stubbed): the build sees a fresh cache with
    shipping off and ``oprl train``'s warm-start threads (``worker_parts.worker_threads``); the copy at ``dest``
    carries the ``shipped`` record; the environment and torch's threads are restored after."""
    import torch

    from oprl.worker_parts import worker_threads

    seen = {}

    def build(model_cfg, task_cfg, warm_cfg, task, *, log, progress):
        seen.update(cache=os.environ["OPRL_CACHE_DIR"], shipping=os.environ["OPRL_SHIPPED_WARM_START"],
                    threads=torch.get_num_threads())  # fmt: skip
        built = Path(seen["cache"]) / "models" / "tiny-x"
        built.mkdir(parents=True)
        (built / "oprl_recipe.json").write_text(json.dumps({"result": {"steps": 1}}))
        return built

    monkeypatch.setattr(warmstart, "warm_started_model", build)
    monkeypatch.setenv("OPRL_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.delenv("OPRL_SHIPPED_WARM_START", raising=False)
    before = torch.get_num_threads()
    dest = warmstart.ship(tmp_path / "shipped", log=lambda *_: None)
    record = json.loads((dest / "oprl_recipe.json").read_text())
    assert seen["shipping"] == "0" and seen["cache"] != str(tmp_path / "mine")
    assert seen["threads"] == worker_threads(load_config()) == record["shipped"]["torch_threads"]
    assert record["result"] == {"steps": 1}
    assert record["shipped"]["command"] == "python -m oprl.trainer.warmstart --ship"
    assert os.environ["OPRL_CACHE_DIR"] == str(tmp_path / "mine") and "OPRL_SHIPPED_WARM_START" not in os.environ
    assert torch.get_num_threads() == before
