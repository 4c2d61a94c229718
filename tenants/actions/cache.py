"""Preference K/V cache: durable invalidation (outbox), clearing and warming on request."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from django.conf import settings
from django.db import transaction
from django.db.models.expressions import RawSQL

from tenants import ports
from tenants.actions.base import assert_actor_may_manage, audit
from tenants.models import AuditEvent, KVInvalidation, Member

# The logger keeps the name it had before actions became a package.
log = logging.getLogger("tenants.actions")
# The writing transaction's id (assigned now if it had none): see KVInvalidation.txid.
CURRENT_TXID = "pg_current_xact_id()::text::bigint"


def invalidate_on_commit(tenant_id: int, member_id: int | None = None, *,
                         conversation_id: int | None = None) -> int:
    """Invalidate cached K/V (L2 + every worker's L1) durably, effective at commit.

    Writes an outbox row (``KVInvalidation``) in the current transaction: it exists iff
    the change commits, and is delivered until acknowledged, Redis outage or not
    (workers follow the table; see ``tenants.ports.deliver_invalidations``). After
    commit the fast path deletes L2 and broadcasts at once. ``member_id`` None means
    the whole tenant. ``conversation_id``: only the links of that stored conversation
    of the member (kind ``links``: the member's segments, lean and other conversations
    stay).
    """
    if conversation_id is not None and member_id is None:
        raise ValueError("a conversation's links are dropped within its member")
    kind = KVInvalidation.Kind.SCOPE if conversation_id is None else KVInvalidation.Kind.LINKS
    row = KVInvalidation.objects.create(
        kind=kind, tenant_ref=tenant_id, member_ref=member_id, conversation_ref=conversation_id,
        txid=RawSQL(CURRENT_TXID, ()),
    )

    def run() -> None:
        ports.deliver_invalidations([row.pk])
        log.info("invalidation %s (%s) queued: tenant=%s member=%s", row.pk, kind, tenant_id,
                 member_id)

    transaction.on_commit(run, robust=True)
    return row.pk


# member -> the token of this thread's (its connection's) latest warm_on_commit: of one
# commit's callbacks only the latest sends; one rolled back leaves a token nobody runs
_LATEST_WARM = threading.local()


def warm_on_commit(member_id: int, after: int | None = None) -> None:
    """After commit, ask a GPU worker to compute the member's K/V and lean again in the
    background (``KV_WARM_ON_EDIT``, ``ports.enqueue_warm``): an edit's invalidation drops
    them, and the member's next chat would otherwise compute the segment and measure the
    lean before its first token. ``after``: the edit's outbox row (``invalidate_on_commit``),
    which the warming worker applies first if its broadcast has not arrived.

    Once per member per transaction (a preference and three memories saved together send
    one: the last edit's, after every invalidation of the commit), nothing on rollback,
    nothing for an inactive member."""
    if not settings.KV_WARM_ON_EDIT:
        return
    latest = _LATEST_WARM.__dict__.setdefault("members", {})
    token = latest[member_id] = object()

    def run() -> None:
        if latest.get(member_id) is not token:  # a later edit of this commit sends it
            return
        del latest[member_id]
        live = Member.objects.filter(pk=member_id, active=True, tenant__active=True,
                                     user__is_active=True).exists()
        if live:
            ports.enqueue_warm(member_id, background=True, after_outbox=after)
            log.info("warm queued after an edit: member=%s", member_id)

    transaction.on_commit(run, robust=True)


@transaction.atomic
def do_clear_kv_cache(members: Iterable[Member], *, actor=None) -> int:
    """Drop the cached K/V of each member (L2 and every worker's L1) after commit."""
    count = 0
    for member in members:
        assert_actor_may_manage(actor, member.tenant)
        audit(member.tenant, AuditEvent.CACHE_CLEARED, actor=actor, target=str(member))
        invalidate_on_commit(member.tenant_id, member.pk)
        count += 1
    return count


@transaction.atomic
def do_warm_kv_cache(members: Iterable[Member], *, actor=None) -> int:
    """Ask a worker to precompute each member's preference K/V (after commit).

    Members without an enabled, non-empty preference have nothing to warm and are skipped.
    """
    count = 0
    for member in members:
        assert_actor_may_manage(actor, member.tenant)
        pref = member.own_preference()
        if pref is None or not pref.enabled or not pref.text:
            continue
        audit(member.tenant, AuditEvent.CACHE_WARMED, actor=actor, target=str(member),
              version=pref.version, content_hash=pref.content_hash)
        transaction.on_commit(lambda pk=member.pk: ports.enqueue_warm(pk), robust=True)
        count += 1
    return count
