"""Control channel between web/commands and every live worker: signed JSON over Redis pub/sub.

Publishers (web, `manage.py kvcache`) call :func:`publish`; each worker process runs one
:class:`ControlListener` thread that verifies the HMAC and dispatches to a handler.
Messages are JSON (never pickle) and authenticated with a key derived from
KV_SIGNING_SECRET, so nothing without the secret can make workers drop or report caches.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

import redis
from django.conf import settings

from config import security
from injection.kvcache.redis_client import connect

log = logging.getLogger(__name__)
CHANNEL_PREFIX = "kvi:control"


def channel() -> str:
    """The control channel of this deployment's Redis db.

    Pub/sub channels are global to a Redis server (they ignore db numbers), so the
    db is part of the name: a demo on db 0 and a test run on db N never hear each other.
    """
    db = urlparse(settings.REDIS_URL).path.strip("/") or "0"
    return f"{CHANNEL_PREFIX}:{db}"

REPLY_TTL = 60
# A handler may return a JSON-safe dict: it is sent back when the message asked for replies.
Handler = Callable[[dict[str, Any]], dict[str, Any] | None]


def _key() -> bytes:
    return security.derived_keys(b"control-channel")[0]


def sign(message: dict[str, Any]) -> bytes:
    body = json.dumps(message, sort_keys=True, separators=(",", ":")).encode()
    mac = hmac.new(_key(), body, hashlib.sha256).hexdigest()
    return json.dumps({"mac": mac, "body": body.decode()}).encode()


def verify(raw: bytes) -> dict[str, Any] | None:
    """The message if its MAC is valid, else None (logged, never dispatched)."""
    try:
        outer = json.loads(raw)
        body = outer["body"].encode()
        # the current secret's key, or a fallback's while a rotation rolls out
        if not security.matches(security.derived_keys(b"control-channel"), body,
                                    str(outer["mac"])):
            raise ValueError("bad mac")
        return json.loads(body)
    except (ValueError, KeyError, TypeError):
        log.warning("control: rejected unauthenticated message")
        return None


_clients: dict[str, redis.Redis] = {}


def make_client(socket_timeout: float = 2.0, url: str | None = None) -> redis.Redis:
    """A fail-fast client (see ``injection.kvcache.redis_client.connect``) for ``REDIS_URL``."""
    return connect(
        url or settings.REDIS_URL, socket_timeout=socket_timeout,
        socket_connect_timeout=min(socket_timeout, 1.0), health_check_interval=30,
    )


def redis_client() -> redis.Redis:
    """A shared client for ``REDIS_URL`` (thread-safe pool, reset after fork by redis-py)."""
    url = settings.REDIS_URL
    client = _clients.get(url)
    if client is None:
        client = _clients.setdefault(url, make_client(2.0, url))
    return client


def publish(op: str, **payload: Any) -> int:
    """Broadcast ``op`` to every worker; returns how many listeners received it (0 if Redis is down)."""
    message = {"op": op, "ts": time.time(), **payload}
    try:
        return int(redis_client().publish(channel(), sign(message)))
    except redis.RedisError as exc:
        log.warning("control: publish %s failed: %s", op, exc)
        return 0


class Replies(list):
    """Replies to one :func:`request`; ``expected`` = processes that received it."""

    expected: int = 0

    @property
    def missing(self) -> int:
        return max(0, self.expected - len(self))


def request(op: str, timeout: float | None = None, **payload: Any) -> Replies:
    """Broadcast ``op`` and collect every receiving worker process's (signed) reply.

    Waits until as many replies as receivers arrived or ``timeout`` passed; raises
    ``redis.RedisError`` when Redis is unreachable (callers report it and fail).
    """
    timeout = settings.KVCACHE_CONTROL_TIMEOUT if timeout is None else timeout
    # every call has a short socket deadline (a hung Redis fails it in seconds); the
    # wait for replies is a series of short blocking pops within that deadline
    client = make_client(settings.REDIS_SOCKET_TIMEOUT)
    reply_to = f"kviw:reply:{uuid.uuid4().hex}"
    message = {"op": op, "ts": time.time(), "reply_to": reply_to, **payload}
    receivers = int(client.publish(channel(), sign(message)))
    replies = Replies()
    replies.expected = receivers
    deadline = time.monotonic() + timeout
    try:
        while len(replies) < receivers:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            item = client.blpop([reply_to], timeout=1)  # whole seconds: any Redis version
            if item is None:
                continue
            reply = verify(item[1])
            if reply is not None:
                replies.append(reply)
    finally:
        client.delete(reply_to)
        client.close()
    if len(replies) < receivers:
        log.warning("control: %s: %d of %d workers replied", op, len(replies), receivers)
    return replies


def send_reply(reply_to: str, reply: dict[str, Any]) -> None:
    if not reply_to.startswith("kviw:reply:"):
        return  # only reply keys of our own shape
    client = redis_client()
    with client.pipeline(transaction=True) as p:
        p.rpush(reply_to, sign(reply))
        p.expire(reply_to, REPLY_TTL)
        p.execute()


class ControlListener(threading.Thread):
    """Subscribes to the control channel and dispatches verified messages; reconnects on error."""

    def __init__(self, handlers: dict[str, Handler], client_factory=redis_client) -> None:
        super().__init__(name="kvi-control", daemon=True)
        self.handlers = handlers
        self._client_factory = client_factory
        self._halt = threading.Event()
        self.ready = threading.Event()
        self.received = 0

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self._listen()
            except redis.RedisError as exc:
                self.ready.clear()
                log.warning("control: listener lost Redis (%s); retrying", exc)
                self._halt.wait(1.0)

    def _listen(self) -> None:
        pubsub = self._client_factory().pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(channel())
        self.ready.set()
        try:
            while not self._halt.is_set():
                msg = pubsub.get_message(timeout=1.0)
                if msg and msg.get("type") == "message":
                    self.dispatch(msg["data"])
        finally:
            pubsub.close()

    def dispatch(self, raw: bytes) -> None:
        message = verify(raw)
        if message is None:
            return
        handler = self.handlers.get(str(message.get("op")))
        if handler is None:
            log.warning("control: unknown op %r", message.get("op"))
            return
        self.received += 1
        try:
            reply = handler(message)
        except Exception as exc:  # a bad message must not kill the listener
            log.exception("control: handler for %r failed", message.get("op"))
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        reply_to = message.get("reply_to")
        if reply_to and reply is not None:
            try:
                send_reply(str(reply_to), reply)
            except redis.RedisError as exc:
                log.warning("control: reply to %r failed: %s", message.get("op"), exc)
