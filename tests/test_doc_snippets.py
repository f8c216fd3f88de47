"""Every snippet of README.md and docs/*.md is run or checked, as its marker says.

The convention (docs/architecture.md, "Doc snippets"): an HTML comment on the line right above a fence decides.

- ```python: run, in a scratch directory holding the repository's ``examples/`` and ``configs/`` (no marker, or
  ``<!-- run -->``); ``<!-- run: slow -->`` runs it under ``-m slow`` (minutes); ``<!-- run: tinker -->`` runs it
  under ``-m slow`` against a Tinker server on a random tiny model served as ``oprl/tiny``; ``<!-- not run: WHY
  -->`` says why not (a fragment of a larger program, a model from the hub, an account).
- ```bash: every ``oprl train | explore | eval | config`` command is checked: its CONFIG.yaml and settings resolve
  as ``oprl config`` resolves them (a renamed key or a bad value fails here); lines with a placeholder (``<run>``,
  ``$VAR``, ``SPEC.yaml``) are left out. ``<!-- run -->`` / ``<!-- run: slow -->`` also run the whole snippet
  with bash (``oprl`` from this environment).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(python|bash)\n(.*?)^```", re.M | re.S)
MARKER = re.compile(r"<!--\s*(run|run:\s*slow|run:\s*tinker|not run:\s*\S.*?)\s*-->\s*$")
PLACEHOLDER = re.compile(r"<[^>]*>|\$|\b[A-Z][A-Z_]*\.yaml\b|\bDIR\b|\.\.\.")
CHECKED = ("train", "explore", "eval", "config")


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int
    language: str
    code: str
    marker: str  # "run" (the default), "run: slow", "run: tinker", "not run: ..."
    marked: bool  # the marker is written above the fence (else the default)

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def snippets() -> list[Snippet]:
    found = []
    for path in DOCS:
        text = path.read_text()
        for match in FENCE.finditer(text):
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            marked = MARKER.search(before)
            marker = re.sub(r":\s*", ": ", marked.group(1)) if marked else "run"
            line = text[: match.start()].count("\n") + 1
            found.append(Snippet(path, line, match.group(1), match.group(2), marker, bool(marked)))
    return found


ALL = snippets()
PYTHON = [s for s in ALL if s.language == "python" and not s.marker.startswith("not run")]
BASH_RUN = [s for s in ALL if s.language == "bash" and s.marked and s.marker in ("run", "run: slow")]
"""Bash snippets marked to run; one without a marker is only checked."""


def _param(snippet: Snippet):
    marks = [pytest.mark.slow] if snippet.marker == "run: slow" else []
    return pytest.param(snippet, id=snippet.id, marks=marks)


def commands(code: str) -> list[list[str]]:
    """The ``oprl`` commands of a bash snippet, continuation lines joined, comments dropped, as argument lists."""
    out = []
    for line in code.replace("\\\n", " ").splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        while (words and words[0] in ("nice", "-n", "flock")) or (words and re.fullmatch(r"\d+|/tmp/\S+", words[0])):
            words = words[1:]
        if len(words) >= 2 and words[0] == "oprl" and words[1] in CHECKED:
            out.append(words[1:])
    return out


def scratch_dir(tmp_path: Path) -> Path:
    """A working directory where the snippets' relative paths (examples/, configs/) resolve."""
    for name in ("examples", "configs"):
        (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path


def test_every_python_snippet_runs_or_says_why_not():
    assert len(PYTHON) >= 5
    for snippet in ALL:
        if snippet.marker.startswith("not run"):
            assert len(snippet.marker) > len("not run: ") + 5, f"{snippet.id}: say why it is not run"


@pytest.mark.parametrize("snippet", [_param(s) for s in PYTHON if s.marker != "run: tinker"])
def test_python_snippet_runs(snippet, tmp_path, monkeypatch):
    monkeypatch.chdir(scratch_dir(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", snippet.code], capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, f"{snippet.id}:\n{done.stderr[-3000:]}"


@pytest.mark.slow  # the SDK, a server and a training step: 30 s to minutes
@pytest.mark.parametrize("snippet", [_param(s) for s in PYTHON if s.marker == "run: tinker"])
def test_python_snippet_runs_against_a_tinker_server(snippet, tmp_path, monkeypatch):
    pytest.importorskip("tinker")
    sys.path.insert(0, str(ROOT / "tests" / "serve" / "tinker"))
    from tinker_server import Running, tiny_model_dir

    from oprl.serve.tinker import build_server

    server = build_server(models=[f"oprl/tiny={tiny_model_dir(tmp_path / 'model')}"], state_dir=tmp_path / "state")
    up = Running(server)
    try:
        env = {"TINKER_BASE_URL": up.url, "TINKER_API_KEY": "tml-local", "TINKER_TELEMETRY": "0"}
        monkeypatch.chdir(scratch_dir(tmp_path))
        done = subprocess.run([sys.executable, "-c", snippet.code], capture_output=True, text=True, timeout=600,
                              env=os.environ | env)  # fmt: skip
    finally:
        up.stop()
    assert done.returncode == 0, f"{snippet.id}:\n{done.stderr[-3000:]}"


CHECKS = [(s, args) for s in ALL if s.language == "bash" for args in commands(s.code)]


@pytest.mark.parametrize(("snippet", "args"), [pytest.param(s, a, id=f"{s.id}:{' '.join(a)[:60]}") for s, a in CHECKS])
def test_bash_snippet_settings_resolve(snippet, args, monkeypatch, capsys):
    from oprl.cli import main

    settings = [a for a in args[1:] if a not in ("--help", "-h", "--debug")]
    if any(PLACEHOLDER.search(a) for a in settings) or (settings and "=" not in settings[0]
                                                       and not settings[0].endswith((".yaml", ".yml"))):  # fmt: skip
        pytest.skip("a placeholder or a run directory: nothing to resolve")
    monkeypatch.chdir(ROOT)
    assert main(["config", *settings]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("snippet", [_param(s) for s in BASH_RUN])
def test_bash_snippet_runs(snippet, tmp_path, monkeypatch):
    monkeypatch.chdir(scratch_dir(tmp_path))
    env = os.environ | {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-e", "-c", snippet.code], capture_output=True, text=True, timeout=1800, env=env)
    assert done.returncode == 0, f"{snippet.id}:\n{done.stderr[-3000:]}"
