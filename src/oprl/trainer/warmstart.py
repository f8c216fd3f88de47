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
task, warm-start settings), written atomically, so later runs with the same recipe start at once.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import tempfile
import time
from pathlib import Path

import torch

from oprl.errors import OprlError
from oprl.explorer.episodes import teacher_forced
from oprl.explorer.evaluate import evaluate
from oprl.io import commit_dir
from oprl.models.batching import right_pad_values
from oprl.models.chat import encode_problem
from oprl.models.loading import cache_dir, load_pretrained
from oprl.models.logprobs import pack, response_logprobs
from oprl.models.tiny import build_model, build_tokenizer
from oprl.progress import RunProgress
from oprl.rollout import LeanEngine
from oprl.tasks.base import EpisodicTask
from oprl.tasks.user_reward import canonical_spec

RECIPE_VERSION = 1
_SLACK = 4
"""Tokens the warm start's own sampling allows beyond its longest demonstration (reply or turn)."""


def recipe(model_cfg, task_cfg, warm_cfg) -> dict:
    """Everything that determines the warm-started weights (and nothing else). ``warmstart.pretrained`` only
    says whether a warm start happens; the embedded model's recipe is the same either way."""
    # format_bonus and partial_credit shape RL's training reward only: the warm start stops on accuracy (the
    # ``correct`` component), which neither changes, so recipes that differ in them share one warm start.
    task = task_cfg.model_dump(mode="json", exclude={"test_size", "format_bonus", "partial_credit"})
    if isinstance(task.get("reward"), (str, list)):  # one name per function, however it was given
        rewards = task["reward"]
        task["reward"] = canonical_spec(rewards) if isinstance(rewards, str) else [canonical_spec(r) for r in rewards]
    spec = {
        "recipe_version": RECIPE_VERSION,
        "model": model_cfg.model_dump(mode="json", exclude={"path", "dtype", "device", "lora"}),
        "task": task,
        "warmstart": warm_cfg.model_dump(mode="json", exclude={"pretrained"}),
    }
    if model_cfg.path != "tiny":  # the starting weights (the tiny model's architecture fields do not apply)
        spec["model"] = {"path": model_cfg.path, "dtype": model_cfg.dtype}
    return spec


def wants_warm_start(model_cfg, warm_cfg) -> bool:
    """Whether ``model.path`` is trained from a warm start: always for ``tiny``, else if ``pretrained``."""
    return model_cfg.path == "tiny" or warm_cfg.pretrained


def warm_started_model(model_cfg, task_cfg, warm_cfg, task, *, log=print, progress: bool = True) -> Path:
    """Path of the cached warm-started model for this recipe, building it first if needed."""
    spec = recipe(model_cfg, task_cfg, warm_cfg)
    if getattr(task, "data_fingerprint", None):  # tasks reading user files: their content, not just the path
        spec["data"] = task.data_fingerprint
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    target = cache_dir() / "models" / f"{'tiny' if model_cfg.path == 'tiny' else 'warm'}-{key}"
    if (target / "oprl_recipe.json").is_file():
        return target
    what = "the embedded tiny model" if model_cfg.path == "tiny" else model_cfg.path
    log(f"warm-starting {what} (first run with this recipe; cached at {target})")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".staging-"))
    try:
        report = _train(model_cfg, warm_cfg, task, staging, log, progress)
        (staging / "oprl_recipe.json").write_text(json.dumps(spec | {"result": report}, indent=2))
        try:
            commit_dir(staging, target, replace=False)  # readers see no directory or a complete one
        except OSError:
            if not (target / "oprl_recipe.json").is_file():  # lost a race to an identical build: fine
                raise
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


def _train(model_cfg, warm_cfg, task, out_dir: Path, log, progress: bool) -> dict:
    start = time.perf_counter()
    model, tokenizer = _initial(model_cfg, warm_cfg)
    validation, training = _held_out(task, warm_cfg, log)
    prompts, answers, masks, limits = _examples(tokenizer, task, training)
    device = next(model.parameters()).device
    engine = LeanEngine(model, tokenizer, temperature=1.0, max_new_tokens=limits["max_new_tokens"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=warm_cfg.lr)
    rng = random.Random(warm_cfg.seed)
    history, accuracy, step = [], 0.0, 0
    # No ETA: the bar's total is the step cap, and the run usually stops earlier, at the target accuracy.
    bar = RunProgress(
        warm_cfg.max_steps,
        enabled=progress,
        description=f"warm start (to val pass@1 >= {warm_cfg.target_accuracy:g})",
        interval=warm_cfg.check_interval,
        eta=False,
    )
    with torch.random.fork_rng(devices=[]), bar:
        torch.manual_seed(warm_cfg.seed)
        while step < warm_cfg.max_steps:
            step += 1
            rows = rng.sample(range(len(training)), min(warm_cfg.batch_size, len(training)))
            batch = [
                t.to(device)
                for t in pack([prompts[i] for i in rows], [answers[i] for i in rows], tokenizer.pad_token_id)
            ]
            # Model tokens only: an episode's environment turns are context, as in RL (all ones for one turn).
            mask = batch[3] & (right_pad_values([masks[i] for i in rows], batch[3].shape[1]).to(device) > 0)  # (B, T)
            loss = _sft_step(model, optimizer, batch, mask)
            if step % warm_cfg.check_interval == 0:
                accuracy = evaluate(
                    engine,
                    _Held(task, validation),
                    tokenizer,
                    num_problems=len(validation),
                    temperature=1.0,
                    seed=warm_cfg.seed + step,
                    max_turns=limits["max_turns"],
                    max_episode_tokens=limits["max_episode_tokens"],
                )["accuracy"]
                history.append({"step": step, "loss": float(loss.detach()), "val_accuracy": accuracy})
                bar.update(step, f"loss {float(loss.detach()):.3f}  val pass@1 {accuracy:.3f}", line=True)
                if accuracy >= warm_cfg.target_accuracy:
                    break
    if accuracy < warm_cfg.target_accuracy:
        log(
            f"warning: warm start stopped at max_steps={warm_cfg.max_steps} with pass@1 {accuracy:.3f} "
            f"< target {warm_cfg.target_accuracy}"
        )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    seconds = time.perf_counter() - start
    log(
        f"warm start: {step} steps, validation pass@1 {accuracy:.3f} (replies of up to "
        f"{limits['max_new_tokens']} tokens), {seconds:.1f}s"
    )
    return {
        "steps": step,
        "val_accuracy": accuracy,
        "seconds": seconds,
        "history": history,
        "reply_tokens": limits["max_new_tokens"] - _SLACK,
        "max_new_tokens": limits["max_new_tokens"],
    }


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
