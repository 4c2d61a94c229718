"""Where the platform keeps its state: ``BASE_DIR`` (the checkout) and ``VAR_DIR`` (``./var``)."""

from __future__ import annotations

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("VAR_DIR", BASE_DIR / "var")).resolve()
