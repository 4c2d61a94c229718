"""The docs stay readable for a newcomer (issue 61): the measurable rules.

- docs/API.md is a reference: every table cell is one line of at most 40 words (how a feature
  behaves goes below the table).
- docs/BENCHMARKS.md's summary is scanned in a minute: at most 30 words a row, each with a date
  and a model; no commit hashes anywhere in the file (they stay in docs/benchmarks/history.md,
  whose headings links may still name).
- README.md shows a first chat within its first 60 lines.
- Every term of docs/GLOSSARY.md that README.md uses is linked to its entry where first used.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
API = ROOT / "docs" / "API.md"
BENCHMARKS = ROOT / "docs" / "BENCHMARKS.md"
GLOSSARY = ROOT / "docs" / "GLOSSARY.md"
README = ROOT / "README.md"
CELL_WORDS, ROW_WORDS, FIRST_CHAT_LINE = 40, 30, 60
LINK = re.compile(r"\[([^\]]*)\]\(([^)]*)\)")
HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def words(text: str) -> int:
    return len(LINK.sub(r"\1", text).split())


def table_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip().strip("|").split(" | ")]
            for line in text.splitlines()
            if line.startswith("|") and not re.match(r"\|[-| :]+\|$", line)]


def summary_rows() -> list[list[str]]:
    text = BENCHMARKS.read_text()
    start = text.index("## Summary")
    end = text.index("\n#", start + 1)
    rows = table_rows(text[start:end])
    assert rows and rows[0][:5] == ["headline", "latest figure", "model", "measured", "section"]
    return rows[1:]


def test_api_table_cells_fit_40_words():
    long = [f"{row[0]}: {words(cell)} words" for row in table_rows(API.read_text())
            for cell in row if words(cell) > CELL_WORDS]
    assert not long, f"docs/API.md table cells over {CELL_WORDS} words: {long}"


def test_benchmarks_summary_rows_are_short_and_dated():
    rows = summary_rows()
    assert len(rows) >= 10
    long = [f"{row[0]}: {words(' '.join(row))}" for row in rows
            if words(" ".join(row)) > ROW_WORDS]
    assert not long, f"BENCHMARKS summary rows over {ROW_WORDS} words: {long}"
    undated = [row[0] for row in rows if not DATE.match(row[3]) or not row[2]]
    assert not undated, f"summary rows without a date or a model: {undated}"


def test_benchmarks_names_no_commit_hashes():
    text = LINK.sub(lambda m: m.group(1), BENCHMARKS.read_text())  # history's anchors aside
    found = sorted(set(HASH.findall(text)))
    assert not found, f"commit hashes in docs/BENCHMARKS.md (history.md keeps them): {found}"
    assert HASH.search("measured at 4bad1e6") and not HASH.search("2026-11-27 0.97x")


def test_readme_first_chat_within_60_lines():
    lines = README.read_text().splitlines()
    first = next((i for i, line in enumerate(lines, 1) if "/api/chat" in line
                  and line.lstrip().startswith("curl")), None)
    assert first is not None and first <= FIRST_CHAT_LINE, (
        f"README's first chat is on line {first} (at most {FIRST_CHAT_LINE})")


# -- glossary terms linked at first use ------------------------------------------------------


def glossary_terms() -> dict[str, str]:
    """Term -> its anchor (a heading "L1, L2" gives both terms the one anchor)."""
    out = {}
    for heading in re.findall(r"^### (.+)$", GLOSSARY.read_text(), re.M):
        anchor = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        for term in heading.split(","):
            out[term.strip()] = anchor
    return out


def term_pattern(term: str) -> re.Pattern:
    """The term and its plural, its words across line breaks, any case."""
    *head, last = term.split()
    last = re.escape(last[:-1]) + "(?:y|ies)" if last.endswith("y") else re.escape(last) + "(?:s|es)?"
    return re.compile(r"\b" + r"\s+".join([*map(re.escape, head), last]) + r"\b", re.I)


def prose(text: str) -> str:
    """``text`` with what is not prose blanked out, offsets kept: code blocks, code spans,
    headings, HTML comments and link targets."""
    blank = lambda m: re.sub(r"[^\n]", " ", m.group())  # noqa: E731
    text = re.sub(r"^```.*?^```", blank, text, flags=re.M | re.S)
    text = re.sub(r"`[^`]{1,200}`", blank, text)  # a span may wrap a line
    text = re.sub(r"^#.*$", blank, text, flags=re.M)
    text = re.sub(r"<!--.*?-->", blank, text, flags=re.S)
    return re.sub(r"\]\([^)]*\)", lambda m: "]" + blank(m)[1:], text)


def unlinked_first_uses(path: Path, glossary: str) -> list[str]:
    """Terms whose first use in ``path`` is not a link to their glossary entry."""
    raw = path.read_text()
    text = prose(raw)
    links = [(m.start(1), m.end(1), m.group(2)) for m in LINK.finditer(raw)]
    bad = []
    for term, anchor in glossary_terms().items():
        m = term_pattern(term).search(text)
        if m is None:
            continue
        target = f"{glossary}#{anchor}"
        if not any(a <= m.start() and m.end() <= b and url == target for a, b, url in links):
            line = raw.count("\n", 0, m.start()) + 1
            bad.append(f"{term} (line {line})")
    return bad


def test_glossary_terms_are_found():
    terms = glossary_terms()
    assert {"lean", "anchor", "L1", "L2", "guide row", "doorkeeper"} <= set(terms)
    assert terms["L2"] == "l1-l2"
    assert term_pattern("memory").search("your memories") and term_pattern("lean").search("leans")
    assert not term_pattern("lean").search("clean")


def test_readme_links_each_glossary_term_at_first_use():
    bad = unlinked_first_uses(README, "docs/GLOSSARY.md")
    assert not bad, f"README.md uses glossary terms first without a link to their entry: {bad}"


@pytest.mark.parametrize("name", ["API.md", "ARCHITECTURE.md", "OPERATIONS.md", "BENCHMARKS.md"])
def test_each_doc_links_the_glossary_terms_it_uses(name):
    """Linked where first used in the glossary's sense (by hand: "an opening phrase" or "GPU
    memory" use the words in another sense), so here: linked at least once."""
    path = ROOT / "docs" / name
    raw = path.read_text()
    text = prose(raw)
    linked = {url for _, url in LINK.findall(raw)}
    missing = [term for term, anchor in glossary_terms().items()
               if term_pattern(term).search(text) and f"GLOSSARY.md#{anchor}" not in linked]
    allowed = {"API.md": {"opening"}}.get(name, set())  # there only "an opening phrase"
    assert not set(missing) - allowed, f"docs/{name} never links these glossary terms: {missing}"
