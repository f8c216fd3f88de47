"""The explorer's single-turn path: rollouts become experiences with the task's rewards, or the configured
``rollout.truncated_reward`` for replies cut at the length limit."""

import pytest

from oprl.explorer.explorer import Explorer
from oprl.models.tiny import build_tokenizer
from oprl.rollout import Rollout
from oprl.tasks.arithmetic import ArithmeticTask


class AnswerEngine:
    """Replies with each problem's right answer; every other row is cut at the length limit (no EOS)."""

    def __init__(self, tokenizer, answers):
        self.tokenizer, self.answers = tokenizer, answers

    def generate(self, prompt_ids, *, seed, sampling=None, batch_size=None):
        texts = [self.answers[self.tokenizer.decode(p)] for p in prompt_ids]
        truncated = [i % 2 == 1 for i in range(len(prompt_ids))]
        ids = [self.tokenizer(t, add_special_tokens=False).input_ids for t in texts]
        ids = [i if cut else [*i, self.tokenizer.eos_token_id] for i, cut in zip(ids, truncated, strict=True)]
        return Rollout(ids, [[-0.5] * len(i) for i in ids], texts, truncated)


@pytest.mark.parametrize("truncated_reward", [None, -0.25])
def test_truncated_reward_replaces_the_score_of_cut_replies_only(truncated_reward):
    tokenizer, task = build_tokenizer(), ArithmeticTask(train_size=20, test_size=4, seed=3)
    explorer = Explorer(
        task, tokenizer, None, prompts_per_step=3, group_size=2, seed=0, truncated_reward=truncated_reward
    )
    rows = explorer.problems_for_step(1)
    explorer.engine = AnswerEngine(tokenizer, {tokenizer.decode(explorer._encode(p)): p.answer for p in rows})
    experiences, _ = explorer.explore(step=1, version=0)
    assert [e.truncated for e in experiences] == [False, True] * 3
    scored = task.score([p for p in rows for _ in range(2)], [e.response_text for e in experiences])
    assert all(s.total > 0 for s in scored)  # every reply is the right answer
    for e, s in zip(experiences, scored, strict=True):
        expected = truncated_reward if e.truncated and truncated_reward is not None else s.total
        assert e.reward == expected
        assert e.reward_components == s.components  # the task's verdict stays logged
