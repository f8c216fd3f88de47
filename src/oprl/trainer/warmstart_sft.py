"""The supervised fine-tuning a warm start runs: demonstrations into examples, the steps until the model solves
*some* problems, and the state a killed warm start resumes from (``oprl.trainer.warmstart`` decides when one runs
and caches its result).

Targets: a task's ``demonstration(problem)`` when it has one (BFCL: the ground-truth calls in the task's own
``<think>...</think><tool_call>{json}</tool_call>`` format; multi-turn tasks: the model turns of a whole
episode, trained on model tokens only), else the problem's reference answer. Problems whose demonstration is
None are left out (counted in the log). The first ``val_problems`` are held out: the run stops when its pass@1 at
temperature 1 on them reaches ``target_accuracy`` (or at ``max_steps``).

The loss is the mean negative log-likelihood of the target tokens, ``-sum_t m_t log pi(y_t | x, y_<t) /
sum_t m_t`` over a batch of ``batch_size`` problems, ``m`` the loss mask (1 = model token).

Resumable: every validation check (at most once every ``SAVE_EVERY_S`` seconds) writes the weights, the
optimizer and the data order to ``models/.partial-<name>/``; a later run of the same recipe continues from
there (the same steps an uninterrupted warm start would take), so a kill loses at most that much.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import time
from dataclasses import dataclass
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
from oprl.models.loading import load_pretrained
from oprl.models.logprobs import pack, response_logprobs
from oprl.models.tiny import build_model, build_tokenizer
from oprl.models.truncation import Sampling
from oprl.progress import RunProgress
from oprl.rollout import LeanEngine
from oprl.tasks.base import EpisodicTask

_SLACK = 4
"""Tokens the warm start's own sampling allows beyond its longest demonstration (reply or turn)."""
SAVE_EVERY_S = 30.0
"""Seconds between the partial states a warm start leaves for a resume (checked at each validation)."""


def train(model_cfg, warm_cfg, task, out_dir: Path, log, progress: bool, partial: Path) -> dict:
    """Fine-tune from ``_initial`` on ``task``'s demonstrations (module docstring), continuing ``partial`` where a
    killed run left one; the model and tokenizer saved to ``out_dir``. The result: steps, validation pass@1,
    seconds, the checks' history and the reply lengths (``length_warning`` reads them)."""
    start = time.perf_counter()
    session = _Session.of(model_cfg, warm_cfg, task, log, partial)
    state: dict[str, Any] = {"step": 0, "accuracy": 0.0, "history": [], "seconds": 0.0}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(warm_cfg.seed)
        if _restore(partial, session.model, session.optimizer, session.rng, state):
            log(f"warm start: continuing from step {state['step']} (a partial state in {partial})")
        start = _steps(session, state, progress, start)
    accuracy, step = state["accuracy"], state["step"]
    if accuracy < warm_cfg.target_accuracy:
        log(
            f"warning: warm start stopped at max_steps={warm_cfg.max_steps} with pass@1 {accuracy:.3f} "
            f"< target {warm_cfg.target_accuracy}"
        )
    session.model.save_pretrained(out_dir)
    session.tokenizer.save_pretrained(out_dir)
    seconds = state["seconds"] + time.perf_counter() - start
    budget = session.limits["max_new_tokens"]
    log(
        f"warm start: {step} steps, validation pass@1 {accuracy:.3f} (replies of up to {budget} tokens), {seconds:.1f}s"
    )
    return {"steps": step, "val_accuracy": accuracy, "seconds": seconds, "history": state["history"]} | {
        "reply_tokens": budget - _SLACK,
        "max_new_tokens": budget,
    }


@dataclass
class _Session:
    """What one warm start trains with: the model and its optimizer, the data order's generator, the sampler of
    its checks, and the examples (``examples``) split into held-out ``validation`` and ``training`` problems."""

    warm_cfg: Any
    task: Any
    partial: Path
    model: Any
    tokenizer: Any
    optimizer: torch.optim.Optimizer
    rng: random.Random
    engine: LeanEngine
    validation: list
    training: list
    prompts: list
    answers: list
    masks: list
    limits: dict

    @classmethod
    def of(cls, model_cfg, warm_cfg, task, log, partial: Path) -> _Session:
        model, tokenizer = _initial(model_cfg, warm_cfg)
        validation, training = _held_out(task, warm_cfg, log)
        prompts, answers, masks, limits = examples(tokenizer, task, training)
        engine = LeanEngine(model, tokenizer, max_new_tokens=limits["max_new_tokens"])  # temperature 1, no truncation
        optimizer = torch.optim.AdamW(model.parameters(), lr=warm_cfg.lr)
        rng = random.Random(warm_cfg.seed)
        return cls(warm_cfg, task, partial, model, tokenizer, optimizer, rng, engine, validation, training, prompts,
                   answers, masks, limits)  # fmt: skip


def _steps(s: _Session, state: dict, progress: bool, start: float) -> float:
    """The supervised steps from ``state["step"]`` until a check reaches the target or ``max_steps``, a partial
    state saved at a check every ``SAVE_EVERY_S``. Returns when the current stretch of ``state["seconds"]`` began."""
    warm_cfg, device = s.warm_cfg, next(s.model.parameters()).device
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
            rows = s.rng.sample(range(len(s.training)), min(warm_cfg.batch_size, len(s.training)))
            batch, mask = _batch(rows, s.prompts, s.answers, s.masks, s.tokenizer.pad_token_id, device)
            loss = _sft_step(s.model, s.optimizer, batch, mask)
            if step % warm_cfg.check_interval:
                bar.update(step)
                continue
            accuracy = _validate(s.engine, s.task, s.validation, s.tokenizer, warm_cfg.seed + step, s.limits)
            state["accuracy"] = accuracy
            state["history"].append({"step": step, "loss": float(loss.detach()), "val_accuracy": accuracy})
            text = f"val pass@1 {accuracy:.3f} (target {warm_cfg.target_accuracy:g})  loss {float(loss.detach()):.3f}"
            bar.update(step, text, line=True)
            if accuracy >= warm_cfg.target_accuracy:
                break
            if time.perf_counter() - saved_at >= SAVE_EVERY_S:
                state["seconds"] += time.perf_counter() - start
                start = time.perf_counter()
                _save_partial(s.partial, s.model, s.optimizer, s.rng, state)
                saved_at = time.perf_counter()
    return start


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
    problems, skipped = demonstrable(task, list(task.problems("train")))
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


def demonstrable(task, problems) -> tuple[list, int]:
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


def examples(tokenizer, task, problems):
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
