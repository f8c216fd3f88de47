"""Supervised warm start: fine-tune on the task's demonstrations until the model solves *some* problems.

RL needs a policy whose samples are sometimes right: from random weights every reward is 0 and every
group-relative advantage vanishes, and so it is for a pretrained model that never writes the task's format
(SmolLM2-135M-Instruct never emits a ``<tool_call>`` block on BFCL). So the model is trained on (prompt,
demonstration) pairs from the train split, only, until its pass@1 at temperature 1 on held-out train problems
reaches ``target_accuracy``, then stops, leaving room for RL. The embedded tiny model is always warm-started
(from random weights); a pretrained ``model.path`` is with ``warmstart.pretrained=true`` (from its weights).

Targets: a task's ``demonstration(problem)`` when it has one (BFCL: the ground-truth calls in the task's own
``<think>...</think><tool_call>{json}</tool_call>`` format; multi-turn tasks: the model turns of a whole
episode, trained on model tokens only), else the problem's reference answer. Problems whose demonstration is
None are left out (counted in the log).

The loss is the mean negative log-likelihood of the target tokens, ``-sum_t m_t log pi(y_t | x, y_<t) /
sum_t m_t`` over a batch of ``batch_size`` problems, ``m`` the loss mask (1 = model token). The result is an
ordinary Hugging Face model directory, cached under the user cache dir keyed by a hash of its recipe (model,
task, warm-start settings), written atomically, so later runs with the same recipe start at once. A plug-in
task is keyed by the file of its class (an entry point and a file path naming the same class share one warm
start); an agent task (``task.name=agent``) by the task of its problems alone: its warm start trains on and
validates with those problems' demonstrations, never through the user's agent, so the agent file and the
endpoint's settings do not enter the key.

Resumable: every validation check (at most once every ``SAVE_EVERY_S`` seconds) writes the weights, the
optimizer and the data order to ``models/.partial-<name>/``; a later run of the same recipe continues from
there (the same steps an uninterrupted warm start would take), so a kill loses at most that much.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model

from oprl.checkpoint.files import load_optimizer, save_optimizer
from oprl.episodes.episode import teacher_forced
from oprl.episodes.evaluation import evaluate
from oprl.errors import OprlError
from oprl.io import commit_dir
from oprl.models.batching import right_pad_values
from oprl.models.chat import encode_problem
from oprl.models.loading import cache_dir, load_pretrained
from oprl.models.logprobs import pack, response_logprobs
from oprl.models.tiny import build_model, build_tokenizer
from oprl.models.truncation import Sampling
from oprl.progress import RunProgress
from oprl.rollout import LeanEngine
from oprl.tasks.base import EpisodicTask
from oprl.tasks.rewards.user import canonical_spec

RECIPE_VERSION = 1
_SLACK = 4
"""Tokens the warm start's own sampling allows beyond its longest demonstration (reply or turn)."""
SAVE_EVERY_S = 30.0
"""Seconds between the partial states a warm start leaves for a resume (checked at each validation)."""
_AGENT_ONLY = {"agent", "host", "port", "batch_wait_s"}
"""Fields of ``task.name=agent`` that concern the agent and its endpoint, not the problems."""


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
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    return spec, cache_dir() / "models" / f"{'tiny' if model_cfg.path == 'tiny' else 'warm'}-{key}"


def cached_warm_start(model_cfg, task_cfg, warm_cfg, task) -> Path | None:
    """The cached warm-started model of this recipe, None when it is still to be built."""
    target = _target(model_cfg, task_cfg, warm_cfg, task)[1]
    return target if (target / "oprl_recipe.json").is_file() else None


def wants_warm_start(model_cfg, warm_cfg) -> bool:
    """Whether ``model.path`` is trained from a warm start: always for ``tiny``, else if ``pretrained``."""
    return model_cfg.path == "tiny" or warm_cfg.pretrained


def warm_started_model(model_cfg, task_cfg, warm_cfg, task, *, log=print, progress: bool = True) -> Path:
    """Path of the cached warm-started model for this recipe, building it first if needed (continuing a
    partial state a killed build left)."""
    spec, target = _target(model_cfg, task_cfg, warm_cfg, task)
    if (target / "oprl_recipe.json").is_file():
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
        report = _train(model_cfg, warm_cfg, task, staging, log, progress, partial)
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


def _initial(model_cfg, warm_cfg):
    """``(model, tokenizer)`` the warm start begins from: random tiny weights, or the pretrained ones."""
    if model_cfg.path != "tiny":
        return load_pretrained(model_cfg.path, dtype=model_cfg.dtype, device=model_cfg.device)
    tokenizer = build_tokenizer()
    model = build_model(
        tokenizer,
        hidden_size=model_cfg.hidden_size,
        num_layers=model_cfg.num_layers,
        num_heads=model_cfg.num_heads,
        seed=warm_cfg.seed,
    )
    return model, tokenizer


def _train(model_cfg, warm_cfg, task, out_dir: Path, log, progress: bool, partial: Path) -> dict:
    start = time.perf_counter()
    model, tokenizer = _initial(model_cfg, warm_cfg)
    validation, training = _held_out(task, warm_cfg, log)
    prompts, answers, masks, limits = _examples(tokenizer, task, training)
    device = next(model.parameters()).device
    engine = LeanEngine(model, tokenizer, max_new_tokens=limits["max_new_tokens"])  # temperature 1, no truncation
    optimizer = torch.optim.AdamW(model.parameters(), lr=warm_cfg.lr)
    rng = random.Random(warm_cfg.seed)
    state: dict[str, Any] = {"step": 0, "accuracy": 0.0, "history": [], "seconds": 0.0}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(warm_cfg.seed)
        if _restore(partial, model, optimizer, rng, state):
            log(f"warm start: continuing from step {state['step']} (a partial state in {partial})")
        # The bar's total is the step cap, and the run usually stops earlier, at the target accuracy: its ETA
        # is an upper bound.
        bar = RunProgress(
            warm_cfg.max_steps,
            enabled=progress,
            description="warm start",
            interval=warm_cfg.check_interval,
            eta_bound=True,
            start=state["step"],
        )
        saved_at = time.perf_counter()
        with bar:
            while state["step"] < warm_cfg.max_steps:
                state["step"] += 1
                step = state["step"]
                rows = rng.sample(range(len(training)), min(warm_cfg.batch_size, len(training)))
                batch, mask = _batch(rows, prompts, answers, masks, tokenizer.pad_token_id, device)
                loss = _sft_step(model, optimizer, batch, mask)
                if step % warm_cfg.check_interval:
                    bar.update(step)
                    continue
                accuracy = _validate(engine, task, validation, tokenizer, warm_cfg.seed + step, limits)
                state["accuracy"] = accuracy
                state["history"].append({"step": step, "loss": float(loss.detach()), "val_accuracy": accuracy})
                text = (
                    f"val pass@1 {accuracy:.3f} (target {warm_cfg.target_accuracy:g})  loss {float(loss.detach()):.3f}"
                )
                bar.update(step, text, line=True)
                if accuracy >= warm_cfg.target_accuracy:
                    break
                if time.perf_counter() - saved_at >= SAVE_EVERY_S:
                    state["seconds"] += time.perf_counter() - start
                    start = time.perf_counter()
                    _save_partial(partial, model, optimizer, rng, state)
                    saved_at = time.perf_counter()
    accuracy, step = state["accuracy"], state["step"]
    if accuracy < warm_cfg.target_accuracy:
        log(
            f"warning: warm start stopped at max_steps={warm_cfg.max_steps} with pass@1 {accuracy:.3f} "
            f"< target {warm_cfg.target_accuracy}"
        )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    seconds = state["seconds"] + time.perf_counter() - start
    log(
        f"warm start: {step} steps, validation pass@1 {accuracy:.3f} (replies of up to "
        f"{limits['max_new_tokens']} tokens), {seconds:.1f}s"
    )
    budget = limits["max_new_tokens"]
    return {"steps": step, "val_accuracy": accuracy, "seconds": seconds, "history": state["history"]} | {
        "reply_tokens": budget - _SLACK,
        "max_new_tokens": budget,
    }


def _batch(rows: list[int], prompts, answers, masks, pad_id: int, device) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The packed supervised batch of examples ``rows`` (``models.logprobs.pack``) and its loss mask (B, T):
    model tokens only (an episode's environment turns are context, as in RL; all ones for one turn)."""
    batch = [t.to(device) for t in pack([prompts[i] for i in rows], [answers[i] for i in rows], pad_id)]
    pad = right_pad_values([masks[i] for i in rows], batch[3].shape[1]).to(device)
    return batch, batch[3] & (pad > 0)  # (B, T)


def _validate(engine, task, validation, tokenizer, seed: int, limits: dict) -> float:
    """pass@1 at temperature 1 on the held-out train problems (the task's scoring, the warm start's limits)."""
    return evaluate(
        engine,
        _Held(task, validation),
        tokenizer,
        num_problems=len(validation),
        sampling=Sampling(),
        seed=seed,
        max_turns=limits["max_turns"],
        max_episode_tokens=limits["max_episode_tokens"],
    )["accuracy"]


def _save_partial(partial: Path, model, optimizer, rng: random.Random, state: dict) -> None:
    """The state a resumed warm start needs, replaced atomically: weights, optimizer, data order, history."""
    staging = Path(tempfile.mkdtemp(dir=partial.parent, prefix=".staging-"))
    try:
        save_model(model, str(staging / "model.safetensors"))  # tied weights once, like save_pretrained
        save_optimizer(optimizer, staging)
        version, internal, gauss = rng.getstate()
        (staging / "warm_state.json").write_text(json.dumps(state | {"rng": [version, list(internal), gauss]}))
        commit_dir(staging, partial, replace=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _restore(partial: Path, model, optimizer, rng: random.Random, state: dict) -> bool:
    """Load a partial state into ``model``, ``optimizer``, ``rng`` and ``state``; False when there is none."""
    if not (partial / "warm_state.json").is_file():
        return False
    saved = json.loads((partial / "warm_state.json").read_text())
    load_model(model, str(partial / "model.safetensors"))
    load_optimizer(optimizer, partial)
    version, internal, gauss = saved.pop("rng")
    rng.setstate((version, tuple(internal), gauss))
    state.update(saved)
    return True


def _held_out(task, warm_cfg, log) -> tuple[list, list]:
    """(validation, training): the train problems that have a demonstration, the first ``val_problems`` held
    out; one line when that leaves nothing to train on."""
    problems, skipped = _demonstrable(task, list(task.problems("train")))
    if skipped:
        log(f"warm start: {skipped} train problems have no demonstration and are left out")
    validation, training = problems[: warm_cfg.val_problems], problems[warm_cfg.val_problems :]
    if not training:
        raise OprlError(
            f"warmstart.val_problems={warm_cfg.val_problems} holds out all {len(problems)} train problems "
            "that have a demonstration; lower it"
        )
    return validation, training


def _sft_step(model, optimizer, batch, mask: torch.Tensor) -> torch.Tensor:
    """One supervised step on the demonstrations: loss = -sum(log pi * mask) / sum(mask) over the packed
    ``batch`` (``models.logprobs.pack``: input ids, attention mask, targets, their mask); ``mask`` (B, T): the
    model tokens."""
    model.train()
    logprobs, _ = response_logprobs(model, batch[0], batch[1], batch[2])  # (B, T)
    loss = -(logprobs * mask).sum() / mask.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss


def positions_needed(tokenizer, task_cfg, task) -> dict:
    """What the warm start of ``task`` will sample: ``{"prompt": longest prompt, "max_new_tokens": its reply
    budget, "positions": their sum}`` in tokens (its engine refuses a sum past the model's context)."""
    task = warm_task(task_cfg, task)[1] or task
    problems = _demonstrable(task, list(task.problems("train")))[0]
    prompts, _, _, limits = _examples(tokenizer, task, problems)
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


def _demonstrable(task, problems) -> tuple[list, int]:
    """``problems`` that have a demonstration (all of them for a task without ``demonstration``), and how many
    were left out; an error when none is left."""
    if not hasattr(task, "demonstration"):
        return problems, 0
    kept = [p for p in problems if task.demonstration(p) is not None]
    if not kept:
        raise OprlError(f"task {task.name}: the warm start needs demonstrations, and no train problem has one")
    return kept, len(problems) - len(kept)


def _turns(task, problem) -> list[str]:
    """The model turns the warm start imitates: the task's demonstration, else the reference answer."""
    turns = task.demonstration(problem) if hasattr(task, "demonstration") else None
    return turns if turns is not None else [problem.answer]


def _examples(tokenizer, task, problems):
    """Supervised targets: ``(prompts, responses, loss masks, sampling limits)``. A single-turn task's response
    is its demonstration's one turn (or, without ``demonstration``, its reference answer) and EOS; a multi-turn
    task's is the whole demonstration episode (model and environment turns), of which only the model's tokens
    are trained on."""
    eos = tokenizer.eos_token_id
    if not isinstance(task, EpisodicTask):
        answers = [[*tokenizer(_turns(task, p)[0], add_special_tokens=False).input_ids, eos] for p in problems]
        longest = max(len(a) for a in answers)
        limits = {"max_new_tokens": longest + _SLACK, "max_turns": 1, "max_episode_tokens": longest + _SLACK}
        return [encode_problem(tokenizer, p) for p in problems], answers, [[1] * len(a) for a in answers], limits
    demonstrations = [_turns(task, p) for p in problems]
    episodes = [teacher_forced(tokenizer, task, p, d) for p, d in zip(problems, demonstrations, strict=True)]
    turns = [len(d) for d in demonstrations]
    turn_length = 1 + max(
        len(tokenizer(r, add_special_tokens=False).input_ids) for d in demonstrations[:200] for r in d
    )
    limits = {
        "max_new_tokens": turn_length + _SLACK,
        "max_turns": max(turns) + 1,
        "max_episode_tokens": max(len(e.response_ids) for e in episodes) + 8,
    }
    return [e.prompt_ids for e in episodes], [e.response_ids for e in episodes], [e.loss_mask for e in episodes], limits


class _Held:
    """Presents held-out train problems as a task's "test" split for the warm start's own check; everything
    else (scoring, environments) is the task's."""

    def __init__(self, task, problems):
        self._task, self._problems = task, problems

    def problems(self, split):
        return self._problems

    def __getattr__(self, name):
        return getattr(self._task, name)
