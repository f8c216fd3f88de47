"""Shared fixtures: an isolated model cache and a small, fast recipe for end-to-end runs.

Every test that needs the embedded model uses the same small task and warm-start recipe, so the tiny model
is built once per test session (a few seconds) in a temporary cache directory.

Layout: tests/<package>/ mirrors src/oprl/<package>/ with unit tests (one component, fakes, hand-computed
values; tests/test_mirror.py checks the mirror); tests/integration/ holds the multi-step runs through the
runtime, subprocesses and sweeps, marked ``integration`` here (``pytest -m "not slow and not integration"``
runs the fast units alone).
"""

from pathlib import Path

import pytest

INTEGRATION = Path(__file__).resolve().parent / "integration"

# Small task + short warm start: the model it yields solves few problems, which is fine for plumbing tests.
SMALL = [
    "task.train_size=600",
    "task.test_size=64",
    "warmstart.max_steps=40",
    "warmstart.check_interval=20",
    "warmstart.val_problems=64",
    "warmstart.target_accuracy=0.99",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "eval.num_problems=32",
    "eval.interval=2",
    "progress=false",
]


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("oprl-cache")


@pytest.fixture(autouse=True)
def _isolated_cache(cache_dir, monkeypatch):
    monkeypatch.setenv("OPRL_CACHE_DIR", str(cache_dir))


@pytest.fixture
def small_overrides(tmp_path):
    return [*SMALL, f"output_dir={tmp_path / 'runs'}"]


def pytest_collection_modifyitems(config, items):
    for item in items:
        if INTEGRATION in Path(item.fspath).resolve().parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    """A Tinker server for the test module (tests/serve/tinker/), on a random tiny model (``tinker_server``)."""
    pytest.importorskip("tinker")
    from tinker_server import TINY, Running, tiny_model_dir

    from oprl.serve.tinker import build_server

    root = tmp_path_factory.mktemp("tinker")
    model = tiny_model_dir(root / "model")
    # Also under its own path: tinker-cookbook loads the tokenizer by base_model name (AutoTokenizer), and a local
    # directory is a name it loads without the hub (tests/serve/tinker/test_tinker_cookbook.py).
    server = build_server(models=[f"{TINY}={model}", f"{model}={model}"], state_dir=root / "state")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TINKER_BASE_URL", "")
        patch.setenv("TINKER_API_KEY", "tml-test-key")
        patch.setenv("TINKER_TELEMETRY", "0")
        up = Running(server)
        up.model_dir = model
        patch.setenv("TINKER_BASE_URL", up.url)
        yield up
        up.stop()


@pytest.fixture(scope="module")
def service(running):
    import tinker

    client = tinker.ServiceClient(base_url=running.url, api_key="tml-test-key")
    yield client
    client.close("success").result()  # its heartbeats stop before the server does (else they print for minutes)


# The rollout engine tests' shared fixtures (tests/rollout/test_engines.py, test_top_k.py). Here rather than in a
# tests/rollout/conftest.py: a second conftest.py would shadow this one under the module name `conftest`, which the
# whole-run tests import SMALL from (`from conftest import SMALL`).
#
# The policy has 2 heads of 32 dimensions (vLLM's CPU attention has no kernel for 16). It is built once per module,
# not per session, so that a module that changes its weights cannot reach another's; the vLLM engines need no more
# than this to stay one per test session: ``oprl.rollout.vllm_shared`` keeps one ``LLM`` per process for a model
# configuration (and dtype, KV-cache size, LoRA slots), and every module's policy has the same configuration.


def _engine_names():
    from oprl.rollout import ENGINES

    return sorted(ENGINES)


@pytest.fixture(params=_engine_names())
def Engine(request):
    """Each registered engine class in turn (lean, hf-generate, vllm): a test taking it runs on every engine."""
    from oprl.rollout import ENGINES

    return ENGINES[request.param]


@pytest.fixture(scope="module")
def policy():
    """``(model, tokenizer)``: the tiny Llama (hidden 64, 2 layers, 2 heads, seed 3) and its tokenizer."""
    from oprl.models.tiny import build_model, build_tokenizer

    tokenizer = build_tokenizer()
    return build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, seed=3), tokenizer
