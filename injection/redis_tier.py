"""L2: HMAC-signed, HMAC-authenticated PackedKV entries in Redis.

* Names come from :class:`~injection.signing.CacheKeySigner` (opaque, per-tenant
  tag prefix); values from :mod:`injection.codec` (MAC verified before decode).
* A bad value is rejected, counted, deleted and reported as a miss: never served.
* Writes go to one background writer with a bounded in-flight quota (AIBrix's
  ``_l2_inflight_quota``): when full the write is skipped and counted, so L2
  never blocks a reply. Each write sets the value with a TTL and adds its name to
  the user's index SET in one transaction, so a user is evicted without SCAN.
* ``get``/``put`` never raise for Redis faults (down, timeout): they count
  ``errors`` and degrade to miss / skipped write. Maintenance calls (``evict``,
  ``verify``, ``stats(scan=True)``) raise ``redis.RedisError`` so callers know.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Any

import redis

from injection import codec
from injection.base import CacheKey, KVStore
from injection.packed import PackedKV
from injection.signing import CacheKeySigner

__all__ = ["RedisKVTier"]

log = logging.getLogger(__name__)
_FAULTS = (redis.RedisError, OSError)
_COUNTERS = ("hits", "misses", "rejects", "errors", "skipped_writes", "writes")
_SCAN_BATCH = 500
_VERIFY_BATCH = 16  # values fetched per pipeline while verifying (bounded memory)


class RedisKVTier(KVStore):
    """Shared L2 cache tier over one Redis client (give it short socket timeouts).

    Args:
        client: a ``redis.Redis`` (bytes responses; see :meth:`from_url`).
        signer: derives entry names and value MACs.
        ttl_seconds: expiry of entries and user indexes (refreshed on write).
        namespace: first component of every Redis name.
        max_inflight: queued + writing puts before new ones are skipped.
        async_writes: False writes inline (maintenance, benchmarks).
        compress: zstd payloads (off by default: see docs/BENCHMARKS.md).
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
    ) -> None:
        if ttl_seconds <= 0 or max_inflight <= 0:
            raise ValueError("ttl_seconds and max_inflight must be positive")
        if client.get_connection_kwargs().get("decode_responses"):
            raise ValueError("RedisKVTier needs a client with decode_responses=False")
        self.client = client
        self.signer = signer.with_namespace(namespace)
        self.ttl_seconds, self.max_inflight = int(ttl_seconds), int(max_inflight)
        self.async_writes, self.compress = async_writes, compress
        self._cv = threading.Condition()
        self._queue: collections.deque[tuple[CacheKey, PackedKV]] = collections.deque()
        self._inflight = 0  # queued + the one being written
        self._writing: CacheKey | None = None
        self._closed = False
        self._counts = dict.fromkeys(_COUNTERS, 0)
        self._per_tenant: dict[str, dict[str, int]] = {}
        self._writer: threading.Thread | None = None

    @classmethod
    def from_url(
        cls, url: str, signer: CacheKeySigner, *, socket_timeout: float = 2.0, **kw: Any
    ) -> RedisKVTier:
        """A tier on a new client with short connect/socket timeouts."""
        client = redis.Redis.from_url(
            url, socket_timeout=socket_timeout, socket_connect_timeout=min(socket_timeout, 0.5)
        )
        return cls(client, signer, **kw)

    # -- reads ----------------------------------------------------------------------
    def get(self, key: CacheKey) -> PackedKV | None:
        """Verified entry or None (miss, bad entry, or Redis fault)."""
        name = self.signer.redis_key(key)
        try:
            blob = self.client.get(name)
        except _FAULTS as e:
            self._count(key.tenant, "errors")
            log.warning("L2 get failed: %s", e)
            return None
        if blob is None:
            self._count(key.tenant, "misses")
            return None
        try:
            kv = codec.decode_named(blob, name, self.signer)
        except codec.CorruptEntry as e:
            self._count(key.tenant, "rejects")
            log.warning("L2 rejected entry %s for tenant tag %s: %s", name, name.split(":")[1], e)
            self._delete_quietly(key, name)
            return None
        self._count(key.tenant, "hits")
        return kv

    # -- writes ---------------------------------------------------------------------
    def put(self, key: CacheKey, kv: PackedKV) -> bool:
        """Store (async by default); False when skipped (queue full, closed, fault)."""
        if not kv.is_cpu:
            raise ValueError(f"RedisKVTier stores CPU PackedKV only, got {kv.device}")
        if not self.async_writes:
            return self._write(key, kv)
        with self._cv:
            if self._closed or self._inflight >= self.max_inflight:
                self._count(key.tenant, "skipped_writes")
                return False
            self._inflight += 1
            self._queue.append((key, kv))
            self._ensure_writer()
            self._cv.notify_all()
        return True

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every accepted write has finished; False on timeout."""
        with self._cv:
            return self._cv.wait_for(lambda: self._inflight == 0, timeout)

    def close(self, timeout: float | None = 5.0) -> None:
        """Finish pending writes, stop the writer; later puts are skipped."""
        self.flush(timeout)
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._writer is not None:
            self._writer.join(timeout)

    def _ensure_writer(self) -> None:
        if self._writer is None or not self._writer.is_alive():
            self._writer = threading.Thread(target=self._writer_loop, name="kvi-l2-writer")
            self._writer.daemon = True
            self._writer.start()

    def _writer_loop(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._queue or self._closed)
                if not self._queue:
                    return
                key, kv = self._queue.popleft()
                self._writing = key
            try:
                self._write(key, kv)
            finally:
                with self._cv:
                    self._writing = None
                    self._inflight -= 1
                    self._cv.notify_all()

    def _write(self, key: CacheKey, kv: PackedKV) -> bool:
        try:
            blob = codec.encode(kv, key, self.signer, compress=self.compress)
            name = self.signer.redis_key(key)
            index = self.signer.user_index_key(key.tenant, key.user)
            with self.client.pipeline(transaction=True) as p:
                p.set(name, blob, ex=self.ttl_seconds)
                p.sadd(index, name)
                p.expire(index, self.ttl_seconds)
                p.execute()
        except Exception as e:  # a write must never take the worker down
            self._count(key.tenant, "errors")
            log.warning("L2 write failed: %s", e)
            return False
        self._count(key.tenant, "writes")
        return True

    # -- maintenance ----------------------------------------------------------------
    def evict(self, tenant: str, user: str | None = None) -> int:
        """Delete ``tenant``'s entries (``user``'s via its index); returns entries deleted.

        Queued writes of that scope are dropped first and a write in progress is
        waited for, so nothing of the scope reappears after this returns.
        """
        self._cancel_pending(tenant, user)
        try:
            if user is not None:
                index = self.signer.user_index_key(tenant, user)
                names = list(self.client.smembers(index))
                deleted = self.client.delete(*names) if names else 0
                self.client.delete(index)
                return int(deleted)
            deleted = 0
            for batch in self._scan(self.signer.tenant_prefix(tenant) + "*"):
                deleted += sum(1 for n in batch if b":e:" in n)
                self.client.delete(*batch)
            return deleted
        except _FAULTS:
            self._count(tenant, "errors")
            raise

    def _cancel_pending(self, tenant: str, user: str | None) -> None:
        def in_scope(k: CacheKey | None) -> bool:
            return k is not None and k.tenant == tenant and (user is None or k.user == user)

        with self._cv:
            keep = [item for item in self._queue if not in_scope(item[0])]
            dropped = len(self._queue) - len(keep)
            self._queue = collections.deque(keep)
            self._inflight -= dropped
            self._cv.notify_all()
            self._cv.wait_for(lambda: not in_scope(self._writing), timeout=10.0)

    def verify(self, tenant: str | None = None) -> dict[str, Any]:
        """Check MAC + header of every entry (of ``tenant``); delete the bad ones."""
        report: dict[str, Any] = {"scanned": 0, "ok": 0, "bad": 0, "deleted": 0, "bad_keys": []}
        reasons: dict[str, str] = {}
        for batch in self._scan(self.signer.entry_match(tenant), _VERIFY_BATCH):
            with self.client.pipeline(transaction=False) as p:
                for n in batch:
                    p.get(n)
                blobs = p.execute(raise_on_error=False)
            for n, blob in zip(batch, blobs, strict=True):
                if blob is None:  # expired since SCAN
                    continue
                name = n.decode(errors="replace")
                report["scanned"] += 1
                try:
                    if not isinstance(blob, bytes):
                        raise codec.CorruptEntry(f"not a string value: {blob!r}"[:120])
                    codec.check(blob, name, self.signer)
                    report["ok"] += 1
                except codec.CorruptEntry as e:
                    report["bad"] += 1
                    report["bad_keys"].append(name)
                    reasons[name] = str(e)
                    report["deleted"] += int(self.client.delete(n))
        report["reasons"] = reasons
        return report

    def stats(self, scan: bool = False, tenants: list[str] | None = None) -> dict[str, Any]:
        """Counters (total and per tenant seen by this process); ``scan`` adds Redis sizes.

        With ``scan``, each known tenant (and each of ``tenants``) gets
        ``entries``/``bytes`` from a SCAN of its prefix, and totals cover every tenant.
        """
        with self._cv:
            out: dict[str, Any] = dict(self._counts)
            per = {t: dict(c) for t, c in self._per_tenant.items()}
            out.update(inflight=self._inflight, max_inflight=self.max_inflight)
        if scan:
            for t in set(per) | set(tenants or ()):
                per.setdefault(t, dict.fromkeys(_COUNTERS, 0)).update(
                    self._sizes(self.signer.entry_match(t))
                )
            out.update(self._sizes(self.signer.entry_match(None)))
        out["per_tenant"] = per
        return out

    # -- helpers --------------------------------------------------------------------
    def _sizes(self, match: str) -> dict[str, int]:
        entries = nbytes = 0
        for batch in self._scan(match):
            with self.client.pipeline(transaction=False) as p:
                for n in batch:
                    p.strlen(n)
                lengths = p.execute(raise_on_error=False)
            entries += len(batch)
            nbytes += sum(x for x in lengths if isinstance(x, int))
        return {"entries": entries, "bytes": nbytes}

    def _scan(self, match: str, batch: int = _SCAN_BATCH):
        """Yield lists of names matching ``match`` (SCAN, never KEYS)."""
        buf: list[bytes] = []
        for n in self.client.scan_iter(match=match, count=_SCAN_BATCH):
            buf.append(n)
            if len(buf) >= batch:
                yield buf
                buf = []
        if buf:
            yield buf

    def _delete_quietly(self, key: CacheKey, name: str) -> None:
        try:
            with self.client.pipeline(transaction=True) as p:
                p.delete(name)
                p.srem(self.signer.user_index_key(key.tenant, key.user), name)
                p.execute()
        except _FAULTS as e:
            self._count(key.tenant, "errors")
            log.warning("L2 delete of rejected entry failed: %s", e)

    def _count(self, tenant: str, what: str) -> None:
        with self._cv:
            self._counts[what] += 1
            per = self._per_tenant.setdefault(tenant, dict.fromkeys(_COUNTERS, 0))
            per[what] += 1
