"""A rich progress bar with live metrics (step, train reward, last eval accuracy); a no-op when disabled."""

from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

TRAIN_FIELDS = "reward {task.fields[reward]:.3f}  eval acc {task.fields[accuracy]:.3f}"


class RunProgress:
    """``fields`` is a rich template over ``task.fields``; ``initial`` gives each field its first value."""

    def __init__(
        self, total: int, *, enabled: bool = True, description: str = "train", fields: str = TRAIN_FIELDS, **initial
    ):
        self.enabled = enabled
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(fields),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            disable=not enabled,
        )
        initial = initial or {"reward": 0.0, "accuracy": 0.0}
        self._task = self._progress.add_task(description, total=total, **initial)

    def __enter__(self):
        self._progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self._progress.__exit__(*exc)

    def update(self, step: int, **fields) -> None:
        self._progress.update(self._task, completed=step, **fields)
