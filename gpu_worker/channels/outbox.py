"""Durable K/V invalidation: delivering the outbox (``tenants.models.KVInvalidation``).

Rows are written by ``tenants.actions.invalidate_on_commit`` in the transaction of the
change. Three deliverers, none of which may lose a row:

* :func:`deliver_now` — after commit (web, commands): delete L2 and broadcast to the
  workers at once (the fast path); marks the row's L2 done only if Redis answered.
* :func:`sweep` — every worker agent, each heartbeat: the L2 deletion of rows still
  pending (Redis was down), until acknowledged; prunes delivered rows past retention.
* :class:`OutboxFollower` — one thread per serving process: reads the rows of every
  transaction committed since its last poll and evicts its own L1. It needs Postgres
  only, so a worker resynchronises after any Redis outage or missed broadcast.

A row's ``kind`` says what goes: ``scope``, the member's whole K/V (or the tenant's);
``links``, only the links of one stored conversation of the member (a deleted
conversation: the member's segments and lean stay).

Why ``txid`` and not ``id`` as the follower's cursor: ids are taken at INSERT, not at
commit, so a transaction that commits late becomes visible with an id below one already
read. Every transaction whose id is below a snapshot's ``xmin`` has finished, so a
follower that reads ``txid >= previous xmin`` (remembering what it applied) sees each
committed row, however late its transaction commits.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection, transaction
from django.utils import timezone

from gpu_worker.channels import kvstore
from tenants.models import KVInvalidation

log = logging.getLogger(__name__)
SWEEP_GRACE_SECONDS = 2.0  # leave a fresh row to the fast path first
ANNOUNCED_TTL_SECONDS = 600.0
# (tenant, member or None: the tenant's, conversation or None: the member's whole K/V)
Scope = tuple[str, str | None, str | None]
Apply = Callable[[str, str | None, str | None], Any]


def _text(ref: int | None) -> str | None:
    return None if ref is None else str(ref)


def _conversation(ref: int | None) -> str | None:
    """A ``links`` row's conversation as the engine keys its links (None: a ``scope`` row)."""
    return None if ref is None else kvstore.conversation_key(ref)


def _scope(row: KVInvalidation) -> Scope:
    """What a row drops: its kind ``links`` names the conversation, a ``scope`` row none."""
    return str(row.tenant_ref), _text(row.member_ref), _conversation(row.conversation_ref)


def _evict_l2(tier: Any, tenant: str, user: str | None, conversation: str | None) -> int:
    if conversation is None:
        return tier.evict(tenant, user)
    return tier.evict_conversation(tenant, user, conversation)


def _mark_l2_done(ids: Sequence[int]) -> None:
    if ids:
        KVInvalidation.objects.filter(pk__in=ids).update(l2_done_at=timezone.now())


def deliver_now(ids: Sequence[int]) -> int:
    """Fast path for committed rows: L2 deletion + broadcast; returns rows acknowledged."""
    rows = list(KVInvalidation.objects.filter(pk__in=ids, l2_done_at__isnull=True).order_by("id"))
    done = []
    for row in rows:
        tenant, user, conversation = _scope(row)
        result = kvstore.invalidate(tenant, user, outbox=row.pk, conversation=conversation)
        if result["l2_deleted"] is None:
            break  # Redis is down: the sweep retries; workers' followers evict L1 anyway
        done.append(row.pk)
    _mark_l2_done(done)
    return len(done)


def sweep(limit: int = 200) -> int:
    """Delete L2 for rows not yet acknowledged (oldest first); prune old delivered rows.

    Raises ``redis.RedisError`` when Redis is still down (nothing is marked then).
    Concurrent sweepers skip each other's rows (``SKIP LOCKED``).
    """
    cutoff = timezone.now() - timedelta(seconds=SWEEP_GRACE_SECONDS)
    with transaction.atomic():
        rows = list(
            KVInvalidation.objects.select_for_update(skip_locked=True)
            .filter(l2_done_at__isnull=True, created_at__lt=cutoff).order_by("id")[:limit]
        )
        if rows:
            tier = kvstore.l2_tier()
            for row in rows:
                _evict_l2(tier, *_scope(row))
            _mark_l2_done([r.pk for r in rows])
            log.info("outbox: L2 invalidation delivered for %d pending rows", len(rows))
    prune()
    return len(rows)


def prune() -> int:
    keep = timezone.now() - timedelta(seconds=settings.KV_OUTBOX_RETENTION_SECONDS)
    deleted, _ = KVInvalidation.objects.filter(
        l2_done_at__isnull=False, created_at__lt=keep
    ).delete()
    return deleted


_FOLLOW_SQL = """
SELECT s.xmin, o.id, o.txid, o.tenant_ref, o.member_ref, o.conversation_ref
FROM (SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS xmin) s
LEFT JOIN {table} o ON o.txid >= %s
ORDER BY o.id
"""


class OutboxFollower(threading.Thread):
    """Applies every committed outbox row to this process's L1, exactly once per row."""

    def __init__(self, apply: Apply, interval: float | None = None) -> None:
        super().__init__(name="kvi-outbox", daemon=True)
        self.apply = apply
        self.interval = settings.KV_OUTBOX_POLL_SECONDS if interval is None else interval
        self._since: int | None = None  # xmin of the previous poll
        self._applied: dict[int, int] = {}  # id -> txid of rows a poll may read again
        self._announced: dict[int, float] = {}  # ids a broadcast or a warm applied first
        self._lock = threading.Lock()
        self._apply_lock = threading.Lock()  # one row applied at a time (apply_once, polls)
        self._halt = threading.Event()
        self.applied_total = 0

    def apply_once(self, outbox_id: int, apply: Callable[[], Any]) -> tuple[bool, Any]:
        """Apply row ``outbox_id`` here with ``apply()`` unless this process did already
        (its broadcast, a warm queued after it, or a poll: whichever comes first applies
        it); ``(applied now, apply's result)``. Returns once the row is applied here, by
        this call or another, so a warm that computes after it is never evicted by its own
        edit's row."""
        outbox_id = int(outbox_id)
        with self._apply_lock:
            with self._lock:
                if outbox_id in self._announced or outbox_id in self._applied:
                    return False, None
                self._announced[outbox_id] = time.monotonic()
            return True, apply()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        failing = False
        while not self._halt.is_set():
            try:
                close_old_connections()
                self.poll_once()
                if failing:
                    log.info("outbox: Postgres reachable again; following")
                failing = False
            except DatabaseError as exc:
                if not failing:
                    log.warning("outbox: cannot read the outbox (%s); retrying", exc)
                failing = True
                connection.close()
            except Exception:  # the follower must outlive any single failure
                log.exception("outbox: poll failed")
            self._halt.wait(self.interval)
        connection.close()

    def poll_once(self) -> int:
        """Apply rows committed since the previous poll; returns how many were applied."""
        with connection.cursor() as cur:
            cur.execute(_FOLLOW_SQL.format(table=KVInvalidation._meta.db_table),
                        [self._since if self._since is not None else 2**62])
            rows = cur.fetchall()
        xmin = rows[0][0]
        applied = 0
        if self._since is not None:  # the first poll only sets the cursor (L1 is empty)
            for _, row_id, txid, tenant, member, conversation in rows:
                if row_id is None or row_id in self._applied:
                    continue
                with self._apply_lock:  # not beside a broadcast's or a warm's (apply_once)
                    with self._lock:
                        self._applied[row_id] = txid
                        if self._announced.pop(row_id, None) is not None:
                            continue
                    self._apply(str(tenant), _text(member), _conversation(conversation))
                applied += 1
        self._forget(xmin)
        self._since = xmin
        self.applied_total += applied
        return applied

    def _apply(self, tenant: str, user: str | None, conversation: str | None) -> None:
        try:
            self.apply(tenant, user, conversation)
        except Exception:
            log.exception("outbox: invalidation of tenant=%s user=%s conversation=%s failed",
                          tenant, user, conversation)

    def _forget(self, xmin: int) -> None:
        self._applied = {i: t for i, t in self._applied.items() if t >= xmin}
        cutoff = time.monotonic() - ANNOUNCED_TTL_SECONDS
        with self._lock:
            self._announced = {i: t for i, t in self._announced.items() if t >= cutoff}
