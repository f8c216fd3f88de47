"""The exception a run ends with when one of its workers dies (kept import-light for the CLI)."""


class WorkerFailure(RuntimeError):
    """A worker (explorer, trainer, buffer) raised or died; the message is one line naming it, what it was
    doing, the cause, and the checkpoint to resume from. The original exception is chained."""
