"""The map of a source tree of oprl: its package import graph (drawn, and as mermaid) and the numbers of its layout.

    python benchmarks/import_graph.py                                  # this checkout's src/
    python benchmarks/import_graph.py /tmp/before/src src --png docs/img/import-graph.png --mermaid

Each SRC is a directory holding ``oprl/`` (a checkout's ``src``). The graph is read from the real ``import``
statements (an ``ast`` walk over every file, imports inside functions included; ``oprl.errors``, the leaf
every layer may use, left out of the drawing): a node is a folder or top-level module of ``oprl``, an arrow
"imports". Printed per tree: files per folder, the longest module and function, the package cycles (strongly
connected components of the package graph) and the module cycles (of the module graph, imports inside
functions included, ``if TYPE_CHECKING:`` blocks left out: every import that can run). With two trees the PNG
shows them side by side (before, after), packages in a cycle in red. matplotlib draws; networkx (installed
with torch) finds the cycles and the layers: each package one row above the highest package it imports.
"""

from __future__ import annotations

import argparse
import ast
import functools
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

LEAVES = {"errors"}
"""Packages every layer may import, left out of the drawing (not of the cycle counts)."""


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports_of(path: Path, root: Path, *, typing_only: bool = True, modules: set[str] | None = None) -> set[str]:
    """Absolute names ``path`` imports (relative imports and ``from oprl import x`` resolved), in functions
    too; ``typing_only=False`` leaves out the ``if TYPE_CHECKING:`` blocks (imports that never run). Given the
    tree's ``modules``, ``from p import x`` is ``p.x`` when that is a module, else ``p`` (the package itself
    is not imported by it: Python runs a package's ``__init__`` before any of its submodules anyway)."""
    package = module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if not typing_only and _is_type_checking(child):
                continue
            if isinstance(child, ast.Import):
                names.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = ".".join(package[: len(package) - child.level + 1]) if child.level else ""
                module = ".".join(part for part in (base, child.module or "") if part)
                if modules is None:
                    names.add(module)
                    names.update(f"{module}.{alias.name}" for alias in child.names)  # submodules too
                else:
                    names.update(
                        f"{module}.{alias.name}" if f"{module}.{alias.name}" in modules else module
                        for alias in child.names
                    )
            visit(child)

    visit(ast.parse(path.read_text()))
    return names


@dataclass
class Tree:
    """One source tree of oprl, read once."""

    root: Path
    """The ``oprl`` package directory."""
    files: list[Path] = field(default_factory=list)

    @classmethod
    def read(cls, src: Path) -> Tree:
        root = Path(src) / "oprl"
        if not root.is_dir():
            raise SystemExit(f"import_graph: {src} has no oprl/ package")
        return cls(root, sorted(root.rglob("*.py")))

    def layer(self, path: Path) -> str:
        parts = path.relative_to(self.root).parts
        return "oprl" if parts == ("__init__.py",) else parts[0].removesuffix(".py")

    def modules(self) -> dict[str, Path]:
        return {module_name(path, self.root): path for path in self.files}

    def package_graph(self) -> dict[str, set[str]]:
        """``layer -> layers it imports`` (every import, in functions too)."""
        graph: dict[str, set[str]] = {self.layer(path): set() for path in self.files}
        for path in self.files:
            targets = {n.split(".")[1] for n in imports_of(path, self.root) if n.startswith("oprl.")}
            graph[self.layer(path)] |= targets & set(graph) - {self.layer(path)}
        return graph

    def module_graph(self) -> dict[str, set[str]]:
        """``module -> oprl modules it imports`` (in functions too; not under TYPE_CHECKING)."""
        modules = self.modules()
        graph: dict[str, set[str]] = {}
        for name, path in modules.items():
            imported = imports_of(path, self.root, typing_only=False, modules=set(modules))
            graph[name] = {n for n in imported if n in modules} - {name}
        return graph

    @functools.cached_property
    def numbers(self) -> dict:
        """Files per folder, the longest module and function (lines), the package and module cycles."""
        per_folder = Counter(
            "(top level)" if len(p.relative_to(self.root).parts) == 1 else p.relative_to(self.root).parts[0]
            for p in self.files
        )
        lengths = {p: len(p.read_text().splitlines()) for p in self.files}
        longest = max(lengths, key=lambda p: lengths[p])
        functions = [
            (node.end_lineno - node.lineno + 1, f"{p.relative_to(self.root)}:{node.name}")
            for p in self.files
            for node in ast.walk(ast.parse(p.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None
        ]
        return {
            "files": len(self.files),
            "lines": sum(lengths.values()),
            "files_per_folder": dict(sorted(per_folder.items())),
            "longest_module": (lengths[longest], str(longest.relative_to(self.root))),
            "longest_function": max(functions),
            "package_cycles": cycles(self.package_graph()),
            "module_cycles": cycles(self.module_graph()),
        }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (each a set of nodes that import each other)."""
    import networkx as nx

    components = nx.strongly_connected_components(nx.DiGraph([(a, b) for a, bs in graph.items() for b in bs]))
    return sorted(sorted(c) for c in components if len(c) > 1)


def mermaid(graph: dict[str, set[str]]) -> str:
    lines = ["graph LR"]
    for node in sorted(graph):
        lines += [f"  {node} --> {target}" for target in sorted(graph[node] - LEAVES) if node not in LEAVES]
    return "\n".join(lines)


def layout(graph: dict[str, set[str]]) -> dict[str, tuple[float, float]]:
    """Positions in rows: a package sits one row above the highest package it imports (a cycle's packages
    share a row); in a row, packages are ordered by the mean position of what they import (fewer crossings)."""
    import networkx as nx

    directed = nx.DiGraph()
    directed.add_nodes_from(graph)
    directed.add_edges_from((a, b) for a, bs in graph.items() for b in bs)
    condensed = nx.condensation(directed)
    depth: dict[int, int] = {}
    for component in reversed(list(nx.topological_sort(condensed))):
        depth[component] = 1 + max((depth[t] for t in condensed.successors(component)), default=-1)
    row = {node: depth[condensed.graph["mapping"][node]] for node in graph}
    positions: dict[str, tuple[float, float]] = {}
    for level in sorted(set(row.values())):
        members = sorted(n for n in graph if row[n] == level)
        below = [positions[t][0] for n in members for t in graph[n] if t in positions]
        centre = sum(below) / len(below) if below else 0.0

        def key(node: str, centre: float = centre) -> tuple[float, str]:
            xs = [positions[t][0] for t in graph[node] if t in positions]
            return (sum(xs) / len(xs) if xs else centre, node)

        members.sort(key=key)
        for i, node in enumerate(members):
            positions[node] = (i - (len(members) - 1) / 2, float(level))
    return positions


def draw(trees: list[tuple[str, Tree]], out: Path) -> None:
    """One panel per tree: its package graph (``LEAVES`` left out), packages in a cycle in red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(trees), figsize=(10 * len(trees), 9), squeeze=False)
    for ax, (title, tree) in zip(axes[0], trees, strict=True):
        graph = {n: t - LEAVES for n, t in tree.package_graph().items() if n not in LEAVES}
        in_cycle = {n for c in cycles(tree.package_graph()) for n in c}
        pos = layout(graph)
        for node, targets in graph.items():
            for target in targets:
                (x0, y0), (x1, y1) = pos[node], pos[target]
                red = node in in_cycle and target in in_cycle
                ax.annotate(
                    "",
                    xy=(x1, y1),
                    xytext=(x0, y0),
                    arrowprops={
                        "arrowstyle": "-|>",
                        "color": "tab:red" if red else "0.6",
                        "lw": 0.7,
                        "alpha": 0.7,
                        "shrinkA": 9,
                        "shrinkB": 9,
                        "mutation_scale": 8,
                    },
                )
        for node, (x, y) in pos.items():
            colour = "mistyrose" if node in in_cycle else "aliceblue"
            ax.text(
                x, y, node, ha="center", va="center", fontsize=8, bbox={"boxstyle": "round", "fc": colour}, zorder=3
            )
        numbers = tree.numbers
        ax.set_title(
            f"{title}: {numbers['files']} files, {len(graph)} packages, "
            f"{len(numbers['package_cycles'])} package cycles, {len(numbers['module_cycles'])} module cycles",
            fontsize=10,
        )
        ax.set_xlim(min(x for x, _ in pos.values()) - 0.8, max(x for x, _ in pos.values()) + 0.8)
        ax.set_ylim(-0.6, max(y for _, y in pos.values()) + 0.6)
        ax.axis("off")
    fig.suptitle("oprl package imports (an arrow: imports; each row above what it imports; oprl.errors left out)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def report(title: str, tree: Tree) -> str:
    n = tree.numbers
    folders = ", ".join(f"{k} {v}" for k, v in n["files_per_folder"].items())
    lines = [
        f"{title}: {n['files']} files, {n['lines']} lines",
        f"  files per folder: {folders}",
        f"  longest module: {n['longest_module'][1]} ({n['longest_module'][0]} lines)",
        f"  longest function: {n['longest_function'][1]} ({n['longest_function'][0]} lines)",
        f"  package cycles: {len(n['package_cycles'])} {n['package_cycles'] or ''}".rstrip(),
        f"  module cycles: {len(n['module_cycles'])} {n['module_cycles'] or ''}".rstrip(),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", nargs="*", type=Path, help="src directories (holding oprl/); default: this checkout")
    parser.add_argument("--png", type=Path, help="draw the trees side by side into this PNG")
    parser.add_argument("--mermaid", action="store_true", help="print each package graph as mermaid")
    args = parser.parse_args(argv)
    sources = args.src or [Path(__file__).resolve().parents[1] / "src"]
    titles = ["before", "after"] if len(sources) == 2 else [str(src) for src in sources]
    trees = [(title, Tree.read(src)) for title, src in zip(titles, sources, strict=True)]
    for title, tree in trees:
        print(report(f"{title} ({tree.root.parent})", tree))
        if args.mermaid:
            print(mermaid(tree.package_graph()))
    if args.png:
        draw(trees, args.png)
        print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
