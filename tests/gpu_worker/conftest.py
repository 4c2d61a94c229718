"""The demo tests' VAR_DIRs (tests/gpu_worker/test_demo_firstrun.py, test_demo_supervisor.py)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from tests.workers import ROOT


def fresh_var_dir() -> Path:
    """Not under pytest's tmp dir: that one is root-only (0700, re-applied by any pytest
    run), and the embedded Postgres runs as another user when we are root."""
    base = ROOT / "var" / "test-demo"
    base.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(dir=base))
    path.chmod(0o755)
    return path


@pytest.fixture(scope="session")
def stopped_demo_dirs():
    """VAR_DIRs a demo made and then stopped cleanly (test_demo_firstrun's first run), for
    a later demo to start in: as every ``make demo`` after the first, it finds its
    Postgres cluster made and migrated instead of making it again."""
    dirs: list[Path] = []
    yield dirs
    for path in dirs:
        shutil.rmtree(path, ignore_errors=True)
