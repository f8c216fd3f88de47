"""``BatchTracker``: where every batch of a run is, and which trainer step is next (the driver's scheduling
state, ``oprl.runtime.driver``); also which explorers are down while they are restarted.
"""

from __future__ import annotations


class BatchTracker:
    """Where every batch is, and which trainer step is next: the driver's scheduling state (which version
    generates a batch is ``oprl.schedule``'s and the synchronizer's, not this tracker's).

    Batch b is the one trainer step b consumes. Invariants:

    - ``pending`` (ascending): batches no explorer has been given yet. Only the head goes out next, and it
      stays pending while it is held back: by the lag rule (the synchronizer has not yet published the
      version that must generate it: ``Synchronizer.version_for(b)`` is None), by ``buffer.max_ready``
      (``b > completed + max_ready``, ``Synchronizer.max_ready``: 4, or max_staleness + 1 in async mode, where
      it bounds the lag too; not in mode=explore), or because every explorer holds ``capacity``
      calls.
    - ``in_flight``: b -> the explorer generating it (running, or queued behind that explorer's running
      call). An explorer holds ``held(i)`` of them, at most ``capacity``: 1, or 2 in overlapped scheduled
      mode, where the next batch and its weights wait in the explorer's inbox so that the round trip
      through the driver (result -> dispatch -> weights load) leaves the critical path.
    - ``ready``: batches handed to the buffer and not yet taken by the trainer. A batch is ready as soon as
      its ``put`` is submitted: the buffer runs calls in submission order, so a ``take`` queued after it
      finds the batch. Nothing becomes ready in mode=explore, which trains nothing.
    - ``completed``: the last trainer step that finished (the checkpoint's step on resume); ``training``:
      step ``completed + 1`` is in flight (``take`` then ``train``). One step at a time, in order.

    - ``down``: explorers being restarted (``lost``: their batches went back to ``pending``); none is given a
      batch until the driver sees it serving again.

    ``pending``, ``in_flight`` and ``ready`` are disjoint; a batch only moves forward, pending -> in flight
    -> ready -> taken (``b <= completed``, or ``b == completed + 1`` while training).
    """

    def __init__(self, pending: list[int], ready: set[int], completed: int, explorers: int, capacity: int):
        self.pending = sorted(pending)
        self.in_flight: dict[int, int] = {}
        self.ready = set(ready)
        self.completed = completed
        self.training = False
        self.explorers, self.capacity = explorers, capacity
        self.down: set[int] = set()
        """Explorers being restarted: they get no batch until they serve again."""

    def held(self, explorer: int) -> int:
        return sum(1 for e in self.in_flight.values() if e == explorer)

    def explorer_with_room(self) -> int | None:
        """The least loaded explorer (lowest index on ties), None when it already holds ``capacity`` calls:
        idle explorers get work before any is queued."""
        serving = [i for i in range(self.explorers) if i not in self.down]
        index = min(serving, key=lambda i: (self.held(i), i), default=None)
        return None if index is None or self.held(index) >= self.capacity else index

    def in_reach(self, max_ready: int | None) -> bool:
        """Is the head of ``pending`` within ``max_ready`` batches of the trainer's next step (None: no bound)?"""
        return max_ready is None or self.pending[0] <= self.completed + max_ready

    def dispatch(self, batch: int, explorer: int) -> None:
        """``batch`` (the head of ``pending``) goes to ``explorer``."""
        assert self.pending[0] == batch, "batches are dispatched in order"
        self.pending.pop(0)
        self.in_flight[batch] = explorer

    def lost(self, explorer: int) -> list[int]:
        """``explorer`` died: it is ``down`` until ``serving`` again, and its batches go back to ``pending``
        (still in order: every batch in flight was dispatched before the head of ``pending``); the lost ones."""
        self.down.add(explorer)
        lost = sorted(b for b, e in self.in_flight.items() if e == explorer)
        for batch in lost:
            del self.in_flight[batch]
        self.pending = sorted(self.pending + lost)
        return lost

    def explored(self, batch: int, to_train: bool) -> None:
        """``batch`` came back and its ``put`` is submitted; ``to_train``: the trainer will take it."""
        del self.in_flight[batch]
        if to_train:
            self.ready.add(batch)

    def unstored(self, batch: int) -> None:
        """``batch``'s put failed (the teacher died scoring it): it is outstanding again, to be generated again."""
        self.ready.discard(batch)
        self.pending = sorted({*self.pending, batch})

    def take(self, step: int) -> None:
        """Step ``completed + 1`` starts (its ``take`` and ``train`` are submitted)."""
        self.ready.discard(step)
        self.training = True

    def trained(self, step: int) -> None:
        self.training = False
        self.completed = step

    def outstanding(self) -> list[int]:
        """Batches still to be generated or being generated, pending first."""
        return self.pending + sorted(self.in_flight)
