"""The committed reports regenerate identically from the committed files (issue #66): ``oprl report`` on arena v2's
results.csv and on the SmolLM2 stale arena's kept runs writes the same report.md, findings.csv and stats.csv as are
committed, declarations included (they read the git history, so a shallow clone or a copy outside git skips). A
change to the statistics that does not regenerate these files fails here."""

import subprocess
from pathlib import Path

import pytest

from oprl.experiments import report

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ("report.md", "findings.csv", "stats.csv")


def full_history() -> bool:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"], capture_output=True,
                          text=True, check=False)  # fmt: skip
    return done.returncode == 0 and done.stdout.strip() == "false"


def regenerate(relative: str, out: Path, monkeypatch) -> None:
    if not full_history():
        pytest.skip("the declarations read the git history: not in a full clone")
    monkeypatch.chdir(ROOT)  # the report names the directory as given: the committed one was made from the root
    report.build_report(Path(relative), out)
    for name in TEXTS:
        assert (out / name).read_text() == (ROOT / relative / name).read_text(), f"{relative}/{name} is stale"


def test_arena_v2_regenerates_identically(tmp_path, monkeypatch):
    regenerate("docs/reproduction/arena2", tmp_path, monkeypatch)


@pytest.mark.slow  # 33 runs' curves are read and drawn: ~30 s on two cores
def test_the_smollm2_stale_arena_regenerates_identically(tmp_path, monkeypatch):
    regenerate("docs/reproduction/smollm2-stale-arena/runs", tmp_path, monkeypatch)
