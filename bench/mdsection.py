"""Write one benchmark's section of docs/BENCHMARKS.md between its markers.

Each benchmark owns ``<!-- bench:NAME -->`` ... ``<!-- /bench:NAME -->``; the file is
re-read right before the edit so sections written by other benchmarks survive.
"""

from __future__ import annotations

import platform
from pathlib import Path

import torch

DOC = Path(__file__).resolve().parent.parent / "docs" / "BENCHMARKS.md"


def machine() -> str:
    """One line describing where the numbers come from."""
    cores = __import__("os").cpu_count()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{cores}-core CPU ({platform.machine()}), {gpu}, torch {torch.__version__}"


def write_section(name: str, body: str, doc: Path = DOC) -> None:
    """Replace (or append) the ``name`` section of ``doc`` with ``body``."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{start}\n{body.strip()}\n{end}"
    doc.parent.mkdir(parents=True, exist_ok=True)
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    doc.write_text(text)


def table(header: list[str], rows: list[list[object]]) -> str:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)
