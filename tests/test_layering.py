"""The architecture shows itself: imports flow one way, and ``oprl.algorithms`` is pure (torch only)."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "oprl"

# Which oprl subpackages each layer may import. The CLI and runtime sit on top; algorithms at the bottom.
ALLOWED = {
    "algorithms": {"algorithms"},
    "tasks": {"tasks", "errors"},
    # Samplers run models; models know nothing of sampling (padding layouts live in models/batching.py).
    "models": {"models", "errors", "io"},
    "rollout": {"rollout", "models"},
}


def imports_of(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layer_imports_only_what_it_may(layer):
    for path in (SRC / layer).rglob("*.py"):
        for name in imports_of(path):
            if name.startswith("oprl."):
                assert name.split(".")[1] in ALLOWED[layer], f"{path.relative_to(SRC)} imports {name}"


def test_algorithms_import_only_torch_and_stdlib():
    allowed_roots = {"torch", "oprl", "typing", "dataclasses", "math", "difflib", "__future__", "collections"}
    for path in (SRC / "algorithms").rglob("*.py"):
        for name in imports_of(path):
            assert name.split(".")[0] in allowed_roots, f"{path.name} imports {name}"


def test_only_cli_and_runtime_reach_into_runtime():
    for path in SRC.rglob("*.py"):
        top = path.relative_to(SRC).parts[0]
        if top in ALLOWED:
            assert not any(n.startswith("oprl.runtime") for n in imports_of(path)), path


def test_only_the_ray_backend_imports_ray():
    for path in SRC.rglob("*.py"):
        if any(n == "ray" or n.startswith("ray.") for n in imports_of(path)):
            assert path.relative_to(SRC).as_posix() == "runtime/ray_backend.py", path
