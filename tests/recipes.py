"""Recipes several test files share: the tiny model's multi-turn episode settings, a counting engine, a plug-in
engine that gains partial rollouts by declaring them, a run killed with SIGKILL once its first checkpoint is on
disk, a package installed with entry points, and a batch carrying the sampler's top-K (``recorded_batch``).

Imported by name (``from recipes import ...``; pytest puts tests/ on the path, as for trainer_helpers), or
named by file path as a plug-in (``rollout.engine=tests/recipes.py:counting_engine``).
"""

import importlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from oprl.messages import Experience
from oprl.rollout import EngineCapabilities, LeanEngine, TorchEngine
from oprl.rollout.lean_engine import lean_sample

EPISODES = [
    "warmstart.max_steps=60",
    "warmstart.batch_size=64",
    "warmstart.check_interval=30",
    "warmstart.val_problems=32",
    "warmstart.target_accuracy=0.99",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=10",
    "rollout.max_turns=3",
    "rollout.max_episode_tokens=48",
    "eval.num_problems=32",
    "eval.interval=2",
    "progress=false",
    "tensorboard=false",
    "runtime.torch_threads=1",
]
"""Multi-turn episodes on the tiny model (warm-started on the tool-arithmetic demonstrations): a task's
``task.*`` settings go next to these."""

CALLS: list[int] = []
"""One entry per ``generate`` call of every engine ``counting_engine`` built in this module's copy."""


def counting_engine(model, tokenizer, **settings):
    """An engine: any callable ``(model, tokenizer, sampling=, max_new_tokens=) -> Engine``; this one is a
    ``LeanEngine`` that counts its ``generate`` calls in ``CALLS``."""
    engine = LeanEngine(model, tokenizer, **settings)
    generate = engine.generate

    def counted(*args, **kwargs):
        CALLS.append(1)
        return generate(*args, **kwargs)

    engine.generate = counted
    return engine


class OwnLoop(TorchEngine):
    """A plug-in engine (``rollout.engine=tests/recipes.py:OwnLoop``): a ``TorchEngine`` over a decode loop of its
    own (here the lean engine's, ``lean_sample``, which asks a switch before every decode step). It declares no
    ``capabilities``, so oprl treats it as sampling each batch with one policy: ``sync.partial=true`` is refused."""

    def __init__(self, model, tokenizer, **settings):
        super().__init__(lean_sample, model, tokenizer, **settings)


class SwitchingLoop(OwnLoop):
    """The same engine declaring what its loop does: partial rollouts with either KV mode. Declaring is all it
    takes for ``sync.partial=true`` to run with it (docs/architecture.md, "How to add an engine")."""

    capabilities = EngineCapabilities(partial_kv=("keep", "recompute"))


def kill_9_after(args: list[str], checkpoint: Path, timeout: float = 240.0) -> None:
    """Start ``oprl train ARGS`` in its own process, SIGKILL it as soon as ``checkpoint`` exists, reap it."""
    command = [sys.executable, "-m", "oprl.cli", "train", *args]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    while not checkpoint.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert process.poll() is None, f"the run ended before it could be killed: {process.stderr.read()[-500:]}"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()


def install_package(site: Path, package: str, source: str, entry_points: str, monkeypatch) -> Path:
    """``package`` (its ``__init__`` is ``source``) in ``site``, with a dist-info declaring ``entry_points``
    (the text of an entry_points.txt), put first on sys.path as an installed distribution would be."""
    (site / package).mkdir(parents=True)
    (site / package / "__init__.py").write_text(source)
    info = site / f"{package}-0.1.dist-info"
    info.mkdir()
    name = package.replace("_", "-")
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)
    monkeypatch.syspath_prepend(str(site))
    # A package of this name installed by an earlier test stays in sys.modules and would be found first.
    monkeypatch.delitem(sys.modules, package, raising=False)
    importlib.invalidate_caches()
    return site


F32 = float(torch.tensor(-0.1234567, dtype=torch.float32))  # the sampler's log-probs are float32 values


def make_batch(batch, version, groups=2, k=2):
    """``groups * k`` experiences of batch ``batch`` sampled by ``version`` (the buffer's and the store's tests)."""
    return [
        Experience(
            prompt_ids=[5, 6, batch],
            response_ids=[7, 8, i],
            behavior_logprobs=[F32, -2.5, -0.0078125],
            reward=float(i % 2) + 0.1,
            reward_components={"correct": float(i % 2), "format": 0.1},
            group_id=(batch - 1) * groups + i // k,
            task_id=f"task/{batch}/{i // k}",
            policy_version=version,
            response_text=f"resp {i}",
            truncated=i == 0,
            extra={"explorer": 1},
        )
        for i in range(groups * k)
    ]


def recorded_batch(k: int = 5) -> list[Experience]:
    """Two groups of two rows of different lengths, each token with the top ``k`` of a random truncated
    distribution (-inf past its kept set), as an engine records them."""
    generator = torch.Generator().manual_seed(7)
    rows = []
    for i, length in enumerate((3, 1, 4, 2)):
        logits = torch.randn(length, 40, generator=generator)
        if i % 2:  # a truncating sampler kept 3 tokens: the rest of the top k is -inf
            logits[:, 3:] = float("-inf")
        values, ids = torch.log_softmax(logits, dim=-1).topk(k, dim=-1)
        rows.append(
            Experience(
                prompt_ids=[1, 2, 3],
                response_ids=ids[:, 0].tolist(),
                behavior_logprobs=values[:, 0].tolist(),
                reward=float(i % 2),
                reward_components={},
                group_id=i // 2,
                task_id=f"t{i // 2}",
                policy_version=0,
                response_text="",
                top_k_ids=ids.tolist(),
                top_k_logprobs=values.tolist(),
            )
        )
    return rows


def top_k_bits(rows: list[Experience]) -> list[tuple[bytes, bytes] | None]:
    """Each row's top-K as bytes (ids int64, log-probs float32; None where not recorded): equal bytes = a
    bit-for-bit round trip."""
    return [
        None
        if e.top_k_ids is None
        else (torch.tensor(e.top_k_ids).numpy().tobytes(), torch.tensor(e.top_k_logprobs).numpy().tobytes())
        for e in rows
    ]
