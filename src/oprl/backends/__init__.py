"""Where workers run: the ``Backend`` protocol, the actor base, local threads, local processes and Ray.

A backend hosts plain worker objects (explorers, the trainer, the evaluator) and runs their methods in
submission order; it never knows what a worker computes. See docs/runtime.md#backends."""
