"""The stale arena's tables in docs/reproduction.md are its committed files' numbers (issue #51: numbers in docs come
from committed files). Regenerating the report without updating the doc, or editing one number by hand, fails here.
Reads CSV and markdown only: milliseconds."""

import csv
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "reproduction.md"
RUNS = ROOT / "docs" / "reproduction" / "smollm2-stale-arena" / "runs"


def section(title: str) -> list[str]:
    lines = DOC.read_text().splitlines()
    start = lines.index(title)
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
    return lines[start:end]


def table(lines: list[str], header: str) -> list[list[str]]:
    """The body rows of the markdown table whose header row starts with ``header``, as stripped cells."""
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def number(text: str) -> float:
    return float(text.replace("−", "-").replace("+", ""))


STALE = "## SmolLM2: the stale arena (issue #51)"


def test_the_run_table_is_the_committed_runs():
    results = {
        (r["preset"], r["setting"], r["seed"]): float(r["final_accuracy"])
        for r in csv.DictReader((RUNS / "results.csv").open())
    }
    rows = table(section(STALE), "| run | accuracy |")
    seen = set()
    for name, accuracy, *_ in rows:
        method, lag, seed = re.fullmatch(r"(.+) lag (\d+) seed (\d+)", name).groups()
        key = (method.lower(), f"lag-{lag}", seed)
        assert key in results, f"{name}: no such run in {RUNS / 'results.csv'}"
        final = number(accuracy.split("/")[-1].strip().strip("*"))
        assert final == pytest.approx(results[key], abs=5e-4), name
        seen.add(key)
    assert seen == set(results)  # every committed run has its row, once


def test_the_findings_table_is_the_committed_findings():
    found = list(csv.DictReader((RUNS / "findings.csv").open()))
    rows = table(section(STALE), "| finding | contrast at lag 4 |")
    assert len(rows) == len(found)
    for row, f in zip(rows, found, strict=True):
        _, _, effect, interval, mde, verdict = row
        low, high = (number(x.split("(")[0]) for x in interval.split(" to "))
        assert number(effect) == pytest.approx(100 * float(f["mean_a_minus_b"]), abs=0.051), row
        assert (low, high) == pytest.approx((100 * float(f["low"]), 100 * float(f["high"])), abs=0.051), row
        assert number(mde) == pytest.approx(100 * float(f["mde"]), abs=0.051), row
        assert verdict.replace("*", "").startswith(f["verdict"]), row
