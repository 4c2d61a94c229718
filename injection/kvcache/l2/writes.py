"""The Redis tier's write path (a mixin of ``RedisKVTier``): an entry and its user index
in one step, within its tenant's budget of its kind (``links``: conversation links;
``entries``: segments and leans), and what a failed write means: a full Redis (refused,
counted; a budgeted entry first makes room from its own tenant's oldest of its kind), a name
of the wrong type (dropped, written again), or a fault."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from injection.base import CacheKey
from injection.kvcache.l2.links import link_conversation
from injection.kvcache.redis_client import DROP_CHUNK, FAULTS, out_of_memory, wrong_type

if TYPE_CHECKING:  # pragma: no cover
    from injection.kvcache.packed import PackedKV

__all__ = ["L2Writes"]

_EVICTIONS = {True: "link_evictions", False: "entry_evictions"}  # counted per ledger kind

log = logging.getLogger("injection.kvcache.redis_tier")


def _codec():
    """``injection.kvcache.codec`` (it needs torch), imported on first encode/decode, so a
    process that only evicts or scans entries (the web invalidating L2) never loads torch."""
    from injection.kvcache import codec

    return codec


class L2Writes:
    """Writes of :class:`injection.kvcache.redis_tier.RedisKVTier` (its client, signer,
    ledger, counters and fault handling)."""

    def _ledger(self, link: bool) -> Any:
        """The tenant budget an entry is written within: its links', or its other entries'
        (None without one: written as they are)."""
        if link:
            return self.links
        return self.entries if self.entries.quota_bytes else None

    def _ledger_keys(self, tenant: str, link: bool) -> tuple[str, ...]:
        ledger = self._ledger(link)
        return ledger.keys(tenant) if ledger is not None else ()

    def _queued_write(self, key: CacheKey, job: tuple[PackedKV, bool]) -> bool:
        return self._write(key, *job)

    def _write(self, key: CacheKey, kv: PackedKV, link: bool = False) -> bool:
        if not self._available(key.tenant):
            return False
        blob = _codec().encode(kv, key, self.signer, compress=self.compress)
        name = self.signer.redis_key(key)
        indexes = (self.signer.user_index_key(key.tenant, key.user),
                   self._conversation_index(key) if link else None)
        for attempt in (1, 2):
            try:
                if not self._store(key.tenant, name, indexes, blob, link):
                    self._count(key.tenant, "refused_writes")  # larger than the budget
                    return False
                break
            except FAULTS as e:
                if not self._recover(key.tenant, indexes, blob, link, e, again=attempt == 1):
                    return False
        self._count(key.tenant, "writes")
        return True

    def _conversation_index(self, key: CacheKey) -> str | None:
        """The index of the stored conversation whose link ``key`` is (None: not one)."""
        conversation = link_conversation(key)
        if conversation is None:
            return None
        return self.signer.conversation_index_key(key.tenant, key.user, conversation)

    def _store(self, tenant: str, name: str, indexes: tuple[str, str | None], blob: Any,
               link: bool) -> bool:
        """Write ``name`` indexed under the user's index (``indexes[0]``) and, for a stored
        conversation's link, its conversation's (``indexes[1]``)."""
        ledger = self._ledger(link)
        if ledger is None:
            self._set_indexed(name, indexes[0], blob)
            return True
        stored, evicted = ledger.write(tenant, name, indexes[0], blob, indexes[1])
        self._count(tenant, _EVICTIONS[link], evicted)
        return stored

    def _recover(self, tenant: str, indexes: tuple[str, str | None], blob: Any, link: bool,
                 e: BaseException, *, again: bool) -> bool:
        """After a failed write: True to write ``again`` (a bad index dropped; a full Redis
        with room made from the tenant's own oldest links), else counted and False."""
        if out_of_memory(e):
            freed = self._make_room(tenant, len(blob), link) if again else 0
            if not freed:
                self._count(tenant, "refused_writes")
                log.info("L2 full (maxmemory): write refused")
            return bool(freed)
        if wrong_type(e) and again:
            expected = {index: b"set" for index in indexes if index}
            expected.update(zip(self._ledger_keys(tenant, link), (b"hash", b"zset"),
                                strict=False))
            return self._drop_wrong_types(tenant, expected, e)
        self._fault(tenant, "write", e)
        return False

    def _drop_wrong_types(self, tenant: str, expected: dict[str, bytes],
                          e: BaseException) -> bool:
        """Delete those of ``expected``'s names that hold another Redis type (each counted
        as a reject); True when one was found, so the write is tried again."""
        try:
            with self.client.pipeline(transaction=False) as p:
                for name in expected:
                    p.type(name)
                found = p.execute()
        except FAULTS as exc:
            self._fault(tenant, "write", exc)
            return False
        bad = [n for (n, want), t in zip(expected.items(), found, strict=True)
               if t not in (want, b"none", want.decode(), "none")]
        for name in bad:
            self._drop_bad_index(tenant, name, e)
        if not bad:
            self._fault(tenant, "write", e)
        return bool(bad)

    def _make_room(self, tenant: str, nbytes: int, link: bool) -> int:
        """The tenant's own oldest entries of the kind deleted for ``nbytes`` (none
        without a ledger of the kind); returns how many went."""
        ledger = self._ledger(link)
        if ledger is None:
            return 0
        try:
            evicted = ledger.make_room(tenant, nbytes)
        except FAULTS as e:
            self._fault(tenant, "write", e)
            return 0
        self._count(tenant, _EVICTIONS[link], evicted)
        return evicted

    def drop_indexed(self, index: str | bytes, names: list[str] | list[bytes]) -> int:
        """Delete ``names`` and take them off ``index`` (atomically per chunk, and also
        when Redis is full); returns how many existed. Raises Redis errors."""
        deleted = 0
        for i in range(0, len(names), DROP_CHUNK):
            deleted += int(self._drop_script(keys=[index, *names[i:i + DROP_CHUNK]]))
        return deleted

    def _set_indexed(self, name: str, index: str, blob: Any) -> None:
        with self.client.pipeline(transaction=True) as p:
            p.set(name, blob, ex=self.ttl_seconds)
            p.sadd(index, name)
            p.expire(index, self.ttl_seconds)
            p.execute()

