"""The plug-in contracts hold: every registered engine is an ``Engine``, both backends are ``Backend``s, every
worker class implements its role (same method names and parameters as the protocol in ``oprl.roles``), and
every typed handle offers exactly its role's verbs and sends nothing else."""

import inspect

import pytest
import torch

from oprl import roles
from oprl.backends.base import Backend
from oprl.backends.local import LocalBackend
from oprl.buffer.buffer import ExperienceBuffer
from oprl.evaluator.evaluator import Evaluator
from oprl.explorer.explorer import ExplorerWorker
from oprl.judge import JudgeWorker
from oprl.models.tiny import build_model, build_tokenizer
from oprl.rollout import ENGINES, Engine, VLLMEngine
from oprl.teacher import TeacherWorker
from oprl.trainer.ranks import ShardedTrainer
from oprl.trainer.role import TrainerWorker


def members(protocol) -> set[str]:
    return {n for n in vars(protocol) if not n.startswith("_")} | set(protocol.__annotations__)


def keywords(function) -> set[str]:
    return {p.name for p in inspect.signature(function).parameters.values() if p.kind is p.KEYWORD_ONLY}


def test_the_torch_engines_are_engines_and_load_weights_changes_what_they_sample():
    tokenizer = build_tokenizer()
    prompts = [[7, 8, 9], [10, 11]]
    for name in ("lean", "hf-generate"):
        model = build_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0)
        engine = ENGINES[name](model, tokenizer, max_new_tokens=4)
        assert isinstance(engine, Engine), name
        before = engine.generate(prompts, seed=3)
        other = build_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=1)
        engine.load_weights({k: v.detach().clone() for k, v in other.named_parameters()})
        assert all(torch.equal(p, q) for p, q in zip(model.parameters(), other.parameters(), strict=True)), name
        assert engine.generate(prompts, seed=3).behavior_logprobs != before.behavior_logprobs, name


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_every_registered_engine_has_the_engine_methods(name):
    engine_type = (
        VLLMEngine
        if name == "vllm"
        else type(
            ENGINES[name](build_model(build_tokenizer(), hidden_size=8, num_layers=1, num_heads=1), build_tokenizer())
        )
    )
    assert issubclass(engine_type, Engine)
    assert (
        keywords(engine_type.generate)
        == keywords(Engine.generate)
        == {"seed", "sampling", "batch_size", "row_seeds", "switch", "record_top_k"}
    )


def test_backends_offer_what_the_driver_calls():  # and ``peer``, what a worker calls another through
    local = LocalBackend()
    assert isinstance(local, Backend)
    ray_backend = pytest.importorskip("oprl.backends.ray_backend")
    missing = [n for n in members(Backend) if not hasattr(ray_backend.RayBackend, n)]
    assert not missing, missing


WORKERS = [
    (TrainerWorker, roles.TrainerRole),
    (ShardedTrainer, roles.TrainerRole),
    (ExplorerWorker, roles.ExplorerRole),
    (ExperienceBuffer, roles.BufferRole),
    (Evaluator, roles.EvaluatorRole),
    (TeacherWorker, roles.TeacherRole),
    (JudgeWorker, roles.JudgeRole),
]
HANDLES = [
    roles.TrainerHandle,
    roles.ExplorerHandle,
    roles.BufferHandle,
    roles.EvaluatorHandle,
    roles.TeacherHandle,
    roles.JudgeClient,  # the judge as the explorers call it: blocking calls over a backend's peer
]


def verbs(protocol) -> set[str]:
    return {n for n, v in vars(protocol).items() if inspect.isfunction(v) and not n.startswith("_")}


@pytest.mark.parametrize("worker, role", WORKERS, ids=lambda w: w.__name__)
def test_workers_implement_their_roles(worker, role):
    assert issubclass(worker, role)
    for name in verbs(role):
        expected = list(inspect.signature(getattr(role, name)).parameters)
        assert list(inspect.signature(getattr(worker, name)).parameters) == expected, (worker, name)


@pytest.mark.parametrize("handle", HANDLES, ids=lambda h: h.__name__)
def test_handles_offer_their_roles_verbs_with_the_same_parameters(handle):
    assert verbs(handle) == verbs(handle.role)
    for name in verbs(handle.role):
        expected = list(inspect.signature(getattr(handle.role, name)).parameters)
        assert list(inspect.signature(getattr(handle, name)).parameters) == expected, (handle, name)


class Recorder:
    name = "recorder"

    def __init__(self):
        self.sent = []

    def call(self, method, *args, num_returns=1):
        self.sent.append((method, args, num_returns))
        return tuple(range(num_returns)) if num_returns > 1 else None


def test_a_handle_sends_its_roles_verb_by_name_and_refuses_another_roles():
    actor = Recorder()
    trainer = roles.TrainerHandle(actor)
    trainer.train(3, "batch future")
    assert actor.sent == [("train", (3, "batch future"), 1)]
    assert roles.BufferHandle(actor).take(2) == (0, 1) and actor.sent[-1] == ("take", (2,), 2)
    with pytest.raises(TypeError, match=r"BufferRole\.save is not a verb of TrainerRole"):
        trainer._call(roles.BufferRole.save, "dir")
    judge = roles.JudgeClient(actor)  # a peer's call(method, *args): the recorder takes it as one
    judge.judge([("p", "c", None)])
    assert actor.sent[-1] == ("judge", ([("p", "c", None)],), 1)
    with pytest.raises(TypeError, match=r"TeacherRole\.score is not a verb of JudgeRole"):
        judge._call(roles.TeacherRole.score, 1, [])


def test_handles_run_on_the_local_backend_in_threads_and_processes(tmp_path):
    """The typed call reaches a real worker on both local flavours (Ray: tests/integration/test_ray.py)."""
    for workers in ("threads", "processes"):
        backend = LocalBackend(workers)
        buffer = roles.BufferHandle(backend.start("buffer", ExperienceBuffer))
        try:
            assert backend.get(buffer.save(str(tmp_path / workers))) == []
            assert backend.get(buffer.restore(str(tmp_path / workers))) == []
        finally:
            backend.shutdown([buffer.actor])


def test_no_worker_method_is_called_by_a_string_outside_the_backends():
    """Typed calls: ``x.call("train", ...)`` (a method named by a literal) appears only where a call is
    transported (``oprl.backends``); everyone else calls a handle's method or passes a protocol's method."""
    import ast
    from pathlib import Path

    src = Path(roles.__file__).parent
    found = []
    for path in src.rglob("*.py"):
        if path.relative_to(src).parts[0] == "backends":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "call"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                found.append(f"{path.relative_to(src)}:{node.lineno}")
    assert not found, found
