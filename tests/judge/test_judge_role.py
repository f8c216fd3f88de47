"""The judge role (``oprl.judge.JudgeWorker``) on a tiny model: it answers a batch of (prompt, completion,
reference) rows with the in-process judge's verdicts, and another worker reaches it through the backend's peer
(``oprl.roles.JudgeClient``) with the same verdicts on threads and on worker processes, the judge in a process
of its own; a failure inside the judge reaches the caller as an error naming it.

Runs through the runtime (threads vs processes, Ray's placement): tests/integration/test_judge_run.py."""

import os

import pytest

from oprl.backends.local import LocalBackend
from oprl.backends.processes import RemoteError
from oprl.config import load_config
from oprl.episodes.judge import build_judge
from oprl.judge import JudgeWorker
from oprl.models.tiny import build_model, build_tokenizer
from oprl.roles import JudgeClient

ROWS = [("2+3=", "5", "5"), ("12+7=", "20", "19"), ("1+1=", "two", None)]


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    """A tiny model directory: ``judge.path=tiny`` is the student's own starting model."""
    path = tmp_path_factory.mktemp("judge") / "model"
    tokenizer = build_tokenizer()
    build_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=5).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def judge_config(*overrides: str):
    return load_config(overrides=["judge.path=tiny", "judge.yes_text=1", "judge.no_text=0", *overrides])


class Asker:
    """A worker that asks the judge itself, as an explorer does: its verdicts and its process id."""

    def __init__(self, judge: JudgeClient):
        self.judge = judge

    def ask(self, rows):
        return self.judge.judge(rows), os.getpid()


def test_the_judge_answers_rows_with_the_in_process_judges_verdicts(student):
    for parser in ("yes-no", "number"):
        config = judge_config(f"judge.parser={parser}", "judge.max_new_tokens=2")
        answer = JudgeWorker(config, student).judge(ROWS)
        found = build_judge(config, student).verdicts(
            [config.judge.template.format(prompt=p, completion=c, reference=r or "") for p, c, r in ROWS]
        )
        assert answer.scores == [0.0 if v is None else v for v in found], parser
        assert answer.unparsed == [v is None for v in found], parser
        assert answer.seconds > 0
    assert not any(JudgeWorker(judge_config(), student).judge(ROWS).unparsed)  # yes-no always parses


@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_a_worker_reaches_the_judge_through_its_peer(student, workers):
    config = judge_config()
    expected = JudgeWorker(config, student).judge(ROWS).scores
    backend = LocalBackend(workers)
    judge = backend.start("judge", JudgeWorker, config, student, threads=1)
    asker = backend.start("asker", Asker, JudgeClient(backend.peer(judge)), threads=1)
    try:
        backend.wait_ready(judge)
        backend.wait_ready(asker)
        verdicts, pid = asker.call("ask", ROWS).result(timeout=120)
        assert verdicts.scores == expected and verdicts.unparsed == [False] * 3
        if workers == "processes":  # each in a process of its own, neither the driver's
            assert len({pid, judge.pid, os.getpid()}) == 3
        # A row that is no (prompt, completion, reference): the judge's TypeError (threads), or the same as
        # RemoteError("TypeError", ...) (processes: relayed from the judge's process through the asker's).
        with pytest.raises((TypeError, RemoteError), match=r"render\(\) missing 2 required positional"):
            asker.call("ask", [("only a prompt",)]).result(timeout=120)
        assert asker.call("ask", ROWS[:1]).result(timeout=120)[0].scores == expected[:1]  # still answering
    finally:
        backend.shutdown([asker, judge])
