"""Data-parallel trainer ranks (gloo, CPU): world_size 2 computes the one-process loss, gradient norm and weights.

The batch has unequal response lengths, so the two ranks hold different token counts: normalising each rank's
loss by its own count (or dividing by the world size again) moves the numbers far beyond the 1e-5 tolerance.
"""

import copy
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from oprl.config import load_config
from oprl.errors import OprlError
from oprl.models.tiny import build_model, build_tokenizer
from oprl.trainer.ranks import SHARDS, ShardedTrainer, check_trainer_machine, rank_threads
from oprl.trainer.role import TrainerWorker
from trainer_helpers import make_batch

TOL = 1e-5
COMPARED = ("loss/total", "loss/pg_loss", "loss/clip_frac", "entropy/mean", "optim/grad_norm", "loss/ratio_max")


def _save_model(directory, hidden, layers, heads):
    tokenizer = build_tokenizer()
    build_model(tokenizer, hidden_size=hidden, num_layers=layers, num_heads=heads, seed=3).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return _save_model(tmp_path_factory.mktemp("tiny"), 32, 2, 2)


def _config(path, sharding, world_size, **extra):
    overrides = [
        f"model.path={path}",
        f"trainer.sharding={sharding}",
        f"trainer.world_size={world_size}",
        "rollout.prompts_per_step=3",
        "rollout.group_size=4",
        "optim.micro_batch_size=2",
        "optim.mini_batches=2",
        "optim.lr=1e-4",
        "runtime.torch_threads=1",
    ]
    return load_config(None, overrides + [f"{k}={v}" for k, v in extra.items()])


def _batches(tokenizer):
    # Three steps, groups of unequal lengths (1-5 tokens + EOS); group ids differ per step.
    batches = []
    for step in range(3):
        batch = make_batch(tokenizer, groups=3, k=4, seed=step)
        for e in batch:
            e.group_id += 10 * step
        batches.append(batch)
    return batches


def _run(worker, batches):
    metrics = [worker.train(step + 1, copy.deepcopy(batch)).metrics for step, batch in enumerate(batches)]
    return metrics, {k: v.clone() for k, v in worker.weights().items()}


def _compare(reference, sharded):
    (ref_metrics, ref_weights), (metrics, weights) = reference, sharded
    for step, (a, b) in enumerate(zip(ref_metrics, metrics, strict=True)):
        for key in COMPARED:
            assert b[key] == pytest.approx(a[key], abs=TOL, rel=TOL), (step, key, a[key], b[key])
    assert ref_weights.keys() == weights.keys()
    for name, value in ref_weights.items():
        assert torch.allclose(weights[name], value, atol=TOL, rtol=0), (name, (weights[name] - value).abs().max())


def _reference(config, path):
    worker = TrainerWorker(
        config.model_copy(update={"trainer": config.trainer.model_copy(update={"sharding": "none", "world_size": 1})}),
        path,
    )
    return _run(worker, _batches(worker.tokenizer))


def assert_ranks_equal_one_process(config, path, before=None, reference_config=None) -> None:
    """Train ``_batches`` on ``config``'s ranks and on one in-process trainer (of ``reference_config``, default
    ``config``); ``_compare`` the two. ``before(trainer)`` runs on the started ranks before training."""
    reference = _reference(reference_config or config, path)
    trainer = ShardedTrainer(config, path)
    try:
        if before is not None:
            before(trainer)
        _compare(reference, _run(trainer, _batches(build_tokenizer())))
    finally:
        trainer.stop()


@pytest.mark.parametrize("sharding", ["ddp", "fsdp"])
def test_two_ranks_equal_one_process(tiny_path, sharding):
    def weights_source(trainer):
        if sharding == "fsdp":  # rank 1 starts on the meta device: its weights are rank 0's, broadcast shard-wise
            assert [m["weights_from"] for m in trainer.memory()] == ["model.path", "rank 0"]

    assert_ranks_equal_one_process(_config(tiny_path, sharding, 2), tiny_path, before=weights_source)


def test_fsdp_ranks_with_activation_checkpointing_equal_one_process(tiny_path):
    """trainer.activation_checkpointing under fully_shard: the recomputed layers gather their shard again in
    backward; losses, gradient norms and weights still equal one process without checkpointing."""
    assert_ranks_equal_one_process(
        _config(tiny_path, "fsdp", 2, **{"trainer.activation_checkpointing": True}),
        tiny_path,
        reference_config=_config(tiny_path, "fsdp", 2),
    )


@pytest.mark.slow  # ~1 min each on an idle 2-core machine (both processes train an 11 M model)
@pytest.mark.parametrize("sharding", ["ddp", "fsdp"])
def test_two_ranks_equal_one_process_11m(tmp_path, sharding):
    path = _save_model(tmp_path, 512, 4, 8)  # ~11 M parameters
    assert_ranks_equal_one_process(_config(path, sharding, 2, **{"algorithm.loss_agg": "seq-mean-token-mean"}), path)


@pytest.mark.slow  # ~1 min on 2 cores
def test_fsdp_ranks_with_lora_and_a_reference_model_equal_one_process(tiny_path):
    """Rank 1's meta-device model gets rank 0's LoRA adapters and reference weights by broadcast, too."""
    assert_ranks_equal_one_process(
        _config(tiny_path, "fsdp", 2, **{"model.lora.r": 4, "algorithm.kl_coef": 0.05}), tiny_path
    )


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"model.device": "cuda", "trainer.world_size": 2, "trainer.sharding": "fsdp"}, "needs 2 GPUs"),
        ({"model.device": "auto", "trainer.dist_backend": "nccl", "trainer.sharding": "ddp"}, "needs CUDA tensors"),
    ],
)
def test_what_the_machine_cannot_train_is_one_line(overrides, message, monkeypatch):
    """The machine's part of the trainer's rules (the rest are config validators, tests/config/test_validators.py):
    GPUs to count, and model.device=auto resolved on a machine without CUDA."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = load_config(None, ["rollout.prompts_per_step=3"] + [f"{k}={v}" for k, v in overrides.items()])
    with pytest.raises(OprlError, match=message) as info:
        check_trainer_machine(config, gpus=0)
    assert "\n" not in str(info.value)


@pytest.mark.slow  # a two-node Ray cluster plus two rank actors: ~1-2 min on 2 cores
def test_ray_ranks_on_two_nodes_match_local_ranks(tiny_path):
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    config = _config(tiny_path, "fsdp", 2)
    local = ShardedTrainer(config, tiny_path)
    try:
        expected = _run(local, _batches(build_tokenizer())[:2])
    finally:
        local.stop()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)  # two logical nodes of one CPU each: one bundle (rank) per node
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    try:
        from oprl.backends.ray_backend import RayRanks

        ray_config = config.model_copy(update={"backend": "ray"})
        trainer = ShardedTrainer(ray_config, tiny_path, RayRanks(rank_threads(config)))
        try:
            nodes = ray.get([r.handle.call.remote("node") for r in trainer.ranks])
            assert len(set(nodes)) == 2
            _compare(expected, _run(trainer, _batches(build_tokenizer())[:2]))
        finally:
            trainer.stop()
    finally:
        ray.shutdown()
        cluster.shutdown()


def _rank_pids(parent: int) -> list[int]:
    """The spawned trainer-rank processes of ``parent`` (multiprocessing children, not its resource tracker)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and "spawn_main" in command and "resource_tracker" not in command:
            pids.append(int(entry.name))
    return pids


@pytest.mark.slow  # three tiny-model runs with two spawned ranks each: ~2-3 min on 2 cores
def test_kill_9_of_a_rank_then_resume_equals_the_uninterrupted_run(tmp_path, cache_dir):
    from conftest import SMALL
    from oprl.cli import main
    from oprl.metrics import deterministic_view, read_metrics

    args = [
        *SMALL,
        "tensorboard=false",
        "runtime.torch_threads=1",
        "steps=6",
        "checkpoint.interval=2",
        "eval.interval=3",
        "trainer.sharding=fsdp",
        "trainer.world_size=2",
        f"output_dir={tmp_path / 'runs'}",
    ]
    assert main(["train", *args, "run_name=whole"]) == 0
    env = os.environ | {"OPRL_CACHE_DIR": str(cache_dir)}
    process = subprocess.Popen(
        [sys.executable, "-m", "oprl.cli", "train", *args, "run_name=killed"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = tmp_path / "runs" / "killed" / "checkpoints" / "step-000002" / "state.json"
    deadline = time.monotonic() + 300
    while not first.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    ranks = _rank_pids(process.pid)
    assert process.poll() is None and len(ranks) == 2, "the run ended before a rank could be killed"
    os.kill(ranks[-1], signal.SIGKILL)
    assert process.wait(timeout=120) == 1
    error = [line for line in process.stderr.read().strip().splitlines() if " INFO oprl: " not in line]
    assert len(error) == 1 and "trainer rank" in error[0], error  # progress log lines aside: one line
    assert main(["train", *args, "run_name=killed", "resume=true"]) == 0
    whole = read_metrics(tmp_path / "runs" / "whole" / "metrics.jsonl")
    resumed = read_metrics(tmp_path / "runs" / "killed" / "metrics.jsonl")
    assert [r["step"] for r in resumed] == list(range(7))
    assert deterministic_view(resumed) == deterministic_view(whole)
    assert (tmp_path / "runs" / "killed" / "final" / "config.json").is_file()


@pytest.mark.slow  # three spawned ranks in all: ~1 min on 2 cores
def test_sharded_checkpoint_resumes_at_another_world_size(tiny_path, tmp_path):
    """DCP reshards: a checkpoint of 2 fsdp ranks restored by 1 fsdp rank continues like the 2-rank trainer."""
    config = _config(tiny_path, "fsdp", 2)
    batches = _batches(build_tokenizer())
    two = ShardedTrainer(config, tiny_path)
    try:
        two.train(1, copy.deepcopy(batches[0]))
        two.save(str(tmp_path / "trainer"))
        expected = _run_from(two, batches, 2)
    finally:
        two.stop()
    one = ShardedTrainer(
        config.model_copy(update={"trainer": config.trainer.model_copy(update={"world_size": 1})}), tiny_path
    )
    try:
        assert one.restore(str(tmp_path / "trainer")) == 1
        restored = one.weights()
        _compare(expected, _run_from(one, batches, 2))
    finally:
        one.stop()
    # mode=eval reads the shards into an ordinary model (no process group).
    from oprl.checkpoint.files import load_full_weights
    from oprl.worker_parts import load_model

    model, _ = load_model(config, tiny_path)
    load_full_weights(model, tmp_path / "trainer" / SHARDS)
    for name, param in model.named_parameters():
        assert torch.equal(param.detach(), restored[name]), name


def _run_from(worker, batches, first_step):
    metrics = [
        worker.train(step, copy.deepcopy(batches[step - 1])).metrics for step in range(first_step, len(batches) + 1)
    ]
    return metrics, {k: v.clone() for k, v in worker.weights().items()}


def test_gpu_check_runs_on_cpu_without_pydantic():
    """benchmarks/gpu_check.py at a tiny shape: one JSON object, a finite loss, and no pydantic import (the GPU
    machine it is written for has none); with ``--tinker``, the Tinker server's step through its backend: sane
    numbers, on-policy ratio 1, and none of the server's HTTP side (fastapi, the SDK, protobuf) imported."""
    import json
    import math

    script = Path(__file__).parents[2] / "benchmarks" / "gpu_check.py"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the script finds its own src/
    done = subprocess.run(
        [
            sys.executable,
            str(script),
            "--shape",
            "tiny",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--threads",
            "1",
            "--groups",
            "2",
            "--group-size",
            "2",
            "--prompt",
            "6",
            "--response",
            "4",
            "--micro-batch",
            "2",
            "--tinker",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["pydantic_imported"] is False and result["not_on_gpu_image"] == []
    assert "torch" in result["oprl_imports"]  # the import check reads the real modules
    assert result["step"] == 2 and result["response_tokens"] > 0 and result["train_s"] > 0
    assert torch.isfinite(torch.tensor([result["loss"], result["grad_norm"], result["trainer_mfu"]])).all()
    assert 0 < result["elapsed_s"] <= result["total_s"] and result["per_rank"][0]["peak_rss_gib"] > 0
    steps = [json.loads(line) for line in done.stderr.splitlines() if line.startswith('{"shape"')]
    assert [s["step"] for s in steps] == [1, 2]  # one line per finished step, as it finishes
    tinker = result["tinker"]  # not_on_gpu_image == [] above: no fastapi, starlette, tinker, google.protobuf
    assert tinker["rows"] == 4 and tinker["sampled_tokens"] > 0 and tinker["version"] == 1
    timings = [tinker[f"{phase}_s"] for phase in ("save_model", "create_model", "sample", "forward_backward")]
    assert all(t > 0 for t in [*timings, tinker["optim_step_s"]])
    numbers = ["sample_tokens_per_s", "forward_backward_tokens_per_s", "loss", "grad_norm", "peak_rss_gib"]
    assert all(math.isfinite(tinker[name]) for name in numbers) and tinker["grad_norm"] > 0
    assert tinker["max_abs_ratio_minus_1"] < 1e-4  # the sampler's log-probs are the trainer's (float32)
    assert any(line.startswith('{"tinker"') for line in done.stderr.splitlines())


def test_fsdp_refuses_a_model_without_decoder_layers_in_one_line():
    from oprl.trainer.distributed import decoder_layers

    with pytest.raises(OprlError, match="has no decoder layers to shard") as info:
        decoder_layers(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    assert "\n" not in str(info.value)
