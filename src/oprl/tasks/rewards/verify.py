"""Answer checking with math-verify in reward processes, under a hard per-answer wall-clock timeout.

A reward function hands ``(reference, candidate)`` string pairs to a ``VerifierPool``; each pair is checked
by math-verify (``parse`` then ``verify``, i.e. sympy) inside a separate Python process. The parent waits at
most ``timeout`` seconds for each answer; when that passes, the reward process is killed (SIGKILL) and replaced,
and the answer gets the verdict ``"timeout"``. A process that dies or raises gives ``"error"``. Both score 0
upstream and are counted, so a hostile or merely unlucky model output (``9^9^9^9`` makes sympy compute a
number with 370 million digits) can neither hang training nor crash it.

Why a process: math-verify's own timeout uses ``signal.alarm``, which only works in the main thread and
cannot interrupt C code, and a thread cannot be killed at all. A process can. The transport is
``oprl.tasks.rewards.processes.RewardPool``: JSON lines (no pickle) on a private pipe pair, each reply checked against
its request's id, the process under a memory limit (``PROCESS_MEMORY_MB``); model text is only ever handed
to math-verify's parsers as a string: nothing is evaluated as code.

Not here: extracting the answer from a response (``oprl.tasks.rewards.builtin``), any notion of reward.
Run one reward process by hand (it then reads stdin and writes stdout): ``echo '{"gold": "72", "pred": "72"}' |
python -m oprl.tasks.rewards.verify``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from oprl.errors import OprlError
from oprl.tasks.rewards.processes import RewardPool, fatal, serve, start_reward_process

VERDICTS = ("match", "mismatch", "malformed", "timeout", "error")
CHECKERS = {
    "math": "oprl.tasks.rewards.verify:check_math",
    "tool-call": "oprl.tasks.bfcl.toolcall:check_request",
}
"""Worker kinds and the checker each answers requests with (``module:function``, request dict in, reply dict
out), imported inside the reward process: the pool knows no checker's module, so a task adds a kind here
without this module importing it. ``math`` also imports math-verify at start-up (missing: one fatal line)."""
KINDS = tuple(CHECKERS)
# The reward process's address-space limit: sympy on a pathological input can allocate without bound before the
# timeout fires; 2 GiB is far above what honest answers need (~200 MB with the imports).
PROCESS_MEMORY_MB = 2048


def require_math_verify(task: str) -> None:
    """One-line ``OprlError`` when math-verify is missing (checked up front, not in a reward process)."""
    import importlib.util

    if importlib.util.find_spec("math_verify") is None:
        raise OprlError(f"task.name={task}: answer checking needs math-verify; pip install 'oprl[math]'")


@dataclass(frozen=True)
class Job:
    """One comparison: ``gold`` is the reference answer, ``pred`` the model's (already extracted) answer.

    ``mode`` says how to read them: ``plain`` (free text such as ``72``, ``$1,000`` or ``\\frac{1}{2}``,
    the GSM8k reward) or ``latex`` (the content of a ``\\boxed{}``, the MATH reward), both for ``math``
    processes; ``tool-call`` / ``tool-call-nothink`` for ``tool-call`` processes: ``gold`` is the JSON ground
    truth, ``pred`` the whole response, the verdict ``oprl.tasks.bfcl.toolcall.verdict``'s (with / without the
    think-tag rules).
    """

    gold: str
    pred: str
    mode: str = "plain"


class VerifierPool(RewardPool):
    """``processes`` answer-checking reward processes of ``kind`` (math-verify or tool-call); ``check(jobs)`` returns
    one verdict per job, in order. ``counts`` accumulates verdicts over the pool's life."""

    def __init__(self, processes: int = 1, timeout: float = 5.0, startup_timeout: float = 120.0, kind: str = "math"):
        if kind not in KINDS:
            raise ValueError(f"VerifierPool needs kind in {KINDS}")
        super().__init__(
            ["oprl.tasks.rewards.verify", kind],
            processes,
            timeout,
            startup_timeout,
            "answer-checking process",
            memory_mb=PROCESS_MEMORY_MB,
        )
        self.kind = kind
        self.counts = dict.fromkeys(VERDICTS, 0)
        self._cache: dict[Job, tuple[str, float]] = {}

    def check(self, jobs: list[Job]) -> list[str]:
        """Verdicts (``match``/``mismatch``/``timeout``/``error``) for ``jobs``; identical jobs are checked once."""
        return [verdict for verdict, _ in self.check_scored(jobs)]

    def check_scored(self, jobs: list[Job]) -> list[tuple[str, float]]:
        """``(verdict, credit)`` per job: ``credit`` is the checker's partial credit in [0, 1] (``tool-call``
        processes: ``oprl.tasks.bfcl.toolcall.calls_credit``), 0.0 where it gives none (math, timeouts, errors)."""
        with self._lock:
            return self._check(jobs)

    def _check(self, jobs: list[Job]) -> list[tuple[str, float]]:
        results: list[tuple[str, float] | None] = [self._cache.get(job) for job in jobs]
        todo: dict[Job, list[int]] = {}
        for index, job in enumerate(jobs):
            if results[index] is None:
                todo.setdefault(job, []).append(index)
        requests = [{"gold": job.gold, "pred": job.pred, "mode": job.mode} for job in todo]
        for job, reply in zip(todo, self._run(requests), strict=True):
            verdict = _verdict(reply)
            credit = float(reply.get("credit", 0.0)) if verdict in ("match", "mismatch", "malformed") else 0.0
            if verdict in ("match", "mismatch", "malformed"):  # a timeout may be load; never cache it
                if len(self._cache) > 100_000:
                    self._cache.clear()
                self._cache[job] = (verdict, credit)
            for index in todo[job]:
                results[index] = (verdict, credit)
        settled = [r for r in results if r is not None]
        assert len(settled) == len(results)  # every job was cached or has just been checked
        for verdict, _ in settled:
            self.counts[verdict] += 1
        return settled


def _verdict(reply: dict) -> str:
    if reply.get("verdict") in VERDICTS:
        return reply["verdict"]
    return "error" if "error" in reply else ("match" if reply.get("match") else "mismatch")


# ---------------------------------------------------------------- the reward process's side


def _verify_pair(gold: str, pred: str, mode: str) -> bool:
    """math-verify's verdict on one pair; its own signal-based timeouts are off (the parent enforces one)."""
    from math_verify import parse, verify

    def read(text: str):
        if mode == "latex":
            return parse(f"$\\boxed{{{text}}}$", parsing_timeout=None) or parse(text, parsing_timeout=None)
        return parse(text, parsing_timeout=None) or parse(f"${text}$", parsing_timeout=None)

    gold_parsed, pred_parsed = read(gold), read(pred)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))


def check_math(request: dict) -> dict:
    """The ``math`` checker: ``{"match": bool}`` for one ``Job`` (``mode`` plain or latex)."""
    gold, pred, mode = str(request["gold"]), str(request["pred"]), request.get("mode", "plain")
    return {"match": _verify_pair(gold, pred, mode)}


def _process_main(kind: str = "math") -> None:
    import importlib
    import logging

    memory_mb = start_reward_process()
    logging.disable(logging.WARNING)  # math-verify warns about the disabled timeouts on every call
    if kind == "math":
        try:
            import math_verify  # noqa: F401
        except ImportError as exc:
            return fatal(f"math-verify is not installed ({exc})")
    module, _, name = CHECKERS[kind].partition(":")
    serve(getattr(importlib.import_module(module), name), memory_mb=memory_mb)


if __name__ == "__main__":
    _process_main(sys.argv[1] if len(sys.argv) > 1 else "math")
