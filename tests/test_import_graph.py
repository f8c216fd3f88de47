"""benchmarks/import_graph.py, the map of a source tree: it reads the same package graph as the layering test,
finds a planted module cycle (one in a function, as the cycles of 9981eb2 were) and draws a PNG."""

import importlib.util
import sys
from pathlib import Path

from test_layering import SRC, package_graph

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "import_graph.py"


def _script():
    spec = importlib.util.spec_from_file_location("import_graph", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _plant(root: Path) -> None:
    files = {
        "oprl/__init__.py": "",
        "oprl/errors.py": "class OprlError(Exception): ...\n",
        "oprl/a/__init__.py": "",
        "oprl/a/one.py": "from oprl.a.two import f\nfrom oprl import errors\n",
        "oprl/a/two.py": "def f():\n    from oprl.a import one  # a cycle through a function\n    return one\n",
        "oprl/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from oprl.a import one\n"
        "from oprl.a.two import f\n\n\ndef long():\n" + "    x = 1\n" * 70,
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_map_of_this_tree_matches_the_layering_test_and_has_no_package_cycle():
    tree = _script().Tree.read(SRC.parent)
    assert tree.package_graph() == {k: v - {"oprl"} for k, v in package_graph().items()}
    assert tree.numbers["package_cycles"] == []
    # No line cap (#69: a 500-line cap had become the target, and files were split at it rather than at a
    # meaning): every module of the tree opens with a docstring naming what it is for, and a split follows that.
    import ast

    bare = [p for p in SRC.rglob("*.py") if p.read_text().strip() and not ast.get_docstring(ast.parse(p.read_text()))]
    assert not bare, f"modules without a docstring naming their meaning: {bare}"


def test_a_planted_cycle_is_found_and_both_trees_are_drawn(tmp_path, capsys):
    script = _script()
    _plant(tmp_path / "src")
    tree = script.Tree.read(tmp_path / "src")
    numbers = tree.numbers
    assert numbers["module_cycles"] == [["oprl.a.one", "oprl.a.two"]]  # b's TYPE_CHECKING import is no cycle
    assert numbers["package_cycles"] == [] and numbers["files_per_folder"] == {"(top level)": 3, "a": 3}
    assert numbers["longest_function"] == (71, "b.py:long")
    out = tmp_path / "graph.png"
    assert script.main([str(tmp_path / "src"), str(SRC.parent), "--png", str(out), "--mermaid"]) == 0
    printed = capsys.readouterr().out
    assert "module cycles: 1 [['oprl.a.one', 'oprl.a.two']]" in printed and "  b --> a" in printed
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
