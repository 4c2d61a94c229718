"""L2: HMAC-signed, HMAC-authenticated PackedKV entries in Redis.

* Names come from :class:`~injection.kvcache.signing.CacheKeySigner` (opaque, per-tenant
  tag prefix); values from :mod:`injection.kvcache.codec` (MAC verified before decode).
* A bad value is rejected, counted, deleted and reported as a miss: never served.
  "Bad" covers every malformed value: bad header or MAC, truncated, and a name that
  holds another Redis type (WRONGTYPE), for entries and user indexes alike. A bad
  value is the entry's problem, never a tier fault: it triggers no bypass.
* Writes go to one background writer with a bounded in-flight quota (AIBrix's
  ``_l2_inflight_quota``): when full the write is skipped and counted, so L2
  never blocks a reply. Each write sets the value with a TTL and adds its name to
  the user's index SET in one transaction, so a user is evicted without SCAN.
* ``get``/``put`` never raise for Redis faults (down, timeout): they count
  ``errors`` and degrade to miss / skipped write. After a fault, requests skip
  Redis for ``retry_after_s`` (counted as ``bypassed``) instead of each paying
  a connect timeout. Maintenance calls (``evict``, ``verify``,
  ``stats(scan=True)``) raise ``redis.RedisError`` so their callers know.
* A full Redis (``maxmemory`` reached, OOM) is not a fault: the write is refused and
  counted (``refused_writes``), reads go on. A conversation link (``link=True``) is
  written within its tenant's link budget (``injection.kvcache.l2.links``): room is made
  from that tenant's own oldest links (``link_evictions``), never another tenant's. Its
  other entries (segments, leans) likewise within ``tenant_quota_bytes`` (``entries``,
  ``entry_evictions``): one tenant cannot fill the shared cache.
* The writer's queue is bounded in bytes as well as in count (``max_inflight_bytes``).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import redis

from injection.base import CacheKey, KVStore
from injection.kvcache.l2.links import LinkLedger, LinkView
from injection.kvcache.l2.maintenance import COUNTERS, L2Maintenance
from injection.kvcache.l2.writer import BoundedWriter
from injection.kvcache.l2.writes import L2Writes, _codec
from injection.kvcache.redis_client import (
    DROP_INDEXED,
    FAULTS,
    connect,
    out_of_memory,
    wrong_type,
)
from injection.kvcache.signing import CacheKeySigner

SEEN_TTL_SECONDS = 3600  # how long a looked-up conversation key is remembered

if TYPE_CHECKING:  # pragma: no cover
    from injection.kvcache.packed import PackedKV

__all__ = ["RedisKVTier", "connect"]

log = logging.getLogger(__name__)


class RedisKVTier(L2Writes, L2Maintenance, KVStore):
    """Shared L2 cache tier over one Redis client (give it short socket timeouts).

    Args:
        client: a ``redis.Redis`` (bytes responses; see :meth:`from_url`).
        signer: derives entry names and value MACs.
        ttl_seconds: expiry of entries and user indexes (refreshed on write).
        namespace: first component of every Redis name.
        max_inflight: queued + writing puts before new ones are skipped.
        async_writes: False writes inline (maintenance, benchmarks).
        compress: zstd payloads (off by default: see docs/BENCHMARKS.md).
        retry_after_s: after a Redis fault, get/put skip Redis this long.
        max_inflight_bytes: K/V bytes queued + writing before new puts are skipped (0: none).
        link_quota_bytes: a tenant's conversation links in Redis, in bytes (0: no budget).
        tenant_quota_bytes: a tenant's other entries in Redis (segments, leans), in bytes
            (0: no budget, no ledger).
    """

    def __init__(
        self,
        client: redis.Redis,
        signer: CacheKeySigner,
        *,
        ttl_seconds: int = 86400,
        namespace: str = "kvi",
        max_inflight: int = 64,
        async_writes: bool = True,
        compress: bool = False,
        retry_after_s: float = 1.0,
        max_inflight_bytes: int = 0,
        link_quota_bytes: int = 0,
        tenant_quota_bytes: int = 0,
    ) -> None:
        if ttl_seconds <= 0 or max_inflight <= 0:
            raise ValueError("ttl_seconds and max_inflight must be positive")
        if max_inflight_bytes < 0:
            raise ValueError("max_inflight_bytes must be >= 0 (0: no byte bound)")
        if client.get_connection_kwargs().get("decode_responses"):
            raise ValueError("RedisKVTier needs a client with decode_responses=False")
        self.client = client
        self._drop_script = client.register_script(DROP_INDEXED)
        signer = signer.with_namespace(namespace)
        self.links = LinkLedger(client, signer, quota_bytes=link_quota_bytes,
                                ttl_seconds=int(ttl_seconds))
        self.entries = LinkLedger(client, signer, quota_bytes=tenant_quota_bytes,
                                  ttl_seconds=int(ttl_seconds), kind="entries")
        self.signer = signer  # the ledgers' too (the setter)
        self.ttl_seconds, self.max_inflight = int(ttl_seconds), int(max_inflight)
        self.async_writes, self.compress = async_writes, compress
        self.retry_after_s = retry_after_s
        self._down_until = 0.0
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(COUNTERS, 0)
        self._per_tenant: dict[str, dict[str, int]] = {}
        self._touched: dict[CacheKey, float] = {}  # key -> monotonic time of its last touch
        self._writer: BoundedWriter[CacheKey, tuple[PackedKV, bool]] = BoundedWriter(
            self._queued_write, self.max_inflight, "kvi-l2-writer",
            max_bytes=max_inflight_bytes, weigh=lambda job: job[0].nbytes,
        )

    @property
    def signer(self) -> CacheKeySigner:
        return self._signer

    @signer.setter
    def signer(self, signer: CacheKeySigner) -> None:
        """A new key generation (``kvcache rotate-key``): names and ledgers follow it."""
        self._signer = self.links.signer = self.entries.signer = signer

    @classmethod
    def from_url(
        cls, url: str, signer: CacheKeySigner, *, socket_timeout: float = 2.0, **kw: Any
    ) -> RedisKVTier:
        """A tier on a new client with short timeouts and one immediate retry."""
        return cls(connect(url, socket_timeout=socket_timeout), signer, **kw)

    # -- reads ----------------------------------------------------------------------
    def get(self, key: CacheKey, *, link: bool = False) -> PackedKV | None:
        """Verified entry or None (miss, bad entry, or Redis fault)."""
        if not self._available(key.tenant):
            return None
        name = self.signer.redis_key(key)
        indexes = (self.signer.user_index_key(key.tenant, key.user),
                   self._conversation_index(key) if link else None)
        try:  # a hit refreshes the entry's TTL (and its indexes', which must outlive it;
            # its ledger's too)
            with self.client.pipeline(transaction=False) as p:
                p.get(name)
                for outlives in (name, *filter(None, indexes),
                                 *self._ledger_keys(key.tenant, link)):
                    p.expire(outlives, self.ttl_seconds)
                blob = p.execute(raise_on_error=True)[0]
        except FAULTS as e:
            if wrong_type(e):
                self._reject(key, name, e)
            else:
                self._fault(key.tenant, "get", e)
            return None
        if blob is None:
            self._count(key.tenant, "misses")
            return None
        codec = _codec()
        try:
            kv = codec.decode_named(blob, name, self.signer)
        except codec.CorruptEntry as e:
            self._reject(key, name, e)
            return None
        self._count(key.tenant, "hits")
        return kv

    def touch(self, key: CacheKey) -> bool:
        """Refresh ``key``'s TTL (and its user index's) for an entry served from L1, at
        most once per ``ttl_seconds / 8`` per key in this process: a tenant segment every
        worker holds in L1 is never read from Redis, yet must not expire while in use.
        False when skipped (recently touched, Redis down) or the entry is gone."""
        now = time.monotonic()
        with self._lock:
            if now - self._touched.get(key, -1e18) < self.ttl_seconds / 8:
                return False
            if len(self._touched) > 65536:
                self._touched.clear()
            self._touched[key] = now
        if not self._available(key.tenant):
            return False
        try:
            with self.client.pipeline(transaction=False) as p:
                p.expire(self.signer.redis_key(key), self.ttl_seconds)
                for outlives in (self.signer.user_index_key(key.tenant, key.user),
                                 *self._ledger_keys(key.tenant, False)):
                    p.expire(outlives, self.ttl_seconds)
                return bool(p.execute()[0])
        except FAULTS as e:
            self._fault(key.tenant, "touch", e)
            return False

    # -- writes ---------------------------------------------------------------------
    def put(self, key: CacheKey, kv: PackedKV, *, link: bool = False) -> bool:
        """Store (async by default); False when skipped (queue full, closed, fault).
        ``link``: a conversation link, written within its tenant's link budget."""
        if not kv.is_cpu:
            raise ValueError(f"RedisKVTier stores CPU PackedKV only, got {kv.device}")
        if not self._available(key.tenant):
            return False
        if not self.async_writes:
            return self._write(key, kv, link)
        if not self._writer.submit(key, (kv, link)):
            self._count(key.tenant, "skipped_writes")
            return False
        return True

    def discard(self, key: CacheKey, *, link: bool = False) -> bool:
        """Delete one entry (a superseded conversation link), its queued write included;
        False on a Redis fault (counted; the entry then expires with its TTL)."""
        self._writer.cancel(lambda k: k == key)
        name = self.signer.redis_key(key)
        try:
            deleted = bool(self.drop_indexed(self.signer.user_index_key(key.tenant, key.user),
                                             [name]))
            ledger = self._ledger(link)
            if ledger is not None:
                ledger.forget(key.tenant, [name])
            return deleted
        except FAULTS as e:
            self._fault(key.tenant, "delete", e)
            return False

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every accepted write has finished; False on timeout."""
        return self._writer.flush(timeout)

    def close(self, timeout: float | None = 5.0) -> None:
        """Finish pending writes, stop the writer; later async puts are skipped."""
        self._writer.close(timeout)

    def first_sighting(self, key: CacheKey) -> bool | None:
        """Mark ``key`` as looked up (a doorkeeper, as in TinyLFU: a few bytes under the
        tenant's prefix for ``SEEN_TTL_SECONDS``); True the first time, False after, None
        when Redis did not answer (counted as usual)."""
        if not self._available(key.tenant):
            return None
        name = self.signer.seen_key(key)
        try:
            return bool(self.client.set(name, b"1", nx=True,
                                        ex=min(self.ttl_seconds, SEEN_TTL_SECONDS)))
        except FAULTS as e:
            if not out_of_memory(e):
                self._fault(key.tenant, "seen", e)
            return None

    def links_view(self) -> LinkView:
        """This tier as the conversation store sees it: every entry a link."""
        return LinkView(self)

    # -- helpers --------------------------------------------------------------------
    def _reject(self, key: CacheKey, name: str, e: BaseException) -> None:
        """A malformed value at ``name``: counted, deleted, reported as a miss (no bypass)."""
        self._count(key.tenant, "rejects")
        log.warning("L2 rejected entry %s: %s", name, e)
        index = self.signer.user_index_key(key.tenant, key.user)
        try:
            self.drop_indexed(index, [name])  # DEL runs even when SREM meets a bad index
        except FAULTS as exc:
            if wrong_type(exc):
                self._drop_bad_index(key.tenant, index, exc)
            else:
                self._fault(key.tenant, "delete", exc)

    def _drop_bad_index(self, tenant: str, index: str, e: BaseException) -> None:
        """A user index that is not a SET (or a link ledger of another type): counted as a
        reject and deleted."""
        self._count(tenant, "rejects")
        log.warning("L2 rejected user index %s: %s", index, e)
        try:
            self.client.delete(index)
        except FAULTS as exc:
            self._fault(tenant, "delete", exc)

    def _available(self, tenant: str) -> bool:
        """False (and counted) while Redis is considered down after a fault."""
        if time.monotonic() < self._down_until:
            self._count(tenant, "bypassed")
            return False
        return True

    def _fault(self, tenant: str, what: str, e: BaseException) -> None:
        self._down_until = time.monotonic() + self.retry_after_s
        self._count(tenant, "errors")
        log.warning("L2 %s failed (skipping Redis for %.1fs): %s", what, self.retry_after_s, e)

    def _count(self, tenant: str, what: str, n: int = 1) -> None:
        if not n:
            return
        with self._lock:
            self._counts[what] += n
            per = self._per_tenant.setdefault(tenant, dict.fromkeys(COUNTERS, 0))
            per[what] += n
