"""A model as the judge (``oprl.episodes.judge``) on a tiny model: the template's placeholders, the yes/no log-ratio
against a hand computation from the logits, an unparsable verdict scoring 0 and counted, and verdicts that do
not depend on the random state (greedy continuations, no sampling)."""

import pytest
import torch

from oprl.config import JudgeConfig, load_config
from oprl.episodes.judge import Judge, JudgedTask, parse_number, prompt_text, render
from oprl.errors import OprlError
from oprl.models.tiny import build_model, build_tokenizer
from oprl.tasks.arithmetic import ArithmeticTask
from oprl.tasks.base import Problem


@pytest.fixture(scope="module")
def tiny():
    tokenizer = build_tokenizer()
    return build_model(tokenizer, hidden_size=32, num_layers=2, num_heads=2, seed=0), tokenizer


def test_the_template_renders_its_three_placeholders():
    problem = Problem("t/0", ({"role": "system", "content": "be brief"}, {"role": "user", "content": "2+3="}), "5")
    text = render("Q {prompt} A {completion} R {reference} {{x}}", prompt_text(problem), "6", problem.answer)
    assert text == "Q 2+3= A 6 R 5 {x}"
    assert render("{reference}|{completion}", "p", "c", None) == "|c"


def test_an_unknown_placeholder_is_one_line_naming_the_key():
    with pytest.raises(OprlError) as error:
        load_config(overrides=["judge.path=tiny", "judge.template=Is {answer} right? {completion}"])
    message = str(error.value)
    assert "\n" not in message and "judge.template" in message and "{answer}" in message


def test_the_yes_no_score_is_the_log_ratio_of_the_next_token(tiny):
    model, tokenizer = tiny
    judge = Judge(model, tokenizer, JudgeConfig(path="tiny", yes_text="1", no_text="0", micro_batch_size=2))
    texts = ["2+3=5 ok?", "12+7=19 right or wrong, say:", "1="]  # different lengths: padding is exercised
    got = judge.verdicts(texts)
    for text, value in zip(texts, got, strict=True):
        ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False)])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, -1]  # the next token's logits, one unpadded row
        logp = logits.double() - torch.logsumexp(logits.double(), dim=0)
        yes, no = tokenizer.encode("1", add_special_tokens=False)[0], tokenizer.encode("0", add_special_tokens=False)[0]
        assert value == pytest.approx(float(logp[yes] - logp[no]), abs=1e-5)


def test_a_judge_that_parses_nothing_scores_zero_and_is_counted(tiny, caplog):
    model, tokenizer = tiny
    settings = JudgeConfig(path="tiny", parser="regex", pattern=r"NEVER(\d+)", max_new_tokens=3, weight=2.0)
    task = ArithmeticTask(train_size=8, test_size=4)
    problems = list(task.problems("train"))[:4]
    responses = [p.answer for p in problems[:2]] + ["x", "y"]
    rules = task.score(problems, responses)
    judged_task = JudgedTask(task, Judge(model, tokenizer, settings))
    judged = judged_task.score(problems, responses)
    assert judged_task.score(problems, responses) == judged  # a second batch: the same, and no second warning
    for rule, reward in zip(rules, judged, strict=True):
        assert reward.total == rule.total
        assert reward.components == {**rule.components, "judge": 0.0, "judge_unparsed": 1.0}
    warnings = [r.getMessage() for r in caplog.records if r.name == "oprl.tasks"]
    assert len(warnings) == 1 and "4 of 4 verdicts" in warnings[0] and "reward/judge_unparsed" in warnings[0]


def test_a_parsed_number_is_weighted_into_the_total(tiny):
    assert parse_number("score: 7.5/10", r"(-?\d+(?:\.\d+)?)") == 7.5
    assert parse_number("grade B", r"grade ([A-F])") is None  # a match that is no number: unparsed
    model, tokenizer = tiny
    judge = Judge(model, tokenizer, JudgeConfig(path="tiny", parser="number", weight=0.5, name="grade"))
    judge.verdicts = lambda texts: [4.0, None]  # the parser's output; the combination is what is checked here
    task = ArithmeticTask(train_size=8, test_size=4)
    problems = list(task.problems("train"))[:2]
    rules = task.score(problems, ["1", "2"])
    judged = JudgedTask(task, judge).score(problems, ["1", "2"])
    assert [r.total for r in judged] == [rules[0].total + 2.0, rules[1].total]
    assert [(r.components["grade"], r.components["grade_unparsed"]) for r in judged] == [(4.0, 0.0), (0.0, 1.0)]


def test_verdicts_do_not_depend_on_the_random_state(tiny):
    model, tokenizer = tiny
    texts = ["3+4=7 score:", "9-2=1 score:", "5+5=10 score:"]
    for parser in ("number", "yes-no"):
        judge = Judge(
            model, tokenizer, JudgeConfig(path="tiny", parser=parser, yes_text="1", no_text="0", max_new_tokens=4)
        )
        torch.manual_seed(1)
        first = judge.verdicts(texts)
        torch.manual_seed(2)
        torch.rand(100)
        assert judge.verdicts(texts) == first, parser


def test_a_multi_turn_task_is_refused_in_one_line(tiny):
    from oprl.tasks.tool_arithmetic import ToolArithmeticTask

    model, tokenizer = tiny
    with pytest.raises(OprlError, match=r"judge\.path: task 'tool-arithmetic' is multi-turn"):
        JudgedTask(ToolArithmeticTask(train_size=4, test_size=2), Judge(model, tokenizer, JudgeConfig(path="tiny")))


def test_a_judge_path_that_does_not_load_is_one_line_naming_judge_path():
    from oprl.episodes.judge import build_judge

    with pytest.raises(OprlError) as error:
        build_judge(load_config(overrides=["judge.path=/nonexistent/judge"]), "unused")
    assert str(error.value).startswith("judge.path: '/nonexistent/judge' not found") and "\n" not in str(error.value)


def test_a_text_longer_than_the_judges_context_is_judged_on_its_end(tiny):
    model, tokenizer = tiny
    context = model.config.max_position_embeddings
    long = "9" * (2 * context) + " ok?"
    for parser, room in (("yes-no", context), ("number", context - 4)):
        judge = Judge(
            model, tokenizer, JudgeConfig(path="tiny", parser=parser, yes_text="1", no_text="0", max_new_tokens=4)
        )
        assert judge.encode(long) == tokenizer.encode(long, add_special_tokens=False)[-room:]
        assert len(judge.verdicts([long, "1+1=2 ok?"])) == 2  # no position past the context
    short = Judge(model, tokenizer, JudgeConfig(path="tiny", yes_text="1", no_text="0"))
    assert short.verdicts([long[-context:]]) == pytest.approx(short.verdicts([long]), abs=1e-6)
