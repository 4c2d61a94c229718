"""The house rules, read from the source with ``ast`` (docs/ARCHITECTURE.md).

- Layers only point down: ``injection`` <- ``tenants`` <- ``gpu_worker``; ``injection``
  imports no Django and nothing of the platform; ``tenants`` reaches the workers only
  through ``tenants.ports`` (implementations installed by ``gpu_worker.apps``).
- No import circles between modules. Imports inside functions count: they hide a
  circle, they do not remove it.
- HTTP (``django.http``, DRF, views) only in the web layer: ``tenants/api``,
  ``tenants/v1``, ``tenants/admin`` and the project's ``config/urls.py``/``asgi.py``.
- Small rooms: at most 15 modules in a package root, none over 300 lines.
- Short functions: none longer (``def`` to the end of its body) than its package's limit in
  ``FUNCTION_LINES`` (the longest matching path prefix applies).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("config", "tenants", "injection", "gpu_worker")
WEB_LAYER = ("tenants/api/", "tenants/v1/", "tenants/admin/", "config/urls.py", "config/asgi.py")
HTTP_MODULES = ("django.http", "django.views", "django.shortcuts", "django.template.response",
                "django.urls", "rest_framework", "drf_spectacular")
MAX_MODULES, MAX_LINES = 15, 300
# path prefix -> the most lines a function there may have (the longest prefix applies)
FUNCTION_LINES = {
    "config/": 60,
    "gpu_worker/": 60,
    "injection/": 60,
    "injection/engine/executor.py": 40,  # the run step: each function one step of a turn
    "tenants/": 60,
}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_modules(root: Path = ROOT) -> dict[str, Path]:
    """Every platform module (migrations aside: Django writes those)."""
    return {module_name(p, root): p for pkg in PACKAGES for p in (root / pkg).rglob("*.py")
            if "migrations" not in p.parts}


def imported_names(path: Path, name: str) -> list[tuple[int, str]]:
    """(line, dotted name) of every import in one module, at any depth; relative
    imports resolved; ``from a import b`` gives ``a.b`` (b may be a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the platform modules it imports (the longest module prefix of a name)."""
    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    graph = {}
    for name, path in modules.items():
        deps = {resolve(d) for _, d in imported_names(path, name)}
        graph[name] = {d for d in deps if d and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def offenders(rule) -> list[str]:
    hits = []
    for name, path in source_modules().items():
        where = path.relative_to(ROOT).as_posix()
        hits += [f"{where}:{line} {dotted}" for line, dotted in imported_names(path, name)
                 if rule(where, dotted)]
    return hits


def function_lengths(path: Path) -> list[tuple[str, int, int]]:
    """(qualified name, line, lines from its ``def`` to the end of its body) of every
    function and method in one module, nested ones included."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    found.append((name, child.lineno, child.end_lineno - child.lineno + 1))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(), filename=str(path)), "")
    return found


def function_limit(where: str) -> int | None:
    """The length limit of functions in ``where`` (a path from the root), or None."""
    prefixes = [p for p in FUNCTION_LINES if where.startswith(p)]
    return FUNCTION_LINES[max(prefixes, key=len)] if prefixes else None


def _under(dotted: str, *roots: str) -> bool:
    return any(dotted == r or dotted.startswith(r + ".") for r in roots)


# -- the scanner itself ------------------------------------------------------------------
def test_scanner_sees_nested_relative_and_from_imports(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("import os\nfrom pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n")
    mods = {module_name(p, tmp_path): p for p in pkg.rglob("*.py")}
    assert [d for _, d in imported_names(mods["pkg.b"], "pkg.b")] == ["pkg.a"]
    graph = import_graph(mods)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.b"]]
    assert cycles({"x": {"y"}, "y": set()}) == []


def test_function_lengths_count_from_def_to_the_end_of_the_body(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text('@staticmethod\ndef f(\n    a,\n):\n    """doc"""\n    return a\n\n\n'
                   "class C:\n    def g(self):\n        def h():\n            pass\n"
                   "        return h\n")
    assert function_lengths(mod) == [("f", 2, 5), ("C.g", 10, 4), ("C.g.h", 11, 2)]
    assert function_limit("injection/engine/executor.py") == 40
    assert function_limit("injection/engine/batch.py") == 60
    assert function_limit("nowhere/x.py") is None


# -- the rules ---------------------------------------------------------------------------
def test_no_import_circles():
    modules = source_modules()
    assert len(modules) > 100  # the scan really covers the platform
    assert cycles(import_graph(modules)) == []


def test_injection_imports_no_django_and_nothing_above_it():
    assert offenders(lambda where, d: where.startswith("injection/") and _under(
        d, "django", "rest_framework", "celery", "tenants", "gpu_worker", "config")) == []


def test_tenants_never_imports_the_worker_package():
    assert offenders(lambda where, d: where.startswith("tenants/")
                     and _under(d, "gpu_worker")) == []


def test_http_only_in_the_web_layer():
    assert offenders(lambda where, d: not where.startswith(WEB_LAYER)
                     and _under(d, *HTTP_MODULES)) == []


@pytest.mark.parametrize("package", [p for p in PACKAGES])
def test_package_roots_stay_small(package):
    crowded = {}
    for folder in [ROOT / package, *(ROOT / package).rglob("*")]:
        if folder.is_dir() and "migrations" not in folder.parts and folder.name != "__pycache__":
            count = len(list(folder.glob("*.py")))
            if count > MAX_MODULES:
                crowded[folder.relative_to(ROOT).as_posix()] = count
    assert crowded == {}


def test_no_module_over_the_size_limit():
    long = {path.relative_to(ROOT).as_posix(): n for path in source_modules().values()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_no_function_over_its_length_limit():
    checked, long = 0, {}
    for path in source_modules().values():
        where = path.relative_to(ROOT).as_posix()
        limit = function_limit(where)
        if limit is None:
            continue
        for name, line, n in function_lengths(path):
            checked += 1
            if n > limit:
                long[f"{where}:{line} {name}"] = f"{n} lines > {limit}"
    assert checked > 500  # the scan really covers the packages in the table
    assert long == {}
