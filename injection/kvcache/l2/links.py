"""A tenant's conversation links in Redis, held to a byte budget (the link ledger); its
other entries (segments, leans) likewise, in a ledger of their own (``kind="entries"``).

Links are the bulk of what L2 holds (a conversation's whole K/V after the injected turn,
rewritten every turn), so each tenant's links are accounted in a ledger under the
tenant's own prefix (``CacheKeySigner.link_ledger_keys``): a HASH of each link's bytes
and user index, plus the tenant's total (``#bytes``), and a ZSET of the links in the
order they were written (milliseconds, strictly increasing). A write that would take the
tenant past ``quota_bytes`` first deletes the tenant's own oldest links; it never touches
another tenant's names. Everything runs in
one Lua script per write, so concurrent workers keep the ledger exact. A link deleted
for room also leaves its member's index (the ledger row names it).

The total is the cache Redis's own ``maxmemory`` (a dedicated instance, ``noeviction``;
docs/OPERATIONS.md): a write refused there (OOM) is retried once after the writing
tenant's own oldest links have made room (:meth:`LinkLedger.make_room`), else it is a
refused write — a miss later, never a failed chat. The entry's SET is the script's first
write, so under OOM Redis refuses the whole script before it changes anything.

A ledger row outlives a link that expired by TTL: the row is the oldest of the tenant's,
so it is the first to go when room is needed, and its recorded bytes come off the total.

A stored conversation's links (``/api/chat``: keyed by the conversation's id, see
:func:`link_hash`) are also named in a conversation index (``CacheKeySigner.
conversation_index_key``), written by the same script, so deleting the conversation drops
exactly its links (``L2Maintenance.evict_conversation``) and nothing else of its member.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import redis

if TYPE_CHECKING:  # pragma: no cover
    from injection.base import CacheKey
    from injection.kvcache.packed import PackedKV

__all__ = ["LINK_PREFIX", "LinkLedger", "LinkView", "TOTAL_FIELD", "link_conversation",
           "link_hash"]

TOTAL_FIELD = "#bytes"
LINK_PREFIX = "link:"  # a stored conversation's link: "link:<conversation id>:<digest>"


def link_hash(conversation: str | None, digest: str) -> str:
    """A link key's content hash: ``digest`` as it is, or tagged with the stored
    conversation it belongs to (``/api/chat``), so that conversation's links are found."""
    return digest if conversation is None else f"{LINK_PREFIX}{conversation}:{digest}"


def link_conversation(key: CacheKey) -> str | None:
    """The stored conversation whose link ``key`` is (None: any other entry, a ``/v1`` link)."""
    if not key.content_hash.startswith(LINK_PREFIX):
        return None
    return key.content_hash[len(LINK_PREFIX):].rpartition(":")[0]  # the id may hold ":"

# helpers of the scripts below: a ledger row ("bytes user-index"), and a link dropped whole
_ROW = """
local function row(ledger, name)
  local v = redis.call('HGET', ledger, name)
  if not v then return 0, nil end
  local size, index = string.match(v, '^(%d+) (.+)$')
  return tonumber(size or '0'), index
end
local function drop(ledger, order, name)
  local size, index = row(ledger, name)
  redis.call('DEL', name)
  if index then redis.call('SREM', index, name) end
  redis.call('ZREM', order, name)
  redis.call('HDEL', ledger, name)
  return size
end
"""

# KEYS: entry, user index, ledger hash, ledger order[, conversation index]; ARGV: blob, ttl,
# now (ms), quota
_WRITE = _ROW + """
local size = string.len(ARGV[1])
local quota = tonumber(ARGV[4])
local old = row(KEYS[3], KEYS[1])
local total = tonumber(redis.call('HGET', KEYS[3], '#bytes') or '0') - old
if quota > 0 and size > quota then
  return {0, 0}
end
local victims = {}
if quota > 0 and total + size > quota then
  local order = redis.call('ZRANGE', KEYS[4], 0, -1)
  for _, name in ipairs(order) do
    if total + size <= quota then break end
    if name ~= KEYS[1] then
      total = total - row(KEYS[3], name)
      victims[#victims + 1] = name
    end
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
for _, name in ipairs(victims) do
  drop(KEYS[3], KEYS[4], name)
end
redis.call('SADD', KEYS[2], KEYS[1])
redis.call('EXPIRE', KEYS[2], ARGV[2])
if KEYS[5] then
  redis.call('SADD', KEYS[5], KEYS[1])
  redis.call('EXPIRE', KEYS[5], ARGV[2])
end
redis.call('HSET', KEYS[3], KEYS[1], size .. ' ' .. KEYS[2], '#bytes', math.max(total, 0) + size)
local top = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')[2]
redis.call('ZADD', KEYS[4], math.max(tonumber(ARGV[3]), tonumber(top or '0') + 1), KEYS[1])
redis.call('EXPIRE', KEYS[3], ARGV[2])
redis.call('EXPIRE', KEYS[4], ARGV[2])
return {1, #victims}
"""

# KEYS: ledger hash, ledger order; ARGV: names no longer stored (deleted by the caller)
_FORGET = _ROW + """
local freed = 0
for _, name in ipairs(ARGV) do
  local size = row(KEYS[1], name)
  if redis.call('HDEL', KEYS[1], name) == 1 then
    freed = freed + size
    redis.call('ZREM', KEYS[2], name)
  end
end
if freed > 0 then
  redis.call('HINCRBY', KEYS[1], '#bytes', -freed)
end
return freed
"""

# KEYS: ledger hash, ledger order; ARGV: bytes to free. Deletes the tenant's oldest links.
_MAKE_ROOM = _ROW + """
local want, freed, n = tonumber(ARGV[1]), 0, 0
while freed < want do
  local oldest = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if not oldest then break end
  freed = freed + drop(KEYS[1], KEYS[2], oldest)
  n = n + 1
end
if freed > 0 then
  redis.call('HINCRBY', KEYS[1], '#bytes', -freed)
end
return n
"""


class LinkLedger:
    """One tenant-scoped budget of entry bytes in the cache Redis: its conversation links
    (``kind`` "links"), or its other entries, segments and leans ("entries")."""

    def __init__(self, client: redis.Redis, signer: Any, *, quota_bytes: int,
                 ttl_seconds: int, kind: str = "links") -> None:
        if quota_bytes < 0:
            raise ValueError("quota_bytes must be >= 0 (0: no per-tenant budget)")
        if kind not in ("links", "entries"):
            raise ValueError(f"no ledger of {kind!r}")
        self.client, self.signer, self.kind = client, signer, kind
        self.quota_bytes, self.ttl_seconds = int(quota_bytes), int(ttl_seconds)
        self._write = client.register_script(_WRITE)
        self._forget = client.register_script(_FORGET)
        self._make_room = client.register_script(_MAKE_ROOM)

    def keys(self, tenant: str) -> tuple[str, str]:
        """The tenant's ledger (HASH, ZSET) of this kind, under its own prefix."""
        if self.kind == "links":
            return self.signer.link_ledger_keys(tenant)
        return self.signer.entry_ledger_keys(tenant)

    def write(self, tenant: str, name: str, index: str, blob: Any,
              conversation_index: str | None = None) -> tuple[bool, int]:
        """Store ``blob`` at ``name`` (indexed under ``index``, and ``conversation_index``
        if given) within the tenant's budget: (stored, own links deleted for room). Not
        stored: larger than the whole budget. Raises Redis errors (``OutOfMemoryError``
        when the cache Redis is full)."""
        ledger, order = self.keys(tenant)
        also = [conversation_index] if conversation_index else []
        stored, evicted = self._write(
            keys=[name, index, ledger, order, *also],
            args=[blob, self.ttl_seconds, int(time.time() * 1000), self.quota_bytes])
        return bool(stored), int(evicted)

    def forget(self, tenant: str, names: list[str | bytes]) -> int:
        """Take deleted links off the tenant's ledger; returns the bytes freed."""
        if not names:
            return 0
        return int(self._forget(keys=list(self.keys(tenant)), args=names))

    def make_room(self, tenant: str, nbytes: int) -> int:
        """Delete the tenant's oldest links until ``nbytes`` are freed (or none is left);
        returns how many went. Deletes only: Redis runs it even when it is full."""
        return int(self._make_room(keys=list(self.keys(tenant)),
                                   args=[int(nbytes)]))

    def usage(self, tenant: str) -> dict[str, int]:
        """The tenant's links as the ledger has them: count and bytes."""
        ledger, order = self.keys(tenant)
        with self.client.pipeline(transaction=False) as p:
            p.hget(ledger, TOTAL_FIELD)
            p.zcard(order)
            total, count = p.execute()
        return {"entries": int(count or 0), "bytes": int(total or 0)}


class LinkView:
    """A :class:`RedisKVTier` whose entries are conversation links (``ConversationStore``'s
    L2): written within the tenant's link budget and taken off its ledger when discarded."""

    def __init__(self, tier: Any) -> None:
        self.tier = tier

    def get(self, key: CacheKey) -> PackedKV | None:
        return self.tier.get(key, link=True)

    def put(self, key: CacheKey, kv: PackedKV) -> bool:
        return self.tier.put(key, kv, link=True)

    def discard(self, key: CacheKey) -> bool:
        return self.tier.discard(key, link=True)

    def first_sighting(self, key: CacheKey) -> bool | None:
        return self.tier.first_sighting(key)

    def evict_conversation(self, tenant: str, user: str, conversation: str) -> int:
        return self.tier.evict_conversation(tenant, user, conversation)
