"""``oprl plot`` never averages unrelated runs: seeds of one config are one band, anything else its own curve."""

import pytest

from oprl.cli import main
from oprl.experiments.curves import PANELS, draw_grid, plot_all, short_names
from oprl.experiments.results import load_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory, cache_dir):
    import os

    os.environ["OPRL_CACHE_DIR"] = str(cache_dir)  # the module fixture runs before the autouse one
    from conftest import SMALL

    root = tmp_path_factory.mktemp("plot-runs")
    common = [*SMALL, f"output_dir={root}", "steps=4", "tensorboard=false"]
    for seed in (0, 1, 2):
        assert main(["train", *common, f"seed={seed}", f"run_name=s{seed}"]) == 0
    assert main(["train", *common, "seed=0", "optim.lr=0.001", "run_name=lr"]) == 0
    assert main(["train", *common, "seed=0", "steps=2", "run_name=short"]) == 0
    return root


def lines_of(fig):
    return [line for ax in fig.axes for line in ax.get_lines()]


def test_two_lrs_draw_two_labelled_curves(runs):
    fig = draw_grid([load_run(runs / "s0"), load_run(runs / "lr")], [(*PANELS["eval_accuracy"], 1)])
    (ax,) = fig.axes
    assert sorted(line.get_label() for line in ax.get_lines()) == ["grpo lr=0.0003", "grpo lr=0.001"]
    assert not ax.collections  # single runs: no band
    assert len({line.get_color() for line in ax.get_lines()}) == 2
    assert ax.get_ylabel() == "eval accuracy (pass@1)"
    legend = [text.get_text() for text in fig.legends[0].get_texts()]
    assert sorted(legend) == ["grpo lr=0.0003", "grpo lr=0.001"]


def test_three_seeds_draw_one_band(runs):
    records = [load_run(runs / f"s{seed}") for seed in (0, 1, 2)]
    fig = draw_grid(records, [(*PANELS["train_reward"], 5)])
    (ax,) = fig.axes
    (line,) = ax.get_lines()
    assert line.get_label() == "grpo (3 seeds: mean, min-max band)"
    assert len(ax.collections) == 1  # the min-max band
    rewards = [r.curve("reward/mean")[1] for r in records]
    assert list(line.get_xdata()) == [1, 2, 3, 4]
    assert line.get_ydata()[0] == pytest.approx(sum(r[0] for r in rewards) / 3)
    assert "moving average, 5 steps" in ax.get_ylabel()


def test_runs_of_different_lengths_keep_their_own_steps(runs):
    fig = draw_grid([load_run(runs / "s0"), load_run(runs / "short")], [(*PANELS["eval_accuracy"], 1)])
    steps = {line.get_label(): list(line.get_xdata()) for line in lines_of(fig)}
    assert steps == {"grpo steps=4": [0, 2, 4], "grpo steps=2": [0, 2]}


def test_oprl_plot_writes_the_figures(runs, tmp_path, capsys):
    assert main(["plot", *(str(runs / n) for n in ("s0", "s1", "s2", "lr")), "--out", str(tmp_path)]) == 0
    written = capsys.readouterr().out.split()
    assert str(tmp_path / "eval_accuracy.png") in written
    assert str(tmp_path / "ess.png") in written and str(tmp_path / "ess_seq.png") in written  # every preset logs ESS
    assert plot_all([load_run(runs / "s0")], tmp_path / "one")  # one run alone plots too


def _fake_run(root, name, overrides, accuracy):
    """A run directory as ``oprl plot`` reads it (the resolved config, eval rows), without training."""
    import json

    import yaml

    from oprl.config import load_config

    run = root / name
    run.mkdir(parents=True)
    config = load_config(None, overrides).model_dump(mode="json")
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    rows = [{"step": s, "eval/accuracy": accuracy + 0.01 * s, "reward/mean": accuracy} for s in range(0, 6, 2)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_run(run)


def _legend_inside(fig) -> None:
    """The legend lies inside the figure and below every panel (nothing clipped, nothing covered)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (legend,) = fig.legends
    box = legend.get_window_extent(renderer)
    assert box.x0 >= 0 and box.x1 <= fig.bbox.width and box.y0 >= 0 and box.y1 <= fig.bbox.height, (box, fig.bbox)
    for ax in fig.axes:
        assert box.y1 <= ax.get_tightbbox(renderer).y0 + 1, (box, ax.get_tightbbox(renderer))


def test_runs_that_differ_in_several_settings_get_short_labels_and_a_legend_inside(tmp_path):
    """#42: a dataset task beside the arithmetic one labelled every task field (``digits=None max_value=None
    ...``), ``interval=50`` named no section, and the legend ran off both edges of the figure."""
    train = tmp_path / "train.jsonl"
    train.write_text('{"prompt": "1+1=", "reference": "2"}\n')
    dataset = ["task.name=dataset", f"task.train_file={train}", "task.reward=examples/arithmetic_reward.py:reward"]
    records = [
        _fake_run(tmp_path, "a", ["optim.lr=0.001", "eval.interval=50", "rollout.group_size=16"], 0.2),
        _fake_run(tmp_path, "b", ["optim.lr=0.0003", "eval.interval=10", "rollout.group_size=4"], 0.3),
        _fake_run(tmp_path, "c", [*dataset, "optim.lr=0.01", "eval.interval=20", "rollout.group_size=8"], 0.4),
    ]
    fig = draw_grid(records, [(*PANELS["eval_accuracy"], 1), (*PANELS["train_reward"], 1)])
    labels = sorted({line.get_label() for line in lines_of(fig)})
    assert labels[0] == "grpo eval.interval=10 lr=0.0003 group=4 task=arithmetic", labels
    assert not any(word in " ".join(labels) for word in ("digits", "train_file", "max_value", " interval=")), labels
    title = fig.legends[0].get_title().get_text()
    assert "lr = optim.lr" in title and "group = rollout.group_size" in title and "task = task.name" in title
    _legend_inside(fig)
    plot_all(records, tmp_path / "plots")  # the PNG of this case (look at it: docs/howto or the report)


def test_long_labels_widen_the_figure_rather_than_clip(tmp_path):
    records = [
        _fake_run(tmp_path, f"r{i}", [f"model.path={'m' * 60}{i}", f"optim.lr={i + 1}e-4"], 0.1 * i) for i in range(3)
    ]
    fig = draw_grid(records, [(*PANELS["eval_accuracy"], 1)])
    _legend_inside(fig)


def test_a_key_that_ends_another_keeps_its_full_name():
    """The tiny distillation sweep's offline rows differ in the top-level ``mode``, which ``sync.mode`` also ends:
    no suffix is unambiguous, and the report stopped with KeyError: 'mode'."""
    every = ["mode", "sync.mode", "algorithm.clip_mode", "optim.lr"]
    names = short_names(["mode", "sync.mode", "optim.lr"], every)
    assert names["mode"] == "mode" and names["optim.lr"] == "lr" and len(set(names.values())) == 3, names
