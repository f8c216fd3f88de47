"""The orchestration: ``run`` (one run end to end), the driver (one event loop wiring explorers, buffer and
trainer on any backend) and the synchronizer (which policy version generates each batch).
The roles themselves live in ``oprl.explorer``, ``oprl.trainer``, ``oprl.buffer``; where they run in
``oprl.backends``; what survives a process in ``oprl.checkpoint``. See docs/architecture.md."""
