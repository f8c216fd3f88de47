"""The architecture shows itself: imports flow one way, and ``oprl.algorithms`` is pure (torch only)."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "oprl"

# Which oprl subpackages (or top-level modules) each layer may import. The CLI and runtime sit on top;
# algorithms at the bottom.
ALLOWED = {
    "algorithms": {"algorithms", "lazy"},
    "tasks": {"tasks", "errors", "plugins"},
    # Samplers run models; models know nothing of sampling (padding layouts live in models/batching.py).
    "models": {"models", "errors", "io", "lazy"},
    "rollout": {"rollout", "models", "errors", "lazy", "plugins"},  # plugins: capabilities(name) of a plug-in
    # The config tree reads the plug-ins' registries for its option lists; it never sees the runtime or the
    # entry points that consume it.
    "config": {"config", "algorithms", "tasks", "rollout", "models", "errors", "io", "plugins"},
    # Experiments drive runs as subprocesses and read their output files; they do not link the runtime. config:
    # ``oprl sweep --set`` checks the first run's settings as ``oprl train`` would, before any run starts;
    # algorithms: the bandit study (experiments/bandit.py) runs the real loss functions on a toy problem.
    "experiments": {"experiments", "algorithms", "config", "errors", "metrics", "io", "progress"},
    # oprl's losses and learning-rate schedule inside other trainers (TRL, verl): the pure math only, never oprl's
    # runtime.
    "integrations": {"integrations", "algorithms"},
    # What travels between roles, and the schedule math: leaves above torch.
    "messages": {"messages"},
    "schedule": {"schedule"},
    # What every worker shares: its clock, the sampling lock, loading a model and an engine, and loading a
    # frozen second model (the teacher's, the judge's: ``load_frozen``).
    # noise: an engine's start prints third-party notices, kept in workers.log (``stderr_kept``, #71).
    "worker_parts": {
        "worker_parts",
        "checkpoint",
        "config",
        "errors",
        "models",
        "rollout",
        "messages",
        "noise",
        "plugins",
    },
    # Backends place workers and rank groups; they know nothing of what the workers do.
    "backends": {"backends", "config", "errors", "messages"},
    # What each role answers and the typed handles the driver calls it through (above the backends).
    "roles": {"roles", "backends", "messages"},
    # On disk: run directories, checkpoints, the experience store and its directories (below every role).
    "checkpoint": {"checkpoint", "config", "errors", "io", "messages", "metrics"},
    # Running a task's episodes: the layer the roles share (episode loops, the agent endpoint, evaluation).
    # messages: the judge's rows and verdicts (``JudgeRow``, ``Verdicts``) travel between the explorers and it.
    "episodes": {"episodes", "config", "errors", "messages", "models", "rollout", "schedule", "tasks", "worker_parts"},
    # The roles, peers over the layers above: none imports another (ROLES below), none the runtime.
    "buffer": {"buffer", "checkpoint", "config", "errors", "io", "messages"},
    "explorer": {
        "explorer",
        "config",
        "episodes",
        "errors",
        "messages",
        "models",
        "checkpoint",  # the weights board a switcher reads mid-batch (partial rollouts)
        "rollout",
        "schedule",
        "tasks",
        "worker_parts",
    },
    "trainer": {
        "trainer",
        "algorithms",
        "backends",
        "checkpoint",
        "config",
        "episodes",
        "errors",
        "io",
        "machine",
        "messages",
        "models",
        "progress",
        "rollout",
        "schedule",
        "tasks",
        "worker_parts",
    },
    "evaluator": {"evaluator", "checkpoint", "config", "episodes", "errors", "tasks", "worker_parts"},
    # The teacher (distillation): loads a second model, scores experiences, rewrites a store (teacher-score).
    # rollout: teacher.engine=vllm prefills in the rollout's in-process vLLM engine (rollout/vllm_engine.py).
    "teacher": {"teacher", "checkpoint", "config", "errors", "io", "messages", "models", "rollout", "worker_parts"},
    # The judge: the run's one judge model, asked by the explorers (its model and parsers are episodes').
    "judge": {"judge", "config", "episodes", "messages"},
    # Servers that speak another API over oprl's parts (``oprl serve tinker``): above the roles like the CLI; they
    # train through the pure loss and the models, warm-start through the API, never through the runtime.
    # backends: ``--workers processes|ray`` places each model on the backends the runtime places its workers on.
    "serve": {
        "serve",
        "algorithms",
        "api",
        "backends",
        "checkpoint",
        "errors",
        "models",
        "rollout",
        "tasks",
        "trainer",
    },
    # Leaves every layer may use.
    "errors": {"errors"},
    "progress": {"progress"},
    # torch bound at first use (``oprl config`` and ``--help`` never load it).
    "lazy": {"lazy"},
    "io": {"io", "errors"},
    # Third-party console notices kept in workers.log (stdlib only).
    "noise": {"noise"},
    # What the CPU is (stdlib only), for the files that record where a number was measured.
    "machine": {"machine"},
    # A configured name -> a class: built-in registry, entry point, import path (tasks, engines, rewards).
    "plugins": {"plugins", "errors"},
}

ROLES = {"buffer", "evaluator", "explorer", "judge", "teacher", "trainer"}
"""The role folders: each is a worker a backend hosts; they talk through the driver (oprl.runtime), never
through each other's modules."""

# Process entry points that host the CLI in another process: they sit above everything, like cli.py.
ENTRY_POINTS = {"experiments/sweep_runner.py"}


def files_of(layer: str) -> list[Path]:
    """The source files of ``layer``: a subpackage's modules, or a top-level module."""
    module = SRC / f"{layer}.py"
    return [module] if module.exists() else sorted((SRC / layer).rglob("*.py"))


def layer_of(path: Path) -> str:
    return path.relative_to(SRC).parts[0].removesuffix(".py")


def imports_of(path: Path, root: Path = SRC) -> set[str]:
    """Absolute names of every module ``path`` imports (relative imports and ``from oprl import x`` resolved)."""
    package = ["oprl", *path.relative_to(root).parent.parts]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            names.add(module)
            if node.module is None or module == "oprl":  # `from . import x`, `from oprl import x`: submodules
                names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layer_imports_only_what_it_may(layer):
    paths = [path for path in files_of(layer) if path.relative_to(SRC).as_posix() not in ENTRY_POINTS]
    assert paths, f"no source files for layer {layer}"
    for path in paths:
        for name in imports_of(path):
            if name.startswith("oprl."):
                assert name.split(".")[1] in ALLOWED[layer], f"{path.relative_to(SRC)} imports {name}"


def test_no_role_imports_another_role():
    for role in sorted(ROLES):
        for path in files_of(role):
            others = {name.split(".")[1] for name in imports_of(path) if name.startswith("oprl.")} & ROLES
            assert others <= {role}, f"{path.relative_to(SRC)} imports the role(s) {sorted(others - {role})}"


def test_algorithms_import_only_torch_and_stdlib():
    allowed_roots = {"torch", "oprl", "typing", "dataclasses", "math", "difflib", "__future__", "collections"}
    allowed_roots |= {"functools"}
    for path in (SRC / "algorithms").rglob("*.py"):
        for name in imports_of(path):
            assert name.split(".")[0] in allowed_roots, f"{path.name} imports {name}"


def test_only_cli_and_runtime_reach_into_runtime():
    for path in SRC.rglob("*.py"):
        if layer_of(path) in ALLOWED:
            assert not any(n.startswith("oprl.runtime") for n in imports_of(path)), path


def package_graph(root: Path = SRC) -> dict[str, set[str]]:
    """``layer -> layers it imports`` over every module of oprl (imports inside functions included)."""
    graph: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        layer = layer_of(path) if path.parent != root or path.name != "__init__.py" else "oprl"
        targets = {name.split(".")[1] for name in imports_of(path, root) if name.startswith("oprl.")}
        graph.setdefault(layer, set()).update(targets - {layer})
    return graph


def cycle_in(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path ``[a, b, ..., a]``, or None (depth-first search, three colours)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (found := visit(target)):
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_package_import_graph_has_no_cycle():
    """Folders (and top-level modules) form a DAG: no role reaches back into one that imports it."""
    graph = package_graph()
    assert {"runtime", "trainer", "explorer", "backends", "checkpoint"} <= set(graph)
    assert cycle_in(graph) is None, " -> ".join(cycle_in(graph) or [])


def test_cycle_in_finds_a_cycle():
    assert cycle_in({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle_in({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


RAY_MODULES = {"backends/ray_backend.py", "experiments/sweep_ray.py"}
"""The modules that import ray (an optional extra, ``oprl[ray]``): the run's Ray backend (workers as actors) and
the sweep's (runs as tasks; ``oprl sweep`` imports it only for ``backend: ray``)."""


def test_only_the_ray_modules_import_ray():
    for path in SRC.rglob("*.py"):
        if any(n == "ray" or n.startswith("ray.") for n in imports_of(path)):
            assert path.relative_to(SRC).as_posix() in RAY_MODULES, path


def test_only_entry_points_reach_into_experiments():
    """``oprl.experiments`` (sweeps, reports, the bandit) are commands: only the CLI (and themselves) may import
    them."""
    for path in SRC.rglob("*.py"):
        layer = layer_of(path)
        if layer not in ("experiments", "cli"):
            assert not any(n.split(".")[:2] == ["oprl", "experiments"] for n in imports_of(path)), path


def test_imports_of_resolves_relative_and_package_imports(tmp_path):
    """The checker itself sees every form of import a layer could hide a dependency in."""
    module = tmp_path / "oprl" / "runtime" / "example.py"
    module.parent.mkdir(parents=True)
    module.write_text("from . import buffer\nfrom ..config import Config\nfrom oprl import errors\nimport oprl.io\n")
    names = imports_of(module, root=tmp_path / "oprl")
    assert {"oprl.runtime.buffer", "oprl.config", "oprl.errors", "oprl.io"} <= names
