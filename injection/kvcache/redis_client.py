"""Redis clients for the platform: fail-fast connections and what counts as a Redis fault."""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

__all__ = ["DROP_INDEXED", "FAULTS", "connect", "out_of_memory", "wrong_type"]

FAULTS = (redis.RedisError, OSError)

# KEYS: a user index, then entry names. Deletes the entries and takes exactly those names
# off the index, atomically. Deletes only, so Redis runs it even at its maxmemory, where a
# MULTI block is refused whole (and a full cache is when deleting matters most).
DROP_INDEXED = """
local n = redis.call('DEL', unpack(KEYS, 2))
redis.call('SREM', KEYS[1], unpack(KEYS, 2))
return n
"""
DROP_CHUNK = 1000  # names per script call (Lua's unpack has a stack limit)


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
    # redis-py prefixes errors raised from a pipeline with the failing command, and Redis
    # those raised in a script with the script's name and line
    return msg.startswith("WRONGTYPE") or "caused error: WRONGTYPE" in msg or (
        msg.startswith("Error running script") and ": WRONGTYPE" in msg)


def out_of_memory(e: BaseException) -> bool:
    """Redis refused a write because it is at its ``maxmemory`` (policy ``noeviction``):
    a full cache, not a fault of the server."""
    if isinstance(e, redis.exceptions.OutOfMemoryError):
        return True
    msg = str(e) if isinstance(e, redis.ResponseError) else ""
    return "OOM command not allowed" in msg or "used memory > 'maxmemory'" in msg
