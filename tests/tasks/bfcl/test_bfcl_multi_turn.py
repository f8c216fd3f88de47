"""BFCL multi-turn on oprl's simulated APIs: the simulators, ground-truth call parsing, the state and response
checks, the episode protocol (tool results, next user turn, end), and a whole episode through the runtime."""

import json

import pytest

from oprl.episodes.episode import run_episodes, teacher_forced
from oprl.models.tiny import build_tokenizer
from oprl.tasks.bfcl.apis import FileSystem, MathAPI, execute, functions_of
from oprl.tasks.bfcl.multi_turn import BfclMultiTurnTask, parse_call

pytest.importorskip("bfcl_eval", reason="pip install --no-deps bfcl-eval (make test does)")

TREE = {
    "root": {
        "work": {
            "type": "directory",
            "contents": {
                "a.txt": {"type": "file", "content": "b line\na line\nb again"},
                "docs": {"type": "directory", "contents": {}},
            },
        }
    }
}


@pytest.fixture(scope="module")
def task():
    return BfclMultiTurnTask()


def test_file_system_behaves_like_a_shell():
    fs = FileSystem(TREE)
    run = functions_of(fs)
    assert execute(run, "ls", {}) == {"current_directory_content": ["a.txt", "docs"]}
    assert execute(run, "sort", {"file_name": "a.txt"}) == {"sorted_content": "a line\nb again\nb line"}
    assert execute(run, "grep", {"file_name": "a.txt", "pattern": "b "}) == {"matching_lines": ["b line", "b again"]}
    assert execute(run, "wc", {"file_name": "a.txt", "mode": "w"}) == {"count": 6, "type": "words"}
    assert execute(run, "cp", {"source": "a.txt", "destination": "docs"})["result"] == "'a.txt' copied to 'docs/a.txt'"
    assert execute(run, "mv", {"source": "a.txt", "destination": "b.txt"})["result"] == "'a.txt' moved to 'b.txt'"
    assert execute(run, "rmdir", {"dir_name": "docs"})["error"].endswith("Directory not empty")
    assert execute(run, "cd", {"folder": "docs"}) == {"current_working_directory": "docs"}
    assert execute(run, "pwd", {}) == {"current_working_directory": "/work/docs"}
    assert execute(run, "cd", {"folder": ".."}) == {"current_working_directory": "work"}
    assert execute(run, "cd", {"folder": ".."})["error"]
    assert execute(run, "find", {"name": "a"}) == {"matches": ["./docs/a.txt"]}
    assert execute(run, "echo", {"content": "hi", "file_name": "new"}) == {}
    assert fs.state()["work"]["contents"]["new"] == {"type": "file", "content": "hi"}
    assert TREE["root"]["work"]["contents"]["a.txt"]["content"] == "b line\na line\nb again"  # config untouched


@pytest.mark.parametrize(
    "name,arguments,key",
    [
        ("divide", {"a": 1, "b": 0}, "error"),
        ("power", {"base": 10, "exponent": 10**6}, "error"),
        ("mean", {"numbers": []}, "error"),
        ("mean", {"numbers": [1, 2, 6]}, "result"),
        ("add", {"a": 1}, "error"),
        ("nope", {}, "error"),
        ("logarithm", {"value": 8, "base": 2, "precision": 3}, "result"),
        ("square_root", {"number": "x", "precision": 2}, "error"),
    ],
)
def test_math_api_results_and_errors(name, arguments, key):
    assert key in execute(functions_of(MathAPI()), name, arguments)


def test_ground_truth_calls_parse_with_positional_arguments(task):
    assert parse_call("sort('final_report.pdf')", task.docs) == ("sort", {"file_name": "final_report.pdf"})
    assert parse_call("mean(numbers=[3,16,60])", task.docs) == ("mean", {"numbers": [3, 16, 60]})
    with pytest.raises(ValueError):
        parse_call("__import__('os').system('x')", task.docs)


def test_problems_come_from_the_simulated_rows_and_every_demonstration_scores_one(task):
    problems = [*task.problems("train"), *task.problems("test")]
    assert (len(task.problems("train")), len(task.problems("test"))) == (20, 5)
    tokenizer = build_tokenizer()
    for p in problems:
        assert {t["function"]["name"] for t in p.tools} <= set(task.docs)
        assert teacher_forced(tokenizer, task, p, task.demonstration(p)).reward.total == 1.0, p.task_id


def math_problem(task):
    return next(
        p
        for p in [*task.problems("train"), *task.problems("test")]
        if any(t["function"]["name"] == "mean" for t in p.tools) and "mean(" in p.answer
    )


def test_state_and_response_checks(task):
    p = math_problem(task)
    demo = task.demonstration(p)
    env = task.environment(p)
    env.reset(p)
    assert "mean" in demo[-2] and demo[-1] == "Done."  # the last user turn asks for the mean
    observations = [env.step(reply).observation for reply in demo[:-2]]
    assert observations[0][0]["role"] == "tool" and "{" in observations[0][0]["content"]
    assert any(o and o[0]["role"] == "user" for o in observations)  # a reply without a call ends the user turn
    wrong_mean = demo[-2].replace('"numbers": [', '"numbers": [1, ')
    assert wrong_mean != demo[-2]
    env.step(wrong_mean)
    step = env.step("Done.")
    assert step.done and step.reward.total == 0.0 and step.reward.components["format"] == 1.0  # response check
    skipped = task.environment(p)
    skipped.reset(p)
    for reply in demo[2:]:  # the first user turn's calls never made: the file system differs (state check)
        skipped.step(reply)
    assert skipped.reward().total == 0.0


def test_malformed_calls_get_an_error_observation_and_cost_the_format(task):
    p = math_problem(task)
    env = task.environment(p)
    env.reset(p)
    step = env.step('<tool_call>{"name": "ls", "arguments": </tool_call>')
    assert not step.done and step.observation[0]["content"].startswith("error: malformed")
    assert json.loads(
        env.step('<tool_call>{"name": "ls", "arguments": {"a": true}}</tool_call>').observation[0]["content"]
    )


def test_a_whole_episode_through_the_runtime(task):
    tokenizer = build_tokenizer()
    p = math_problem(task)
    demo = task.demonstration(p)

    class Replay:  # plays the demonstration, one model turn per call
        def __init__(self):
            self.turn = 0

        def generate(self, prompt_ids, *, seed, sampling=None, batch_size=None):
            from oprl.rollout import Rollout

            reply = demo[self.turn]
            self.turn += 1
            ids = [*tokenizer(reply, add_special_tokens=False).input_ids, tokenizer.eos_token_id]
            return Rollout([ids], [[-0.1] * len(ids)], [reply], [False])

    [episode] = run_episodes(Replay(), tokenizer, task, [p], seed=0, max_turns=len(demo), max_tokens=100_000)
    assert episode.reward.total == 1.0 and not episode.truncated and episode.turns == len(demo)
    text = tokenizer.decode([t for t, m in zip(episode.response_ids, episode.loss_mask, strict=True) if not m])
    assert "<|tool|>" in text and "<|user|>" in text  # tool results and later user turns: environment tokens
