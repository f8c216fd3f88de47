"""When a finding was declared, against when its runs ran: ``declared before data`` or ``exploratory``.

A finding's contrasts live in the sweep spec (``report.findings``). A claim stated after its data were seen is an
exploratory one, whatever its wording, so ``oprl report`` dates both sides from what cannot be back-dated without
rewriting history:

- **The declaration** of a contrast (a, b, metric, margin, under any finding name): the oldest commit of the spec's
  git history (``git log --follow``) from which the contrast is in the spec's findings in every later version up
  to HEAD, at its committer date. A contrast removed and added back dates from its return; a changed margin is a
  new contrast. The spec is the committed source the sweep was planned from: the tracked YAML whose
  ``output_dir`` and findings are those of the ``sweep.yaml`` beside the runs (that copy is written when a sweep
  starts, so its own history dates the copy, not the claim); where no source is tracked, the copy's own history.
  A contrast in no commit (an uncommitted edit), a spec outside git or a shallow clone get no date, and say so.
- **A run**: its recorded start, the ``perf/wall_time`` of the first row of its ``metrics.jsonl`` (written by the
  run itself since 2026-12-07; a kept run directory is a copy, so its file times are the copy's). A run without
  one (older runs) is dated by the first commit holding its results: its ``summary.json`` (kept run directories)
  or its row of ``results.csv``. That commit's date, less the run's seconds, is the latest it can have started.

A finding's runs are its contrasts' cells at the seeds the contrasts use. It is **declared before data** when its
declaration (the latest of its contrasts') precedes the start of every one of its runs (recorded, or the latest
the commit record allows). It is **exploratory (declared after k of n runs)** when k of its runs had
started before it was declared; **undated** when a date is missing, with the reason.

Not here: deciding the findings (``findings``), running git beyond ``log``/``show``/``ls-files``/``grep``.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import yaml

from oprl.errors import OprlError
from oprl.experiments import findings

BEFORE = "declared before data"


@dataclass(frozen=True)
class Declared:
    """A contrast's declaration: the commit that introduced it (as it stands) and that commit's date, or no commit
    and ``why``."""

    commit: str | None
    at: datetime | None
    why: str = ""


@dataclass(frozen=True)
class Status:
    """A finding's declaration against its runs: the label, the latest declaration, its n runs, k of them started
    before it."""

    label: str
    declared: Declared
    runs: int
    before: int


def _git(root: Path, *args: str) -> str | None:
    """``git -C root ARGS``'s output, None when git fails (not a repository, no such path)."""
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=False)
    except OSError:  # no git installed: as good as outside a repository
        return None
    return done.stdout if done.returncode == 0 else None


def repository(path: Path) -> tuple[Path | None, str]:
    """(the git work tree holding ``path``, "") or (None, why not: outside git, or a shallow clone)."""
    path = Path(path).resolve()
    top = _git(path if path.is_dir() else path.parent, "rev-parse", "--show-toplevel")
    if top is None:
        return None, "the spec is not in git"
    root = Path(top.strip())
    if (_git(root, "rev-parse", "--is-shallow-repository") or "").strip() == "true":
        return None, "a shallow clone: no history to date it by"
    return root, ""


def source_spec(sweep_dir: Path, spec: Mapping) -> tuple[Path | None, str]:
    """The tracked spec a sweep directory's ``sweep.yaml`` was copied from (module docstring), else the copy when
    it is tracked itself; (None, why) otherwise."""
    sweep_dir = Path(sweep_dir).resolve()
    root, why = repository(sweep_dir)
    if root is None:
        return None, why
    copy = sweep_dir / "sweep.yaml"
    claims = _contrasts(spec)
    listed = _git(root, "grep", "-l", "-z", "-F", "findings", "--", "*.yaml", "*.yml") or ""
    sources = []
    for name in sorted(filter(None, listed.split("\0"))):
        path = root / name
        if path == copy:
            continue
        try:
            other = yaml.safe_load(path.read_text()) or {}
        except (yaml.YAMLError, OSError):
            continue
        if (
            isinstance(other, dict)
            and other.get("output_dir") == spec.get("output_dir")
            and _contrasts(other) >= claims
        ):
            sources.append(path)
    if sources:
        return sources[0], ""
    if _git(root, "ls-files", "--error-unmatch", str(copy)) is not None:
        return copy, ""
    return None, "the spec is not in git"


def _contrasts(spec: object) -> set[findings.Contrast]:
    """Every contrast of a spec's ``report.findings`` (any finding name); none where it does not parse."""
    report = spec.get("report") if isinstance(spec, dict) else None
    try:
        parsed = findings.parse((report or {}).get("findings") if isinstance(report, dict) else None, "history")
    except OprlError:
        return set()
    return {c for contrasts in parsed.values() for c in contrasts}


def declarations(spec_file: Path | None, contrasts: Iterable[findings.Contrast], why: str = "") -> dict:
    """``{contrast: Declared}``: the oldest commit from which each contrast is in every version of ``spec_file``
    up to HEAD (module docstring); no commit, with the reason, where there is none."""
    wanted = list(dict.fromkeys(contrasts))
    if spec_file is None:
        return {c: Declared(None, None, why) for c in wanted}
    root, why = repository(spec_file)
    if root is None:
        return {c: Declared(None, None, why) for c in wanted}
    log = _git(root, "log", "--follow", "--format=%x00%H %cI", "--name-only", "--", str(spec_file)) or ""
    versions = []  # newest first: (commit, date, the spec's path at that commit)
    for entry in filter(None, log.split("\0")):
        head, *names = [line for line in entry.splitlines() if line.strip()]
        commit, stamp = head.split(" ")
        versions.append((commit, datetime.fromisoformat(stamp), names[-1] if names else None))
    found: dict[findings.Contrast, Declared] = {}
    open_ = set(wanted)  # contrasts whose run of versions back from HEAD is unbroken so far
    for index, (commit, date, name) in enumerate(versions):
        text = _git(root, "show", f"{commit}:{name}") if name else None
        present = _contrasts(yaml.safe_load(text) if text else None) if text else set()
        if index == 0:
            open_ &= present
        for contrast in list(open_):
            if contrast in present:
                found[contrast] = Declared(commit, date)
            else:
                open_.discard(contrast)
    relative = spec_file.relative_to(root) if spec_file.is_relative_to(root) else spec_file
    return {c: found.get(c, Declared(None, None, f"not in any commit of {relative}")) for c in wanted}


def run_dates(sweep_dir: Path) -> dict[str, datetime]:
    """``{run: date}``: the first commit holding each run's results, from the kept run directories'
    ``summary.json`` and from ``results.csv``'s rows (module docstring); empty outside git."""
    sweep_dir = Path(sweep_dir).resolve()
    root, _ = repository(sweep_dir)
    if root is None:
        return {}
    out: dict[str, datetime] = {}
    added = _git(root, "log", "--diff-filter=A", "--format=%x00%cI", "--name-only", "--", str(sweep_dir)) or ""
    for entry in filter(None, added.split("\0")):  # newest first: the oldest addition is written last
        date, *names = [line for line in entry.splitlines() if line.strip()]
        for name in names:
            if name.endswith("/summary.json"):
                out[Path(name).parent.name] = datetime.fromisoformat(date)
    table = sweep_dir / "results.csv"
    log = _git(root, "log", "--reverse", "--format=%H %cI", "--", str(table)) or ""
    relative = table.relative_to(root)
    for line in log.splitlines():
        commit, date = line.split(" ")
        text = _git(root, "show", f"{commit}:{relative}") or ""
        for row in csv.DictReader(io.StringIO(text)):
            run = row.get("run")
            if run and (run not in out or datetime.fromisoformat(date) < out[run]):
                out[run] = datetime.fromisoformat(date)
    return out


def recorded_starts(sweep_dir: Path) -> dict[str, datetime]:
    """``{run: start}`` from each run directory's first ``metrics.jsonl`` row that has ``perf/wall_time``."""
    out: dict[str, datetime] = {}
    for path in sorted(Path(sweep_dir).glob("*/metrics.jsonl")):
        with path.open() as handle:
            for line in handle:
                try:
                    wall = json.loads(line).get("perf/wall_time")
                except json.JSONDecodeError:  # a torn line: the run's other rows still date it
                    continue
                if isinstance(wall, int | float):
                    out[path.parent.name] = datetime.fromtimestamp(wall, tz=timezone.utc)
                    break
    return out


def status(
    declared: list[Declared],
    runs: list[tuple[str | None, float]],
    dates: Mapping[str, datetime],
    started: Mapping[str, datetime] | None = None,
) -> Status:
    """A finding's label from its contrasts' declarations and its runs ``(run name, seconds)``: a run starts at
    its recorded start (``started``) where it has one, else at the latest its first commit allows, that commit
    less its seconds (module docstring)."""
    started = started or {}
    missing = next((d for d in declared if d.at is None), None)
    if missing is not None or not declared:
        missing = missing or Declared(None, None, "no contrast")
        return Status(f"undated ({missing.why})", missing, len(runs), 0)
    latest = max(declared, key=lambda d: d.at or datetime.min)
    assert latest.at is not None
    starts = [started.get(name) or (dates[name] - timedelta(seconds=seconds if seconds == seconds else 0.0)
                                     if name in dates else None)
              for name, seconds in ((n or "", s) for n, s in runs)]  # fmt: skip
    before = sum(1 for start in starts if start is not None and start < latest.at)
    if before:
        return Status(f"exploratory (declared after {before} of {len(runs)} runs)", latest, len(runs), before)
    undated = sum(1 for start in starts if start is None)
    if undated:
        return Status(f"undated ({undated} of {len(runs)} runs in no commit: no time recorded)", latest, len(runs), 0)
    return Status(BEFORE, latest, len(runs), 0)
