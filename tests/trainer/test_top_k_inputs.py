"""The trainer's side of ``rollout.record_top_k``: a step's inputs carry the rows' sampler top-K as (N, T, K) tensors
(``StepInputs.top_k``, built by ``oprl.trainer.inputs.top_k_of``), and nothing when the rows recorded none."""

import torch

from trainer_helpers import make_batch, make_trainer


def test_a_steps_inputs_carry_the_rows_top_k_and_nothing_without_them():
    trainer, tokenizer = make_trainer()
    batch = make_batch(tokenizer)
    assert trainer.inputs.compute(batch, step=1).top_k is None
    generator = torch.Generator().manual_seed(1)
    for e in batch:
        logp = torch.log_softmax(torch.randn(len(e.response_ids), 50, generator=generator), dim=-1)
        values, ids = logp.topk(4, dim=-1)
        e.top_k_ids, e.top_k_logprobs = ids.tolist(), values.tolist()
    top = trainer.inputs.compute(batch, step=1).top_k
    width = max(len(e.response_ids) for e in batch)
    assert top is not None and top.ids.shape == top.logprobs.shape == (len(batch), width, 4)
    for b, e in enumerate(batch):
        assert top.ids[b, : len(e.response_ids)].tolist() == e.top_k_ids
        assert torch.equal(top.logprobs[b, : len(e.response_ids)], torch.tensor(e.top_k_logprobs))


def test_a_step_with_top_k_trains_as_the_step_without():
    """No loss reads them yet: the same step, metrics and weights, with or without."""
    plain, tokenizer = make_trainer()
    recorded, _ = make_trainer()
    batch = make_batch(tokenizer)
    with_top_k = make_batch(tokenizer)
    for e in with_top_k:
        e.top_k_ids = [[7, 8]] * len(e.response_ids)
        e.top_k_logprobs = [[-0.5, -1.5]] * len(e.response_ids)
    a, b = plain.step(batch), recorded.step(with_top_k)
    assert {k: v for k, v in a.items() if not k.startswith("perf/")} == {
        k: v for k, v in b.items() if not k.startswith("perf/")
    }
    assert all(torch.equal(p, q) for p, q in zip(plain.model.parameters(), recorded.model.parameters(), strict=True))
