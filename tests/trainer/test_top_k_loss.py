"""The sampler's top-K read by a loss (``Algorithm.needs.top_k``: score centering, DPPO's Top-K divergence): the
policy forward returns the log-probs of extra ids from the same log-softmax as the sampled token's
(``oprl.models.logprobs``, ``extra_ids``), the trainer asks for them only when the method reads them, a run that
records none is refused at load in one line, and every preset trains two steps of ``oprl train``."""

import pytest
import torch

from oprl.algorithms import PRESETS
from oprl.algorithms.method import Method
from oprl.cli import main
from oprl.config import OptimConfig
from oprl.errors import OprlError
from oprl.metrics import read_metrics
from oprl.models.logprobs import grouped_response_logprobs, packed_response_logprobs, response_features
from oprl.models.tiny import build_model, build_tokenizer
from oprl.models.truncation import Sampling
from oprl.trainer.trainer import Trainer
from trainer_helpers import make_batch

TOP_K_PRESETS = ["reinforce-sc", "rec-oneside-nois-sc", "tis-token-sc", "dppo-tv-topk", "dppo-kl-topk"]


def _rows(tokenizer):
    batch = make_batch(tokenizer, groups=2, k=3)
    return [e.prompt_ids for e in batch], [e.response_ids for e in batch], batch


@pytest.mark.parametrize("forward", [grouped_response_logprobs, packed_response_logprobs])
@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.7, top_k=5)])
def test_the_forward_gathers_extra_ids_from_the_same_log_softmax(forward, sampling):
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0)
    prompts, responses, _ = _rows(tokenizer)
    pad = tokenizer.pad_token_id
    plain = forward(model, prompts, responses, pad, sampling=sampling, with_entropy=True)
    width, vocab = plain[0].shape[1], model.get_output_embeddings().out_features
    ids = torch.randint(0, vocab, (len(responses), width, 4), generator=torch.Generator().manual_seed(0))
    logprobs, entropy, mask, extra = forward(model, prompts, responses, pad, sampling=sampling, with_entropy=True,
                                             extra_ids=ids)  # fmt: skip
    assert len(plain) == 3 and torch.equal(logprobs, plain[0]) and torch.equal(entropy, plain[1])  # unchanged
    from oprl.models.logprobs import pack

    input_ids, attention, targets, _ = pack(prompts, responses, pad)
    features, head = response_features(model, input_ids, attention, width)
    scaled = head(features).float() / sampling.temperature  # (B, T, V)
    if sampling.truncates:  # the kept set rebuilt from these logits, plus the sampled token
        dropped = ~sampling.kept(scaled).scatter(-1, targets[..., None], True)
        scaled = scaled.masked_fill(dropped, float("-inf"))
    expected = torch.log_softmax(scaled, dim=-1).gather(-1, ids)  # (B, T, K)
    assert torch.allclose(extra[mask], expected[mask], atol=1e-5)
    assert torch.all(extra[~mask] == 0)
    if sampling.truncates:
        assert bool(torch.isinf(extra[mask]).any())  # ids outside the kept set score −inf
    extra[mask].clamp(min=-30).sum().backward()  # differentiable: the score-centering term's gradient path
    assert model.get_output_embeddings().weight.grad is not None


def _trainer(preset):
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0)
    method = Method.of(PRESETS[preset], max_response_tokens=8)
    trainer = Trainer(model, pad_id=tokenizer.pad_token_id, method=method, optim=OptimConfig(micro_batch_size=4),
                      sampling=Sampling(), seed=0)  # fmt: skip
    return trainer, tokenizer


def _with_top_k(batch, k=4, vocab=50):
    generator = torch.Generator().manual_seed(1)
    for e in batch:
        logp = torch.log_softmax(torch.randn(len(e.response_ids), vocab, generator=generator), dim=-1)
        values, ids = logp.topk(k, dim=-1)
        e.top_k_ids, e.top_k_logprobs = ids.tolist(), values.tolist()
    return batch


@pytest.mark.parametrize("preset", TOP_K_PRESETS)
def test_a_step_of_each_preset_reads_the_top_k_and_refuses_rows_without(preset):
    trainer, tokenizer = _trainer(preset)
    assert trainer.method.needs.top_k
    with pytest.raises(OprlError, match="record_top_k > 0"):
        trainer.step(make_batch(tokenizer))
    metrics = trainer.step(_with_top_k(make_batch(tokenizer)))
    key = "loss/score_centering" if preset.endswith("-sc") else "loss/dppo_divergence_mean"
    assert key in metrics and metrics["loss/total"] == metrics["loss/total"]


def test_centering_changes_the_step_and_only_with_a_mean_advantage_off_policy():
    """reinforce-sc vs reinforce on the same rows: the loss differs by the aggregated centering term exactly."""
    plain, tokenizer = _trainer("reinforce")
    centred, _ = _trainer("reinforce-sc")
    a = plain.step(_with_top_k(make_batch(tokenizer)))
    b = centred.step(_with_top_k(make_batch(tokenizer)))
    assert b["loss/score_centering"] != 0
    assert b["loss/total"] == pytest.approx(a["loss/total"] + b["loss/score_centering"], abs=1e-6)
    assert not all(torch.equal(p, q) for p, q in zip(plain.model.parameters(), centred.model.parameters(), strict=True))


@pytest.mark.parametrize(
    ("setting", "culprit"),
    [("algorithm.preset=reinforce-sc", "algorithm.score_centering=true"),
     ("algorithm.preset=dppo-kl-topk", "algorithm.clip_mode=dppo-kl-topk"),
     ("algorithm.preset=tis-token-sc", "algorithm.score_centering=true")],
)  # fmt: skip
def test_a_method_reading_the_top_k_is_refused_without_record_top_k(setting, culprit, tmp_path, capsys):
    assert main(["config", setting, f"output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"error: {culprit} reads the sampler's top-K per token but rollout.record_top_k=0: set it > 0, e.g. 4"
    ]
    assert main(["config", setting, "rollout.record_top_k=4", f"output_dir={tmp_path}"]) == 0
    capsys.readouterr()


def test_score_centering_on_a_weight_without_its_form_is_refused(tmp_path, capsys):
    settings = ["algorithm.score_centering=true", "rollout.record_top_k=4", f"output_dir={tmp_path}"]  # grpo: IS
    assert main(["config", *settings]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: config: algorithm.score_centering: score_centering has a form for weight=none or truncated-is "
        "(NoIS, TIS), not weight=importance-sampling"
    ]


@pytest.mark.parametrize(
    "preset", [pytest.param(p, marks=[] if p in ("reinforce-sc", "dppo-tv-topk") else [pytest.mark.slow])
               for p in TOP_K_PRESETS],
)  # fmt: skip
def test_oprl_train_two_steps_of_each_preset(preset, small_overrides, tmp_path):
    args = [*small_overrides, "steps=2", "eval.interval=0", "checkpoint.interval=0", "tensorboard=false",
            "rollout.record_top_k=4", f"algorithm.preset={preset}", "run_name=r"]  # fmt: skip
    assert main(["train", *args]) == 0
    rows = read_metrics(tmp_path / "runs" / "r" / "metrics.jsonl")
    key = "loss/score_centering" if preset.endswith("-sc") else "loss/dppo_divergence_mean"
    steps = [row for row in rows if key in row]
    assert len(steps) == 2 and all(row[key] == row[key] for row in steps)
