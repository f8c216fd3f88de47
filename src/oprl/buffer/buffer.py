"""The experience buffer: fresh batches waiting for their trainer step, a replay pool, and the store on disk.

Live runs (mode=both): explorers' batches arrive with ``put(batch, experiences)`` and leave with
``take(step)``, which returns the fresh batch of that step (batch index = trainer step, so the schedule, not
arrival order, decides what is trained when) plus, with replay on, the ``replay.groups_per_step`` groups of
highest priority ``policy_version - decay * use_count`` among already-used groups. Offline runs (mode=offline)
read the store instead: step t takes the next ``prompts_per_step`` groups in stored order, for up to
``buffer.passes`` passes.

The buffer owns use counts: each group's count lives here and is written into the experiences it hands out
(the count *before* this use), so the trainer may hold the same objects (local backend) or copies (Ray).
``save``/``restore`` cover everything unconsumed (fresh batches, the replay pool with its counts, the offline
cursor) for checkpoints. Deliberately not here: which policy version is due when (``schedule``,
``synchronizer``) and advantages (the trainer).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from oprl.checkpoint.store import ExperienceStore, read_parquet, write_parquet
from oprl.config import RunConfig
from oprl.errors import OprlError
from oprl.io import named
from oprl.messages import Experience


@dataclass
class Group:
    """One prompt's responses, the unit of replay."""

    batch: int
    """The batch (trainer step) it was generated for."""
    group_id: int
    experiences: list[Experience]
    uses: int = 0
    """Trainer steps that have used it so far."""

    @property
    def version(self) -> int:
        return self.experiences[0].policy_version

    def priority(self, decay: float) -> tuple:
        """Sort key, highest first: newer policy, fewer uses; ties to the newer batch, then lower group id."""
        return (self.version - decay * self.uses, self.batch, -self.group_id)


def split_groups(batch: int, experiences: list[Experience]) -> list[Group]:
    """Consecutive experiences with the same group id form a group (explorers emit them that way)."""
    groups: list[Group] = []
    for exp in experiences:
        if not groups or groups[-1].group_id != exp.group_id:
            groups.append(Group(batch, exp.group_id, [], uses=exp.use_count))
        groups[-1].experiences.append(exp)
    return groups


class OfflineSource:
    """Groups of a store in stored order (ascending batch files), ``passes`` times over; the position is one
    integer, so a checkpoint can record it."""

    def __init__(self, store: ExperienceStore, passes: int):
        self.store = store
        self.passes = passes
        self.files = store.batches()
        self.counts = [
            len(set(read_parquet(store.path_of(b), columns=["group_id"]).column("group_id").to_pylist()))
            for b in self.files
        ]
        self.total = sum(self.counts)
        self.position = 0
        self._cache: tuple[int, list[Group]] | None = None

    def next_groups(self, count: int) -> list[Group]:
        if self.position + count > self.total * self.passes:
            raise OprlError(
                f"buffer.path: {self.store.root} holds {self.total} groups; {self.passes} pass(es) cannot feed "
                f"another step of {count} groups (after {self.position} used): lower steps or raise buffer.passes"
            )
        out = []
        for _ in range(count):
            pass_index, offset = divmod(self.position, self.total)
            group = self._group_at(offset)
            out.append(Group(group.batch, group.group_id, group.experiences, uses=group.uses + pass_index))
            self.position += 1
        return out

    def _group_at(self, offset: int) -> Group:
        file_index = 0
        while offset >= self.counts[file_index]:  # the file holding the group, and the offset inside it
            offset -= self.counts[file_index]
            file_index += 1
        if self._cache is None or self._cache[0] != file_index:
            batch = self.files[file_index]
            self._cache = (file_index, split_groups(batch, self.store.read(batch)))
        return self._cache[1][offset]


class ExperienceBuffer:
    def __init__(
        self,
        *,
        store_dir: str | None = None,
        offline_dir: str | None = None,
        passes: int = 1,
        prompts_per_step: int = 1,
        replay_groups: int = 0,
        max_uses: int = 1,
        decay: float = 1.0,
        capacity: int = 1024,
    ):
        self.store = ExperienceStore(store_dir) if store_dir else None
        self.offline = OfflineSource(ExperienceStore.locate(offline_dir), passes) if offline_dir else None
        self.prompts_per_step = prompts_per_step
        self.replay_groups, self.max_uses, self.decay, self.capacity = replay_groups, max_uses, decay, capacity
        self.ready: dict[int, list[Experience]] = {}
        self.pool: list[Group] = []
        self.evicted = 0
        self.failed_puts: dict[int, BaseException] = {}

    # -- live runs --------------------------------------------------------------------------------------
    def put(self, batch: int, experiences: list[Experience], keep: bool = True) -> int:
        """Persist (when a store is set) and queue the batch for trainer step ``batch``; returns its size."""
        if self.store is not None:
            try:
                self.store.write(batch, experiences)
            except BaseException as exc:
                self.failed_puts[batch] = exc  # what ``take`` reports, rather than "never put"
                raise
        if keep:
            self.ready[batch] = experiences
        return len(experiences)

    def take(self, step: int) -> tuple[list[Experience], dict[str, float]]:
        """The batch of trainer ``step``: its fresh groups, then the replayed ones; and buffer metrics."""
        if self.offline is not None:
            fresh = self.offline.next_groups(self.prompts_per_step)
        else:
            if step in self.failed_puts:
                raise self.failed_puts[step]
            if step not in self.ready:
                raise RuntimeError(f"buffer: batch {step} was never put")
            fresh = split_groups(step, self.ready.pop(step))
        replayed = self._pick_replay()
        stats = self._replay_stats(step, fresh, replayed)
        batch = []
        for group in fresh + replayed:
            for exp in group.experiences:
                exp.use_count = group.uses
            batch.extend(group.experiences)
            group.uses += 1
        if self.replay_groups:
            self._refill_pool(fresh + replayed)
        stats["buffer/replay_pool_groups"] = float(len(self.pool))
        stats["buffer/evicted_groups"] = float(self.evicted)
        stats["perf/buffer_batches_ready"] = float(len(self.ready))
        return batch, stats

    def _pick_replay(self) -> list[Group]:
        if self.replay_groups == 0 or not self.pool:
            return []
        self.pool.sort(key=lambda g: g.priority(self.decay), reverse=True)
        chosen, self.pool = self.pool[: self.replay_groups], self.pool[self.replay_groups :]
        return chosen

    def _refill_pool(self, used: list[Group]) -> None:
        """Groups with uses left join (or rejoin) the pool; beyond capacity the lowest priority go."""
        self.pool.extend(g for g in used if g.uses < self.max_uses)
        if len(self.pool) > self.capacity:
            self.pool.sort(key=lambda g: g.priority(self.decay), reverse=True)
            self.evicted += len(self.pool) - self.capacity
            del self.pool[self.capacity :]

    @staticmethod
    def _replay_stats(step: int, fresh: list[Group], replayed: list[Group]) -> dict[str, float]:
        rows = sum(len(g.experiences) for g in fresh + replayed)
        replay_rows = sum(len(g.experiences) for g in replayed)
        stats = {"replay/groups": float(len(replayed)), "replay/frac": replay_rows / max(rows, 1)}
        if replayed:
            stats["replay/age_mean"] = sum((step - 1) - g.version for g in replayed) / len(replayed)
            stats["replay/age_max"] = float(max((step - 1) - g.version for g in replayed))
            stats["replay/use_count_mean"] = sum(g.uses for g in replayed) / len(replayed)
        return stats

    # -- checkpoints ------------------------------------------------------------------------------------
    def save(self, directory: str) -> list[int]:
        """Write unconsumed fresh batches, the replay pool and the offline cursor; returns the fresh batches."""
        root = Path(directory)
        root.mkdir(parents=True, exist_ok=True)
        for batch, experiences in self.ready.items():
            write_parquet(root / f"ready-{batch:06d}.parquet", experiences, batch)
        pool = []
        for group in self.pool:
            for exp in group.experiences:
                exp.use_count = group.uses
            pool.extend(group.experiences)
        pool_batches = [g.batch for g in self.pool for _ in g.experiences]
        if pool:
            write_parquet(root / "replay.parquet", pool, pool_batches)
        meta = {
            "ready": sorted(self.ready),
            "pool_batches": pool_batches,
            "evicted": self.evicted,
            "offline_position": self.offline.position if self.offline else None,
        }
        with named(root / "buffer.json"):
            (root / "buffer.json").write_text(json.dumps(meta))
        return sorted(self.ready)

    def restore(self, directory: str) -> list[int]:
        """Inverse of ``save``; returns the fresh batches restored."""
        root = Path(directory)
        meta = json.loads((root / "buffer.json").read_text())
        self.ready = {b: read_parquet(root / f"ready-{b:06d}.parquet") for b in meta["ready"]}
        self.pool, self.evicted = [], meta["evicted"]
        if meta["pool_batches"]:
            experiences = read_parquet(root / "replay.parquet")
            for batch, exp in zip(meta["pool_batches"], experiences, strict=True):
                if not self.pool or self.pool[-1].group_id != exp.group_id or self.pool[-1].batch != batch:
                    self.pool.append(Group(batch, exp.group_id, [], uses=exp.use_count))
                self.pool[-1].experiences.append(exp)
        if self.offline is not None and meta["offline_position"] is not None:
            self.offline.position = meta["offline_position"]
        return sorted(self.ready)


def make_buffer(config: RunConfig, store_dir: str | None) -> ExperienceBuffer:
    """The buffer worker of a run (a module-level factory, so a Ray actor can build it too)."""
    replay = config.replay
    return ExperienceBuffer(
        store_dir=store_dir,
        offline_dir=config.buffer.path if config.mode == "offline" else None,
        passes=config.buffer.passes,
        prompts_per_step=config.rollout.prompts_per_step,
        replay_groups=replay.groups_per_step,
        max_uses=replay.max_uses,
        decay=replay.decay,
        capacity=replay.capacity,
    )
