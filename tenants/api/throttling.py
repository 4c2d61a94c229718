"""Per-member and per-tenant rate limits on shared Redis counters (sliding window, atomic).

One Lua script checks the member's and the tenant's counters together and counts the
request against both only when both allow it, so a refused request costs nothing and
web processes never race. The window is a sliding-window counter (previous fixed window
weighted by how much of it still overlaps), timed by the Redis server's clock.

Limits come from settings (``"N/s"``, ``"N/min"``, ``"N/h"``, ``"N/day"``; empty or
``None`` disables a limit):

- ``CHAT_RATE_PER_MEMBER`` (default ``"30/min"``), ``CHAT_RATE_PER_TENANT`` (``"300/min"``)
- ``API_RATE_PER_MEMBER`` (``"300/min"``), ``API_RATE_PER_TENANT`` (``"3000/min"``)
- ``CHAT_TPM_PER_MEMBER``, ``CHAT_TPM_PER_TENANT``: tokens per minute (empty: off), checked
  before the request rate (tenants.budgets.tpm)
- ``THROTTLE_FAIL_OPEN`` (``True``): when Redis is unreachable requests are let through
  and a warning is logged (at most once per 30 s); ``False`` answers 503 instead.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import NamedTuple

import redis
from django.conf import settings
from rest_framework.throttling import BaseThrottle

from injection.kvcache.redis_client import connect
from tenants.actions import is_answered
from tenants.api.permissions import request_member
from tenants.budgets import tpm
from tenants.errors import Throttled, WorkerUnavailable

log = logging.getLogger(__name__)
KEY_PREFIX = "kvi:rl"
DEFAULTS = {
    "CHAT_RATE_PER_MEMBER": "30/min",
    "CHAT_RATE_PER_TENANT": "300/min",
    "API_RATE_PER_MEMBER": "300/min",
    "API_RATE_PER_TENANT": "3000/min",
}
_PERIODS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hour": 3600, "d": 86400,
            "day": 86400}

# KEYS: one base key per limit (the window index is appended here, from the server clock).
# ARGV: window seconds and limit, per key.
# Returns {0, remaining, limit, reset_s} of the tightest limit when admitted (counted against
# every limit), else {index hit, retry_after_s}.
_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local windows, currents = {}, {}
local rem, lim, reset = nil, 0, 0
for i = 1, #KEYS do
  local window = tonumber(ARGV[2 * i - 1])
  local limit = tonumber(ARGV[2 * i])
  local idx = math.floor(now / window)
  local elapsed = (now - idx * window) / window
  local cur_key = KEYS[i] .. ':' .. idx
  local cur = tonumber(redis.call('GET', cur_key) or '0')
  local prev = tonumber(redis.call('GET', KEYS[i] .. ':' .. (idx - 1)) or '0')
  if prev * (1 - elapsed) + cur + 1 > limit then
    local wait
    if cur + 1 <= limit then
      -- the previous window's weight must decay enough, within this window
      wait = (1 - (limit - cur - 1) / prev - elapsed) * window
    else
      -- next window, then this window's count (weighted) must decay
      wait = (1 - elapsed) * window + window * math.min(1, math.max(0, 1 - (limit - 1) / cur))
    end
    return {i, math.max(1, math.ceil(wait))}
  end
  windows[i], currents[i] = window, cur_key
  local left = math.floor(limit - (prev * (1 - elapsed) + cur + 1))
  if rem == nil or left < rem then
    rem, lim, reset = left, limit, math.max(1, math.ceil((1 - elapsed) * window))
  end
end
for i = 1, #KEYS do
  redis.call('INCR', currents[i])
  redis.call('EXPIRE', currents[i], 2 * windows[i] + 1)
end
return {0, rem, lim, reset}
"""


class RateState(NamedTuple):
    """The tightest limit after a request (the ``x-ratelimit-*`` response headers)."""

    limit: int
    remaining: int
    reset_s: int


class Limit(NamedTuple):
    scope: str  # "member" or "tenant"
    key: str
    count: int
    window_s: int


def parse_rate(rate: str | None) -> tuple[int, int] | None:
    """``"30/min"`` -> (30, 60); ``None``/``""`` -> None (no limit)."""
    if not rate:
        return None
    try:
        count, _, period = str(rate).partition("/")
        num = "".join(c for c in period if c.isdigit()) or "1"
        unit = period.lstrip("0123456789").strip().lower()
        return int(count), int(num) * _PERIODS[unit]
    except (KeyError, ValueError):
        raise ValueError(f"bad rate {rate!r}; use e.g. '30/min'") from None


def _rate(name: str) -> tuple[int, int] | None:
    return parse_rate(getattr(settings, name, DEFAULTS[name]))


_scripts: dict[str, redis.commands.core.Script] = {}
_scripts_lock = threading.Lock()
_last_warning = 0.0


def _script():
    """The registered script on a client for the current REDIS_URL (short timeouts)."""
    url = settings.REDIS_URL
    with _scripts_lock:
        if url not in _scripts:
            client = connect(url, socket_timeout=0.5, socket_connect_timeout=0.5)
            _scripts[url] = client.register_script(_SCRIPT)
        return _scripts[url]


def check(scope: str, tenant_id: int, member_id: int) -> RateState | None:
    """Count one request of ``scope`` against the member and tenant limits, or raise Throttled.

    Returns the tightest limit's state (None: no limits, or Redis unreachable)."""
    limits = []
    prefix = scope.upper()
    for who, ident, setting in (("member", member_id, f"{prefix}_RATE_PER_MEMBER"),
                                ("tenant", tenant_id, f"{prefix}_RATE_PER_TENANT")):
        rate = _rate(setting)
        if rate is not None:
            key = f"{KEY_PREFIX}:{scope}:{who[0]}:{ident}"
            limits.append(Limit(who, key, rate[0], rate[1]))
    if not limits:
        return None
    result = _run(limits)
    if result is None:
        return None
    if int(result[0]) == 0:
        return RateState(limit=int(result[2]), remaining=int(result[1]), reset_s=int(result[3]))
    limit, retry_after = limits[int(result[0]) - 1], int(result[1])
    raise Throttled(
        f"Rate limit for this {limit.scope} exceeded ({limit.count} per {limit.window_s}s).",
        scope=limit.scope, retry_after=retry_after, limit=limit.count,
    )


def _run(limits: list[Limit]) -> list | None:
    keys, args = [], []
    for limit in limits:
        keys.append(limit.key)
        args += [limit.window_s, limit.count]
    try:
        return _script()(keys=keys, args=args)
    except redis.RedisError as exc:
        _degraded(exc)
        return None


def _degraded(exc: Exception) -> None:
    global _last_warning
    if time.monotonic() - _last_warning > 30:
        _last_warning = time.monotonic()
        log.warning("throttling: Redis unavailable (%s); %s", exc,
                    "failing open" if _fail_open() else "refusing requests")
    if not _fail_open():
        raise WorkerUnavailable("Rate limiting is unavailable.", retry_after=5)


def _fail_open() -> bool:
    return bool(getattr(settings, "THROTTLE_FAIL_OPEN", True))


class MemberTenantThrottle(BaseThrottle):
    """DRF throttle: per-member and per-tenant limits for ``scope``; raises Throttled itself
    so the 429 carries the stable error shape, the scope hit and ``Retry-After``."""

    scope = "api"

    def allow_request(self, request, view) -> bool:
        member = request_member(request)
        if self.scope == "chat":  # first: a refusal costs no request
            request._request.kvi_tpm = check_tpm(member.tenant_id, member.pk)
        try:
            state = check(self.scope, member.tenant_id, member.pk)
        except Throttled as exc:
            _remember(request, RateState(exc.details["limit"], 0, exc.details["retry_after"]))
            raise
        _remember(request, state)
        return True


def check_tpm(tenant_id: int, member_id: int) -> tpm.TokenState | None:
    """Tokens-per-minute limits (``CHAT_TPM_PER_MEMBER`` / ``CHAT_TPM_PER_TENANT``,
    tenants.budgets.tpm): Throttled while the last minute's tokens reach one; else the
    tightest one's state (the ``x-ratelimit-*-tokens`` headers), None without limits."""
    try:
        return tpm.check(tenant_id, member_id)
    except tpm.TpmExceeded as exc:
        raise Throttled(str(exc), scope=exc.scope, retry_after=exc.retry_after,
                        limit=exc.limit, unit="tokens_per_minute") from None
    except redis.RedisError as exc:
        _degraded(exc)
        return None


def _remember(request, state: RateState | None) -> None:
    """For the ``x-ratelimit-*`` response headers (tenants.api.headers)."""
    request._request.kvi_ratelimit = state


class ChatThrottle(MemberTenantThrottle):
    """Chat limits; a replay (an ``Idempotency-Key`` already answered) costs nothing: it
    returns the stored answer (or a 422 for another body) and generates nothing."""

    scope = "chat"

    def allow_request(self, request, view) -> bool:
        key = request.headers.get("Idempotency-Key")
        if key and len(key) <= 128 and is_answered(request_member(request), key):
            _remember(request, None)
            return True
        return super().allow_request(request, view)


class ApiThrottle(MemberTenantThrottle):
    scope = "api"
