"""``/v1/completions`` with ``n > 1`` (issue 67, item 3): the prompt that continues a choice continues the
longest one it starts with, by text and by token ids, so a choice that is a prefix of another ("4" and "42") is
never trained in its place; the stored row is compared token by token with what the engine sampled."""

import pytest
from test_agent_endpoint import agent_task, run

from oprl.models.tiny import build_tokenizer
from oprl.rollout import Rollout, Sampling

REPLIES = ["4", "42"]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


class Choices:
    """The first call's k-th row replies ``REPLIES[k % 2]`` (no EOS: "4" is a prefix of "42" in tokens too),
    each token with log-prob -(k + 1)/10; later calls reply "ok" and EOS. Keeps the first call's rows."""

    sampling, max_new_tokens = Sampling(), 16

    def __init__(self, tokenizer):
        self.tokenizer, self.first = tokenizer, None

    def generate(self, prompt_ids, *, seed, sampling=None, batch_size=None, row_seeds=None):
        if self.first is None:
            texts = [REPLIES[k % 2] for k in range(len(prompt_ids))]
            ids = [self.tokenizer(t, add_special_tokens=False).input_ids for t in texts]
            logprobs = [[-(k + 1) / 10] * len(r) for k, r in enumerate(ids)]
            self.first = (ids, logprobs)
        else:
            texts = ["ok"] * len(prompt_ids)
            ids = [[*self.tokenizer("ok", add_special_tokens=False).input_ids, self.tokenizer.eos_token_id]] * len(
                prompt_ids
            )
            logprobs = [[-0.5] * len(r) for r in ids]
        return Rollout(ids, logprobs, texts, [False] * len(ids))


@pytest.mark.parametrize("form", ["text", "ids"])
def test_the_longest_choice_the_prompt_continues_is_the_one_trained(tokenizer, form):
    """9790d4b: by text, "4" was taken for the prompt that continued "42" (the row trained "4" and the "2" as
    context, and the reward earned after "42" was credited to "4"); by ids, only the first choice could be
    continued (a new segment: 0 tokens of the turn trained)."""
    prompt = "6*7="

    def agent(client, problem):
        start = prompt if form == "text" else tokenizer(prompt, add_special_tokens=False).input_ids
        first = client.completions.create(model="policy", prompt=start, n=2, max_tokens=4)
        assert [c.text for c in first.choices] == REPLIES
        if form == "text":
            follow = prompt + "42" + " ok?"
        else:
            follow = start + tokenizer("42 ok?", add_special_tokens=False).input_ids
        client.completions.create(model="policy", prompt=follow, max_tokens=4)
        return 1.0

    engine = Choices(tokenizer)
    task = agent_task(agent)
    [episode] = run(engine, tokenizer, task, task.problems("train")[:1])
    sampled, logprobs = engine.first[0][1], engine.first[1][1]  # choice 1: "42"
    assert episode.info["segments"] == 1 and episode.info["agent_failed"] == 0
    assert episode.response_ids[: len(sampled)] == sampled and episode.loss_mask[: len(sampled)] == [1] * 2
    assert episode.behavior_logprobs[: len(sampled)] == logprobs  # choice 1's, not choice 0's -0.1
    context = tokenizer(" ok?", add_special_tokens=False).input_ids
    after = episode.response_ids[len(sampled) : len(sampled) + len(context)]
    assert after == context and episode.loss_mask[len(sampled) : len(sampled) + len(context)] == [0] * len(context)
    assert episode.info["dropped_tokens"] == 1  # choice 0's one token
    assert episode.outcome.total == 1.0


def test_two_choices_of_one_text_and_other_tokens_are_a_400():
    """Which of two choices a text prompt continues cannot be told when their texts are equal and their tokens
    are not (a special token left out of the text): a 400 asking for token ids, never a guess."""
    from oprl.episodes.endpoint.sessions import Choice, RequestRefused, _longest

    one, other = (Choice(ids=ids, logprobs=[0.0] * len(ids), text="4", ended=True) for ids in ([28], [28, 3]))
    with pytest.raises(RequestRefused, match="send token ids"):
        _longest([one, other], lambda c: c.text)
    assert _longest([one, Choice(ids=[28], logprobs=[-1.0], text="4", ended=True)], lambda c: c.text) is one
