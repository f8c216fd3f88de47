"""``oprl sweep --only / --set / --out`` (#53 item 7): shrinking a sweep from the command line, without copying its
spec. Planning only (dry runs): no run is trained."""

import pytest
import yaml

from oprl.errors import OprlError
from oprl.experiments import sweep, sweep_spec

SPEC = {
    "output_dir": "runs/demo",
    "overrides": ["steps=200", "eval.interval=20"],
    # A list of grids: their union in order (a pilot first), which the selection must keep working on.
    "grid": [
        {"algorithm.preset": ["grpo"], "setting": {"lag-4": {"sync.offset": 4}}, "seed": [0]},
        {
            "algorithm.preset": {"grpo": {"algorithm.preset": "grpo"}, "reinforce": {"algorithm.preset": "reinforce"}},
            "setting": {"lag-0": {"sync.offset": 0}, "lag-4": {"sync.offset": 4}, "short": {"steps": 20}},
            "seed": [0, 1],
        },
    ],
}


def write(tmp_path, spec=SPEC):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({**spec, "output_dir": str(tmp_path / "out")}, sort_keys=False))
    return path


def test_only_selects_by_axis_and_short_name_in_the_grid_order():
    runs = sweep_spec.plan(SPEC)
    chosen = sweep_spec.select(runs, ["algorithm.preset=grpo", "setting=lag-4", "seed=0"])
    assert [r.name for r in chosen] == ["preset=grpo__setting=lag-4__seed=0"]  # the pilot, planned once
    # One axis twice: either list's values (the pilot comes first, as the grid lists it).
    union = sweep_spec.select(runs, ["preset=grpo", "preset=reinforce", "setting=lag-4", "seed=0"])
    assert [r.labels["algorithm.preset"] for r in union] == ["grpo", "reinforce"]
    both = sweep_spec.select(runs, ["setting=lag-0", "seed=1"])
    assert [r.labels["algorithm.preset"] for r in both] == ["grpo", "reinforce"]


@pytest.mark.parametrize(
    ("only", "message"),
    [
        (["presets=grpo"], "no axis 'presets' in the grid; axes: algorithm.preset, setting, seed"),
        (["preset=grpoo"], "no algorithm.preset 'grpoo' in the grid; values: grpo, reinforce"),
        (["seed"], "expected axis=value"),
    ],
)
def test_only_typos_fail_with_one_line(only, message):
    with pytest.raises(OprlError, match=message):
        sweep_spec.select(sweep_spec.plan(SPEC), only)


def test_only_runs_into_the_sweeps_own_directory(tmp_path):
    logged = []
    out = sweep.run_sweep(write(tmp_path), dry_run=True, only=["preset=reinforce", "seed=0"], log=logged.append)
    assert out == tmp_path / "out"  # the same runs as the whole sweep's: finished ones are shared
    assert logged[0] == (
        f"sweep {out}: 12 runs, 3 selected by --only, 0 already finished, 3 to run, 1 at a time, "
        "a failed run tried again up to 1 time(s)"  # retries: default 1 on either pool
    )
    assert all("algorithm.preset=reinforce" in line and "seed=0" in line for line in logged[1:])
    (out / "preset=reinforce__setting=lag-0__seed=0").mkdir(parents=True)
    (out / "preset=reinforce__setting=lag-0__seed=0" / "summary.json").write_text("{}")
    logged.clear()
    sweep.run_sweep(write(tmp_path), dry_run=True, only=["preset=reinforce", "seed=0"], log=logged.append)
    assert "1 already finished, 2 to run" in logged[0]


def test_set_overrides_every_run_after_the_grid_into_its_own_directory(tmp_path):
    logged = []
    out = sweep.run_sweep(write(tmp_path), dry_run=True, only=["setting=short"], sets=["steps=60"], log=logged.append)
    assert out == tmp_path / "out+steps=60"  # other runs than the spec's: kept apart
    for line in logged[1:]:
        # The grid's bundle says steps=20; --set comes last, so the run trains 60 steps.
        assert line.index("steps=20") < line.index("steps=60") and f"output_dir={out}" in line
    assert sweep.run_sweep(write(tmp_path), dry_run=True, sets=["steps=60"], out_dir=tmp_path / "mine",
                           log=logged.append) == tmp_path / "mine"  # fmt: skip


def test_the_saved_spec_of_a_set_sweep_plans_the_same_runs(tmp_path):
    """``final_overrides`` is a spec key: the sweep.yaml written beside the runs loads and plans them again
    (``oprl report`` reads it for the labels)."""
    spec = sweep_spec.with_overrides(sweep_spec.load_spec(write(tmp_path)), ["steps=60"])
    assert spec["final_overrides"] == ["steps=60"]
    saved = tmp_path / "saved.yaml"
    saved.write_text(yaml.safe_dump(spec, sort_keys=False))
    assert sweep_spec.plan(sweep_spec.load_spec(saved)) == sweep_spec.plan(spec)
    assert all(r.overrides[-1] == "steps=60" for r in sweep_spec.plan(spec))


@pytest.mark.parametrize(("sets", "message"), [(["stepz=60"], "unknown key 'stepz'"), (["steps"], "key=value")])
def test_set_typos_fail_before_any_run(tmp_path, sets, message):
    with pytest.raises(OprlError, match=message):
        sweep.run_sweep(write(tmp_path), dry_run=True, sets=sets, log=lambda line: None)


def test_a_selection_of_nothing_is_refused(tmp_path):
    spec = {
        **SPEC,
        "grid": [{"algorithm.preset": ["grpo"], "seed": [0]}, {"algorithm.preset": ["reinforce"], "seed": [1]}],
    }
    with pytest.raises(OprlError, match="selects no run"):
        sweep.run_sweep(write(tmp_path, spec), dry_run=True, only=["preset=grpo", "seed=1"], log=lambda line: None)


def test_kept_runs_count_as_finished_and_replace_unfinished_leftovers(tmp_path):
    """``keep:`` (docs/sweeps.md): a run kept as finished is restored into the output directory before planning,
    replacing an unfinished leftover of it; a dry run counts it as finished and writes nothing."""
    kept, out = tmp_path / "kept", tmp_path / "out"
    name = "preset=reinforce__setting=lag-0__seed=0"
    (kept / name).mkdir(parents=True)
    for file in sweep.KEPT_FILES:
        (kept / name / file).write_text(file)
    (kept / "preset=grpo__setting=lag-0__seed=0").mkdir()  # no summary: not finished, not restored
    logged = []
    sweep.run_sweep(write(tmp_path), dry_run=True, keep=kept, only=["seed=0"], log=logged.append)
    assert "6 selected by --only, 1 already finished, 5 to run" in logged[0] and not out.exists()
    (out / name / "checkpoints").mkdir(parents=True)  # an unfinished leftover of the same run
    assert sweep.restore_kept(sweep_spec.plan(SPEC), out, kept) == 1
    assert sorted(p.name for p in (out / name).iterdir()) == sorted(sweep.KEPT_FILES)
    assert not (out / "preset=grpo__setting=lag-0__seed=0").exists()
    assert sweep.restore_kept(sweep_spec.plan(SPEC), out, kept) == 0  # already there: nothing copied twice


def test_drop_checkpoints_deletes_a_finished_runs_checkpoints_as_it_finishes(tmp_path, monkeypatch):
    """``drop_checkpoints: true`` (docs/sweeps.md): each run's ``checkpoints/`` go the moment it finishes, after its
    light files were kept, before the next run starts (27 checkpointed SmolLM2 runs once filled a disk); its
    ``final/`` model stays, and a failed run keeps the checkpoint it will resume from."""
    out, kept = tmp_path / "out", tmp_path / "kept"
    spec = {**SPEC, "grid": {"algorithm.preset": ["grpo", "reinforce", "m2po"], "seed": [0]}, "keep": str(kept)}
    path = write(tmp_path, {**spec, "drop_checkpoints": True})
    names = [r.name for r in sweep_spec.plan(spec)]
    seen_before_start = []

    def execute(todo, parallel, *, prepare, log_path, log, on_success=None, retries=0):
        failed = []
        for run in todo:
            seen_before_start.append(sorted(p.name for p in out.glob("*/checkpoints")))
            (out / run.name / "checkpoints" / "step-000010").mkdir(parents=True)
            (out / run.name / "checkpoints" / "step-000010" / "optimizer.safetensors").write_bytes(b"x" * 4096)
            if run.name.startswith("preset=m2po"):  # this one fails: no summary, its checkpoint resumes it
                failed.append(run.name)
                continue
            (out / run.name / "final").mkdir()
            for file in sweep.KEPT_FILES:
                (out / run.name / file).write_text(file)
            on_success(run)
        return failed

    monkeypatch.setattr(sweep.sweep_local, "execute", execute)
    monkeypatch.setattr(sweep, "collect_results", lambda *a, **k: [])  # the files above are placeholders
    logged = []
    with pytest.raises(OprlError, match="1 run\\(s\\) failed"):
        sweep.run_sweep(path, log=logged.append)
    assert seen_before_start == [[], [], []]  # the first two were dropped as they finished, not at the end
    for name in names[:2]:
        assert not (out / name / "checkpoints").exists() and (out / name / "final").is_dir()
        assert (kept / name / "summary.json").is_file()
    assert (out / names[2] / "checkpoints" / "step-000010").is_dir()
    assert f"run {names[0]}: finished, its checkpoints dropped (0.00 GiB)" in logged
    # Off by default; --drop-checkpoints (drop_checkpoints=True) turns it on for runs finished before, too.
    (out / names[0] / "checkpoints").mkdir()
    monkeypatch.setattr(sweep.sweep_local, "execute", lambda todo, *a, **k: [])
    sweep.run_sweep(write(tmp_path, spec), log=logged.append)
    assert (out / names[0] / "checkpoints").is_dir()
    sweep.run_sweep(write(tmp_path, spec), drop_checkpoints=True, log=logged.append)
    assert not (out / names[0] / "checkpoints").exists() and (out / names[2] / "checkpoints").is_dir()
    with pytest.raises(OprlError, match="'drop_checkpoints' must be true or false, not 'yes'"):
        sweep_spec.load_spec(write(tmp_path, {**spec, "drop_checkpoints": "yes"}))


def test_a_report_after_only_awaits_only_the_selected_runs(tmp_path):
    """#71: after ``--only preset=grpo`` the report's group of grpo and reinforce listed reinforce as "not finished
    yet", though this sweep never runs it; the selection is saved with the spec, and the report awaits only it."""
    import json

    from oprl.config import load_config
    from oprl.config.loading import save_config
    from oprl.experiments import report

    spec = {**SPEC, "report": {"groups": {"RL": ["grpo", "reinforce"]}}}
    out = tmp_path / "out"
    for run in sweep_spec.select(sweep_spec.plan(spec), ["preset=grpo"]):  # finished, as a sweep would leave them
        (out / run.name).mkdir(parents=True)
        save_config(load_config(overrides=list(run.overrides)), out / run.name / "config.yaml")
        rows = [{"step": 0, "eval/accuracy": 0.4}, {"step": 20, "eval/accuracy": 0.5, "reward/mean": 0.5}]
        (out / run.name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (out / run.name / "summary.json").write_text(json.dumps({"seconds": 1.0}))
    logged: list[str] = []
    sweep.run_sweep(write(tmp_path, spec), only=["preset=grpo"], log=logged.append)
    assert "6 selected by --only, 6 already finished, 0 to run" in logged[0]
    assert yaml.safe_load((out / "sweep.yaml").read_text())["only"] == ["preset=grpo"]
    text = report.build_report(out).read_text()
    assert "## RL" in text and "Not finished yet" not in text
    # The whole sweep (no `only:`) still awaits reinforce.
    (out / "sweep.yaml").write_text(yaml.safe_dump({**spec, "output_dir": str(out)}))
    assert "Not finished yet: reinforce." in report.build_report(out).read_text()


def test_a_bad_only_in_the_spec_is_one_line(tmp_path):
    with pytest.raises(OprlError, match="'only' must list axis=value"):
        sweep_spec.load_spec(write(tmp_path, {**SPEC, "only": "preset=grpo"}))


def test_report_noise_is_a_spec_key_oprl_sweep_accepts(tmp_path):
    """``report.noise: pooled`` (read by oprl report) is accepted by oprl sweep; anything else is one line."""
    sweep_spec.load_spec(write(tmp_path, {**SPEC, "report": {"noise": "pooled"}}))
    with pytest.raises(OprlError, match=r"report\.noise must be one of own, pooled, not 'pool'"):
        sweep_spec.load_spec(write(tmp_path, {**SPEC, "report": {"noise": "pool"}}))
