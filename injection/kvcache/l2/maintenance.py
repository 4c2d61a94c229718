"""L2 maintenance: evict a tenant, a user or one stored conversation's links, clear
everything, verify entries, sizes and stats.

A mixin of :class:`injection.kvcache.redis_tier.RedisKVTier` (it uses the tier's client,
signer, writer and counters). These calls raise ``redis.RedisError`` so their callers
(``manage.py kvcache``, invalidation) know when Redis did not answer.
"""

from __future__ import annotations

from typing import Any

import redis

from injection.kvcache.l2 import scan as l2_scan
from injection.kvcache.l2.links import link_conversation
from injection.kvcache.redis_client import FAULTS, wrong_type

COUNTERS = ("hits", "misses", "rejects", "errors", "bypassed", "skipped_writes", "writes",
            "refused_writes", "link_evictions", "entry_evictions")


class L2Maintenance:
    """Eviction, verification and statistics over the tier's Redis names."""

    def evict(self, tenant: str, user: str | None = None) -> int:
        """Delete ``tenant``'s entries (``user``'s via its index); returns entries deleted.

        Queued writes of that scope are dropped first and a write in progress is
        waited for, so nothing of the scope reappears after this returns. An index
        loses only the names deleted with it: an entry another process indexes while
        this runs stays indexed, so the next eviction finds it (never an orphan).
        """
        self._writer.cancel(lambda k: k.tenant == tenant and (user is None or k.user == user))
        try:
            if user is not None:
                return self._evict_index(tenant, self.signer.user_index_key(tenant, user))
            return self._evict_tenant(tenant)
        except FAULTS:
            self._count(tenant, "errors")
            raise

    def _evict_tenant(self, tenant: str) -> int:
        prefix = self.signer.tenant_prefix(tenant)
        indexes, deleted = (prefix + "u:").encode(), 0
        for batch in self._scan(prefix + "*"):
            others = [n for n in batch if not n.startswith(indexes)]  # entries, link ledger
            deleted += self._delete_names(others)
            for index in (n for n in batch if n.startswith(indexes)):
                deleted += self._evict_index(tenant, index)
        return deleted

    def evict_conversation(self, tenant: str, user: str, conversation: str) -> int:
        """Delete the links of ``user``'s stored conversation ``conversation`` (its index);
        the user's other entries (segments, lean, other conversations' links) stay. Its
        queued link writes are dropped first, as :meth:`evict` does; returns links deleted."""
        def mine(k: Any) -> bool:
            return (k.tenant, k.user) == (tenant, user) and link_conversation(k) == conversation

        self._writer.cancel(mine)
        index = self.signer.conversation_index_key(tenant, user, conversation)
        try:
            names = self._index_names(tenant, index)
            if not names:
                return 0
            self._unindex(tenant, self.signer.user_index_key(tenant, user), names)
            deleted = self.drop_indexed(index, names)  # the index goes with its last name
            self.links.forget(tenant, names)
            return deleted
        except FAULTS:
            self._count(tenant, "errors")
            raise

    def _unindex(self, tenant: str, index: str, names: list[bytes]) -> None:
        """Take ``names`` off a user index (a malformed one is counted and deleted)."""
        try:
            self.client.srem(index, *names)
        except redis.ResponseError as e:
            if not wrong_type(e):
                raise
            self._drop_bad_index(tenant, index, e)

    def _index_names(self, tenant: str, index: str | bytes) -> list[bytes]:
        """The names a user (or conversation) index holds; [] for a malformed index, which
        is counted and deleted."""
        try:
            return list(self.client.smembers(index))
        except redis.ResponseError as e:
            if not wrong_type(e):
                raise
            self._drop_bad_index(tenant, index, e)
            return []

    def _evict_index(self, tenant: str, index: str | bytes) -> int:
        """Delete the entries a user index names and remove exactly those names from it."""
        names = self._index_names(tenant, index)
        if not names:
            return 0
        deleted = self.drop_indexed(index, names)  # an empty set goes with its last name
        for ledger in (self.links, self._ledger(False)):  # off the tenant's budgets
            if ledger is not None:
                ledger.forget(tenant, names)
        return deleted

    def evict_all(self) -> int:
        """Delete every entry and user index of the namespace, of every tenant and key
        generation (other names in the namespace stay); returns entries deleted."""
        self._writer.cancel(lambda k: True)
        deleted = 0
        for batch in self._scan(f"{self.signer.namespace}:*"):
            deleted += self._delete_names([n for n in batch if self.signer.parse_name(n)])
        return deleted

    def _delete_names(self, names: list[bytes]) -> int:
        """Delete entry/index/ledger names; returns how many were entries."""
        if names:
            self.client.delete(*names)
        return sum(1 for n in names if (self.signer.parse_name(n) or ("", ""))[1] == "e")

    def verify(self, tenant: str | None = None) -> dict[str, Any]:
        """Check MAC + header of every entry (of ``tenant``); delete the bad ones."""
        return l2_scan.verify(self.client, self.signer, self.signer.entry_match(tenant))

    def stats(self, scan: bool = False, tenants: list[str] | None = None) -> dict[str, Any]:
        """Counters (total and per tenant seen by this process); ``scan`` adds Redis sizes.

        With ``scan``, each known tenant (and each of ``tenants``) gets
        ``entries``/``bytes`` (conversation links included), from one SCAN of every
        tenant's entries bucketed by tenant (not a pass per tenant), and
        ``link_entries``/``link_bytes`` from its link ledger, ``ledger_entries``/
        ``ledger_bytes`` from the ledger of its other entries (with ``tenant_quota_bytes``);
        totals cover every tenant.
        """
        with self._lock:
            out: dict[str, Any] = dict(self._counts)
            per = {t: dict(c) for t, c in self._per_tenant.items()}
        out.update(inflight=self._writer.inflight, max_inflight=self.max_inflight,
                   inflight_bytes=self._writer.inflight_bytes,
                   max_inflight_bytes=self._writer.max_bytes,
                   link_quota_bytes=self.links.quota_bytes,
                   tenant_quota_bytes=self.entries.quota_bytes)
        if scan:
            by_tag = l2_scan.sizes_by_tag(self.client, self.signer.entry_match(None),
                                          self._tag)
            for t in set(per) | set(tenants or ()):
                links, budgeted = self.links.usage(t), self.entries.usage(t)
                per.setdefault(t, dict.fromkeys(COUNTERS, 0)).update(
                    by_tag.get(self.signer.tenant_tag(t), {"entries": 0, "bytes": 0}),
                    link_entries=links["entries"], link_bytes=links["bytes"],
                    ledger_entries=budgeted["entries"], ledger_bytes=budgeted["bytes"],
                )
            out.update({f: sum(row[f] for row in by_tag.values()) for f in ("entries", "bytes")})
        out["per_tenant"] = per
        return out

    def user_sizes(self, tenant: str, user: str) -> dict[str, int]:
        """Entries and bytes in Redis of one user of ``tenant`` (its index; the tenant
        segment's slot ``~tenant`` included); raises ``redis.RedisError``."""
        names = sorted(self.client.smembers(self.signer.user_index_key(tenant, user)))
        with self.client.pipeline(transaction=False) as p:
            for n in names:
                p.strlen(n)
            lengths = p.execute(raise_on_error=False) if names else []
        live = [x for x in lengths if isinstance(x, int) and x > 0]  # expired: 0
        return {"entries": len(live), "bytes": sum(live)}

    def _tag(self, name: bytes) -> str:
        """The tenant tag of an entry's name ("" for a name of another form)."""
        try:
            return self.signer.tag_of(name)
        except ValueError:
            return ""

    def _scan(self, match: str):
        return l2_scan.batches(self.client, match)
