"""The Ray backend: trainer, buffer and two explorers as actors on a local 2-CPU Ray, with the same metrics
as the local backend in scheduled mode. Skipped when Ray is not installed (``pip install 'oprl[ray]'``)."""

import pytest

from oprl.cli import main
from oprl.metrics import deterministic_view, read_metrics

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray():
    # A 2-CPU instance shared by the module's runs; the backend leaves an instance it did not start running.
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_with_two_explorers_matches_local(local_ray, small_overrides, tmp_path):
    args = [
        *small_overrides,
        "steps=4",
        "sync.offset=1",
        "tensorboard=false",
        "runtime.torch_threads=1",
        "checkpoint.interval=2",
    ]
    assert main(["train", *args, "run_name=local"]) == 0
    assert main(["train", *args, "run_name=ray", "backend=ray", "runtime.explorers=2"]) == 0
    local = read_metrics(tmp_path / "runs" / "local" / "metrics.jsonl")
    distributed = read_metrics(tmp_path / "runs" / "ray" / "metrics.jsonl")
    assert deterministic_view(distributed) == deterministic_view(local)
    store = tmp_path / "runs" / "ray" / "experiences"
    assert len(list(store.glob("batch-*.parquet"))) == 4
    assert (tmp_path / "runs" / "ray" / "checkpoints" / "step-000004" / "state.json").is_file()
    assert (tmp_path / "runs" / "ray" / "final" / "config.json").is_file()


def test_top_k_crosses_a_ray_actor_bit_for_bit(local_ray):
    """``rollout.record_top_k``'s columns through the real buffer worker as a Ray actor (the object store); the
    threads and processes wire: tests/backends/test_top_k_wire.py."""
    from oprl.backends.ray_backend import RayBackend
    from oprl.buffer.buffer import ExperienceBuffer
    from recipes import recorded_batch, top_k_bits

    backend = RayBackend(address=None, num_cpus=2, workers=1)
    actor = backend.start("buffer", ExperienceBuffer, compute=False)
    sent = recorded_batch()
    assert backend.get(actor.call("put", 1, sent, True)) == 4
    taken, _ = backend.get(actor.call("take", 1))
    assert top_k_bits(taken) == top_k_bits(sent) and [vars(e) for e in taken] == [vars(e) for e in sent]
