"""The Tinker server's compute (backend, models, training, checkpoints, sampling, losses, a placed model's worker)
runs on plain data and imports none of the HTTP side's packages, so a bare GPU image (torch, transformers, peft; no
SDK, protobuf, fastapi or pydantic) drives it (``benchmarks/gpu_check.py --tinker``)."""

import json
import subprocess
import sys

import pytest

COMPUTE = ("backend", "models", "training", "checkpoints", "sampling", "losses", "names", "records", "errors")
COMPUTE += ("finite", "placement")
HTTP_SIDE = ("pydantic", "fastapi", "starlette", "uvicorn", "tinker", "google.protobuf")


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_the_compute_modules_import_no_sdk_protobuf_fastapi_or_pydantic():
    imports = "".join(f"import oprl.serve.tinker.{name}\n" for name in COMPUTE)
    loaded = json.loads(
        _run(
            f"import json, sys\n{imports}"
            f"print(json.dumps(sorted(m for m in sys.modules if any(m == p or m.startswith(p + '.') "
            f"for p in {HTTP_SIDE!r}))))\n"
        )
    )
    assert loaded == []


def test_the_package_loads_its_server_on_first_use():
    """``oprl.serve.tinker`` names the server's entry points (PEP 562) without importing them until asked."""
    pytest.importorskip("fastapi")
    _run(
        "import sys\n"
        "import oprl.serve.tinker as package\n"
        "assert 'oprl.serve.tinker.app' not in sys.modules and 'oprl.serve.tinker.cli' not in sys.modules\n"
        "from oprl.serve.tinker import build_server, create_app\n"
        "assert create_app is sys.modules['oprl.serve.tinker.app'].create_app and callable(build_server)\n"
        "assert not hasattr(package, 'nothing')\n"
    )
