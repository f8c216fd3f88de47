"""``oprl.metrics``'s plot of one run (``metrics.png``): what it draws for which rows."""

import matplotlib.pyplot as plt

from oprl.metrics import draw_run, plot_run

ROWS = [{"step": s, "reward/mean": 0.1 * s, "eval/accuracy": 0.2} for s in range(1, 4)]


def _labels(fig) -> list[str]:
    return [text.get_text() for text in fig.axes[0].get_legend().get_texts()]


def test_a_distillation_run_shows_its_reverse_kl_on_its_own_axis(tmp_path):
    rows = [{**row, "distill/reverse_kl": 2.5 - 0.5 * row["step"]} for row in ROWS]
    fig = draw_run(rows, "run distill")
    assert len(fig.axes) == 2  # the KL is in nats, not on the reward's 0-1 axis
    assert list(fig.axes[1].lines[0].get_ydata()) == [2.0, 1.5, 1.0]
    assert "reverse KL to the teacher (per token, right axis)" in _labels(fig)
    plt.close(fig)
    plot_run(rows, tmp_path / "metrics.png")
    assert (tmp_path / "metrics.png").stat().st_size > 1000


def test_a_run_without_a_teacher_has_one_axis():
    fig = draw_run(ROWS)
    assert len(fig.axes) == 1 and _labels(fig) == ["train reward (batch mean)", "eval accuracy (pass@1)"]
    plt.close(fig)
