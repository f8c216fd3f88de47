"""LoRA weight sync (``model.lora_sync``): only the adapters cross, byte for byte, on every engine; vLLM serves
each version as a LoRA adapter of its own and samples a batch (or a partial rollout's segment) wholly under the
version it records; the on-policy rho bound of its LoRA kernels against the merged weights; the refusals.

The vLLM tests build one small LoRA engine per shape (cached per process, as in a run) on the tiny Llama with 2
heads of 32 dimensions (vLLM's CPU attention has no kernel for 16)."""

import contextlib
import copy
import io
import json
from pathlib import Path

import pytest
import torch

from oprl.config import load_config
from oprl.errors import OprlError
from oprl.models.adapters import adapter_tensors, base_weights, lora_rank, merged_weights, write_adapter
from oprl.models.chat import encode_prompt
from oprl.models.logprobs import pack, response_logprobs
from oprl.models.tiny import build_model, build_tokenizer
from oprl.rollout import LeanEngine, Sampling
from oprl.worker_parts import lora_serving, make_engine, trainable_weights

peft = pytest.importorskip("peft")


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def lora_policy(tokenizer, seed=3, r=4):
    """A tiny LoRA policy whose adapters act (peft starts lora_B at zero)."""
    base = build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, seed=seed)
    model = peft.get_peft_model(base, peft.LoraConfig(r=r, lora_alpha=2 * r, target_modules="all-linear"))
    step(model, seed)
    return model


def step(model, seed):
    """A stand-in for an optimizer step: every adapter tensor moves."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.add_(torch.randn(param.shape, generator=generator) * 0.3)


def prompts_of(tokenizer, texts=("1+2=", "35+47-9=", "7=", "123*4-56+7=")):
    return [encode_prompt(tokenizer, [{"role": "user", "content": t}]) for t in texts]


def recomputed(model, prompts, rollout):
    """``(trainer log-probs (B, T), behaviour log-probs (B, T), mask (B, T))`` of a rollout under ``model``."""
    input_ids, attention_mask, targets, mask = pack(prompts, rollout.response_ids, 0)
    with torch.no_grad():
        logprobs, _ = response_logprobs(model, input_ids, attention_mask, targets, sampling=Sampling(1.0))
    behaviour = torch.zeros_like(logprobs)
    for i, row in enumerate(rollout.behavior_logprobs):
        behaviour[i, : len(row)] = torch.tensor(row)
    return logprobs, behaviour, mask.bool()


def gap(model, prompts, rollout) -> float:
    """max |log pi_trainer - log pi_behaviour| over the sampled tokens: |rho - 1| on-policy, to first order."""
    logprobs, behaviour, mask = recomputed(model, prompts, rollout)
    return (logprobs - behaviour)[mask].abs().max().item()


# -- what crosses ----------------------------------------------------------------------------------------------
def backend_of(name: str):
    """A backend of kind ``name`` (threads, processes, ray: a local 1-CPU Ray started here, shut down by
    ``shutdown``)."""
    if name == "ray":
        pytest.importorskip("ray")
        from oprl.backends.ray_backend import RayBackend

        return RayBackend(address=None, num_cpus=1, workers=1)
    from oprl.backends.local import LocalBackend

    return LocalBackend(workers=name)


@pytest.mark.parametrize("backend_name", ["threads", "processes", pytest.param("ray", marks=pytest.mark.slow)])
def test_a_lora_snapshot_is_the_adapters_alone_and_crosses_every_backend_byte_equal(tokenizer, backend_name, tmp_path):
    """The trainer's snapshot of a LoRA policy holds lora_A / lora_B only (no base tensor travels); through a
    worker of each backend (threads: by reference; processes: the worker pipe and shared memory; Ray: its object
    store) it arrives byte-equal, loads into a fresh policy exactly, and what vLLM then reads (``write_adapter``)
    is the trainer's own adapter file, byte for byte."""
    model = lora_policy(tokenizer)
    backend = backend_of(backend_name)
    snapshot = trainable_weights(model, to_cpu=backend.cpu_snapshots)
    assert snapshot and all(".lora_A." in name or ".lora_B." in name for name in snapshot)
    adapter_bytes = sum(t.numel() * t.element_size() for t in snapshot.values())
    whole = sum(t.numel() * t.element_size() for t in merged_weights(model).values())
    assert adapter_bytes * 10 < whole
    actor = backend.start("echo", dict, threads=1)
    try:
        backend.wait_ready(actor)
        back = backend.get(actor.call("setdefault", "weights", snapshot))
    finally:
        backend.shutdown([actor])
    assert back.keys() == snapshot.keys()
    for name, tensor in snapshot.items():
        assert back[name].dtype == tensor.dtype and back[name].numpy().tobytes() == tensor.numpy().tobytes()
    fresh = lora_policy(tokenizer, seed=3)
    step(fresh, 99)  # other adapters, the same base
    LeanEngine(fresh, tokenizer).load_weights(back)
    assert all(torch.equal(p, dict(model.named_parameters())[n]) for n, p in fresh.named_parameters())
    assert write_adapter(fresh, tmp_path / "sampler") == write_adapter(model, tmp_path / "trainer") == adapter_bytes
    for file in ("adapter_model.safetensors", "adapter_config.json"):
        assert (tmp_path / "sampler" / file).read_bytes() == (tmp_path / "trainer" / file).read_bytes()


def test_the_adapter_directory_holds_the_snapshot_byte_equal(tokenizer, tmp_path):
    """What vLLM loads (``write_adapter``: peft's format) is the trainer's adapter tensors, byte for byte, with
    the config that scales them (alpha / r)."""
    from safetensors.torch import load_file

    model = lora_policy(tokenizer, r=8)
    size = write_adapter(model, tmp_path)
    written = load_file(str(tmp_path / "adapter_model.safetensors"))
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], lora_rank(model)) == (8, 16, 8)
    snapshot = trainable_weights(model, to_cpu=True)
    assert size == sum(t.numel() * t.element_size() for t in snapshot.values())
    assert written.keys() == adapter_tensors(model).keys() and len(written) == len(snapshot)
    for name, tensor in snapshot.items():
        saved = written[name.replace(".default.", ".")]
        assert saved.numpy().tobytes() == tensor.numpy().tobytes()
    assert not any("lora_" in name for name in base_weights(model))


# -- vLLM: one adapter per version ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def VLLMEngine():
    pytest.importorskip("vllm")
    from oprl.rollout import VLLMEngine

    return VLLMEngine


def test_vllm_serves_each_synced_version_as_an_adapter_and_loads_the_base_once(tokenizer, VLLMEngine):
    """Three syncs: each samples under the trainer's version (the on-policy bound), the base is loaded once, the
    engine holds ``lora_slots`` adapters and drops older ones, and what reaches vLLM is the adapter's bytes."""
    trainer = lora_policy(tokenizer, seed=3)
    engine = VLLMEngine(copy.deepcopy(trainer), tokenizer, max_new_tokens=10, lora_sync="adapter", lora_slots=2)
    assert engine.lora_sync == "adapter" and engine.shared.lora.rank == 8  # r=4 served in vLLM's smallest, 8
    prompts = prompts_of(tokenizer)
    for version in (1, 2, 3):
        step(trainer, 10 + version)
        snapshot = trainable_weights(trainer, to_cpu=True)
        engine.load_weights(snapshot)
        rollout = engine.generate(prompts, seed=version)
        assert gap(trainer, prompts, rollout) < 1e-4  # measured: 3e-6 (float32, CPU punica)
        assert engine.shared.adapter_bytes == sum(t.numel() * t.element_size() for t in snapshot.values())
    assert engine.shared.reloads == 1
    held = engine.shared.adapters.values()
    assert len(held) == 2 and engine.shared.llm.llm_engine.list_loras() == {r.lora_int_id for r in held}
    folders = {str(path) for path in Path(engine.shared.adapter_root).iterdir()}  # removed at exit (atexit)
    assert {r.lora_path for r in held} <= folders and len(folders) == len(engine.shared.adapters)  # dropped: gone
    with trainer.disable_adapter():  # the adapters act: sampling from the base alone would not match
        assert gap(trainer, prompts, rollout) > 1e-2


def test_the_adapter_slots_vllm_allocates_are_what_lora_slot_bytes_counts(tokenizer, VLLMEngine):
    """vLLM allocates every slot at start-up (GPU memory on CUDA): rank x (in + out) per adapted layer, plus the
    embedding and the head, per slot; ``lora_slot_bytes`` (what benchmarks/gpu_check.py reports for a 1.5B shape)
    counts exactly what the engine holds."""
    from oprl.rollout.vllm_shared import allocated_lora_bytes, lora_slot_bytes

    model = lora_policy(tokenizer, seed=3)
    engine = VLLMEngine(copy.deepcopy(model), tokenizer, max_new_tokens=4, lora_sync="adapter", lora_slots=2)
    assert (engine.shared.lora.rank, engine.shared.lora.slots) == (8, 2)
    assert lora_slot_bytes(model, engine.shared.lora, "float32") == allocated_lora_bytes(engine.shared) > 0


def test_vllm_lora_kernels_against_the_merged_weights_on_policy(tokenizer, VLLMEngine):
    """The rho bound: the same policy served as an adapter and merged, each recomputed by the trainer's un-merged
    peft forward: both within 1e-4 of it (measured on the tiny model: adapter 3e-6, merged 5e-7)."""
    trainer = lora_policy(tokenizer, seed=5)
    prompts = prompts_of(tokenizer)
    gaps = {}
    for mode in ("adapter", "merged"):
        engine = VLLMEngine(copy.deepcopy(trainer), tokenizer, max_new_tokens=10, lora_sync=mode)
        gaps[mode] = gap(trainer, prompts, engine.generate(prompts, seed=1))
    assert gaps["adapter"] < 1e-4 and gaps["merged"] < 1e-4, gaps


def test_vllm_engines_sharing_one_llm_each_sample_under_their_own_version(tokenizer, VLLMEngine):
    """Two samplers of one process (two explorers on threads, or the trainer's evaluation) at different versions
    alternate on the shared LLM: each call samples under its own adapter, and the base is never reloaded."""
    trainer = lora_policy(tokenizer, seed=7)
    older, newer = copy.deepcopy(trainer), copy.deepcopy(trainer)
    step(newer, 8)
    first = VLLMEngine(copy.deepcopy(older), tokenizer, max_new_tokens=10, lora_sync="adapter", lora_slots=2)
    second = VLLMEngine(copy.deepcopy(newer), tokenizer, max_new_tokens=10, lora_sync="adapter", lora_slots=2)
    assert first.shared is second.shared
    prompts = prompts_of(tokenizer)
    reloads = None
    for _ in range(2):
        for engine, policy in ((first, older), (second, newer)):
            assert gap(policy, prompts, engine.generate(prompts, seed=3)) < 1e-4
        reloads = reloads if reloads is not None else first.shared.reloads
    assert first.shared.reloads == reloads  # the second round reloaded nothing


def test_a_batch_across_a_switch_records_each_token_under_its_own_adapter(tokenizer, VLLMEngine, tmp_path):
    """Partial rollouts (abort and resume): tokens before the switch are sampled under version 0's adapter, the
    rest under version 1's, each token's version recorded; a version-1 batch sampled meanwhile by another engine
    and the finished version-0 engine's next batch are each wholly under their own version."""
    from oprl.checkpoint.board import post_weights
    from oprl.explorer.switcher import Switcher

    old = lora_policy(tokenizer, seed=11)
    new = copy.deepcopy(old)
    step(new, 12)
    post_weights(tmp_path / "board", 1, trainable_weights(new, to_cpu=True))
    prompts = prompts_of(tokenizer)
    engine = VLLMEngine(copy.deepcopy(old), tokenizer, max_new_tokens=10, lora_sync="adapter", lora_slots=2)
    other = VLLMEngine(copy.deepcopy(new), tokenizer, max_new_tokens=10, lora_sync="adapter", lora_slots=2)
    plain = engine.generate(prompts, seed=5)
    switch = Switcher(engine, tmp_path / "board", 0, at_step=4, target=1, kv="recompute")
    rollout = engine.generate(prompts, seed=5, switch=switch)
    assert max(len(r) for r in rollout.response_ids) > 5
    for i, response in enumerate(rollout.response_ids):
        assert response[:4] == plain.response_ids[i][:4]
        assert rollout.behavior_versions[i] == [0] * min(4, len(response)) + [1] * (len(response) - 4)
    under_old, behaviour, mask = recomputed(old, prompts, rollout)
    under_new, _, _ = recomputed(new, prompts, rollout)
    assert (under_old - behaviour)[:, :4][mask[:, :4]].abs().max() < 1e-4
    assert (under_new - behaviour)[:, 4:][mask[:, 4:]].abs().max() < 1e-4
    assert (under_old - behaviour)[:, 4:][mask[:, 4:]].abs().max() > 1e-2
    assert gap(new, prompts, other.generate(prompts, seed=6)) < 1e-4


def test_a_batch_in_flight_across_two_syncs_samples_each_token_under_its_own_adapter(tokenizer, VLLMEngine, tmp_path):
    """One batch, two syncs while it decodes (partial rollouts, recompute): tokens 0-2 under version 0's adapter,
    3-5 under version 1's, the rest under version 2's; each token's recorded version is the one whose policy gives
    its behaviour log-prob (within the kernels' 1e-4), not a neighbour's; the engine holds at most its 2 slots
    and loads the base once (at its first call), never at a sync."""
    from oprl.checkpoint.board import post_weights
    from oprl.explorer.switcher import Switcher

    class TwoSyncs(Switcher):
        """Loads version v at decode step ``at`` for each ``(at, v)`` of ``plan``."""

        def __init__(self, engine, board, plan):
            super().__init__(engine, board, 0, kv="recompute")
            self.plan = plan

        def before(self, step):
            due = [v for at, v in self.plan if at <= step and v > self.version]
            return self._load(due[-1], wait=True, step=step) if due else False

        def next_point(self, step):
            return min((at for at, v in self.plan if at > step and v > self.version), default=None)

    policies = [lora_policy(tokenizer, seed=21)]
    for version in (1, 2):
        policies.append(copy.deepcopy(policies[-1]))
        step(policies[-1], 21 + version)
        post_weights(tmp_path / "board", version, trainable_weights(policies[-1], to_cpu=True))
    prompts = prompts_of(tokenizer)
    engine = VLLMEngine(copy.deepcopy(policies[0]), tokenizer, max_new_tokens=12, lora_sync="adapter", lora_slots=2)
    reloads = engine.shared.reloads
    rollout = engine.generate(prompts, seed=9, switch=TwoSyncs(engine, tmp_path / "board", [(3, 1), (6, 2)]))
    assert max(len(r) for r in rollout.response_ids) > 6
    for i, response in enumerate(rollout.response_ids):
        expected = [0] * min(3, len(response)) + [1] * max(0, min(6, len(response)) - 3) + [2] * (len(response) - 6)
        assert rollout.behavior_versions[i] == expected[: len(response)]
    _, behaviour, mask = recomputed(policies[0], prompts, rollout)
    versions = torch.zeros_like(mask, dtype=torch.long)
    for i, row in enumerate(rollout.behavior_versions):
        versions[i, : len(row)] = torch.tensor(row)
    for version, policy in enumerate(policies):
        under, _, _ = recomputed(policy, prompts, rollout)
        own, others = mask & (versions == version), mask & (versions != version)
        assert own.any() and (under - behaviour)[own].abs().max() < 1e-4
        assert (under - behaviour)[others].abs().max() > 1e-2  # the versions differ where they are told apart
    assert len(engine.shared.adapters) <= 2 and engine.shared.reloads <= reloads + 1  # its base once, then adapters


# -- configuration ---------------------------------------------------------------------------------------------
def test_lora_serving_follows_the_lag_and_defaults_to_adapters():
    """On lean (and hf-generate, and vllm on CUDA: tests/config/test_lora_sync_default.py has the whole table)."""
    assert lora_serving(load_config(None, [])) is None
    assert lora_serving(load_config(None, ["model.lora.r=4"])) == ("adapter", 1)
    assert lora_serving(load_config(None, ["model.lora.r=4", "sync.offset=2"])) == ("adapter", 3)
    async_run = ["model.lora.r=4", "model.lora_sync=merged", "sync.mode=async", "sync.max_staleness=3"]
    assert lora_serving(load_config(None, async_run)) == ("merged", 4)


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (["model.lora_sync=adapter"], r"model\.lora_sync=adapter needs a LoRA policy: set model\.lora\.r > 0"),
        (
            ["model.lora.r=4", "rollout.engine=vllm", "sync.offset=16", "model.lora_sync=adapter"],
            r"model\.lora_sync=adapter: sync\.offset=16 keeps 17 policy versions live .* rollout\.engine=vllm holds "
            r"at most 16 adapters; lower sync\.offset or use model\.lora_sync=merged",
        ),
        (
            [
                "model.lora.r=4",
                "rollout.engine=vllm",
                "sync.mode=async",
                "sync.max_staleness=16",
                "model.lora_sync=adapter",
            ],
            r"model\.lora_sync=adapter: sync\.max_staleness=16 keeps 17 policy versions live .* at most 16 adapters; "
            r"lower sync\.max_staleness",
        ),
    ],
)
def test_what_the_sampler_cannot_serve_is_refused_at_config_load_in_one_line(overrides, line, tmp_path, capsys):
    """Before anything is built or written: ``oprl train`` exits 2 with the one line, and no run directory."""
    from oprl.cli import main

    with pytest.raises(OprlError, match=f"^{line}"):
        load_config(None, overrides)
    assert main(["train", *overrides, f"output_dir={tmp_path}", "run_name=refused"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: model.lora_sync=adapter") and not any(tmp_path.iterdir())


def test_the_live_versions_an_engine_can_hold_pass_and_merged_or_unbounded_engines_are_not_limited():
    for overrides in (
        ["model.lora.r=4", "rollout.engine=vllm", "sync.offset=15", "model.lora_sync=adapter"],  # 16: vLLM's most
        ["model.lora.r=4", "rollout.engine=vllm", "sync.offset=16", "model.lora_sync=merged"],  # one model at a time
        ["model.lora.r=4", "rollout.engine=vllm", "sync.offset=16"],  # unset on a CPU: merged
        ["model.lora.r=4", "sync.offset=16"],  # lean: peft holds the one model it samples
    ):
        load_config(None, overrides)


def test_refusals_are_one_line_before_anything_samples(tokenizer, VLLMEngine):
    config = load_config(None, ["model.lora.r=4", "model.lora_sync=merged"])  # lean: peft's forward only
    with pytest.raises(OprlError, match=r"^model\.lora_sync=merged: rollout\.engine=lean serves a LoRA policy"):
        make_engine(config, lora_policy(tokenizer), tokenizer)
    with pytest.raises(OprlError, match=r"^model\.lora_sync=adapter: 17 live policy versions .* at most 16"):
        VLLMEngine(lora_policy(tokenizer), tokenizer, lora_sync="adapter", lora_slots=17)
    with pytest.raises(OprlError, match=r"^model\.lora\.r=600: vLLM serves adapters up to rank 512"):
        VLLMEngine(lora_policy(tokenizer, r=600), tokenizer, lora_sync="adapter")


# -- whole runs ------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_an_adapter_synced_run_samples_what_the_merged_run_samples(small_overrides, tmp_path, VLLMEngine):
    """The tiny model with LoRA on vLLM, lag 1, 3 steps: the adapter-synced run (threads, then worker processes)
    draws the same tokens as the merged one (the same rewards and lengths at every step: the two differ by float
    rounding in the log-probs only) and stays on-policy at step 1 (rho within 1e-5 of 1)."""
    from oprl.cli import main
    from oprl.metrics import read_metrics

    common = ["steps=3", "model.lora.r=4", "model.lora.alpha=8", "rollout.engine=vllm", "sync.offset=1"]
    common += ["tensorboard=false", "runtime.torch_threads=1", "eval.interval=0"]
    runs = {}
    for name, extra in {
        "merged": ["model.lora_sync=merged"],
        "adapter": ["model.lora_sync=adapter"],  # given: unset, vllm on a CPU is merged
        "adapter-processes": ["model.lora_sync=adapter", "runtime.workers=processes"],
    }.items():
        assert main(["train", *small_overrides, *common, *extra, f"run_name={name}"]) == 0
        runs[name] = [r for r in read_metrics(tmp_path / "runs" / name / "metrics.jsonl") if "reward/mean" in r]
    for name in ("adapter", "adapter-processes"):
        for mine, merged in zip(runs[name], runs["merged"], strict=True):
            assert (mine["step"], mine["reward/mean"]) == (merged["step"], merged["reward/mean"])
            assert mine["response/length_mean"] == merged["response/length_mean"]
        assert abs(runs[name][0]["rho/behavior_max"] - 1) < 1e-5 and abs(runs[name][0]["rho/behavior_min"] - 1) < 1e-5


LORA_VLLM = [
    "model.lora.r=4",
    "model.lora.alpha=8",
    "rollout.engine=vllm",
    "tensorboard=false",
    "runtime.torch_threads=1",
]

ADAPTER = ["model.lora_sync=adapter"]  # given: unset, vllm on a CPU serves the policy merged


LAG_1 = ["steps=3", "sync.offset=1", "eval.interval=0"]


def sampled(root, name) -> list[tuple]:
    """``(step, mean reward, mean length, rho max, rho min)`` of each trained step of run ``name``."""
    from oprl.metrics import read_metrics

    rows = [r for r in read_metrics(root / name / "metrics.jsonl") if "reward/mean" in r]
    keys = ("step", "reward/mean", "response/length_mean", "rho/behavior_max", "rho/behavior_min")
    return [tuple(r[k] for k in keys) for r in rows]


@pytest.fixture(scope="module")
def merged_run(tmp_path_factory, cache_dir):
    """The tiny model with LoRA on vLLM, lag 1, 3 steps, on threads, model.lora_sync unset: merged on this CPU, which
    the run's output says in one line; what the adapter-synced runs of the other backends must sample."""
    pytest.importorskip("vllm")
    from conftest import SMALL
    from oprl.cli import main

    root = tmp_path_factory.mktemp("lora-runs")
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed):
        patch.setenv("OPRL_CACHE_DIR", str(cache_dir))
        args = [*SMALL, *LORA_VLLM, *LAG_1, f"output_dir={root}", "run_name=merged"]
        assert main(["train", *args]) == 0
    notice = load_config(None, args).model.lora_sync_notice("vllm")
    assert notice is not None and notice.startswith("model.lora_sync: merged (rollout.engine=vllm on CPU: ")
    assert printed.getvalue().splitlines().count(notice) == 1
    return root, sampled(root, "merged")


def assert_samples_as_merged(root, name, merged):
    """The same tokens as the merged run (rewards and lengths at every step: the two differ by float rounding in
    the log-probs only), on-policy at step 1 (rho within 1e-5 of 1)."""
    mine = sampled(root, name)
    assert [row[:3] for row in mine] == [row[:3] for row in merged]
    assert abs(mine[0][3] - 1) < 1e-5 and abs(mine[0][4] - 1) < 1e-5


@pytest.mark.slow
def test_on_ray_an_adapter_synced_run_samples_what_the_merged_run_samples(merged_run):
    """backend=ray: the explorer actor's vLLM engine loads the base once and each version's adapter."""
    ray = pytest.importorskip("ray")
    from conftest import SMALL
    from oprl.cli import main

    root, merged = merged_run
    # Frugal: a 0.1 GB vLLM KV cache (1.0 by default; these replies need kilobytes), and a small object store (a
    # LoRA r=4 version of the tiny model is kilobytes). Ray's memory monitor off for this test's own cluster only: it
    # kills workers when the whole machine passes 95% memory, which on a shared machine other processes decide, not
    # this run (two kills seen at 96-99%).
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=128 * 2**20,
        _system_config={"memory_monitor_refresh_ms": 0},
    )
    try:
        args = [*SMALL, *LORA_VLLM, *ADAPTER, *LAG_1, "backend=ray", "rollout.kv_cache_gb=0.1"]
        args += [f"output_dir={root}", "run_name=adapter-ray"]
        assert main(["train", *args]) == 0
    finally:
        ray.shutdown()
    assert_samples_as_merged(root, "adapter-ray", merged)


@pytest.mark.slow
def test_with_vllm_in_its_own_process_an_adapter_synced_run_samples_what_the_merged_run_samples(
    merged_run,
):
    """rollout.engine_process=true: vLLM's engine core in a process of its own reads each adapter directory
    itself (add_lora through vLLM's client); the base crosses as bytes once, never the merged model."""
    from conftest import SMALL
    from oprl.cli import main

    root, merged = merged_run
    name = "adapter-engine-process"
    args = [*SMALL, *LORA_VLLM, *ADAPTER, *LAG_1, "rollout.engine_process=true", f"output_dir={root}"]
    args.append(f"run_name={name}")
    assert main(["train", *args]) == 0
    assert_samples_as_merged(root, name, merged)


@pytest.mark.slow
def test_an_adapter_synced_run_healed_or_resumed_equals_the_undisturbed_run(small_overrides, tmp_path, monkeypatch):
    """Lag 2 (three live adapter versions) on worker processes, 6 steps, checkpoints every 2: (1) the explorer
    process killed as batch 3 reaches it is restarted, its new engine loads the base once and the adapter of the
    version the batch needs, and the run equals the undisturbed one (every metric but perf/*, the final adapter
    byte for byte); (2) the run killed (SIGKILL) after its step-2 checkpoint and resumed equals it too."""
    pytest.importorskip("vllm")
    from oprl.backends.faults import VARIABLE
    from oprl.cli import main
    from oprl.metrics import deterministic_view, read_metrics
    from recipes import kill_9_after

    args = [*small_overrides, *LORA_VLLM, *ADAPTER, "steps=6", "sync.offset=2", "checkpoint.interval=2"]
    args.append("eval.interval=0")
    args += ["runtime.workers=processes"]
    runs = tmp_path / "runs"
    assert main(["train", *args, "run_name=whole"]) == 0
    whole = deterministic_view(read_metrics(runs / "whole" / "metrics.jsonl"))
    assert [r["step"] for r in whole] == list(range(7))

    monkeypatch.setenv(VARIABLE, "explorer@step=3")
    assert main(["train", *args, "run_name=healed"]) == 0
    monkeypatch.delenv(VARIABLE)
    restarts = json.loads((runs / "healed" / "summary.json").read_text())["restarts"]
    assert len(restarts) == 1 and min(restarts[0]["batches"]) == 3, restarts
    assert deterministic_view(read_metrics(runs / "healed" / "metrics.jsonl")) == whole
    final = "final/adapter_model.safetensors"  # a LoRA run's final model is its adapter (peft's format)
    assert (runs / "healed" / final).read_bytes() == (runs / "whole" / final).read_bytes()

    kill_9_after([*args, "run_name=killed"], runs / "killed" / "checkpoints" / "step-000002" / "state.json", 900)
    assert len(read_metrics(runs / "killed" / "metrics.jsonl")) < 7
    assert main(["train", *args, "run_name=killed", "resume=true"]) == 0
    assert deterministic_view(read_metrics(runs / "killed" / "metrics.jsonl")) == whole
