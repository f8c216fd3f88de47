"""One meaning per name: a class name is defined in one oprl module only, a class named after an oprl module or
package lives in it, and "worker" names a role's worker (``TrainerWorker``, ``ExplorerWorker``, ...) only.

Before #43, ``Session`` (the agent endpoint's conversation; the started run's parts), ``Pending`` (the backends'
call-result protocol; the endpoint's waiting request) and ``Schedule`` (the driver's batch tracker, beside the
``oprl.schedule`` version math) each meant two things, and "worker" three (role workers, reward processes, sweep
runners)."""

import ast
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "oprl"

ALLOWED_TWICE: dict[str, str] = {}
"""Class name -> why two modules may define it. Empty: give a reason per entry, or rename one of them."""

ROLE_FOLDERS = {"buffer", "evaluator", "explorer", "judge", "teacher", "trainer"}
HOSTS = {"backends"}
"""Where a class hosting a role's worker lives (the Ray backend's actor body, ``_HostWorker``)."""


def classes() -> dict[str, list[str]]:
    """Class name -> the modules (paths under src/oprl) that define it, nested classes included."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef):
                found[node.name].append(path.relative_to(SRC).as_posix())
    return found


def test_no_class_name_is_defined_in_two_modules():
    twice = {name: paths for name, paths in classes().items() if len(paths) > 1 and name not in ALLOWED_TWICE}
    assert not twice, f"one meaning per name: rename one of each ({twice})"
    stale = [name for name in ALLOWED_TWICE if len(classes().get(name, [])) < 2]
    assert not stale, f"ALLOWED_TWICE entries no longer defined twice: {stale}"


def test_a_class_named_after_an_oprl_module_lives_in_it():
    modules = {p.stem for p in SRC.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()}
    misplaced = {
        name: paths
        for name, paths in classes().items()
        if name.lower() in modules
        and any(Path(p).parts[0] != name.lower() and Path(p).stem != name.lower() for p in paths)
    }
    assert not misplaced, f"a class named after an oprl module, defined elsewhere (rename it): {misplaced}"


def test_worker_names_a_roles_worker_only():
    where = {name: paths for name, paths in classes().items() if name.endswith("Worker")}
    assert {"TrainerWorker", "ExplorerWorker", "TeacherWorker"} <= set(where)
    strays = {
        name: paths for name, paths in where.items() if any(Path(p).parts[0] not in ROLE_FOLDERS | HOSTS for p in paths)
    }
    assert not strays, f"a *Worker class outside the role folders (reward processes, sweep runners...): {strays}"
    modules = {p.relative_to(SRC).as_posix() for p in SRC.rglob("*worker*.py")}
    assert modules <= {"worker_parts.py"}, modules  # the parts every role's worker is built from


def test_the_old_names_are_gone():
    from oprl.episodes.endpoint import server as endpoint
    from oprl.roles import BufferHandle, BufferRole
    from oprl.runtime import driver, run
    from oprl.tasks.rewards import processes

    assert not hasattr(endpoint, "Pending") and hasattr(endpoint, "PendingReply")
    assert not hasattr(run, "Session") and hasattr(run, "RunParts")
    assert not hasattr(driver, "Schedule") and hasattr(driver, "BatchTracker")
    assert hasattr(processes, "RewardPool") and not hasattr(processes, "WorkerPool")
    for owner in (BufferRole, BufferHandle):  # the synchronizer posts the weights board (runtime/synchronizer.py)
        assert not any(hasattr(owner, verb) for verb in ("open_board", "post_weights")), owner
