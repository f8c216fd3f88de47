"""Progress of a long loop (a run's steps, the warm start, a sweep's runs): a live rich bar on a terminal,
plain log lines elsewhere.

Where stdout is a terminal (or a notebook) and progress is enabled, a bar shows ``done/total``, the text
the caller gives (reward, accuracy, ...), elapsed time and ETA. Anywhere else (a cluster job, ``nohup``,
CI, ``progress=false``) the same text goes to the ``oprl`` logger (Python ``logging``, level INFO) as one
line every ``interval`` steps or ``interval_s`` seconds, whichever comes first, and whenever the caller
says a line is due (after an evaluation, at the end), so a log file or ``tail -f`` shows how a run goes.
When nothing configured logging, the ``oprl`` logger writes to stderr itself (``attach_default_handler``).
"""

from __future__ import annotations

import logging
import sys
import time

LOGGER = logging.getLogger("oprl")
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def interactive() -> bool:
    """Whether a live bar can be drawn: stdout is a terminal or a notebook (rich's detection)."""
    from rich.console import Console

    console = Console()
    return console.is_terminal or console.is_jupyter


def attach_default_handler() -> None:
    """Give the ``oprl`` logger a stderr handler at INFO unless logging is configured (a root or ``oprl``
    handler exists): progress lines must show up in a job's log without any setup, and never twice."""
    if LOGGER.handlers or logging.getLogger().handlers:
        if LOGGER.level == logging.NOTSET:
            LOGGER.setLevel(logging.INFO)
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_FORMAT))
    LOGGER.addHandler(handler)
    LOGGER.setLevel(logging.INFO)
    LOGGER.propagate = False


def format_seconds(seconds: float) -> str:
    """``42s``, ``3m07s``, ``1h02m``."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class RunProgress:
    """``with RunProgress(total) as p: p.update(done, text)``: a bar, or log lines (module docstring).

    ``eta=False`` leaves the time remaining out; ``eta_bound=True`` marks it an upper bound (a loop that
    usually stops before ``total``, like the warm start, which ends at its target accuracy): ``eta at most 6m15s
    (if it runs all 600 steps)``. ``start``: the
    count already done when this process began (a resumed run): the rate, hence the ETA, counts only what
    this process did. ``unit`` names what is counted in log lines (step, run).

    The bar fits the terminal: description, ``done/total`` and the ETA come first and always show; the
    caller's text gets the width left, its fields (separated by two spaces) dropped from the end to fit.
    """

    def __init__(
        self,
        total: int,
        *,
        enabled: bool = True,
        description: str = "train",
        interval: int = 10,
        interval_s: float = 60.0,
        eta: bool = True,
        eta_bound: bool = False,
        start: int = 0,
        unit: str = "step",
        console=None,
    ):
        self.total, self.description, self.unit, self.eta = total, description, unit, eta
        self.eta_bound, self.start = eta_bound, start
        self.interval, self.interval_s = interval, interval_s
        self.bar = enabled and (console is not None or interactive())
        self.lines = 0
        """Log lines written (a bar writes none)."""
        self._started = time.perf_counter()
        self._last_line: tuple[int, float] | None = (start, self._started) if start else None
        self._progress = None
        if self.bar:
            self._progress, self._task = self._make_bar(console)
        else:
            attach_default_handler()

    def _make_bar(self, console):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
        from rich.table import Column

        columns = [TextColumn("[bold]{task.description}"), MofNCompleteColumn()]
        if self.eta:
            columns += [TextColumn("eta at most" if self.eta_bound else "eta"), TimeRemainingColumn(compact=True)]
        columns += [
            BarColumn(bar_width=10),
            TextColumn("{task.fields[text]}", table_column=Column(no_wrap=True, overflow="ellipsis")),
        ]
        progress = Progress(*columns, console=console)
        return progress, progress.add_task(self.description, total=self.total, completed=self.start, text="")

    def _fit(self, text: str, description: str) -> str:
        """``text`` with its last fields dropped until the line fits the console's width."""
        assert self._progress is not None
        digits = len(str(self.total))
        eta = len("eta at most " if self.eta_bound else "eta ") + len("0:00:00") + 1 if self.eta else 0
        fixed = len(description) + 1 + 2 * digits + 1 + 1 + eta + 10 + 1  # columns and the spaces between them
        room = self._progress.console.width - fixed
        fields = [f for f in text.split("  ") if f]
        while fields and len("  ".join(fields)) > room:
            fields.pop()
        return "  ".join(fields)

    def __enter__(self):
        if self._progress is not None:
            self._progress.__enter__()
        return self

    def __exit__(self, *exc):
        if self._progress is not None:
            return self._progress.__exit__(*exc)
        return None

    def update(self, done: int, text: str | None = None, *, line: bool = False, status: str | None = None) -> None:
        """``done`` of ``total`` are finished; ``text`` describes them (None: keep the last). ``line``: write a
        log line now (in log mode) whatever the interval. ``status``: what is going on meanwhile (bar only: its
        label)."""
        if self._progress is not None:
            if status is not None:
                self._progress.update(self._task, description=f"{self.description} ({status})")
            else:
                fields = {} if text is None else {"text": self._fit(text, self.description)}
                self._progress.update(self._task, completed=done, description=self.description, **fields)
            return
        text = self._last_text[1] if text is None else text
        now = time.perf_counter()
        last_done, last_time = self._last_line or (0, self._started)
        due = line or done >= self.total or done - last_done >= self.interval or now - last_time >= self.interval_s
        if status is not None or not due or (self._last_line is not None and (done, text) == self._last_text):
            return
        self._last_line, self._last_text = (done, now), (done, text)
        parts = [f"{self.description} {self.unit} {done}/{self.total}", text]
        elapsed = now - self._started
        if self.eta and self.start < done < self.total:
            remaining = format_seconds(elapsed / (done - self.start) * (self.total - done))
            # A bound reads as one: the time to the cap, which the loop usually stops short of ("<= 6m15s" with
            # 74 s left read as an estimate).
            bound = f"eta at most {remaining} (if it runs all {self.total} {self.unit}s)"
            parts.append(bound if self.eta_bound else f"eta {remaining}")
        parts.append(f"elapsed {format_seconds(elapsed)}")
        LOGGER.info("  ".join(p for p in parts if p))
        self.lines += 1

    _last_text: tuple[int, str] = (-1, "")
