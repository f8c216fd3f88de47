"""How many places declare each algorithm knob (issue #69: "places declaring an algorithm knob 5 -> 1").

    python benchmarks/knob_places.py src                 # this tree
    git archive d75e96b | tar -x -C /tmp/old && python benchmarks/knob_places.py /tmp/old/src   # before spec.py

A place is, in ``oprl/algorithms/*.py`` and ``oprl/config/algorithm.py`` of SRC: a class field named like the
knob (a dataclass or pydantic field; tensor fields, which are results, aside), a key of a module-level dict
literal whose name holds ``DEFAULTS``, or the knob's name as a string in a tuple literal (the range sets, the help
``GROUPS``, the key tuples). The knobs are the algorithm section's fields but ``preset``, read from SRC itself.
Range checks written as code (``if not 0 <= x <= 1``) are not counted, so a count before is a lower bound.
"""

from __future__ import annotations

import ast
import collections
import sys
from pathlib import Path


def _tuple_names(node: ast.AST, knobs: set[str]) -> list[str]:
    return [
        c.value
        for sub in ast.walk(node)
        if isinstance(sub, ast.Tuple)
        for c in sub.elts
        if isinstance(c, ast.Constant) and c.value in knobs
    ]


def places(src: Path, knobs: set[str]) -> dict[str, set[tuple[str, str]]]:
    found: dict[str, set[tuple[str, str]]] = collections.defaultdict(set)
    files = [*sorted((src / "oprl" / "algorithms").glob("*.py")), src / "oprl" / "config" / "algorithm.py"]
    for path in files:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    name = item.target.id
                    if name in knobs and "Tensor" not in ast.unparse(item.annotation):
                        found[name].add((path.name, f"class {node.name}"))
                if isinstance(item, ast.Assign | ast.AnnAssign) and item.value is not None:  # GROUPS, ...
                    target = ast.unparse(item.targets[0] if isinstance(item, ast.Assign) else item.target)
                    for name in _tuple_names(item.value, knobs):
                        found[name].add((path.name, f"{node.name}.{target}"))
        for node in tree.body:
            if not isinstance(node, ast.Assign | ast.AnnAssign):
                continue
            target = ast.unparse(node.targets[0] if isinstance(node, ast.Assign) else node.target)
            for sub in ast.walk(node):
                if isinstance(sub, ast.Dict) and "DEFAULTS" in target:
                    for key in sub.keys:
                        if isinstance(key, ast.Constant) and key.value in knobs:
                            found[key.value].add((path.name, target))
            for name in _tuple_names(node, knobs):
                found[name].add((path.name, target))
    return found


def main(src: Path) -> None:
    sys.path.insert(0, str(src))
    from oprl.config.algorithm import AlgorithmConfig

    knobs = {name for name in AlgorithmConfig.model_fields if name != "preset"}
    found = places(src, knobs)
    spread = collections.Counter(len(found[name]) for name in knobs)
    print(f"{len(knobs)} knobs; places per knob -> knobs: {dict(sorted(spread.items()))}")
    for name in ("eps_low", "kondo_rate", "kl_coef", "baseline"):
        print(f"  {name}: {sorted(found[name])}")


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve())
