"""The teacher on the embedded model: a teacher equal to the sampler returns the behaviour log-probs, lean and
hf prefill agree, groups stay whole, ``teacher.path`` resolves every kind of source, a tokenizer mismatch is
one line, and schema 4 stores teacher log-probs while schema-3 files still load."""

import pyarrow.parquet as pq
import pytest
import torch

from oprl.checkpoint.store import read_parquet, write_parquet
from oprl.errors import OprlError
from oprl.messages import Experience
from oprl.models.tiny import build_model, build_tokenizer
from oprl.rollout import ENGINES, Sampling
from oprl.teacher import Teacher, group_chunks
from oprl.teacher.loading import check_same_tokens
from oprl.worker_parts import frozen_source


@pytest.fixture(scope="module")
def sampled():
    """A tiny model and 3 prompts x 4 responses sampled from it by the lean engine at temperature 0.7."""
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=32, num_layers=2, num_heads=2, seed=0)
    engine = ENGINES["lean"](model, tokenizer, sampling=Sampling(0.7), max_new_tokens=6)
    prompts = [tokenizer(f"<|user|>{a}+{a}=</s><|assistant|>", add_special_tokens=False).input_ids for a in range(3)]
    rows = [p for p in prompts for _ in range(4)]
    rollout = engine.generate(rows, seed=0)
    return model, tokenizer, rows, rollout


def test_a_teacher_equal_to_the_sampler_returns_the_behaviour_logprobs(sampled):
    model, tokenizer, prompts, rollout = sampled
    for engine in ("lean", "hf"):
        teacher = Teacher(model, tokenizer.pad_token_id, sampling=Sampling(0.7), engine=engine, micro_batch_size=5)
        values = teacher.logprobs(prompts, rollout.response_ids)
        assert [len(v) for v in values] == [len(r) for r in rollout.response_ids]
        for got, expected in zip(values, rollout.behavior_logprobs, strict=True):
            assert got == pytest.approx(expected, abs=1e-4), engine


def test_score_copies_rows_and_fills_teacher_logprobs(sampled):
    model, tokenizer, prompts, rollout = sampled
    rows = [
        Experience(p, r, b, 0.0, {}, i // 4, "t", 0, "")
        for i, (p, r, b) in enumerate(zip(prompts, rollout.response_ids, rollout.behavior_logprobs, strict=True))
    ]
    teacher = Teacher(model, tokenizer.pad_token_id, sampling=Sampling(0.7))
    scored = teacher.score(rows)
    assert all(e.teacher_logprobs is None for e in rows)
    assert [len(e.teacher_logprobs) for e in scored] == [len(e.response_ids) for e in rows]


def test_group_chunks_keep_groups_whole():
    prompts = [[1]] * 3 + [[2]] * 3 + [[3]] * 2
    assert group_chunks(prompts, 6) == [[0, 1, 2, 3, 4, 5], [6, 7]]
    assert group_chunks(prompts, 4) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert group_chunks(prompts, 2) == [[0, 1], [2], [3, 4], [5], [6, 7]]  # a group larger than the size splits


def test_frozen_source_resolves_runs_checkpoints_and_models(tmp_path):
    student = str(tmp_path / "student")
    run = tmp_path / "run"
    (run / "checkpoints" / "step-000002").mkdir(parents=True)
    (run / "checkpoints" / "step-000002" / "state.json").write_text("{}")
    assert frozen_source("tiny", student) == (student, None)
    assert frozen_source(str(run), student) == (student, run / "checkpoints" / "step-000002")
    assert frozen_source(str(run / "checkpoints" / "step-000002"), student)[1] == run / "checkpoints" / "step-000002"
    (run / "final").mkdir()
    (run / "final" / "config.json").write_text("{}")
    assert frozen_source(str(run), student) == (str(run / "final"), None)
    assert frozen_source("Org/model", student) == ("Org/model", None)
    with pytest.raises(OprlError, match="neither a model directory nor a run directory"):
        frozen_source(str(tmp_path), student)


def test_a_tokenizer_mismatch_is_one_line_naming_both_vocabularies():
    student = build_tokenizer()
    check_same_tokens(build_tokenizer(), student, "teacher-dir", "tiny")  # same tokens: nothing to say
    teacher = build_tokenizer()
    teacher.add_tokens(["<tool>"])
    with pytest.raises(OprlError) as error:
        check_same_tokens(teacher, student, "teacher-dir", "tiny")
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("teacher.path: teacher-dir's vocabulary (104 tokens) is not model.path tiny's (103")
    assert "'<tool>': id 103 vs None" in message


def test_schema_4_stores_teacher_logprobs_and_schema_3_files_load(tmp_path):
    rows = [
        Experience([1, 2], [3, 4], [-0.5, -0.25], 1.0, {}, 0, "t", 0, "x", teacher_logprobs=[-0.75, -0.125]),
        Experience([1, 2], [5], [-1.0], 0.0, {}, 0, "t", 0, "y"),
    ]
    path = tmp_path / "batch-000001.parquet"
    write_parquet(path, rows, 1)
    assert pq.read_schema(path).metadata[b"oprl_schema"] == b"4"  # no top-K recorded: version 4's file
    assert [vars(e) for e in read_parquet(path)] == [vars(e) for e in rows]
    table = pq.read_table(path)
    version_3 = table.drop_columns(["teacher_logprobs"]).replace_schema_metadata({"oprl_schema": "3"})
    pq.write_table(version_3, tmp_path / "batch-000002.parquet")
    old = read_parquet(tmp_path / "batch-000002.parquet")
    assert [e.teacher_logprobs for e in old] == [None, None]
    assert [e.behavior_logprobs for e in old] == [e.behavior_logprobs for e in rows]


def test_teacher_logprobs_are_float32_in_the_store(tmp_path):
    value = float(torch.tensor(-1.2345678, dtype=torch.float32))
    path = tmp_path / "batch-000003.parquet"
    write_parquet(path, [Experience([1], [2], [-1.0], 0.0, {}, 0, "t", 0, "", teacher_logprobs=[value])], 3)
    assert read_parquet(path)[0].teacher_logprobs == [value]
