"""Where and when: the schedule, explorers, buffer and experience store, trainer, synchronizer, the driver that
wires them, the local (threads or processes) and Ray backends, checkpoints, warm start and ``run``.
See docs/runtime.md."""
