"""task.name=dataset: rows from JSONL / parquet / CSV / ``datasets`` directories, user rewards in timed reward
processes, and one-line errors naming the setting for every user mistake."""

import json
import time
from pathlib import Path

import pytest

from oprl.cli import main
from oprl.errors import OprlError
from oprl.tasks import DatasetTask, build_task

ROOT = Path(__file__).resolve().parents[3]
TRAIN = ROOT / "examples" / "arithmetic_train.jsonl"
TEST = ROOT / "examples" / "arithmetic_test.jsonl"
EXAMPLE_REWARD = f"{ROOT / 'examples' / 'arithmetic_reward.py'}:reward"

REWARDS = '''
import time

def behaves(prompt, completion, reference, **row):
    """Hangs, raises or returns nonsense on request; else 1 for the reference and a dict when asked."""
    if completion == "hang":
        time.sleep(60)
    if completion == "crash":
        raise ValueError("boom")
    if completion == "text":
        return "one"
    if completion == "nan":
        return float("nan")
    if completion == "dict":
        return {"correct": 1.0, "style": 0.5}
    return float(completion == reference) + 0.0 * len(row)

def always_crashes(prompt, completion, reference, **row):
    raise RuntimeError("my reward is broken")

def always_hangs(prompt, completion, reference, **row):
    with open(__file__ + ".calls", "a") as calls:
        calls.write("call\\n")
    time.sleep(60)

def length(prompt, completion, reference, difficulty=None):
    return -0.01 * len(completion) * (1 if difficulty is None else int(difficulty))

def two_arguments(prompt, completion):
    return 1.0

def chat(prompt, completion, reference, **row):
    return float(isinstance(prompt, list) and prompt[-1]["content"].startswith("Q:"))
'''


def rows(n=12):
    return [json.loads(line) for line in TRAIN.read_text().splitlines()[:n]]


@pytest.fixture(scope="module")
def rewards_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("rewards") / "my_rewards.py"
    path.write_text(REWARDS)
    return path


def write_formats(directory: Path, records: list[dict]) -> dict[str, dict]:
    """The same records as JSONL, parquet, CSV, a ``save_to_disk`` directory and a directory of files."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    pq.write_table(pa.Table.from_pylist(records), directory / "rows.parquet")
    (directory / "rows.csv").write_text(
        "prompt,reference\n" + "".join(f"{r['prompt']},{r['reference']}\n" for r in records)
    )
    saved = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(records), "test": datasets.Dataset.from_list(records[:3])}
    )
    saved.save_to_disk(str(directory / "saved"))
    (directory / "files").mkdir(exist_ok=True)
    (directory / "files" / "train.jsonl").write_text((directory / "rows.jsonl").read_text())
    return {
        "jsonl": {"train_file": str(directory / "rows.jsonl")},
        "parquet": {"train_file": str(directory / "rows.parquet")},
        "csv": {"train_file": str(directory / "rows.csv")},
        "save_to_disk": {"hf_name": str(directory / "saved")},
        "datasets dir": {"hf_name": str(directory / "files")},
    }


def test_every_source_gives_the_same_problems(tmp_path, rewards_file):
    records = rows()
    sources = write_formats(tmp_path, records)
    expected = [({"role": "user", "content": r["prompt"]},) for r in records]
    for name, source in sources.items():
        task = DatasetTask(**source, reward=f"{rewards_file}:behaves")
        assert [p.messages for p in task.problems("train")] == expected, name
        assert [p.answer for p in task.problems("train")] == [r["reference"] for r in records], name
        test = task.problems("test")
        assert len(test) == (3 if name == "save_to_disk" else len(records)), name  # no test split: train's
        first = task.problems("train")[0]
        assert [r.total for r in task.score([first, first], [first.answer, "nope"])] == [1.0, 0.0], name


def test_chat_prompts_system_prompt_extra_columns_and_sizes(tmp_path, rewards_file):
    path = tmp_path / "chat.jsonl"
    chat = [
        {
            "messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": f"Q: {i}+1"}],
            "difficulty": i % 3 + 1,
        }
        for i in range(6)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in chat))
    task = DatasetTask(
        train_file=str(path),
        prompt_column="messages",
        reference_column=None,
        train_size=4,
        reward=[f"{rewards_file}:chat", f"{rewards_file}:length"],
        reward_weights=[1.0, 2.0],
    )
    problems = task.problems("train")
    assert len(problems) == 4 and problems[1].messages[1]["content"] == "Q: 1+1"
    scored = task.score(problems[:2], ["abc", "abcd"])
    # chat: 1; length: -0.01 * len * difficulty (row 1: difficulty 1, row 2: difficulty 2), weighted by 2
    assert scored[0].total == pytest.approx(1.0 - 2 * 0.03) and scored[1].total == pytest.approx(1.0 - 2 * 0.08)
    assert scored[0].components["chat"] == 1.0 and scored[0].components["length"] == pytest.approx(-0.03)
    plain = DatasetTask(train_file=str(TRAIN), train_size=2, system_prompt="Add.", reward=f"{rewards_file}:behaves")
    assert plain.problems("train")[0].messages[0] == {"role": "system", "content": "Add."}


def test_hang_crash_nonsense_and_dict_rewards_score_zero_are_counted_and_never_stall(rewards_file):
    task = DatasetTask(train_file=str(TRAIN), train_size=8, reward=f"{rewards_file}:behaves", reward_timeout=1.0)
    problems = list(task.problems("train")[:6])
    responses = [problems[0].answer, "hang", "crash", "text", "nan", "dict"]
    start = time.perf_counter()
    scored = task.score(problems, responses)
    assert time.perf_counter() - start < 20  # one timeout (1 s) plus worker restarts, not 60 s
    assert [r.total for r in scored] == [1.0, 0.0, 0.0, 0.0, 0.0, 1.5]
    assert [r.components["reward_timeout"] for r in scored] == [0, 1, 0, 0, 0, 0]
    assert [r.components["reward_error"] for r in scored] == [0, 0, 1, 1, 1, 0]
    assert scored[5].components["style"] == 0.5
    assert task.rewards.counts == {"calls": 6, "timeout": 1, "error": 3}
    assert task.score(problems[:1], [problems[0].answer])[0].total == 1.0  # the pool recovered


@pytest.mark.parametrize(
    "function, message",
    [
        ("always_crashes", "RuntimeError: my reward is broken"),
        ("always_hangs", "timed out after 0.5s"),
    ],
)
def test_a_reward_failing_on_every_row_stops_with_one_line(rewards_file, function, message):
    task = DatasetTask(train_file=str(TRAIN), train_size=4, reward=f"{rewards_file}:{function}", reward_timeout=0.5)
    problems = task.problems("train")
    with pytest.raises(OprlError, match=f"task.reward: .*{function} failed on all 4 rows .*{message}") as error:
        task.score(problems, ["1"] * len(problems))
    assert "\n" not in str(error.value) and "e.g. dataset/train/" in str(error.value)


def one_line_error(argv, capsys) -> str:
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def task_error(overrides) -> str:
    from oprl.config import load_config

    with pytest.raises(OprlError) as error:
        build_task(load_config(None, overrides).task)
    assert "\n" not in str(error.value)
    return str(error.value)


def test_user_mistakes_are_one_line_naming_the_setting(tmp_path, rewards_file, capsys):
    broken = tmp_path / "broken.py"
    broken.write_text("import not_a_module_anywhere\n")
    base = ["task.name=dataset", f"task.train_file={TRAIN}"]
    cases = {
        "task.prompt_column: no column 'question'": ["task.prompt_column=question", f"task.reward={EXAMPLE_REWARD}"],
        "task.reference_column: no column 'answer'": ["task.reference_column=answer", f"task.reward={EXAMPLE_REWARD}"],
        "task.reward: file 'nowhere/r.py' not found": ["task.reward=nowhere/r.py:fn"],
        "task.reward: cannot import": [f"task.reward={broken}:fn"],
        "ModuleNotFoundError": [f"task.reward={broken}:fn"],
        "task.reward: cannot import 'no_such_package.rewards'": ["task.reward=no_such_package.rewards:fn"],
        "has no function 'missing'": [f"task.reward={rewards_file}:missing"],
        "task.reward: ": ["task.reward=just_a_name"],
        "wrong signature two_arguments(prompt, completion)": [f"task.reward={rewards_file}:two_arguments"],
        "task.name=dataset needs a reward function": [],
        "task.reward_weights: 2 weights for 1": [f"task.reward={EXAMPLE_REWARD}", "task.reward_weights=[1,2]"],
    }
    for expected, extra in cases.items():
        assert expected in task_error(base + extra), expected
    assert "task.train_file" in task_error(["task.name=dataset", f"task.reward={EXAMPLE_REWARD}"])
    cli = [*base, "task.prompt_column=question", f"task.reward={EXAMPLE_REWARD}", f"output_dir={tmp_path}"]
    assert "task.prompt_column" in one_line_error(cli, capsys)  # and through the command line


def test_the_example_trains_a_few_steps(small_overrides, tmp_path):
    """examples/: the JSONL files and the reward file run end to end with the embedded tiny model."""
    overrides = [o for o in small_overrides if not o.startswith("task.")] + [
        "task.name=dataset",
        f"task.train_file={TRAIN}",
        f"task.test_file={TEST}",
        f"task.reward={EXAMPLE_REWARD}",
        "steps=2",
        "run_name=example",
    ]
    assert main(["train", *overrides]) == 0
    records = [json.loads(line) for line in (tmp_path / "runs" / "example" / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in records if "reward/correct" in r]
    assert len(trained) == 2 and all(r["reward/reward_error"] == 0 for r in trained)
    assert any("eval/accuracy" in r for r in records)
    assert build_task(DatasetTask.Config(train_file=str(TRAIN), reward=EXAMPLE_REWARD)).name == "dataset"


def test_the_warm_start_cache_follows_the_data_not_the_path(tmp_path, rewards_file):
    """The tiny model is warm-started on the references: editing the file in place must give a new cache key."""
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows(6)))
    first = DatasetTask(train_file=str(path), reward=f"{rewards_file}:behaves").data_fingerprint
    assert DatasetTask(train_file=str(path), reward=f"{rewards_file}:behaves").data_fingerprint == first
    path.write_text("".join(json.dumps(r) + "\n" for r in rows(7)))
    assert DatasetTask(train_file=str(path), reward=f"{rewards_file}:behaves").data_fingerprint != first
