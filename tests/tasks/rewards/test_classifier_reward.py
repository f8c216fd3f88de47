"""``task.reward=model:PATH`` (#71 item 8): a sequence-classification model's score as the reward, on a tiny
randomly initialised Llama classifier saved to a temporary directory (no hub)."""

import json
from pathlib import Path

import pytest
import torch

from oprl.errors import OprlError
from oprl.models.tiny import build_tokenizer
from oprl.tasks.data.dataset import DatasetTask
from oprl.tasks.rewards import classifier
from oprl.tasks.rewards.classifier import ClassifierReward
from oprl.tasks.rewards.user import UserRewards, canonical_spec

ROOT = Path(__file__).resolve().parents[3]


def save_classifier(path: Path, num_labels: int = 1, causal: bool = False) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

    tokenizer = build_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, num_labels=num_labels,
                         pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config) if causal else LlamaForSequenceClassification(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


ROWS = [{"prompt": [{"role": "user", "content": f"{i}+{i}="}], "completion": str(2 * i) * (1 + i % 3),
         "reference": str(2 * i), "row": {}} for i in range(classifier.BATCH + 4)]  # fmt: skip


@pytest.fixture(scope="module")
def reward_model(tmp_path_factory) -> Path:
    return save_classifier(tmp_path_factory.mktemp("rm") / "rm")


def one_by_one(path: Path, texts: list[str]) -> list[float]:
    """The reference: each text alone, no padding, the model's own forward."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForSequenceClassification.from_pretrained(path)
    with torch.no_grad():
        return [float(model(**tokenizer(text, return_tensors="pt")).logits[0, 0]) for text in texts]


def test_the_reward_is_the_models_logit_batched_as_one_by_one(reward_model):
    """Rows of different lengths padded into batches of ``BATCH`` (two batches here) score as each alone."""
    scorer = ClassifierReward(f"model:{reward_model}")
    scores = scorer.score(ROWS)
    texts = [scorer.text(row["prompt"], row["completion"]) for row in ROWS]
    assert texts[1] == "<|user|>1+1=</s><|assistant|>22</s>"  # the chat template: the completion as the reply
    assert scores == pytest.approx(one_by_one(reward_model, texts), abs=1e-5)
    assert len(set(scores)) > 1  # a random model still tells the rows apart


def test_a_classifier_with_labels_scores_its_last_labels_probability(tmp_path):
    scores = ClassifierReward(f"model:{save_classifier(tmp_path / 'clf', num_labels=2)}").score(ROWS[:3])
    assert all(0.0 < s < 1.0 for s in scores)


def test_task_reward_names_a_classifier_beside_a_function(reward_model, tmp_path):
    """Through the dataset task as ``task.reward`` parses it: the classifier scores in this process (its component
    ``reward_model``), the function in the reward processes, weighted and summed."""
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "reference": str(2 * i)}) + "\n" for i in range(3)))
    function = f"{ROOT / 'examples' / 'arithmetic_reward.py'}:reward"
    task = DatasetTask(train_file=str(data), reward=[f"model:{reward_model}", function], reward_weights=[0.5, 1.0])
    try:
        problems = list(task.problems("train"))
        rewards = task.score(problems, ["0", "2", "x"])
        alone = ClassifierReward(f"model:{reward_model}").score(
            [{"prompt": p, "completion": c} for p, c in zip(("0+0=", "1+1=", "2+2="), ("0", "2", "x"), strict=True)]
        )
        assert [r.components["reward_model"] for r in rewards] == pytest.approx(alone, abs=1e-6)
        assert [r.components["correct"] for r in rewards] == [1.0, 1.0, 0.0]
        assert [r.total for r in rewards] == pytest.approx(
            [0.5 * a + r.components["correct"] + r.components["format"] for a, r in zip(alone, rewards, strict=True)]
        )
        with task.rewards.probe():  # the pre-run check loads no model (it runs in the driver)
            assert [r.components["reward_model"] for r in task.score(problems[:1], ["0"])] == [0.0]
    finally:
        task.rewards.close()


def test_a_classifier_alone_starts_no_reward_process(reward_model):
    rewards = UserRewards([f"model:{reward_model}"], None, timeout=1.0, processes=1)
    assert rewards.pool is None
    (reward,) = rewards.score(ROWS[:1])
    assert reward.total == reward.components["reward_model"] and reward.components["reward_error"] == 0.0
    rewards.close()
    assert canonical_spec(f"model:{reward_model}") == f"model:{reward_model.resolve()}"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("model:", "names no model; use model:PATH"),
        ("model:{tmp}/nothing", "nothing' is no directory"),
        ("model:{tmp}", "no model config at"),
        ("model:{causal}", "is a LlamaForCausalLM, not a sequence-classification model"),
    ],
)
def test_a_bad_path_is_one_line(tmp_path, spec, message):
    causal = save_classifier(tmp_path / "lm", causal=True)
    with pytest.raises(OprlError, match=message) as raised:
        UserRewards([spec.format(tmp=tmp_path, causal=causal)], None, timeout=1.0, processes=1)
    assert "\n" not in str(raised.value) and str(raised.value).startswith("task.reward: ")
