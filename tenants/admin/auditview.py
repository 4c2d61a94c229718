"""How audit rows read in the admin: exact times, who acted, and preference diffs."""

from __future__ import annotations

import difflib
import json

from django.utils import timezone
from django.utils.html import format_html, format_html_join

from tenants import origin
from tenants.models import AuditEvent, AuditLog

DIFF_EVENTS = {AuditEvent.PREFERENCE_CHANGED, AuditEvent.PREFERENCE_CREATED,
               AuditEvent.PREFERENCE_DELETED, AuditEvent.TENANT_CHANGED,
               AuditEvent.TENANT_INSTRUCTIONS_CHANGED, AuditEvent.MEMBER_CHANGED}


def exact_time(value) -> str:
    """``2026-11-22 05:43:07 UTC``: seconds and the zone, in the site's time zone."""
    local = timezone.localtime(value)
    return local.strftime("%Y-%m-%d %H:%M:%S ") + (local.tzname() or "")


def actor_kind(obj: AuditLog, actor) -> str:
    """The stored kind; rows from before it was stored are inferred from the actor."""
    if obj.actor_kind:
        return obj.actor_kind
    if obj.actor_id is None:
        return origin.SYSTEM
    if obj.event_type in (AuditEvent.CHAT_REQUEST, AuditEvent.CHAT_ABANDONED):
        return origin.MEMBER
    return origin.ADMIN if actor is not None and actor.is_staff else origin.MEMBER


def _words_diff(before: str, after: str):
    """Word-level diff as HTML: removed words struck through, added ones underlined."""
    a, b = before.split(), after.split()
    parts = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b).get_opcodes():
        if op in ("delete", "replace"):
            parts.append(format_html('<del class="kvi-del">{}</del>', " ".join(a[i1:i2])))
        if op in ("insert", "replace"):
            parts.append(format_html('<ins class="kvi-ins">{}</ins>', " ".join(b[j1:j2])))
        if op == "equal":
            parts.append(format_html("{}", " ".join(a[i1:i2])))
    return format_html_join(" ", "{}", ((p,) for p in parts))


def before_after(obj: AuditLog):
    """A table field | before | after for changes that carry ``old``/``new``."""
    old, new = obj.data.get("old") or {}, obj.data.get("new") or {}
    if not isinstance(old, dict) or not isinstance(new, dict) or not (old or new):
        return "-"
    rows = []
    for field in sorted(set(old) | set(new)):
        a, b = old.get(field, ""), new.get(field, "")
        changed = a != b
        diff = _words_diff(str(a), str(b)) if changed and isinstance(a, str) else "-"
        rows.append((field, "" if a is None else a, "" if b is None else b,
                     "changed" if changed else "same", diff))
    body = format_html_join(
        "", '<tr class="kvi-{3}"><th>{0}</th><td>{1}</td><td>{2}</td><td>{4}</td></tr>', rows)
    return format_html('<table class="kvi-diff"><thead><tr><th>field</th><th>before</th>'
                       "<th>after</th><th>difference</th></tr></thead><tbody>{}</tbody>"
                       "</table>", body)


def pretty_json(data) -> str:
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False)
