"""A model's defaults and the evidence that chose them: ``profiles/<registry name>.json``.

A profile holds, per mechanism, the default the platform uses on that model, its status
("measured", "platform default", "not calibrated"), what it applies to and the evidence
(cases, wins/losses, p, cost per reply; "not measured" where there is none). It is matched to
a loaded model by ``fingerprint.model_key`` (config + tokenizer and chat template), never by
path. Read from: a ``profile.json`` in the model's own dir (an operator's, for a model of
their own; it must carry the model's key), else the profiles shipped in this package.

What the engine reads from it: ``guidance.default``, the contrastive guidance strength a turn
gets when neither the request nor the tenant sets one (``engine/guidance/contrast.resolve``);
the anchor and the member's lean run at that strength, so they are off with it. A model
without a profile gets 0: guidance, the anchor and the lean off (the worker logs it once).
``reminder.default`` and ``constraints.default``: whether the memory reminder and the decoding
constraints run on a turn whose request and tenant leave them unset (``default_on``):
"on"/"off" (or true/false) where a measurement chose it for that model; a text starting with
"platform default" (or no entry, or no profile) keeps the platform-wide default
(``prompting/reminder.DEFAULT_ON``, ``prompting/constraints.DEFAULT_ON``), measured on SmolLM2.
The reminder off takes the anchor with it: a deep turn is anchored only where it is reminded
(``engine/guidance/plan.plan_anchor``; on Qwen's validation cases that costs the anchor's +11).
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path
from typing import Any, NamedTuple

from injection.engine.decoding import loops
from injection.model.fingerprint import model_key
from injection.prompting import constraints, reminder

__all__ = ["PLATFORM", "PROFILE_FILE", "SWITCHES", "Profile", "ProfileError", "attach", "default_on",
           "find", "for_adapter", "guidance_default", "guides_by_default", "loop_ngram", "packaged",
           "read", "summary"]

log = logging.getLogger(__name__)
PROFILES_DIR = Path(__file__).with_name("profiles")
PROFILE_FILE = "profile.json"  # beside a model's own weights (MODEL_PATH)
# the on/off mechanisms whose default a profile may set, each with the module holding the
# platform-wide default (its ``DEFAULT_ON``, read when asked)
SWITCHES = {"reminder": reminder, "constraints": constraints, "loop_guard": loops}
PLATFORM = "platform default"  # a switch's default starting so: the platform-wide one


class ProfileError(ValueError):
    """A profile file that cannot be used (unreadable, or without a key or a strength)."""


class Profile(NamedTuple):
    """One model's profile (``mechanisms``: the file's per-mechanism entries)."""

    name: str
    model_key: str
    guidance: float  # default contrastive guidance strength; 0: off
    calibrated: bool
    source: str  # the file it was read from
    mechanisms: dict[str, Any]


def read(path: str | Path) -> Profile:
    """A profile file, checked: a model key, and a guidance default >= 0."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
        strength = float(data["mechanisms"]["guidance"]["default"])
        key = str(data["model_key"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ProfileError(f"{path} is not a usable model profile "
                           f"({type(exc).__name__}: {exc})") from None
    if not key or strength < 0:
        raise ProfileError(f"{path}: no model_key, or a negative guidance default")
    for name in SWITCHES:
        entry = data["mechanisms"].get(name)
        if isinstance(entry, dict) and "default" in entry:
            try:
                _switch(entry["default"])
            except ValueError as exc:
                raise ProfileError(f"{path}: {name}: {exc}") from None
    return Profile(str(data.get("model", path.stem)), key, strength,
                   bool(data.get("calibrated")), str(path), dict(data["mechanisms"]))


@functools.cache
def packaged() -> dict[str, Profile]:
    """The profiles shipped with the platform, by model key."""
    found = (read(p) for p in sorted(PROFILES_DIR.glob("*.json")))
    return {p.model_key: p for p in found}


def find(key: str, model_dir: str | Path | None = None) -> Profile | None:
    """The profile of the model with ``key``: its dir's own (if it carries that key),
    else a shipped one, else None."""
    own = Path(model_dir) / PROFILE_FILE if model_dir is not None else None
    if own is not None and own.is_file():
        profile = read(own)
        if profile.model_key == key:
            return profile
        log.warning("%s is for model key %s, not the loaded model's %s: not used",
                    own, profile.model_key, key)
    return packaged().get(key)


def attach(adapter: Any, model_dir: str | Path | None = None) -> Profile | None:
    """Find the loaded model's profile and keep it on the adapter (the worker, at load);
    says once, in the log, what it found."""
    key = model_key(adapter)
    profile = find(key, model_dir)
    adapter._profile = profile
    if profile is None:
        log.warning("no model profile for model key %s: guidance, the anchor and the "
                    "member's lean are off (a profile is earned by measurement: "
                    "docs/OPERATIONS.md, model profiles)", key)
    else:
        log.info("model profile %s (%s): guidance default %s, reminder %s, decoding "
                 "constraints %s, loop guard %s, %s", profile.name, profile.source,
                 profile.guidance,
                 *("on" if default_on(adapter, n) else "off" for n in SWITCHES),
                 "calibrated" if profile.calibrated else "not calibrated")
    return profile


def for_adapter(adapter: Any) -> Profile | None:
    """The adapter's profile: the one attached at load, else a shipped one by its key."""
    attached = getattr(adapter, "_profile", None)
    return attached if attached is not None else packaged().get(model_key(adapter))


def guidance_default(adapter: Any) -> float:
    """The model's default guidance strength (0 without a profile)."""
    profile = for_adapter(adapter)
    return profile.guidance if profile is not None else 0.0


def guides_by_default(adapter: Any, where: str) -> bool:
    """Whether the model's default guidance runs ``where``: "first_turns" (the member's lean
    or the guide row on a conversation's first turns: ``guidance.first_turns``),
    "deep_turns" (a reminded deep turn anchored: ``anchor.deep_turns``) or "deep_lean" (an
    anchored deep turn leaning after its first token: ``anchor.deep_lean``).
    Only for a turn whose strength is the default; a request's or tenant's strength
    guides as before. Absent from a profile: on (as the strength says)."""
    return _flag(adapter, "guidance" if where == "first_turns" else "anchor", where, True)


def anchors_first_turns(adapter: Any) -> bool:
    """Whether a first turn the model's profile leaves unguided (``guidance.first_turns``
    false) is anchored instead: its first token as the guide would pick it, the rest its
    model's own (``anchor.first_turns``; absent: not)."""
    return _flag(adapter, "anchor", "first_turns", False)


def _flag(adapter: Any, section: str, key: str, absent: bool) -> bool:
    """The profile's ``section.key`` (``absent`` where the entry or the key is missing);
    False without a profile."""
    profile = for_adapter(adapter)
    if profile is None:
        return False
    entry = profile.mechanisms.get(section)
    return bool(entry.get(key, absent)) if isinstance(entry, dict) else absent


def _switch(value: Any) -> bool | None:
    """A switch's ``default``: True/False ("on"/"off"), None for the platform-wide one."""
    if isinstance(value, bool):
        return value
    if value in ("on", "off"):
        return value == "on"
    if isinstance(value, str) and value.startswith(PLATFORM):
        return None
    raise ValueError(f"default {value!r} is none of \"on\", \"off\", true, false or "
                     f"\"{PLATFORM}: ...\"")


def default_on(adapter: Any, name: str) -> bool:
    """Whether the switch ``name`` ("reminder", "constraints") runs on a turn whose request
    and tenant leave it unset: the model's profile's "on"/"off", else (no profile, no entry,
    or "platform default: ...") the platform-wide ``DEFAULT_ON``."""
    profile = for_adapter(adapter)
    entry = profile.mechanisms.get(name) if profile is not None else None
    chosen = _switch(entry.get("default", PLATFORM)) if isinstance(entry, dict) else None
    return bool(SWITCHES[name].DEFAULT_ON) if chosen is None else chosen


def loop_ngram(adapter: Any) -> int:
    """The loop guard's run length on this model: its profile's ``loop_guard.ngram``, else
    ``loops.NGRAM``."""
    profile = for_adapter(adapter)
    entry = profile.mechanisms.get("loop_guard") if profile is not None else None
    n = entry.get("ngram") if isinstance(entry, dict) else None
    return int(n) if isinstance(n, int) and n > 0 else loops.NGRAM


def summary(adapter: Any) -> dict[str, Any]:
    """What ``kvcache stats`` and ``/metrics`` show of the loaded model's profile: its
    guidance strength and whether each switch runs by default (``default_on``)."""
    profile = for_adapter(adapter)
    switches = {name: default_on(adapter, name) for name in SWITCHES}
    if profile is None:
        return {"name": "none", "model_key": model_key(adapter), "calibrated": False,
                "guidance": 0.0, **switches, "defaults": {}}
    defaults = {k: v.get("default") for k, v in profile.mechanisms.items()
                if isinstance(v, dict)}
    return {"name": profile.name, "model_key": profile.model_key,
            "calibrated": profile.calibrated, "guidance": profile.guidance, **switches,
            "defaults": defaults}
