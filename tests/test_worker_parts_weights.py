"""Weight snapshots travel as one flat buffer per dtype (pickle, shared memory, safetensors all see the same)."""

import pickle

import torch

from oprl.checkpoint.files import load_weights, save_weights
from oprl.models.tiny import build_model, build_tokenizer
from oprl.worker_parts import FlatWeights, trainable_weights


def _snapshot():
    model = build_model(build_tokenizer(), hidden_size=32, num_layers=1, num_heads=2, seed=0)
    return model, trainable_weights(model, to_cpu=True)


def test_snapshot_is_a_copy_laid_out_in_one_buffer_per_dtype():
    model, weights = _snapshot()
    params = dict(model.named_parameters())
    assert weights.keys() == params.keys() and len(weights) > 5
    storages = {t.untyped_storage().data_ptr() for t in weights.values()}
    assert len(storages) == 1
    for name, tensor in weights.items():
        assert torch.equal(tensor, params[name]) and tensor.data_ptr() != params[name].data_ptr()
    with torch.no_grad():
        next(model.parameters()).add_(1.0)  # training moves on; the snapshot does not
    assert not torch.equal(next(model.parameters()), weights[next(iter(weights))])


def test_pickling_keeps_values_and_the_single_buffer_and_loads_into_a_model(tmp_path):
    _model, weights = _snapshot()
    mixed = FlatWeights.copy_of({**weights, "extra": torch.arange(3, dtype=torch.int64)})
    restored = pickle.loads(pickle.dumps(mixed))
    assert isinstance(restored, FlatWeights) and restored.keys() == mixed.keys()
    assert all(torch.equal(restored[k], mixed[k]) and restored[k].dtype == mixed[k].dtype for k in mixed)
    assert len({t.untyped_storage().data_ptr() for t in restored.values()}) == 2  # float32 + int64
    fresh = build_model(build_tokenizer(), hidden_size=32, num_layers=1, num_heads=2, seed=1)
    fresh.load_state_dict(pickle.loads(pickle.dumps(weights)), strict=False)
    assert all(torch.equal(p, weights[n]) for n, p in fresh.named_parameters())
    save_weights(weights, tmp_path / "w.safetensors")
    assert all(torch.equal(v, weights[k]) for k, v in load_weights(tmp_path / "w.safetensors").items())


def test_snapshot_crosses_a_worker_process_pipe_intact():
    from oprl.backends.processes import ProcessActor

    _, weights = _snapshot()
    # The worker is a plain dict in its own process: setdefault stores the snapshot there and sends it back.
    actor = ProcessActor("echo", dict, (), threads=1)
    try:
        back = actor.call("setdefault", "weights", weights).result(timeout=120)
    finally:
        actor.stop()
        actor.join()
    assert isinstance(back, FlatWeights) and all(torch.equal(back[k], weights[k]) for k in weights)
    assert len({t.untyped_storage().data_ptr() for t in back.values()}) == 1
