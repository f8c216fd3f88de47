"""#53 items 8 and 9 on synthetic run records (no training): distillation is labelled by what it optimises and shown
where the reward is (console line, figures); a curve equal to another is drawn dashed on top and named as coinciding
(not as an identical run: its config differs), rather than hidden under its twin."""

import copy
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
    assert note.get_text() == "coinciding curves (dashed; their configs differ):\nrec-oneside-nois = reinforce"


def test_offline_distillation_runs_sharing_a_kl_curve_are_not_called_identical():
    """#71: two offline distillation configs whose reverse KL coincides and whose accuracy does not: the KL panel
    names a coinciding curve, never "identical runs", and the accuracy panel names nothing."""
    kl = [{"step": s, "distill/reverse_kl": 1.0 / (1 + s)} for s in (1, 2)]
    accuracy = ({"step": 2, "eval/accuracy": 0.45}, {"step": 2, "eval/accuracy": 0.30})
    records = [
        record("distill", rows=[*kl, score], distill_coef=coef, distill_mix="replace")
        for score, coef in zip(accuracy, (1.0, 0.5), strict=True)
    ]
    fig = draw_grid(records, [(*PANELS["distill_reverse_kl"], 1), (*PANELS["eval_accuracy"], 1)])
    kl_panel, accuracy_panel = fig.axes[:2]
    (note,) = kl_panel.texts
    assert (
        note.get_text()
        == "coinciding curves (dashed; their configs differ):\ndistill distill_coef=0.5 = distill distill_coef=1"
    )
    assert not accuracy_panel.texts


def test_a_config_saved_before_a_key_existed_is_the_same_curve_as_todays():
    """Keys added since a run was saved read as their defaults (``oprl.config.read_saved``): the SmolLM2 stale
    arena's runs of older trees lack rollout.engine_process, algorithm.ess_lr and dual_clip, and are one curve with
    today's runs of the same settings; a key set to another value is still told apart."""
    from oprl.config import load_config
    from oprl.experiments.curves import flat_settings

    today = load_config(None, ["algorithm.preset=grpo"]).model_dump(mode="json")
    old = copy.deepcopy(today)
    for section, key in (("rollout", "engine_process"), ("algorithm", "ess_lr"), ("algorithm", "dual_clip")):
        del old[section][key]
    assert flat_settings(old) == flat_settings(today)
    assert flat_settings(old)["rollout.engine_process"] is False
    other = copy.deepcopy(today)
    other["rollout"]["engine_process"] = True
    assert flat_settings(other)["rollout.engine_process"] is True
    assert len(curve_groups([RunRecord(Path(f"r{i}"), {}, c, []) for i, c in enumerate((old, today, other))])) == 2
    # A config that no longer validates (a removed key) is read as saved, not dropped or completed.
    stale = {"rollout": {"engine": "vllm", "removed_key": 1}, "seed": 0}
    assert flat_settings(stale) == {"rollout.engine": "vllm", "rollout.removed_key": 1}


def test_async_runs_get_a_panel_of_their_own_labelled_async(tmp_path):
    """#71: an async run's k=1, m=0 put it in the on-policy panel of ``oprl plot`` beside the scheduled run; it is
    drawn in a panel of its own, named by its bound."""
    import json

    import yaml

    from oprl.config import load_config
    from oprl.experiments.results import load_run, setting_of

    runs = []
    for name, settings in (("on", []), ("async", ["sync.mode=async", "sync.max_staleness=8"])):
        run = tmp_path / name
        run.mkdir()
        config = load_config(None, ["steps=2", *settings]).model_dump(mode="json")
        (run / "config.yaml").write_text(yaml.safe_dump(config))
        (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
        runs.append(load_run(run))
    assert [r.labels["setting"] for r in runs] == ["on-policy", "async-8"]
    assert setting_of({**runs[1].config, "mode": "offline"}) == "offline"
    fig = draw_grid(runs, [(*PANELS["eval_accuracy"], 1)])
    assert [ax.get_title() for ax in fig.axes] == ["on-policy", "async, lag <= 8"]
    assert [len(ax.get_lines()) for ax in fig.axes] == [1, 1]
