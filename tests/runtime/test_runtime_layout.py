"""The runtime's layout (issue #69): the synchronizer is the one reader of the schedule's settings
(``config.sync.mode``, ``sync.partial``, ...) after the config, each module names its one meaning in its
docstring, and no function runs over 60 lines."""

import ast
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[2] / "src" / "oprl" / "runtime"
SCHEDULE = {"mode", "partial", "switch_step", "partial_kv", "max_staleness", "interval", "offset", "max_token_lag"}
"""``SyncConfig``'s settings; its presentation (``label()``, ``describe()``: a run's name and headline) is not the
schedule."""


def schedule_reads(source: str) -> list[str]:
    """``<config>.sync.<setting>`` reads in ``source``, as ``line: text`` (``<config>``: ``config``, ``cfg`` or any
    attribute so named, e.g. ``self.cfg`` or ``opened.config``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in SCHEDULE and isinstance(node.value, ast.Attribute):
            owner = node.value
            named = owner.value.id if isinstance(owner.value, ast.Name) else getattr(owner.value, "attr", "")
            if owner.attr == "sync" and named in ("config", "cfg"):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_only_the_synchronizer_reads_the_schedule_of_the_config():
    reads = {
        path.name: schedule_reads(path.read_text())
        for path in sorted(RUNTIME.glob("*.py"))
        if path.name != "synchronizer.py"
    }
    assert {name: lines for name, lines in reads.items() if lines} == {}
    assert "sync = config.sync" in (RUNTIME / "synchronizer.py").read_text()  # Synchronizer.of reads it, once


def test_the_check_can_fail():
    planted = (
        "def f(config, self):\n"
        "    a = config.sync.mode\n"
        "    b = self.cfg.sync.partial\n"
        "    c = config.sync.label()\n"  # its name and headline: not the schedule
    )
    assert schedule_reads(planted) == ["2: config.sync.mode", "3: self.cfg.sync.partial"]


def test_each_module_names_its_meaning_and_no_function_runs_over_60_lines():
    long = []
    for path in sorted(RUNTIME.glob("*.py")):
        tree = ast.parse(path.read_text())
        if path.name != "__init__.py":
            assert ast.get_docstring(tree), f"runtime/{path.name} has no module docstring"
        long += [
            f"runtime/{path.name}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60
        ]
    assert long == []
