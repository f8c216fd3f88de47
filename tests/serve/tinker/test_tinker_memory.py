"""What bounds the server's memory: weight snapshots within ``--snapshot-gb`` (the newest two always) and
``forward_backward`` in micro-batches of ``--micro-batch-tokens`` padded tokens, which change neither the loss nor
the gradient (the losses are sums), except for a preset with a batch rule (M2PO, BAPO), which reads the whole call
and runs as one micro-batch. Through the SDK, on servers of the random tiny model."""

import gc
import weakref

import numpy as np
import pytest
from tinker_server import TINY, datum, serve

tinker = pytest.importorskip("tinker")
types = tinker.types


def test_snapshots_are_kept_within_their_memory_budget_and_the_newest_two_always(tmp_path):
    """A full fine-tuning snapshot is the whole model: with ``snapshot_gb=0`` only the newest two stay (an async
    recipe one step off-policy samples from both); an older sampler's call fails naming its session and the
    option, and the server goes on."""
    up = serve(tmp_path, snapshot_gb=0.0)
    service = tinker.ServiceClient(base_url=up.url, api_key="tml-test-key")
    try:
        client = service.create_lora_training_client(base_model=TINY, rank=0, seed=2).result()
        tokens = client.get_tokenizer().encode("1+2=3")
        prompt = types.ModelInput.from_ints(tokens[:3])
        samplers, made = [], []
        for _ in range(4):
            samplers.append(client.save_weights_and_get_sampling_client().result())
            (policy,) = up.server.backend.policies.values()
            made.append(weakref.ref(next(reversed(policy.snapshots.values()))))
            client.forward_backward([datum(tokens, weights=[1.0] * (len(tokens) - 1))], "cross_entropy")
            client.optim_step(types.AdamParams(learning_rate=0.01)).result()
        params = types.SamplingParams(max_tokens=2, seed=0, stop=[])
        for old in samplers[:2]:
            with pytest.raises(tinker.RequestFailedError, match=r"was dropped .*--snapshot-gb, at least 2"):
                old.sample(prompt, 1, params).result()
        for kept in samplers[2:]:
            assert len(kept.sample(prompt, 1, params).result().sequences[0].tokens) == 2
        (policy,) = up.server.backend.policies.values()
        assert len(policy.snapshots) == 2
        # The dropped snapshots' tensors are freed though their samplers stay open (the cookbook closes none).
        gc.collect()
        assert [ref() is None for ref in made] == [True, True, False, False]
    finally:
        service.close("success").result()
        up.stop()


def _step(root, loss_fn, config, **options):
    """One forward_backward + optim_step of 12 replies on a fresh full fine-tuning model: (loss, its outputs'
    log-probs, a sample's log-probs after the step). The behaviour log-probs are the model's own, except reply 1's,
    0.25 off: M2PO's second moment over the whole call (0.025) keeps every token, over reply 1
    alone it masks it, so a batch rule split into micro-batches would step differently."""
    up = serve(root, **options)
    service = tinker.ServiceClient(base_url=up.url, api_key="tml-test-key")
    try:
        client = service.create_lora_training_client(base_model=TINY, rank=0, seed=4).result()
        tokenizer = client.get_tokenizer()
        prompt = tokenizer.encode("3+4=")
        replies = ["7", "12", "7 ", "70", "1", "77", "8", "6", "17", "4", "71", "9"]
        sequences = [prompt + tokenizer.encode(reply) for reply in replies]
        own = client.forward([datum(t, weights=[1.0] * (len(t) - 1)) for t in sequences], "cross_entropy")
        own = own.result().loss_fn_outputs
        data = []
        for k, tokens in enumerate(sequences):
            n, pad = len(tokens) - 1, len(prompt) - 1
            behaviour = (own[k]["logprobs"].to_numpy() + (0.25 if k == 1 else 0.0)).tolist()
            advantage = 1.0 if k % 2 == 0 else -1.0
            data.append(datum(tokens, logprobs=behaviour, advantages=[0.0] * pad + [advantage] * (n - pad)))
        out = client.forward_backward(data, loss_fn, config).result()
        # eps well above the gradients: Adam's first step g/(|g| + eps) is then about linear in g, so float rounding
        # in a near-zero gradient cannot flip its sign into a full step of lr (what an eps of 1e-12 does)
        client.optim_step(types.AdamParams(learning_rate=0.01, eps=0.1)).result()
        sampler = client.save_weights_and_get_sampling_client().result()
        after = sampler.compute_logprobs(types.ModelInput.from_ints(prompt + tokenizer.encode("7"))).result()
        logprobs = [o["logprobs"].tolist() for o in out.loss_fn_outputs]
        return out.metrics["loss:sum"], logprobs, after[1:]
    finally:
        service.close("success").result()
        up.stop()


@pytest.mark.parametrize(
    ("loss_fn", "config"),
    [
        ("importance_sampling", {}),
        ("importance_sampling", {"preset": "grpo"}),
        ("importance_sampling", {"preset": "m2po"}),
    ],
)
def test_micro_batches_change_neither_the_loss_nor_the_step(tmp_path, loss_fn, config):
    whole = _step(tmp_path / "whole", loss_fn, config, micro_batch_tokens=10**6)
    small = _step(tmp_path / "small", loss_fn, config, micro_batch_tokens=8)  # about one row per micro-batch
    np.testing.assert_allclose(small[0], whole[0], rtol=1e-5, atol=1e-6)
    for a, b in zip(small[1], whole[1], strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    np.testing.assert_allclose(small[2], whole[2], rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("snapshot_gb", -1.0, "--snapshot-gb: must be >= 0"),
        ("micro_batch_tokens", 0, "--micro-batch-tokens: must be >= 1"),
    ],
)
def test_a_bad_memory_bound_is_one_line_naming_its_option(tmp_path, option, value, message):
    from oprl.errors import OprlError
    from oprl.serve.tinker import build_server

    with pytest.raises(OprlError, match=f"^{message}"):
        build_server(models=[], state_dir=tmp_path, **{option: value})
