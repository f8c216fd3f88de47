"""BFCL from the installed bfcl-eval wheel: subsets, the seeded split, tools in the prompt (chat template or
the documented system-prompt format), the reward on the real ground truth, one-line errors."""

import json
from pathlib import Path

import pytest

from oprl.cli import main
from oprl.config import load_config
from oprl.errors import OprlError
from oprl.models.chat import TOOLS_PROMPT, encode_problem, render
from oprl.models.tiny import build_tokenizer
from oprl.tasks import TASKS
from oprl.tasks.bfcl.single_turn import BFCL_SUBSETS, BfclTask, data_file, read_lines, tool_schema
from oprl.tasks.bfcl.toolcall import verdict
from oprl.trainer.warmstart import recipe, wants_warm_start

pytest.importorskip("bfcl_eval", reason="pip install --no-deps bfcl-eval (make test does)")


@pytest.fixture(scope="module")
def task():
    return BfclTask(subsets=["simple_python", "parallel"], verify_timeout=10.0)


def test_data_comes_from_the_wheel_and_splits_by_seed(task):
    rows = read_lines(data_file("BFCL_v4_simple_python.json"))
    assert len(rows) == 400 and rows[0]["id"] == "simple_python_0"
    train, test = task.problems("train"), task.problems("test")
    assert len(train) + len(test) == 600 and len(test) == 120
    assert not {p.task_id for p in train} & {p.task_id for p in test}
    again = BfclTask(subsets=["simple_python", "parallel"], train_size=50)
    assert [p.task_id for p in again.problems("test")] == [p.task_id for p in test]  # fixed by the seed alone
    assert [p.task_id for p in again.problems("train")] == [p.task_id for p in train[:50]]
    other = BfclTask(subsets=["simple_python", "parallel"], seed=5)
    assert [p.task_id for p in other.problems("test")] != [p.task_id for p in test]
    assert "bfcl" in TASKS and TASKS["bfcl"].Config is type(task.config)


def test_problem_carries_tools_and_ground_truth(task):
    p = next(p for p in task.problems("train") if p.task_id.startswith("bfcl/parallel_"))
    truth = json.loads(p.answer)
    assert len(truth) >= 2 and all(len(call) == 1 for call in truth)
    assert p.messages[0]["role"] == "system" and "<tool_call>" in p.messages[0]["content"]
    assert p.tools and p.tools[0]["type"] == "function"
    assert p.tools[0]["function"]["parameters"]["type"] == "object"  # BFCL's "dict" in JSON-schema terms
    assert tool_schema({"name": "f", "parameters": {"type": "dict", "properties": {"x": {"type": "float"}}}}) == {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "number"}}}},
    }


def test_tools_rendered_by_the_template_or_the_system_prompt(task):
    p = task.problems("train")[0]
    plain = build_tokenizer()  # its template has no tools section: the documented system-prompt format
    text = render(plain, p.messages, p.tools)
    listing = TOOLS_PROMPT.format(tools="\n".join(json.dumps(t) for t in p.tools))
    assert text.startswith("<|system|>" + p.messages[0]["content"] + "\n\n" + listing)
    assert encode_problem(plain, p) == plain(text, add_special_tokens=False).input_ids
    with_tools = build_tokenizer()
    with_tools.chat_template = (
        "{% if tools %}TOOLS{% for t in tools %}[{{ t['function']['name'] }}]{% endfor %}{% endif %}"
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    text = render(with_tools, p.messages, p.tools)
    assert text.startswith(f"TOOLS[{p.tools[0]['function']['name']}]<|system|>{p.messages[0]['content']}</s>")
    assert "<tools>" not in text


def test_reward_on_the_real_ground_truth(task):
    p = next(p for p in task.problems("train") if p.task_id.startswith("bfcl/parallel_"))
    calls = []
    for truth in json.loads(p.answer):
        ((name, spec),) = truth.items()
        arguments = {k: v[0] for k, v in spec.items() if v[0] != ""}
        calls.append(f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>")
    right = "<think>call them all</think>" + "".join(reversed(calls))
    wrong = "<think>only one</think>" + calls[0]
    rewards = task.score([p, p, p], [right, wrong, "".join(calls)])
    assert [r.total for r in rewards] == [1.0, 0.0, 0.0]
    assert [r.components["format"] for r in rewards] == [1.0, 1.0, 0.0]
    aware = BfclTask(subsets=["simple_python", "parallel"], verify_timeout=10.0, format_bonus=0.1)
    rewards = aware.score([p, p, p], [right, wrong, "".join(calls)])
    assert [r.total for r in rewards] == pytest.approx([1.1, 0.1, -0.1])  # task.format_bonus reaches the reward
    assert [r.components["correct"] for r in rewards] == [1.0, 0.0, 0.0]
    graded = BfclTask(subsets=["simple_python", "parallel"], verify_timeout=10.0, partial_credit=0.5)
    rewards = graded.score([p, p, p], [right, wrong, "".join(calls)])
    # task.partial_credit reaches the reward: the one right call of several earns 1 / |calls| of its credit
    n = len(calls)
    assert [r.total for r in rewards] == pytest.approx([1.0, 0.5 / n, 0.0])
    assert [r.components["correct"] for r in rewards] == [1.0, 0.0, 0.0]


@pytest.mark.parametrize("think", [True, False])
def test_demonstrations_are_correct_on_every_row(think):
    """The warm start's targets: the reference response of every row of every subset scores a match (two
    live_simple rows list no acceptable value for a required argument: None, no call matches them)."""
    everything = BfclTask(subsets=list(BFCL_SUBSETS), think=think)
    problems = [p for split in ("train", "test") for p in everything.problems(split)]
    demonstrations = {p.task_id: everything.demonstration(p) for p in problems}
    missing = sorted(task_id for task_id, d in demonstrations.items() if d is None)
    assert missing == ["bfcl/live_simple_106-63-0", "bfcl/live_simple_112-68-0"]
    for p in problems:
        if demonstrations[p.task_id] is not None:
            (text,) = demonstrations[p.task_id]
            assert verdict(p.answer, text, think=think) == "match", p.task_id
            assert text.startswith("<think>") is think


def test_the_smollm2_example_warm_starts_on_demonstrations():
    config = load_config(Path(__file__).parents[3] / "configs" / "examples" / "smollm2-bfcl.yaml")
    assert config.task.name == "bfcl" and config.model.path == "smollm2-135m-instruct"
    assert wants_warm_start(config.model, config.warmstart) and config.eval.seed is not None
    assert recipe(config.model, config.task, config.warmstart)["model"] == {
        "path": "smollm2-135m-instruct",
        "dtype": "float32",
    }
    # a format-aware RL reward does not change what the warm start learns: the same cached model
    example = Path(__file__).parents[3] / "configs" / "examples" / "smollm2-bfcl.yaml"
    for override in ("task.format_bonus=0.2", "task.partial_credit=0.5"):
        shaped = load_config(example, [override])
        assert recipe(shaped.model, shaped.task, shaped.warmstart) == recipe(
            config.model, config.task, config.warmstart
        )


def test_bad_subset_is_one_line_listing_the_valid_ones(capsys):
    assert main(["config", "task.name=bfcl", "task.subsets=[simple_python,simple_pyhton]"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'simple_pyhton'" in err and "live_parallel_multiple" in err
    with pytest.raises(OprlError, match=r"task\.subsets.*valid: simple_python"):
        BfclTask(subsets=["nope"])
