"""Training with rollout.top_k / rollout.top_p < 1: every engine samples from, and records the log-prob of, the
truncated distribution the trainer rebuilds, so on-policy rho = 1 with a float32 sampler; the config accepts it
for the built-in engines and refuses it, in one line, where the rule is unknown; evaluation keeps its own.

The vLLM case uses the model shape of tests/rollout/test_engines.py, so one vLLM engine serves both files."""

from pathlib import Path

import pytest
import torch

from oprl.config import load_config
from oprl.errors import OprlError
from oprl.models.chat import encode_prompt
from oprl.models.logprobs import grouped_response_logprobs
from oprl.models.truncation import Sampling, kept_tokens
from oprl.rollout import ENGINES, LeanEngine, engines_with

RECIPES = Path(__file__).parents[1] / "recipes.py"
SETTINGS = [(1.0, 0, 0.9), (1.0, 20, 1.0), (1.0, 20, 0.9), (0.7, 5, 0.8)]
"""(temperature, top_k, top_p): the issue's two settings, both at once, and a colder, tighter one."""


def _prompts(tokenizer):
    texts = ["1+2=", "35+47-9=", "7=", "123*4-56+7="] * 8
    return [encode_prompt(tokenizer, [{"role": "user", "content": t}]) for t in texts]


@pytest.mark.parametrize("engine", engines_with(lambda c: c.exact_truncation))  # what they declare, checked
def test_on_policy_rho_is_one_under_top_k_and_top_p(policy, engine):
    if engine == "vllm":
        pytest.importorskip("vllm")
    model, tokenizer = policy
    prompts = _prompts(tokenizer)
    for temperature, top_k, top_p in SETTINGS:
        score = Sampling(temperature, top_k, top_p)
        rollout = ENGINES[engine](model, tokenizer, sampling=score, max_new_tokens=12).generate(prompts, seed=11)
        behavior = torch.zeros(len(prompts), max(len(r) for r in rollout.response_ids))  # (B, T)
        for i, row in enumerate(rollout.behavior_logprobs):
            behavior[i, : len(row)] = torch.tensor(row)
        with torch.no_grad():
            logprobs, _, mask = grouped_response_logprobs(
                model, prompts, rollout.response_ids, tokenizer.pad_token_id, sampling=score
            )
            full, _, _ = grouped_response_logprobs(
                model, prompts, rollout.response_ids, tokenizer.pad_token_id, sampling=Sampling(temperature)
            )
        assert mask.sum() > 100
        rho = (logprobs - behavior)[mask].exp()
        assert (rho - 1).abs().max() < 1e-5, (engine, score)
        # The truncation bit (the full softmax would read it as a policy change), and every token is in it.
        assert (full - behavior)[mask].min() < -0.05, (engine, score)


def test_sampled_tokens_lie_in_the_kept_set():
    scores = torch.randn(4000, 50, generator=torch.Generator().manual_seed(0)) * 2
    from oprl.rollout.lean_engine import sample_token

    torch.manual_seed(0)
    tokens, logprob = sample_token(scores, Sampling(top_k=7, top_p=0.8))
    kept = kept_tokens(scores, 7, 0.8)
    assert kept[torch.arange(4000), tokens].all() and (kept.sum(-1) < 7).any()
    expected = scores.masked_fill(~kept, float("-inf")).log_softmax(-1)[torch.arange(4000), tokens]
    assert torch.allclose(logprob, expected, atol=1e-6)


def test_the_config_trains_with_top_k_and_top_p_on_built_in_engines():
    for engine in sorted(ENGINES):
        config = load_config(None, ["rollout.top_p=0.9", "rollout.top_k=20", f"rollout.engine={engine}"])
        assert (config.rollout.top_p, config.rollout.top_k) == (0.9, 20)
    assert load_config(None, []).rollout.top_k == 0


@pytest.mark.parametrize(
    "overrides, key", [(["rollout.top_k=20"], "rollout.top_k=20"), (["rollout.top_p=0.9"], "rollout.top_p=0.9")]
)
def test_an_engine_whose_rule_is_unknown_is_refused_naming_the_key(overrides, key):
    plug_in = f"rollout.engine={RECIPES}:OwnLoop"  # a plug-in declaring no exact_truncation: rule unknown
    with pytest.raises(OprlError, match=rf"^{key}: rollout.engine=.* cannot rebuild") as error:
        load_config(None, [*overrides, plug_in])
    assert "\n" not in str(error.value)
    load_config(None, [plug_in])  # no truncation: fine
    load_config(None, [*overrides, plug_in, "mode=eval"])  # nothing trained: fine
    with pytest.raises(OprlError, match=r"rollout\.top_k"):
        load_config(None, ["rollout.top_k=-1"])


def test_evaluation_samples_without_the_rollouts_top_k(policy):
    """evaluate() samples with ``Sampling.of(config.eval)``, whole: eval.temperature and eval.top_p decide and
    the rollouts' rollout.top_k stays out, as before top-k existed; the engine keeps its own."""
    from oprl.episodes.evaluation import evaluate
    from oprl.tasks import build_task
    from oprl.tasks.arithmetic import ArithmeticTaskConfig

    model, tokenizer = policy
    calls = []

    class Recording:
        def __init__(self, engine):
            self.engine = engine

        def generate(self, prompts, **kwargs):
            calls.append(kwargs)
            return self.engine.generate(prompts, **kwargs)

        def weights_changed(self):
            self.engine.weights_changed()

    config = load_config(None, ["rollout.top_k=3", "eval.top_p=0.95"])
    engine = Recording(LeanEngine(model, tokenizer, sampling=Sampling.of(config.rollout), max_new_tokens=4))
    task = build_task(ArithmeticTaskConfig(train_size=8, test_size=4))
    evaluate(engine, task, tokenizer, num_problems=4, sampling=Sampling.of(config.eval), seed=0)
    assert calls and all(c["sampling"] == Sampling(1.0, 0, 0.95) for c in calls)
    assert engine.engine.sampling == Sampling(1.0, 3, 1.0)
    greedy = Sampling(top_k=1)  # a call's sampling wins over the engine's
    first, second = (engine.engine.generate(_prompts(tokenizer)[:4], seed=s, sampling=greedy) for s in (0, 1))
    assert first.response_ids == second.response_ids
