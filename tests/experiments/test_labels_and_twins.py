"""#53 items 8 and 9 on synthetic run records (no training): distillation is labelled by what it optimises and shown
where the reward is (console line, figures); a run identical to another is drawn dashed on top and named, rather
than hidden under its twin."""

from pathlib import Path

import pytest

from oprl.experiments.curves import PANELS, curve_groups, draw_grid, label_curves, plot_all
from oprl.experiments.results import RunRecord, objective_of
from oprl.runtime.rows import progress_text

ROWS = [{"step": 0, "eval/accuracy": 0.40}, {"step": 1, "reward/mean": 0.5}, {"step": 2, "eval/accuracy": 0.45}]


def record(preset, seed=0, rows=ROWS, **algorithm):
    config = {"algorithm": {"preset": preset, "distill_coef": 0.0, **algorithm}, "seed": seed, "steps": 2}
    return RunRecord(Path(f"{preset}-{seed}"), {"preset": preset, "setting": "on-policy", "seed": str(seed)}, config,
                     list(rows))  # fmt: skip


@pytest.mark.parametrize(
    ("algorithm", "label"),
    [
        ({"preset": "grpo", "distill_coef": 0.0}, "grpo"),
        ({"preset": "distill", "distill_coef": 1.0, "distill_mix": "replace"}, "distill"),
        (
            {"preset": "rec-oneside-nois", "distill_coef": 1.0, "distill_mix": "replace"},
            "distill (rec-oneside-nois loss)",
        ),
        ({"preset": "grpo", "distill_coef": 1.0, "distill_mix": "add"}, "grpo+distill"),
        ({"preset": "grpo", "distill_coef": None}, "grpo"),
    ],
)
def test_a_run_is_labelled_by_what_it_optimises(algorithm, label):
    assert objective_of(algorithm) == label


def test_a_clipped_distillation_curve_is_not_labelled_as_rl():
    curves = curve_groups(
        [record("rec-oneside-nois"), record("rec-oneside-nois", distill_coef=1.0, distill_mix="replace")]
    )
    label_curves(curves)
    assert curves[0].label.startswith("rec-oneside-nois ")
    assert curves[1].label.startswith("distill (rec-oneside-nois loss) ")


def test_the_console_line_shows_the_distillation_signal_beside_the_reward():
    text = progress_text({"reward/mean": 0.25, "distill/reverse_kl": 0.4321, "lag/mean": 0.0}, None)
    assert text.startswith("reward 0.250  rev-KL 0.432  ")
    assert "rev-KL" not in progress_text({"reward/mean": 0.25}, None)


def test_distillation_runs_get_a_reverse_kl_figure(tmp_path):
    rows = [{**row, "distill/reverse_kl": 1.0 / (1 + row["step"])} for row in ROWS]
    written = plot_all([record("distill", rows=rows, distill_coef=1.0, distill_mix="replace")], tmp_path)
    assert tmp_path / "distill_reverse_kl.png" in written
    assert not (tmp_path / "nothing" / "distill_reverse_kl.png").exists()
    assert "distill_reverse_kl.png" not in [p.name for p in plot_all([record("grpo")], tmp_path / "rl")]


def test_an_identical_run_is_drawn_dashed_and_named():
    """On-policy REC-OneSide-NoIS is REINFORCE run for run (ρ ≡ 1): both must show."""
    records = [record(p, seed) for p in ("reinforce", "rec-oneside-nois", "grpo") for seed in (0, 1)]
    records[-1].rows = [*ROWS[:2], {"step": 2, "eval/accuracy": 0.47}]  # grpo differs
    fig = draw_grid(records, [(*PANELS["eval_accuracy"], 1)])
    (ax,) = fig.axes
    styles = {line.get_label().split(" (")[0]: line.get_linestyle() for line in ax.get_lines()}
    assert styles == {"reinforce": "-", "rec-oneside-nois": "--", "grpo": "-"}
    (note,) = ax.texts
    assert note.get_text() == "identical runs (dashed):\nrec-oneside-nois = reinforce"


def test_a_config_saved_before_engine_process_had_a_default_is_the_same_curve():
    from oprl.experiments.curves import flat_settings

    old = flat_settings({"rollout": {"engine_process": None, "engine": "vllm"}, "seed": 0})
    new = flat_settings({"rollout": {"engine_process": False, "engine": "vllm"}, "seed": 1})
    assert old == new == {"rollout.engine_process": False, "rollout.engine": "vllm"}
    assert flat_settings({"rollout": {"engine": "vllm"}}) == new  # saved before the key existed
    assert flat_settings({"rollout": {"engine_process": True}}) == {"rollout.engine_process": True}
