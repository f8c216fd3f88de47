"""The run directory's files under failure (issue 25, item 5): rows written whole, a torn file read with a
warning (``oprl plot`` included), ``final/`` written whole or not at all, errors naming the file."""

import errno
import json
import os

import pytest

from oprl.backends.failure import WorkerFailure
from oprl.cli import main
from oprl.config import load_config, save_config
from oprl.metrics import MetricsLogger, read_metrics
from oprl.runtime.checkpointing import write_final


def test_a_row_cut_short_by_a_full_disk_is_never_left_in_the_file(tmp_path, monkeypatch):
    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.log(0, {"eval/accuracy": 0.5})
    real = os.write

    def full(fd, data):  # what a disk with a few bytes left does: a short write, then ENOSPC
        real(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)
    for step in range(1, 11):
        with pytest.raises(OSError, match=r"No space left on device: '.*metrics\.jsonl'"):
            logger.log(step, {"reward/mean": 1.0})
    monkeypatch.setattr(os, "write", real)
    logger.log(1, {"reward/mean": 1.0})
    logger.close()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1]


def test_a_torn_last_line_is_dropped_with_one_warning_and_plot_reads_it(tmp_path, capsys):
    rows = [{"step": s, "reward/mean": s / 4, **({"eval/accuracy": 0.1} if s % 2 == 0 else {})} for s in range(4)]
    text = "".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "rew'
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text(text)
    save_config(load_config(None, ["steps=3"]), tmp_path / "run" / "config.yaml")
    assert read_metrics(tmp_path / "run" / "metrics.jsonl") == rows
    assert capsys.readouterr().err.count("dropped a torn last line") == 1
    assert main(["plot", str(tmp_path / "run"), "--out", str(tmp_path / "plots")]) == 0  # was a JSONDecodeError
    assert "torn last line" in capsys.readouterr().err and any((tmp_path / "plots").iterdir())


def test_final_is_written_whole_or_not_at_all(tmp_path):
    def dies_before_the_tokenizer(directory):
        os.makedirs(directory)
        with open(os.path.join(directory, "model.safetensors"), "wb") as handle:
            handle.write(b"weights")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(directory, "tokenizer.json"))

    (tmp_path / "x").write_text("")
    with pytest.raises(WorkerFailure, match=r"trainer failed writing the final model .*final: .*No space left"):
        write_final(tmp_path, dies_before_the_tokenizer)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x"]  # no final/ without its tokenizer, no staging

    def whole(directory):
        os.makedirs(directory)
        for name in ("model.safetensors", "tokenizer.json"):
            (tmp_path / ".tmp-final" / name).write_text(name)

    write_final(tmp_path, whole, step=3)
    written = sorted(p.name for p in (tmp_path / "final").iterdir())
    assert written == ["model.safetensors", "oprl_final.json", "tokenizer.json"]  # with the step it holds (#42)
