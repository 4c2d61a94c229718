"""The benchmark docs stay readable and writable (issue 34).

- docs/BENCHMARKS.md holds today's figures in at most 400 lines; the runs before them live in
  docs/benchmarks/history.md.
- Every section a benchmark writes with ``mdsection.write_section(NAME, ...)`` keeps its
  ``<!-- bench:NAME -->`` ... ``<!-- /bench:NAME -->`` markers in BENCHMARKS.md, so
  ``--write-docs`` replaces that section instead of appending a second copy at the end.
- Links to a section of either file (``BENCHMARKS.md#anchor``, ``history.md#anchor``)
  point at a heading that exists.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "docs" / "BENCHMARKS.md"
HISTORY = ROOT / "docs" / "benchmarks" / "history.md"
MAX_LINES = 400
MARKER = re.compile(r"^<!-- (/?)bench:([\w-]+) -->$", re.M)  # a marker is a line of its own
LINK_SOURCES = ("docs", "bench", "tests", "injection", "tenants", "gpu_worker", "config")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file (repeated headings get -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        m = None if in_code else re.match(r"#{1,6} (.+)", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def module_literals(tree: ast.Module) -> dict[str, object]:
    """Module-level ``NAME = <literal>`` assignments."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return out


def argument_choices(tree: ast.Module, dest: str) -> list[str] | None:
    """The ``choices`` of ``add_argument(dest, choices=...)``, a literal or ``sorted(NAME)``."""
    literals = module_literals(tree)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument" and node.args
                and isinstance(node.args[0], ast.Constant) and node.args[0].value == dest):
            continue
        for kw in node.keywords:
            if kw.arg != "choices":
                continue
            value = kw.value
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) \
                    and value.func.id == "sorted" and value.args:
                value = value.args[0]
            if isinstance(value, ast.Name) and value.id in literals:
                return sorted(literals[value.id])
            try:
                return sorted(ast.literal_eval(value))
            except ValueError:
                return None
    return None


def section_names(path: Path) -> list[str]:
    """The names one bench script passes to ``write_section`` (f-strings over ``args.X``
    expanded with the choices of the ``X`` argument)."""
    tree = ast.parse(path.read_text())
    names = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args and (
                getattr(node.func, "id", None) == "write_section"
                or getattr(node.func, "attr", None) == "write_section")):
            continue
        if len(node.args) > 2 or any(k.arg == "doc" for k in node.keywords):
            continue  # written to a document of its own, not docs/BENCHMARKS.md
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            names.append(arg.value)
            continue
        assert isinstance(arg, ast.JoinedStr), f"{path.name}: write_section's name is not a string"
        parts = arg.values
        fields = [p for p in parts if isinstance(p, ast.FormattedValue)]
        assert len(fields) == 1 and isinstance(fields[0].value, ast.Attribute), \
            f"{path.name}: write_section's name is an f-string this test cannot expand"
        choices = argument_choices(tree, fields[0].value.attr)
        assert choices, f"{path.name}: no choices for args.{fields[0].value.attr}"
        for choice in choices:
            names.append("".join(p.value if isinstance(p, ast.Constant) else str(choice)
                                 for p in parts))
    return names


def written_sections() -> dict[str, str]:
    """Section name -> the bench script that writes it."""
    out = {}
    for path in sorted((ROOT / "bench").glob("*.py")):
        if path.name == "mdsection.py":
            continue
        for name in section_names(path):
            out[name] = path.name
    return out


def test_benchmarks_md_fits_in_400_lines():
    lines = BENCHMARKS.read_text().count("\n")
    assert lines <= MAX_LINES, (
        f"docs/BENCHMARKS.md has {lines} lines (at most {MAX_LINES}): move the runs a newer "
        "one replaced to docs/benchmarks/history.md")


def test_the_section_finder_sees_the_known_writers():
    sections = written_sections()
    # a literal name, and the f-string of fault_probe.py expanded over its services
    assert sections["codec"] == "bench_codec.py"
    assert {"fault-redis", "fault-postgres"} <= set(sections)


def test_every_written_section_keeps_its_markers():
    text = BENCHMARKS.read_text()
    missing = [f"{name} ({script})" for name, script in written_sections().items()
               if f"<!-- bench:{name} -->" not in text or f"<!-- /bench:{name} -->" not in text]
    assert not missing, f"sections without their markers in docs/BENCHMARKS.md: {missing}"


def test_markers_open_once_and_close_in_order():
    open_name = None
    seen = set()
    for closing, name in MARKER.findall(BENCHMARKS.read_text()):
        if not closing:
            assert open_name is None, f"bench:{name} opens inside bench:{open_name}"
            assert name not in seen, f"bench:{name} appears twice"
            open_name = name
            seen.add(name)
        else:
            assert name == open_name, f"/bench:{name} closes while bench:{open_name} is open"
            open_name = None
    assert open_name is None, f"bench:{open_name} never closes"


def test_history_holds_no_markers():
    assert HISTORY.exists()
    assert not MARKER.search(HISTORY.read_text()), \
        "markers belong in docs/BENCHMARKS.md only (write_section edits that file)"


def link_files():
    yield from ROOT.glob("*.md")
    for folder in LINK_SOURCES:
        for pattern in ("*.md", "*.py"):
            yield from (p for p in (ROOT / folder).rglob(pattern) if p != Path(__file__))


@pytest.mark.parametrize("target", [BENCHMARKS, HISTORY], ids=lambda p: p.name)
def test_section_links_resolve(target):
    known = anchors(target)
    link = re.compile(re.escape(target.name) + r"#([\w-]+)")
    broken = [f"{path.relative_to(ROOT)}: #{anchor}"
              for path in link_files() for anchor in link.findall(path.read_text())
              if anchor not in known]
    # links inside the file itself: (#anchor)
    broken += [f"{target.name}: #{a}" for a in re.findall(r"\]\(#([\w-]+)\)", target.read_text())
               if a not in known]
    assert not broken, f"links to headings that do not exist: {broken}"
