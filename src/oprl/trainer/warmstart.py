"""Supervised warm start: which one a run gets, and the cached model it leaves.

RL needs a policy whose samples are sometimes right: from random weights every reward is 0 and every
group-relative advantage vanishes, and so it is for a pretrained model that never writes the task's format
(SmolLM2-135M-Instruct never emits a ``<tool_call>`` block on BFCL). So the model is first fine-tuned on (prompt,
demonstration) pairs from the train split, only, until its pass@1 at temperature 1 on held-out train problems
reaches ``target_accuracy``, then stops, leaving room for RL (the fine-tuning itself: ``warmstart_sft``). The
embedded tiny model is always warm-started (from random weights); a pretrained ``model.path`` is with
``warmstart.pretrained=true`` (from its weights).

The result is an ordinary Hugging Face model directory, cached under the user cache dir keyed by a hash of its
recipe (model, task, warm-start settings: ``recipe``), written atomically, so later runs with the same recipe start
at once. A plug-in task is keyed by the file of its class (an entry point and a file path naming the same class
share one warm start); an agent task (``task.name=agent``) by the task of its problems alone: its warm start
trains on and validates with those problems' demonstrations, never through the user's agent, so the agent file
and the endpoint's settings do not enter the key.

The default recipe's result is committed (``SHIPPED``: 1.4 MB, the weights the default job's warm start builds
on a 2-core AMD EPYC, bit-identical over repeated builds there): a cache without it gets a copy instead of a
warm start (100-360 s there, most of a fresh machine's first ``make demo``), and every machine starts RL from
the same weights (the warm start's own steps depend on the CPU's float rounding). It is used only when its
recorded recipe equals the run's, so any changed model, task or warm-start setting trains its own;
``OPRL_SHIPPED_WARM_START=0`` trains the default one too (what benchmarks of the warm start need), and
``python -m oprl.trainer.warmstart --ship`` rebuilds the committed copy (tests/integration/test_demo_imports.py fails
when the default recipe no longer matches it). The checks around it: ``positions_needed`` (what its sampling
needs of the model's context, for preflight) and ``length_warning`` (RL's reply budget against the replies it
taught).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from oprl.io import commit_dir
from oprl.machine import cpu_name
from oprl.models.loading import cache_dir
from oprl.tasks.rewards.user import canonical_spec
from oprl.trainer.warmstart_sft import demonstrable, examples, train

RECIPE_VERSION = 1
_AGENT_ONLY = {"agent", "host", "port", "batch_wait_s"}
"""Fields of ``task.name=agent`` that concern the agent and its endpoint, not the problems."""
SHIPPED = Path(__file__).resolve().parents[1] / "models" / "tiny_default"
"""The committed warm start of the default recipe: a Hugging Face model directory with its ``oprl_recipe.json``
(the recipe, the build's result, and ``shipped``: where and how it was built)."""


def recipe(model_cfg, task_cfg, warm_cfg, task=None) -> dict:
    """Everything that determines the warm-started weights (and nothing else). ``warmstart.pretrained`` only
    says whether a warm start happens; the embedded model's recipe is the same either way. ``task``: the built
    task, whose class names a plug-in (module docstring)."""
    task_cfg, task = warm_task(task_cfg, task)
    # format_bonus and partial_credit shape RL's training reward only: the warm start stops on accuracy (the
    # ``correct`` component), which neither changes, so recipes that differ in them share one warm start.
    values = task_cfg if isinstance(task_cfg, dict) else task_cfg.model_dump(mode="json")
    spec_task = {k: v for k, v in values.items() if k not in {"test_size", "format_bonus", "partial_credit"}}
    if isinstance(spec_task.get("reward"), (str, list)):  # one name per function, however it was given
        rewards = spec_task["reward"]
        spec_task["reward"] = (
            canonical_spec(rewards) if isinstance(rewards, str) else [canonical_spec(r) for r in rewards]
        )
    if task is not None and not type(task).__module__.startswith("oprl."):  # a plug-in: the file of its class
        cls = type(task)
        spec_task["name"] = f"{Path(inspect.getfile(cls)).resolve()}:{cls.__qualname__}"
    spec = {
        "recipe_version": RECIPE_VERSION,
        "model": model_cfg.model_dump(mode="json", exclude={"path", "dtype", "device", "lora"}),
        "task": spec_task,
        "warmstart": warm_cfg.model_dump(mode="json", exclude={"pretrained"}),
    }
    if model_cfg.path != "tiny":  # the starting weights (the tiny model's architecture fields do not apply)
        spec["model"] = {"path": model_cfg.path, "dtype": model_cfg.dtype}
    return spec


def warm_task(task_cfg, task=None):
    """``(section, task)`` the warm start learns: an agent task's problems (their own task, never the agent),
    else the task itself."""
    if getattr(task_cfg, "name", None) != "agent":
        return task_cfg, task
    inner = getattr(task, "inner", None)
    section = getattr(inner, "config", None)
    if section is None:  # no built task at hand: the problems' section as configured
        section = {k: v for k, v in task_cfg.model_dump(mode="json").items() if k not in _AGENT_ONLY}
    return section, inner


def _target(model_cfg, task_cfg, warm_cfg, task) -> tuple[dict, Path]:
    """The recipe and the cache directory of its warm-started model."""
    spec = recipe(model_cfg, task_cfg, warm_cfg, task)
    learned = warm_task(task_cfg, task)[1]
    if getattr(learned, "data_fingerprint", None):  # tasks reading user files: their content, not just the path
        spec["data"] = learned.data_fingerprint
    return spec, cache_dir() / "models" / f"{'tiny' if model_cfg.path == 'tiny' else 'warm'}-{_key(spec)}"


def shipped_for(spec: dict) -> Path | None:
    """``SHIPPED`` when its recorded recipe is ``spec`` (compared as the cache key's JSON) and shipping is not
    turned off (``OPRL_SHIPPED_WARM_START=0``), else None."""
    record = SHIPPED / "oprl_recipe.json"
    if os.environ.get("OPRL_SHIPPED_WARM_START", "1") == "0" or not record.is_file():
        return None
    saved = json.loads(record.read_text())
    recipe_only = {k: v for k, v in saved.items() if k not in ("result", "shipped")}
    return SHIPPED if _key(recipe_only) == _key(spec) else None


def _key(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def cached_warm_start(model_cfg, task_cfg, warm_cfg, task) -> Path | None:
    """The cached (or committed, ``SHIPPED``) warm-started model of this recipe, None when it is still to be
    built."""
    spec, target = _target(model_cfg, task_cfg, warm_cfg, task)
    return target if (target / "oprl_recipe.json").is_file() else shipped_for(spec)


def wants_warm_start(model_cfg, warm_cfg) -> bool:
    """Whether ``model.path`` is trained from a warm start: always for ``tiny``, else if ``pretrained``."""
    return model_cfg.path == "tiny" or warm_cfg.pretrained


def warm_started_model(model_cfg, task_cfg, warm_cfg, task, *, log=print, progress: bool = True) -> Path:
    """Path of the cached warm-started model for this recipe, building it first if needed (continuing a
    partial state a killed build left)."""
    spec, target = _target(model_cfg, task_cfg, warm_cfg, task)
    if (target / "oprl_recipe.json").is_file():
        return target
    shipped = shipped_for(spec)
    if shipped is not None:
        _install_shipped(shipped, target, log)
        return target
    task = warm_task(task_cfg, task)[1] or task
    what = "the embedded tiny model" if model_cfg.path == "tiny" else model_cfg.path
    partial = target.parent / f".partial-{target.name}"
    if getattr(task_cfg, "name", None) == "agent":
        log(f"warm start: on the demonstrations of task {task.name} (the agent's problems), not through the agent")
    log(f"warm-starting {what} (first run with this recipe; cached at {target})")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".staging-"))
    try:
        report = train(model_cfg, warm_cfg, task, staging, log, progress, partial)
        (staging / "oprl_recipe.json").write_text(json.dumps(spec | {"result": report}, indent=2))
        try:
            commit_dir(staging, target, replace=False)  # readers see no directory or a complete one
        except OSError:
            if not (target / "oprl_recipe.json").is_file():  # lost a race to an identical build: fine
                raise
        shutil.rmtree(partial, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _install_shipped(shipped: Path, target: Path, log) -> None:
    """Copy the committed warm start into the cache (atomically, like a build), so that everything after reads
    it where a built one would be."""
    result = json.loads((shipped / "oprl_recipe.json").read_text())["result"]
    log(
        f"warm start: the committed one of this recipe ({result['steps']} steps, validation pass@1 "
        f"{result['val_accuracy']:.3f}; OPRL_SHIPPED_WARM_START=0 trains it here instead), cached at {target}"
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".staging-"))
    try:
        shutil.copytree(shipped, staging, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
        try:
            commit_dir(staging, target, replace=False)
        except OSError:
            if not (target / "oprl_recipe.json").is_file():  # lost a race to an identical copy: fine
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def ship(dest: Path = SHIPPED, log=print) -> Path:
    """Build the default recipe's warm start from scratch (as ``oprl train`` does: the default config, one
    torch thread per worker) in a fresh cache, and write it to ``dest`` with a ``shipped`` record (torch
    version, CPU, threads) for ``shipped_for``."""
    import platform

    import torch

    from oprl.config import load_config
    from oprl.tasks import build_task
    from oprl.worker_parts import available_cores, worker_threads

    config = load_config()
    task = build_task(config.task)
    threads = worker_threads(config)  # the torch threads `oprl train` gives its warm start (1 on 2 cores)
    previous, environ = torch.get_num_threads(), dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="oprl-ship-") as cache:
        os.environ.update(OPRL_CACHE_DIR=cache, OPRL_SHIPPED_WARM_START="0")
        torch.set_num_threads(threads)
        try:
            built = warm_started_model(config.model, config.task, config.warmstart, task, log=log, progress=False)
        finally:
            torch.set_num_threads(previous)
            os.environ.clear()
            os.environ.update(environ)
        record = json.loads((built / "oprl_recipe.json").read_text())
        record["shipped"] = {
            "command": "python -m oprl.trainer.warmstart --ship",
            "torch": torch.__version__,
            "machine": f"{platform.machine()}, {available_cores()} cores, {cpu_name()}",
            "torch_threads": threads,
        }
        (built / "oprl_recipe.json").write_text(json.dumps(record, indent=2) + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(built, dest)
    log(f"wrote {dest} ({sum(f.stat().st_size for f in dest.iterdir()) / 1e6:.2f} MB)")
    return dest


def positions_needed(tokenizer, task_cfg, task) -> dict:
    """What the warm start of ``task`` will sample: ``{"prompt": longest prompt, "max_new_tokens": its reply
    budget, "positions": their sum}`` in tokens (its engine refuses a sum past the model's context)."""
    task = warm_task(task_cfg, task)[1] or task
    problems = demonstrable(task, list(task.problems("train")))[0]
    prompts, _, _, limits = examples(tokenizer, task, problems)
    prompt = max(len(p) for p in prompts)
    return {
        "prompt": prompt,
        "max_new_tokens": limits["max_new_tokens"],
        "positions": prompt + limits["max_new_tokens"],
    }


def length_warning(model_dir: str | Path, max_new_tokens: int) -> str | None:
    """A warning when RL's ``rollout.max_new_tokens`` cuts replies the warm start taught (its validation
    generates up to the longest demonstration + a few tokens, whatever RL will allow); None when they fit
    or the cached model predates the record of its reply length."""
    recipe_file = Path(model_dir) / "oprl_recipe.json"
    if not recipe_file.is_file():
        return None
    result = json.loads(recipe_file.read_text()).get("result", {})
    needed = result.get("reply_tokens")
    if needed is None or max_new_tokens >= needed:
        return None
    return (
        f"warning: rollout.max_new_tokens={max_new_tokens} is shorter than the warm start's replies (up to "
        f"{needed} tokens; its validation pass@1 {result.get('val_accuracy', float('nan')):.3f} was measured "
        f"generating up to {result.get('max_new_tokens')}): RL replies will be cut; raise rollout.max_new_tokens "
        f"to >= {needed}"
    )


if __name__ == "__main__":
    if sys.argv[1:] != ["--ship"]:
        sys.exit("usage: python -m oprl.trainer.warmstart --ship   (rebuilds src/oprl/models/tiny_default)")
    ship()
