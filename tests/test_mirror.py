"""``tests/`` mirrors ``src/oprl/`` folder by folder, so a package's tests are where its code is.

The rule, checked here:
- every folder under ``tests/`` (recursively) is a package under ``src/oprl/`` at the same relative path,
  except ``NOT_PACKAGES`` (multi-step runs, data files) and caches;
- every package under ``src/oprl/`` (a folder with an ``__init__.py``, recursively) has its folder under
  ``tests/``, holding at least one ``test_*.py`` file;
- a ``tests/test_*.py`` file at the top names a top-level module of oprl by prefix (``test_cli.py`` tests
  ``cli.py``; ``test_schedule.py`` tests ``schedule.py``), or is one of ``WHOLE_PACKAGE``: checks of the
  package as a whole, which belong to no one module.
"""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src" / "oprl"

NOT_PACKAGES = {"integration", "data"}
"""Top-level test folders that mirror no package: ``integration/`` (multi-step runs through the runtime, marked
``integration``), ``data/`` (files the tests read)."""

WHOLE_PACKAGE = {
    "test_architecture_links.py": "docs/architecture.md's links into the source, the life of one step in three files",
    "test_contracts.py": "every role's worker satisfies its Protocol, every handle its role",
    "test_doc_snippets.py": "every snippet of README.md and docs/*.md runs or resolves as its marker says",
    "test_howto.py": "the how-to pages of docs/architecture.md, run as written",
    "test_import_graph.py": "benchmarks/import_graph.py: no import circles",
    "test_layering.py": "which folder may import which (the layers, roles as peers)",
    "test_mirror.py": "this file: tests/ mirrors src/oprl/",
    "test_names.py": "one meaning per name across the package",
    "test_plugin_kinds.py": "every kind of plug-in (task, engine, loss, reward...) by file path and entry point",
}
"""Top-level test files that check the package as a whole, each with what it checks."""


def _skipped(name: str) -> bool:
    return name == "__pycache__" or name.startswith(".")


def _folders(root: Path, skip_top: set[str] = frozenset()) -> set[str]:
    """Relative paths of every folder under ``root`` (caches and ``skip_top`` subtrees left out)."""
    found = set()
    for path in root.rglob("*"):
        if not path.is_dir():
            continue
        parts = path.relative_to(root).parts
        if parts[0] in skip_top or any(_skipped(part) for part in parts):
            continue
        found.add("/".join(parts))
    return found


def _packages(src: Path) -> set[str]:
    return {folder for folder in _folders(src) if (src / folder / "__init__.py").is_file()}


def _strays(src: Path, tests: Path) -> list[str]:
    """Test folders with no package at the same path."""
    return sorted(_folders(tests, NOT_PACKAGES) - _packages(src))


def _untested(src: Path, tests: Path) -> list[str]:
    """Packages whose test folder is missing or holds no ``test_*.py`` file."""
    return sorted(package for package in _packages(src) if not list((tests / package).glob("test_*.py")))


def _unmatched(src: Path, tests: Path) -> list[str]:
    """Top-level test files that name no top-level module and are not in ``WHOLE_PACKAGE``."""
    modules = {path.stem for path in src.glob("*.py") if path.stem != "__init__"}
    return [
        path.name
        for path in sorted(tests.glob("test_*.py"))
        if path.name not in WHOLE_PACKAGE
        and not any((topic := path.stem.removeprefix("test_")) == m or topic.startswith(f"{m}_") for m in modules)
    ]


def test_every_test_folder_is_a_package_of_oprl():
    assert _strays(SRC, TESTS) == [], "tests/ folders with no package at src/oprl/<same path>"


def test_every_package_has_its_test_folder_with_a_test_file():
    assert _untested(SRC, TESTS) == [], "packages of src/oprl/ without tests/<same path>/test_*.py"


def test_top_level_test_files_name_a_top_level_module_or_check_the_whole_package():
    assert _unmatched(SRC, TESTS) == [], "top-level test files that name no module of src/oprl/*.py"
    assert all((TESTS / name).is_file() for name in WHOLE_PACKAGE), "WHOLE_PACKAGE names a file that is gone"


def test_the_rule_catches_a_stray_folder_a_package_without_tests_and_an_unnamed_file(tmp_path):
    """The checks above can fail: a fake tree with one case of each."""
    src, tests = tmp_path / "src" / "oprl", tmp_path / "tests"
    for package in ("pkg", "pkg/sub", "untested"):
        (src / package).mkdir(parents=True)
        (src / package / "__init__.py").write_text("")
    (src / "plain_folder").mkdir()  # no __init__.py: not a package, needs no tests
    for module in ("__init__", "cli", "partial"):
        (src / f"{module}.py").write_text("")
    for folder in ("pkg/sub", "stray/deep", "integration/deep", "data/x", "pkg/__pycache__"):
        (tests / folder).mkdir(parents=True)
    (tests / "pkg" / "test_a.py").write_text("")
    (tests / "pkg" / "sub" / "helpers.py").write_text("")  # a folder without a test_*.py file
    for name in ("test_cli.py", "test_partial_tokens.py", "test_partially.py", "test_layering.py", "test_misc.py"):
        (tests / name).write_text("")
    assert _strays(src, tests) == ["stray", "stray/deep"]
    assert _untested(src, tests) == ["pkg/sub", "untested"]
    assert _unmatched(src, tests) == ["test_misc.py", "test_partially.py"]


def test_every_test_file_name_is_unique():
    """pytest imports test files by basename (no ``__init__.py`` in tests/): two ``test_loading.py`` in two
    folders stop collection ("import file mismatch") in whichever order a clean checkout collects them."""
    names = [path.name for path in TESTS.rglob("test_*.py") if ".venv" not in path.parts]
    assert sorted({n for n in names if names.count(n) > 1}) == []


def test_the_readme_layout_names_every_top_level_package():
    """README.md's layout section is the map a new user reads first: #53 found judge/, teacher/, episodes/ and
    evaluator/ missing from it."""
    readme = (TESTS.parent / "README.md").read_text()
    layout = readme.split("## Layout", 1)[1].split("```")[1]
    top = sorted(package for package in _packages(SRC) if "/" not in package)
    assert [p for p in top if f"  {p}/ " not in layout and f" {p}/ (" not in layout] == []
