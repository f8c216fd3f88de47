"""The progress bar at a terminal's width, and its ETA after a resume (oprl.progress)."""

import io
import logging
import re

from rich.console import Console

from oprl.progress import RunProgress

TEXT = "reward 0.312  eval acc 0.402 (step 20)  len 6.1  truncated 0.00  lag 0.0  3.2 s/step  reward/format 0.98"


def _bar_line(width: int, **kwargs) -> str:
    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=True, color_system=None, legacy_windows=False)
    with RunProgress(300, description="train", console=console, **kwargs) as progress:
        progress.update(120, TEXT)
        progress.update(121, TEXT)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())  # cursor and erase codes
    lines = [line for line in text.replace("\r", "\n").splitlines() if line.strip()]
    return lines[-1]


def test_the_bar_at_80_columns_keeps_the_step_count_and_the_eta():
    line = _bar_line(80)
    assert len(line.rstrip()) <= 80, line
    assert "121/300" in line and "eta " in line and "reward 0.312  eval acc 0.402 (step 20)" in line, line
    assert "reward/format" not in line  # fields dropped from the end, whole
    wide = _bar_line(200)
    assert "121/300" in wide and "reward/format 0.98" in wide, wide


def test_the_eta_after_a_resume_counts_only_this_process(caplog, monkeypatch):
    """Resumed at step 100 of 200: 10 steps in 10 s leave 90 steps, 1m30s (not 100 x 0.1 s = 'eta 10s')."""
    clock = iter([0.0, 10.0])
    monkeypatch.setattr("oprl.progress.time.perf_counter", lambda: next(clock))
    with caplog.at_level(logging.INFO, logger="oprl"):
        progress = RunProgress(200, enabled=False, start=100, interval=10)
        progress.update(110, "reward 0.5")
    (line,) = [r.getMessage() for r in caplog.records if r.name == "oprl"]
    assert "train step 110/200" in line and "eta 1m30s" in line, line


def test_an_upper_bound_reads_as_one(caplog, monkeypatch):
    """The warm start's ETA is the time to its step cap, which it usually stops short of at its target accuracy.
    Before (#53): 'eta <= 6m15s' with 74 s left, read as an estimate; now the cap it is measured to is named."""
    clock = iter([0.0, 25.0])
    monkeypatch.setattr("oprl.progress.time.perf_counter", lambda: next(clock))
    with caplog.at_level(logging.INFO, logger="oprl"):
        progress = RunProgress(600, enabled=False, description="warm start", interval=40, eta_bound=True)
        progress.update(40, "val pass@1 0.300 (target 0.5)")
    (line,) = [r.getMessage() for r in caplog.records if r.name == "oprl"]
    assert "eta at most 5m50s (if it runs all 600 steps)" in line and "<=" not in line, line
