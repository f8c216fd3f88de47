"""The rules between config fields are validators (oprl.config): ``oprl config`` refuses exactly what a run
refuses, before anything starts, with the same one line (the line the runtime printed when it checked them).

Each case is one rule: the ``key=value`` settings that break it and the start of its line. The same settings
go through ``oprl config``, ``oprl train`` and ``oprl.train(...)``; all three must give that one line (exit 2
from the command line), and the run must start nothing (no task, no model, no run directory)."""

from pathlib import Path

import pytest
import yaml

import oprl
from oprl import api
from oprl.cli import main
from oprl.config import RunConfig, load_config, save_config
from oprl.errors import OprlError

RECIPES = Path(__file__).parents[1] / "recipes.py"

REFUSED = {
    # RunConfig: mode, resume, overwrite, buffer.path, eval.checkpoint (runtime.run.check_config before)
    "offline-without-store": (["mode=offline"], "mode=offline: set buffer.path to an experience store"),
    "resume-without-name": (["resume=true"], "resume=true: set run_name to the run to continue"),
    "resume-and-overwrite": (
        ["resume=restart", "run_name=x", "overwrite=true"],
        "overwrite=true and resume=restart: choose one (overwrite replaces the run)",
    ),
    "resume-eval": (["resume=true", "run_name=x", "mode=eval"], "resume=true: mode=eval has nothing to resume"),
    "eval-checkpoint-outside-eval": (["eval.checkpoint=runs/a/checkpoints/step-2"], "eval.checkpoint is read only"),
    # RunConfig.run_name (checkpoint.rundir.check_run_name before)
    "run-name-path": (["run_name=a/b"], "run_name: 'a/b' must be a single directory name (no '/', not '.' or"),
    "run-name-dotdot": (["run_name=.."], "run_name: '..' must be a single directory name"),
    "run-name-long": ([f"run_name={'x' * 201}"], f"run_name: {'x' * 40!r}... is 201 bytes long; at most 200"),
    # RunConfig: advantages and distillation (check_config; teacher.loading.check_teacher's config part)
    "group-size-one": (["rollout.group_size=1"], "rollout.group_size=1: every advantage is relative to its group"),
    "distill-without-teacher": (["algorithm.preset=distill"], "algorithm.distill_coef=1 needs a teacher: set"),
    # sections: sync, replay, rollout (check_config; explorer.shaping.check_shaping)
    "async-staleness": (
        ["sync.mode=async", "sync.interval=4", "sync.max_staleness=1"],
        "sync.max_staleness=1 must be >= sync.interval - 1 = 3: weights are published only every 4 steps",
    ),
    # settings a mode does not read are refused, never dropped (issue #53: async ignored sync.offset)
    "async-offset": (
        ["sync.mode=async", "sync.offset=4"],
        "sync.offset=4 is not read with sync.mode=async: an async run's lag is bounded by sync.max_staleness (set "
        "sync.max_staleness=4",
    ),
    # issue #71: buffer.max_ready=4 (then the default) held sync.max_staleness=8 at lag 3
    "async-pacing-below-staleness": (
        ["sync.mode=async", "sync.max_staleness=8", "buffer.max_ready=4"],
        "buffer.max_ready=4 holds an async run's lag at 3, below sync.max_staleness=8: set buffer.max_ready >= 9",
    ),
    "scheduled-staleness": (["sync.max_staleness=3"], "sync.max_staleness=3 is not read with sync.mode=scheduled"),
    "switch-step-async": (
        ["sync.partial=true", "sync.mode=async", "sync.switch_step=4"],
        "sync.switch_step=4 is not read with sync.mode=async",
    ),
    "replay-once": (["replay.groups_per_step=2", "replay.max_uses=1"], "replay.max_uses must be >= 2 when replay"),
    "overlong-buffer-too-long": (["rollout.overlong_buffer=9"], "rollout.overlong_buffer=9 exceeds rollout.max_new"),
    "overlong-and-truncated-reward": (
        ["rollout.overlong_buffer=2", "rollout.truncated_reward=-0.1"],
        "rollout.overlong_buffer and rollout.truncated_reward are alternatives",
    ),
    # trainer section and RunConfig (trainer.ranks.check_trainer_config's machine-free part)
    "ranks-unsharded": (["trainer.world_size=2"], "trainer.world_size=2 needs trainer.sharding=ddp or fsdp"),
    "ranks-over-groups": (
        ["trainer.world_size=4", "trainer.sharding=ddp", "rollout.prompts_per_step=3"],
        "trainer.world_size=4 exceeds the groups per step (rollout.prompts_per_step=3)",
    ),
    "autocast-bf16-weights": (
        ["trainer.autocast=bfloat16", "model.dtype=bfloat16"],
        "trainer.autocast=bfloat16 needs model.dtype=float32",
    ),
    "nccl-on-cpu": (["trainer.dist_backend=nccl"], "trainer.dist_backend=nccl needs CUDA tensors, model.device=cpu"),
    "ray-cuda-ranks-without-gpus": (
        ["backend=ray", "model.device=cuda", "trainer.sharding=ddp"],
        "backend=ray with model.device=cuda: set runtime.gpus_per_trainer_rank",
    ),
    # RunConfig against the engine's declared capabilities (partial.check_partial; config.loading._check_truncation)
    "partial-engine": (
        ["sync.partial=true", "rollout.engine=hf-generate"],
        "sync.partial=true needs rollout.engine=lean or vllm (the engines that switch weights",
    ),
    "partial-plugin-undeclared": (
        ["sync.partial=true", f"rollout.engine={RECIPES}:OwnLoop"],
        "sync.partial=true needs rollout.engine=lean or vllm",
    ),
    "partial-kv-vllm": (
        ["sync.partial=true", "rollout.engine=vllm"],
        "sync.partial=true with rollout.engine=vllm needs sync.partial_kv=recompute: it supports only that",
    ),
    "partial-sequential": (["sync.partial=true", "runtime.overlap=false"], "sync.partial=true needs runtime.overlap"),
    "truncation-plugin": (
        ["rollout.top_p=0.9", f"rollout.engine={RECIPES}:OwnLoop"],
        f"rollout.top_p=0.9: rollout.engine={RECIPES}:OwnLoop samples by its own truncation rule",
    ),
    "engine-process-lean": (
        ["rollout.engine_process=true"],
        "rollout.engine_process=true: rollout.engine=lean samples in the worker's process (it runs no model in a "
        "process of its own); use one of vllm, or unset it",
    ),
    "top-k-plugin-undeclared": (
        ["rollout.record_top_k=4", f"rollout.engine={RECIPES}:OwnLoop"],
        f"rollout.record_top_k=4: rollout.engine={RECIPES}:OwnLoop records no top log-probs",
    ),
}

ACCEPTED = [
    # a neighbour of each rule that passes: the rules refuse no more than they say
    ["mode=offline", "buffer.path=runs/store"],
    ["resume=true", "run_name=x"],
    ["mode=eval", "eval.checkpoint=runs/a/checkpoints/step-2"],
    ["run_name=a-b.c_1"],
    ["rollout.group_size=1", "algorithm.baseline_shift=0.1"],  # AsymRE's shifted baseline trains at K=1
    ["rollout.group_size=1", "mode=explore"],
    ["algorithm.preset=distill", "teacher.path=tiny"],
    ["sync.mode=async", "sync.interval=4", "sync.max_staleness=3"],
    ["sync.interval=4", "sync.max_staleness=1"],  # scheduled: max_staleness at its default
    ["sync.mode=async", "sync.max_staleness=4", "sync.offset=0"],  # async: the bound, offset at its default
    ["sync.mode=async", "sync.max_staleness=8", "buffer.max_ready=9"],
    ["sync.interval=20", "buffer.max_ready=2"],  # scheduled: pacing only
    ["mode=explore", "sync.mode=async", "sync.max_staleness=8", "buffer.max_ready=2"],  # explore trains nothing
    ["sync.partial=true", "sync.switch_step=4", "sync.offset=1"],
    ["sync.partial=false", "sync.switch_step=4", "sync.partial_kv=recompute"],  # inert: an A/B turns partial off
    # a run's saved config or a shared YAML keeps its schedule under mode=explore / eval: not refused
    ["mode=explore", "sync.offset=1"],
    ["mode=eval", "sync.interval=4", "sync.offset=2"],
    ["rollout.overlong_buffer=8"],
    ["trainer.world_size=3", "trainer.sharding=ddp", "rollout.prompts_per_step=3"],
    ["trainer.autocast=bfloat16"],
    ["trainer.dist_backend=nccl", "model.device=auto"],  # the machine decides: trainer.ranks.check_trainer_machine
    ["sync.partial=true", "rollout.engine=vllm", "sync.partial_kv=recompute"],
    ["sync.partial=true", f"rollout.engine={RECIPES}:SwitchingLoop"],  # declared by the plug-in
    ["rollout.top_p=0.9", f"rollout.engine={RECIPES}:OwnLoop", "mode=eval"],  # eval: no trainer to rebuild it
    ["rollout.engine=vllm", "rollout.engine_process=true"],
    ["rollout.engine=vllm", "rollout.record_top_k=20"],
    ["rollout.engine=hf-generate", "rollout.record_top_k=1"],
]


@pytest.fixture
def nothing_runs(monkeypatch):
    """``oprl.api.run`` (the task, the model, the runtime) replaced by a recorder."""
    calls = []
    monkeypatch.setattr(api, "run", lambda *args, **kwargs: calls.append(args))
    return calls


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


@pytest.mark.parametrize("case", REFUSED)
def test_a_rule_refuses_the_same_line_in_oprl_config_and_in_a_run(case, tmp_path, capsys, nothing_runs):
    settings, line = REFUSED[case]
    out = tmp_path / "runs"
    settings = [*settings, f"output_dir={out}", "progress=false"]
    assert main(["config", *settings]) == 2
    printed = _error_line(capsys)
    assert printed.startswith(f"error: {line}"), printed
    assert "Value error" not in printed and "config: " not in printed  # the runtime's line, not pydantic's
    assert main(["train", *settings]) == 2
    assert _error_line(capsys) == printed
    with pytest.raises(OprlError) as raised:
        oprl.train(**{key: yaml.safe_load(value) for key, value in (s.split("=", 1) for s in settings)})
    assert f"error: {raised.value}" == printed
    assert nothing_runs == [] and not out.exists()  # refused at load: no task, model or run directory


@pytest.mark.parametrize("settings", ACCEPTED, ids=lambda s: " ".join(s)[:60])
def test_the_neighbour_of_a_rule_is_accepted(settings, capsys):
    assert main(["config", *settings]) == 0, capsys.readouterr().err
    assert yaml.safe_load(capsys.readouterr().out)["seed"] == 0


def test_a_config_built_in_python_is_refused_by_the_same_rules():
    with pytest.raises(OprlError, match=r"^mode=offline: set buffer.path"):
        RunConfig(mode="offline")
    config = load_config(None, ["rollout.max_new_tokens=16"])
    with pytest.raises(OprlError, match=r"^rollout.overlong_buffer=17 exceeds rollout.max_new_tokens=16"):
        config.rollout.overlong_buffer = 17  # sections validate assignments
    with pytest.raises(OprlError, match=r"^config: algorithm.preset: unknown preset 'nope'"):
        load_config(None, ["algorithm.preset=nope", "rollout.group_size=1"])  # the preset's line, as a run's


def test_a_run_begun_with_overwrite_resumes(tmp_path):
    """The saved config keeps overwrite=true (how the run began); the resumed config takes the given
    overwrite, so the resume/overwrite rule does not refuse the merged config."""
    from oprl.runtime.resume import resumed_config

    run_dir = tmp_path / "runs" / "x"
    run_dir.mkdir(parents=True)
    save_config(load_config(None, ["overwrite=true", "run_name=x", "steps=3"]), run_dir / "config.yaml")
    given = load_config(None, ["resume=true", "run_name=x", f"output_dir={tmp_path / 'runs'}", "steps=5"])
    merged = resumed_config(given, run_dir)
    assert (merged.resume, merged.overwrite, merged.steps) == (True, False, 5)


@pytest.mark.parametrize("backend", [["backend=local"], ["runtime.workers=processes"], ["backend=ray"]])
def test_async_with_an_offset_is_refused_on_every_backend(backend, tmp_path, capsys, nothing_runs):
    """#53: ``sync.mode=async sync.offset=4`` ran with lag <= 1 (max_staleness's default) under a name saying
    m4. It is refused before anything starts, whatever runs the workers, naming the setting that does bound an
    async run's lag; that setting is the one the run's name and headline then show."""
    from oprl.runtime.run import run_label

    settings = [*backend, "sync.mode=async", "sync.offset=4", f"output_dir={tmp_path}", "progress=false"]
    assert main(["train", *settings]) == 2
    assert "set sync.max_staleness=4 for lag <= 4" in _error_line(capsys)
    assert nothing_runs == [] and list(tmp_path.iterdir()) == []
    config = load_config(None, [*backend, "sync.mode=async", "sync.max_staleness=4"])
    assert "-k1-async4-" in run_label(config) and config.sync.describe() == "k=1 async, lag <= 4"
    assert api._start_line(config).endswith("(grpo, k=1 async, lag <= 4, 300 steps)")


def test_buffer_max_ready_follows_an_async_runs_staleness():
    """#71: unset, ``buffer.max_ready`` lets an async run reach ``sync.max_staleness`` (max_staleness + 1 batches
    ahead); a scheduled run keeps 4, pacing only."""
    from oprl.runtime.synchronizer import Synchronizer

    def reach(*settings):
        return Synchronizer.of(load_config(None, list(settings)), 1).max_ready

    assert reach("sync.mode=async", "sync.max_staleness=8") == 9
    assert reach("sync.mode=async", "sync.max_staleness=8", "buffer.max_ready=12") == 12
    assert reach("sync.interval=20") == 4 and reach("buffer.max_ready=2") == 2
    assert reach("mode=explore", "sync.mode=async", "sync.max_staleness=8") is None
