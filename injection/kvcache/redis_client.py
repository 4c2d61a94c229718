"""Redis clients for the platform: fail-fast connections and what counts as a Redis fault."""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

__all__ = ["FAULTS", "connect", "wrong_type"]

FAULTS = (redis.RedisError, OSError)


def connect(
    url: str, *, socket_timeout: float = 2.0, socket_connect_timeout: float | None = None,
    **kw: Any,
) -> redis.Redis:
    """A client with short timeouts and one immediate retry: during a Redis outage a call
    fails in about ``socket_timeout`` instead of redis-py's default backoff retries (~3-4 s).
    A hung Redis (stopped, accepting connections but never answering) fails a call within
    about two ``socket_timeout``; a pooled connection idle for ``health_check_interval``
    seconds (default 30) is pinged before reuse, and TCP keepalive finds dead peers."""
    if socket_connect_timeout is None:
        socket_connect_timeout = min(socket_timeout, 0.5)
    kw.setdefault("health_check_interval", 30)
    kw.setdefault("socket_keepalive", True)
    return redis.Redis.from_url(
        url, socket_timeout=socket_timeout, socket_connect_timeout=socket_connect_timeout,
        retry=Retry(NoBackoff(), 1), **kw,
    )


def wrong_type(e: BaseException) -> bool:
    """A reply error about the value at a name (not the server): that name is malformed."""
    msg = str(e) if isinstance(e, redis.ResponseError) else ""
    # redis-py prefixes errors raised from a pipeline with the failing command
    return msg.startswith("WRONGTYPE") or "caused error: WRONGTYPE" in msg
