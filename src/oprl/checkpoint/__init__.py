"""Everything that survives a process: the run directory and its lock, checkpoint files and their manifest,
and resume (which checkpoint to load, what to cut back, how to restore a session). See docs/runtime.md."""
