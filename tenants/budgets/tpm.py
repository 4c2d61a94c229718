"""Tokens-per-minute limits per member and per tenant, on shared Redis counters.

A chat's tokens (prompt + completion) are counted when its reply is stored
(:func:`record`, after the storing transaction commits); a new chat is refused
(:func:`check`, from ``tenants.api.throttling.ChatThrottle``) while the member's or
the tenant's tokens of the last minute reach the limit. The minute is a sliding window
(previous fixed window weighted by its overlap), timed by the Redis server's clock, as
the request-rate limits. Chats still running are not counted yet, so a burst admitted
together can pass the limit by what those chats use; token *budgets*
(``tenants.budgets.ledger``) are the hard bound.

Settings: ``CHAT_TPM_PER_MEMBER`` and ``CHAT_TPM_PER_TENANT`` (tokens per minute;
empty/0: no limit).
"""

from __future__ import annotations

import logging
import threading
from typing import NamedTuple

import redis
from django.conf import settings

from injection.kvcache.redis_client import connect

log = logging.getLogger(__name__)
KEY_PREFIX = "kvi:rl:tpm"
WINDOW_S = 60

# KEYS: base keys; ARGV: window, then one limit per key. {0, tightest remaining, its
# limit, reset_s} when under every limit, else {index hit, retry_after_s}.
_CHECK = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local window = tonumber(ARGV[1])
local idx = math.floor(now / window)
local elapsed = (now - idx * window) / window
local rem, lim = nil, 0
for i = 1, #KEYS do
  local limit = tonumber(ARGV[i + 1])
  local cur = tonumber(redis.call('GET', KEYS[i] .. ':' .. idx) or '0')
  local prev = tonumber(redis.call('GET', KEYS[i] .. ':' .. (idx - 1)) or '0')
  local used = prev * (1 - elapsed) + cur
  if used >= limit then
    local wait
    if cur < limit then
      wait = (1 - (limit - cur) / prev - elapsed) * window
    else
      wait = (1 - elapsed) * window + window * math.max(0, 1 - limit / cur)
    end
    return {i, math.max(1, math.ceil(wait))}
  end
  if rem == nil or limit - used < rem then
    rem, lim = math.floor(limit - used), limit
  end
end
return {0, rem, lim, math.max(1, math.ceil((1 - elapsed) * window))}
"""
_RECORD = """
local t = redis.call('TIME')
local idx = math.floor(tonumber(t[1]) / tonumber(ARGV[1]))
for i = 1, #KEYS do
  redis.call('INCRBY', KEYS[i] .. ':' .. idx, ARGV[2])
  redis.call('EXPIRE', KEYS[i] .. ':' .. idx, 2 * tonumber(ARGV[1]) + 1)
end
return 1
"""


class TokenState(NamedTuple):
    """The tightest TPM limit before this request (``x-ratelimit-*-tokens`` headers)."""

    limit: int
    remaining: int
    reset_s: int


class TpmExceeded(Exception):
    def __init__(self, scope: str, limit: int, retry_after: int) -> None:
        super().__init__(f"Tokens-per-minute limit for this {scope} reached ({limit}).")
        self.scope, self.limit, self.retry_after = scope, limit, retry_after


def limits() -> dict[str, int]:
    """{"member": n, "tenant": n} of the limits in force (absent: no limit)."""
    found = {}
    for scope in ("member", "tenant"):
        value = getattr(settings, f"CHAT_TPM_PER_{scope.upper()}", "") or 0
        if int(value) > 0:
            found[scope] = int(value)
    return found


def _keys(tenant_id: int, member_id: int, scopes) -> list[str]:
    ident = {"member": f"m:{member_id}", "tenant": f"t:{tenant_id}"}
    return [f"{KEY_PREFIX}:{ident[s]}" for s in scopes]


_scripts: dict[tuple[str, str], redis.commands.core.Script] = {}
_lock = threading.Lock()


def _script(source: str):
    url = settings.REDIS_URL
    with _lock:
        if (url, source) not in _scripts:
            client = connect(url, socket_timeout=0.5, socket_connect_timeout=0.5)
            _scripts[(url, source)] = client.register_script(source)
        return _scripts[(url, source)]


def check(tenant_id: int, member_id: int) -> TokenState | None:
    """Raise TpmExceeded while a limit is reached; None without limits. Redis errors
    propagate (the caller decides to fail open or closed)."""
    active = limits()
    if not active:
        return None
    scopes = list(active)
    result = _script(_CHECK)(keys=_keys(tenant_id, member_id, scopes),
                             args=[WINDOW_S, *(active[s] for s in scopes)])
    if int(result[0]) == 0:
        return TokenState(int(result[2]), int(result[1]), int(result[3]))
    scope = scopes[int(result[0]) - 1]
    raise TpmExceeded(scope, active[scope], int(result[1]))


def record(tenant_id: int, member_id: int, tokens: int) -> None:
    """Count a stored chat's tokens (best effort: a Redis fault only loses this count)."""
    if tokens <= 0 or not limits():
        return
    try:
        _script(_RECORD)(keys=_keys(tenant_id, member_id, ("member", "tenant")),
                         args=[WINDOW_S, int(tokens)])
    except redis.RedisError as exc:
        log.warning("tpm: could not count %d tokens (%s)", tokens, exc)
