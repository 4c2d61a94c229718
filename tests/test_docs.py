"""The benchmark docs stay readable and writable (issue 34).

- docs/BENCHMARKS.md holds today's figures in at most 400 lines; the runs before them live in
  docs/benchmarks/history.md.
- Every section a benchmark writes with ``mdsection.write_section(NAME, ...)`` keeps its
  ``<!-- bench:NAME -->`` ... ``<!-- /bench:NAME -->`` markers in BENCHMARKS.md, so
  ``--write-docs`` replaces that section instead of appending a second copy at the end.
- Links to a section of either file (``BENCHMARKS.md#anchor``, ``history.md#anchor``)
  point at a heading that exists.
- docs/ARCHITECTURE.md's request section is the plan's fields and the steps that fill and
  run them: at most 20 lines, each naming its function, every ``TurnPlan`` field in it, and
  every dotted name the file gives in backticks is found in the source.
"""

from __future__ import annotations

import ast
import functools
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


# -- docs/ARCHITECTURE.md: the request section ----------------------------------------------

ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
REQUEST_HEADING = "One chat request"  # how the request section's heading starts
REQUEST_MAX_LINES = 20
REQUEST_MAX_WIDTH = 140  # so that 20 lines stay 20 lines' worth
SOURCE_PACKAGES = ("injection", "tenants", "gpu_worker", "config")
THIRD_PARTY = {"django", "rest_framework", "torch", "transformers", "redis", "celery"}
FILE_SUFFIXES = {"py", "md", "txt", "json", "toml", "yml", "yaml", "cfg", "sh", "html", "gguf"}
CODE_SPAN = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")


def request_section() -> list[str]:
    """The request section's non-blank lines: from its heading to the next heading."""
    lines = ARCHITECTURE.read_text().splitlines()
    starts = [i for i, line in enumerate(lines)
              if re.match(r"#{1,6} " + re.escape(REQUEST_HEADING), line)]
    assert len(starts) == 1, f"docs/ARCHITECTURE.md: one heading '{REQUEST_HEADING} ...'"
    body = []
    for line in lines[starts[0] + 1:]:
        if re.match(r"#{1,6} ", line):
            break
        if line.strip():
            body.append(line)
    return body


def dotted_names(text: str) -> list[str]:
    """The code names in backticks (``pkg.module.func``, ``Class.method``, a call's name in
    ``f(x=1)``): spans that are a dotted name, not file names or other projects' modules."""
    out = []
    for span in CODE_SPAN.findall(text):
        name = re.sub(r"\(.*\)$", "", span.strip())
        if not DOTTED.fullmatch(name):
            continue  # code, a formula, a path
        parts = name.split(".")
        if parts[-1] in FILE_SUFFIXES or parts[0] in THIRD_PARTY:
            continue
        out.append(name)
    return out


@functools.cache
def source_modules() -> dict[str, Path]:
    """Dotted module name -> file, for the project's packages (a package: its __init__)."""
    out = {}
    for package in SOURCE_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


@functools.cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


@functools.cache
def classes() -> dict[str, list[ast.ClassDef]]:
    out: dict[str, list[ast.ClassDef]] = {}
    for path in source_modules().values():
        for node in parsed(path).body:
            if isinstance(node, ast.ClassDef):
                out.setdefault(node.name, []).append(node)
    return out


def members(node: ast.Module | ast.ClassDef, seen: frozenset = frozenset()) -> dict:
    """Names a module or class defines: functions, classes, assignments, a module's imports
    (what it re-exports), a class's ``self.x`` attributes and its bases' members."""
    out: dict[str, ast.AST] = {}
    for n in node.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[n.name] = n
        elif isinstance(n, ast.Assign):
            out.update((t.id, n) for t in n.targets if isinstance(t, ast.Name))
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            out[n.target.id] = n
        elif isinstance(n, (ast.Import, ast.ImportFrom)) and isinstance(node, ast.Module):
            out.update(((a.asname or a.name).split(".")[0], n) for a in n.names)
    if isinstance(node, ast.ClassDef):
        for n in ast.walk(node):
            if (isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
                    and isinstance(n.value, ast.Name) and n.value.id == "self"):
                out.setdefault(n.attr, n)
        for base in node.bases:
            name = getattr(base, "id", None)
            for cls in classes().get(name, []) if name not in seen else []:
                for key, value in members(cls, seen | {node.name}).items():
                    out.setdefault(key, value)
    return out


def defined(node: ast.Module | ast.ClassDef, parts: list[str]) -> bool:
    """``parts`` name something ``node`` defines (``[]``: ``node`` itself)."""
    for i, part in enumerate(parts):
        found = members(node).get(part)
        if found is None or (i < len(parts) - 1 and not isinstance(found, ast.ClassDef)):
            return False
        node = found
    return True


def resolves(name: str) -> bool:
    """``name`` is a module of the project (given whole or by its last parts, as in
    ``planning.planner``) followed by what it defines, or a class or function of the project
    followed by its members (``SegmentChain.get``)."""
    parts = name.split(".")
    modules = source_modules()
    for k in range(len(parts), 0, -1):
        prefix = ".".join(parts[:k])
        for module, path in modules.items():
            if (module == prefix or module.endswith("." + prefix)) and defined(
                    parsed(path), parts[k:]):
                return True
    return any(isinstance(members(parsed(path)).get(parts[0]), (
        ast.ClassDef, ast.FunctionDef)) and defined(parsed(path), parts)
        for path in modules.values())


def test_the_name_finder_tells_real_names_from_stale_ones():
    assert resolves("planning.planner.TurnPlanner.plan")  # a module by its last parts
    assert resolves("injection.engine.executor.InjectionExecutor._run")
    assert resolves("kvcache.chain.SegmentChain.get")
    assert resolves("faults.EngineFaults._capture_segment")
    assert resolves("batch.BatchEngine._capture_segment")  # inherited from EngineFaults
    assert resolves("SegmentChain.shared")  # a class named without its module
    assert resolves("tenants.history.precut")
    assert not resolves("planning.planner.TurnPlanner.no_such_step")
    assert not resolves("engine.faults._capture_segment")  # a method, not a function
    assert dotted_names("`a.b(x=1)` `assert kv.is_cpu` `config/urls.py` `asgi.py` "
                        "`django.http` `(1+s)·log p`") == ["a.b"]


def test_request_section_is_at_most_20_lines():
    lines = request_section()
    assert len(lines) <= REQUEST_MAX_LINES, (
        f"docs/ARCHITECTURE.md's request section has {len(lines)} lines (at most "
        f"{REQUEST_MAX_LINES}): details go to its subsections")
    wide = [line[:50] for line in lines if len(line) > REQUEST_MAX_WIDTH]
    assert not wide, f"request section lines over {REQUEST_MAX_WIDTH} characters: {wide}"


def test_request_section_names_a_function_on_each_line():
    bare = [line[:60] for line in request_section()
            if not any(resolves(name) for name in dotted_names(line))]
    assert not bare, f"request section lines naming no function of the source: {bare}"


def test_request_section_covers_the_plans_fields():
    tree = parsed(ROOT / "injection" / "engine" / "planning" / "plan.py")
    plan = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TurnPlan")
    fields = [n.target.id for n in plan.body
              if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    assert fields, "TurnPlan's fields not found in injection/engine/planning/plan.py"
    text = "\n".join(request_section())
    missing = [f for f in fields if f"`{f}`" not in text]
    assert not missing, f"TurnPlan fields the request section does not name: {missing}"


def test_architecture_names_only_what_exists():
    stale = sorted({name for name in dotted_names(ARCHITECTURE.read_text())
                    if not resolves(name)})
    assert not stale, f"docs/ARCHITECTURE.md names what the source does not define: {stale}"
