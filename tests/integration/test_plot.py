"""``oprl plot`` never averages unrelated runs: seeds of one config are one band, anything else its own curve."""

import pytest

from oprl.cli import main
from oprl.experiments.curves import PANELS, draw_grid, plot_all
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
    assert plot_all([load_run(runs / "s0")], tmp_path / "one")  # one run alone plots too
