"""Authenticated Celery task messages: an HMAC over what a task is asked to do.

Every task message this platform publishes carries ``kvi_sig`` (a message header): an
HMAC-SHA256 over the task's name, id, positional and keyword arguments (canonical JSON),
keyed by a secret derived from ``KV_SIGNING_SECRET`` (domain-separated, so the K/V
payload key and this key never coincide). The sending side signs in Celery's
``before_task_publish`` signal (connected in ``config.celery``), so every sender
(``apply_async``, ``delay``, ``send_task`` by name) signs without knowing it; the GPU
tasks check it before any work (``gpu_worker.ops.taskauth.SignedTask``).

Why an HMAC and not Celery's message signing (``task_serializer="auth"``): Celery's
signing needs an X.509 key pair and certificate store on every web and worker node and
signs with public-key crypto per message, while web and workers already share
``KV_SIGNING_SECRET`` (the Redis K/V payloads are authenticated with it); a keyed hash is
the same guarantee for parties that share a secret, costs microseconds, and keeps JSON
messages readable by Celery's own tooling (inspect, flower, purge).

Not covered: replay of a captured, authentic message. A chat runs only under its live
idempotency claim in Postgres (an old or repeated chat message is refused there); warming
a member's K/V is idempotent; a playground reply stores nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from config import security

HEADER = "kvi_sig"
_CONTEXT = b"kvinject celery task message v1"


def _key() -> bytes:
    return security.derived_keys(_CONTEXT)[0]


def canonical(name: str, task_id: str, args: Any, kwargs: Any) -> bytes:
    """The signed bytes: a tuple and the list JSON makes of it sign alike."""
    body = [name, task_id, list(args or ()), dict(kwargs or {})]
    return json.dumps(body, sort_keys=True, separators=(",", ":"), default=str).encode()


def signature(name: str, task_id: str, args: Any, kwargs: Any) -> str:
    return hmac.new(_key(), canonical(name, task_id, args, kwargs), hashlib.sha256).hexdigest()


def is_authentic(name: str, task_id: str, args: Any, kwargs: Any, sig: Any) -> bool:
    """Signed with KV_SIGNING_SECRET or one of its fallbacks (a rotation rolling out)."""
    if not isinstance(sig, str) or not task_id:
        return False
    body = canonical(name, task_id, args, kwargs)
    return security.matches(security.derived_keys(_CONTEXT), body, sig)


def sign_message(sender: str | None = None, body: Any = None, headers: dict | None = None,
                 **_: Any) -> None:
    """``before_task_publish`` receiver: add the signature header to an outgoing task."""
    if headers is None or sender is None:
        return
    if isinstance(body, (list, tuple)):  # protocol 2: (args, kwargs, embed)
        args, kwargs = body[0], body[1]
    else:  # protocol 1: a dict
        args, kwargs = (body or {}).get("args"), (body or {}).get("kwargs")
    headers.setdefault(HEADER, signature(sender, headers.get("id", ""), args, kwargs))
