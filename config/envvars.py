"""Typed reads of environment variables for the settings modules."""

from __future__ import annotations

import os


def env_bool(name: str, default: bool) -> bool:
    v = os.environ.get(name)
    return default if v is None else v.strip().lower() in ("1", "true", "yes", "on")


def env_auto_bool(name: str) -> bool | None:
    """Unset or "auto": None (the code decides); otherwise on/off, refusing anything else."""
    v = (os.environ.get(name) or "auto").strip().lower()
    if v == "auto":
        return None
    if v in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return v in ("1", "true", "yes", "on")
    raise ValueError(f"{name}={v!r}: expected auto, on or off")


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def env_list(name: str) -> list[str]:
    """A comma-separated list; unset or empty: []. Items are stripped, empty ones dropped."""
    return [item.strip() for item in os.environ.get(name, "").split(",") if item.strip()]
