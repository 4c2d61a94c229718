"""Layers only point down: nothing under ``tenants/`` imports the worker package.

``tenants`` reaches the workers through ``tenants.ports`` (implementations installed by
``gpu_worker.apps``) and enqueues tasks by name; an import of ``gpu_worker`` from the
Django app made ``tenants.actions -> gpu_worker.tasks -> ... -> tenants`` a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

TENANTS = Path(__file__).resolve().parents[2] / "tenants"


def worker_imports(path: Path) -> list[str]:
    """Every ``import gpu_worker...`` / ``from gpu_worker... import`` in one module,
    at any depth (function-level imports count too)."""
    found = []
    where = path.relative_to(TENANTS.parent) if path.is_relative_to(TENANTS.parent) else path
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        found += [f"{where}:{node.lineno} {n}" for n in names
                  if n == "gpu_worker" or n.startswith("gpu_worker.")]
    return found


def test_scanner_sees_top_level_and_nested_imports(tmp_path):
    sample = tmp_path / "probe.py"
    sample.write_text("import os\nfrom gpu_worker import tasks\nimport gpu_workers\n"
                      "def f():\n    import gpu_worker.channels.kvstore\n")
    assert [hit.split()[-1] for hit in worker_imports(sample)] == ["gpu_worker",
                                                                  "gpu_worker.channels.kvstore"]


def test_no_module_under_tenants_imports_gpu_worker():
    modules = sorted(TENANTS.rglob("*.py"))
    assert len(modules) > 20  # the scan really covers the app
    offenders = [hit for path in modules for hit in worker_imports(path)]
    assert offenders == []
