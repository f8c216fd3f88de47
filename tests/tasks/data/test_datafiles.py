"""GSM8k and MATH problems from local files: formats, malformed rows (skipped, counted, reported), errors."""

import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("math_verify")

from oprl.config import load_config
from oprl.errors import OprlError
from oprl.tasks import GSM8kTask, MathTask, build_task
from oprl.tasks.data.files import find_split_file, read_rows

GOOD = [
    {"question": "Ann has 3 pens and buys 4 more. How many pens?", "answer": "3+4 = <<3+4=7>>7\n#### 7"},
    {"question": "What is 1,000 + 234?", "answer": "#### 1,234"},
    {"question": "Tom owes 5 and pays 8. What is his balance?", "answer": "#### -3", "extra": "ignored"},
]


def write_jsonl(path, lines):
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


def test_jsonl_with_malformed_rows_are_skipped_counted_and_reported(tmp_path, caplog):
    train = write_jsonl(
        tmp_path / "train.jsonl",
        [
            GOOD[0],
            "{not json",  # row 2
            {"question": "No marker", "answer": "7"},  # row 3
            "",  # blank line: ignored, not a row
            GOOD[1],  # row 5
            {"answer": "#### 2"},  # row 6: no question
            {"question": "", "answer": "#### 2"},  # row 7: empty question
            '["a", "list"]',  # row 8: not an object
            {"question": 5, "answer": "#### 2"},  # row 9: not a string
            {"question": "Words?", "answer": "#### seven"},  # row 10: not a number
            GOOD[2],  # row 11
        ],
    )
    test = write_jsonl(tmp_path / "test.jsonl", GOOD)
    with caplog.at_level(logging.WARNING, logger="oprl.tasks"):
        task = GSM8kTask(train_file=str(train), test_file=str(test))
    problems = task.problems("train")
    assert [p.answer for p in problems] == ["7", "1234", "-3"]
    assert [p.task_id for p in problems] == ["gsm8k/train/000001", "gsm8k/train/000005", "gsm8k/train/000011"]
    assert sorted(task.skipped["train"]) == [2, 3, 6, 7, 8, 9, 10]
    assert task.skipped["test"] == {}
    assert task.skipped["train"][2] == "not a JSON object"
    assert "'####'" in task.skipped["train"][3]
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.startswith(f"task.train_file: {train}: skipped 7 malformed row(s): ")
    assert "rows 3, 10: no number after '####'" in message
    system, user = problems[0].messages
    assert system["role"] == "system" and "<think>" in system["content"] and user["content"] == GOOD[0]["question"]


def test_parquet_json_and_directory_layouts(tmp_path):
    snapshot = tmp_path / "gsm8k" / "main"
    snapshot.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(GOOD * 2), snapshot / "train-00000-of-00001.parquet")
    (snapshot / "test-00000-of-00001.json").write_text(json.dumps(GOOD[:2]))
    task = build_task(load_config(None, ["task.name=gsm8k", f"task.path={tmp_path / 'gsm8k'}"]).task)
    assert len(task.problems("train")) == 6 and len(task.problems("test")) == 2
    capped = GSM8kTask(path=str(tmp_path / "gsm8k"), train_size=4, test_size=1)
    assert len(capped.problems("train")) == 4 and len(capped.problems("test")) == 1
    # An explicit file wins over the directory for its split.
    other = write_jsonl(tmp_path / "other.jsonl", GOOD[:1])
    assert len(GSM8kTask(path=str(tmp_path / "gsm8k"), test_file=str(other)).problems("test")) == 1


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: write_jsonl(d / "t.jsonl", [{"question": "q", "answer": "no marker"}]), "no usable rows"),
        (lambda d: write_jsonl(d / "t.jsonl", ["", "  "]), "no usable rows (it is empty)"),
        (lambda d: d / "missing.jsonl", "not found"),
        (lambda d: (d / "t.txt").write_text("a,b") and d / "t.txt", "unsupported extension"),
        (lambda d: (d / "t.json").write_text('{"a": 1}') and d / "t.json", "JSON list of objects"),
        (lambda d: (d / "t.parquet").write_text("not parquet") and d / "t.parquet", "cannot read"),
    ],
)
def test_bad_files_are_one_line_errors_naming_the_key(tmp_path, make, message):
    bad = make(tmp_path)
    good = write_jsonl(tmp_path / "good.jsonl", GOOD)
    with pytest.raises(OprlError, match=r"task\.train_file") as info:
        GSM8kTask(train_file=str(bad), test_file=str(good))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_source_files_needs_files_and_directories_must_be_unambiguous(tmp_path):
    with pytest.raises(OprlError, match=r"task\.source=files needs task\.train_file or task\.path"):
        GSM8kTask(source="files")
    write_jsonl(tmp_path / "train.jsonl", GOOD)
    write_jsonl(tmp_path / "train_extra.jsonl", GOOD)
    with pytest.raises(OprlError, match="found 2 train"):
        find_split_file(tmp_path, "train", key="task.path")
    with pytest.raises(OprlError, match=r"task\.path: found no test"):
        GSM8kTask(path=str(tmp_path), train_file=str(tmp_path / "train.jsonl"))


def test_hub_unreachable_is_a_one_line_error(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(OprlError, match=r"task.hub_id: cannot load 'openai/gsm8k' split 'train'.*task.train_file"):
        GSM8kTask()


def test_math_rows_boxed_references_and_single_line_answers(tmp_path, caplog):
    rows = [
        {"problem": "Compute $1/2+1/4$.", "solution": "We get $\\boxed{\\frac{3}{4}}$."},
        {"problem": "No answer here", "solution": "a long\nsolution without a box"},
        {"problem": "Nested", "solution": "First \\boxed{1}, finally \\boxed{\\sqrt{2}}"},
        {"problem": "Broken", "solution": "\\boxed{2"},
    ]
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    test = write_jsonl(tmp_path / "test.jsonl", [{"problem": "p", "answer": "\\frac{1}{2}"}])
    with caplog.at_level(logging.WARNING, logger="oprl.tasks"):
        task = MathTask(train_file=str(train), test_file=str(train), answer_field="solution")
    assert [p.answer for p in task.problems("train")] == ["\\frac{3}{4}", "\\sqrt{2}"]
    assert sorted(task.skipped["train"]) == [2, 4]
    assert "rows 2, 4: no \\boxed{} answer in 'solution'" in caplog.records[0].getMessage()
    assert str(train) in caplog.records[0].getMessage()
    (user,) = task.problems("train")[0].messages
    assert user["content"].endswith("within \\boxed{}.")
    with pytest.raises(
        OprlError, match=r"task\.test_file: .*test\.jsonl has no usable rows .*row 1: no 'solution' field"
    ):
        MathTask(train_file=str(train), test_file=str(test))  # test rows have no 'solution' field
    task = MathTask(train_file=str(test), test_file=str(test), answer_field="answer", system_prompt="Be brief.")
    assert task.problems("test")[0].answer == "\\frac{1}{2}"
    assert task.problems("test")[0].messages[0] == {"role": "system", "content": "Be brief."}
    rewards = task.score(task.problems("test") * 2, ["$\\boxed{0.5}$", "\\boxed{2}"])
    assert [r.total for r in rewards] == [1.0, 0.0]


def test_read_rows_numbers_rows_from_one(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", ["", json.dumps({"a": 1}), "[1]"])
    assert [(r.number, r.data) for r in read_rows(path, key="k")] == [(2, {"a": 1}), (3, None)]


def test_the_malformed_rows_warning_is_said_once_per_run(tmp_path, caplog):
    """A run builds its task in the driver, the explorer and the evaluator: one warning, not three, and a
    child process started afterwards (runtime.workers=processes) does not repeat it."""
    import subprocess
    import sys

    train = write_jsonl(tmp_path / "train.jsonl", [GOOD[0], "{not json", GOOD[1]])
    test = write_jsonl(tmp_path / "test.jsonl", GOOD)
    with caplog.at_level(logging.WARNING, logger="oprl.tasks"):
        for _ in range(3):
            GSM8kTask(train_file=str(train), test_file=str(test))
    assert [r.getMessage().count("skipped 1 malformed row") for r in caplog.records] == [1]
    build = f"from oprl.tasks import GSM8kTask; GSM8kTask(train_file={str(train)!r}, test_file={str(test)!r})"
    child = subprocess.run(
        [sys.executable, "-c", build],
        capture_output=True,
        text=True,
    )
    assert child.returncode == 0 and "malformed" not in child.stderr
