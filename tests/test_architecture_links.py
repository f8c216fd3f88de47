"""docs/architecture.md's links into the source cannot rot: every ``[`code`](../src/oprl/PATH#LN)`` link names code
that is on line N of PATH, and "The life of one training step" reads in at most three files (issue #54)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
LINK = re.compile(r"\[`(?P<code>[^`]+)`\]\(\.\./(?P<path>src/oprl/[^)#]+)#L(?P<line>\d+)\)")


def links(text: str) -> list[tuple[str, str, int]]:
    return [(m["code"], m["path"], int(m["line"])) for m in LINK.finditer(text)]


def broken(text: str, root: Path = ROOT) -> list[str]:
    """The links of ``text`` whose line does not hold their code, each as one line naming the fix."""
    out = []
    for code, path, line in links(text):
        file = root / path
        lines = file.read_text().splitlines() if file.is_file() else []
        if not (0 < line <= len(lines) and code in lines[line - 1]):
            found = [i + 1 for i, text_line in enumerate(lines) if code in text_line]
            out.append(f"{path}#L{line} does not hold {code!r}" + (f" (now at line {found})" if found else ""))
    return out


def step_section(text: str) -> str:
    start = text.index("## The life of one training step")
    return text[start : text.index("\n## ", start + 1)]


def test_every_source_link_of_the_page_holds_its_code():
    text = PAGE.read_text()
    assert len(links(step_section(text))) >= 20, "the life of one step links each of its stages"
    assert broken(text) == []


def test_one_step_reads_in_at_most_three_files():
    files = {path for _, path, _ in links(step_section(PAGE.read_text()))}
    assert files == {"src/oprl/runtime/driver.py", "src/oprl/explorer/explorer.py", "src/oprl/trainer/trainer.py"}


def test_a_moved_line_is_reported_with_where_it_went(tmp_path):
    """The check can fail: a link whose code moved names the line it moved to; a missing file fails too."""
    (tmp_path / "src" / "oprl").mkdir(parents=True)
    (tmp_path / "src" / "oprl" / "a.py").write_text("x = 1\ny = group_advantages(r)\n")
    page = "[`group_advantages(r)`](../src/oprl/a.py#L1) [`x = 1`](../src/oprl/a.py#L1) [`z`](../src/oprl/b.py#L3)"
    assert broken(page, tmp_path) == [
        "src/oprl/a.py#L1 does not hold 'group_advantages(r)' (now at line [2])",
        "src/oprl/b.py#L3 does not hold 'z'",
    ]
