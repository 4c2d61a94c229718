"""Exactly-once chats: an idempotency slot per (tenant, member, key) in Postgres.

* the web **claims** the key before it enqueues (:func:`do_claim_chat`): a new key is
  ``pending`` with the attempt's request id and a deadline on the database clock; a key
  already answered replays the stored answer; a key still running is a 409;
* the worker stores the exchange only under **its own pending, unexpired** claim
  (:func:`take_claim`, inside ``do_record_chat``'s transaction, row-locked);
* the web **abandons** the claim when it stops waiting (:func:`do_abandon_chat`); if the
  worker won the row lock first, the web returns the stored answer instead.

Redis and Celery state (results, revokes) may be lost in an outage; this row is not.
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from typing import Any, NamedTuple

from django.db import transaction
from django.db.models import F, Q
from django.db.models.functions import Now

from tenants.actions.base import audit
from tenants.errors import ChatAbandoned, ChatInProgress, IdempotencyKeyReused
from tenants.models import AuditEvent, ChatExchange, Member
from tenants.usage import accounting as usage_rollup

IN_PROGRESS_RETRY_AFTER = 5  # seconds a 409 tells the client to wait before retrying
State = ChatExchange.State


class Claim(NamedTuple):
    request_id: str  # the attempt to run (the Celery task id)
    replay: dict[str, Any] | None  # the stored answer when the key was answered before


def request_hash(message: str, conversation_id: int | None, params: dict) -> str:
    """What a request asks for; a reused key must ask for the same."""
    body = json.dumps([message, conversation_id, params], sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()


def stored_answer(exchange: ChatExchange) -> dict[str, Any]:
    """The API body of a stored exchange (what its first request was answered)."""
    cache = dict(exchange.cache or {})
    used = cache.pop("memories_used", None)
    body = {
        "reply": exchange.reply.content if exchange.reply_id else "",
        "conversation": exchange.conversation_id,
        "usage": exchange.usage,
        "cache": cache,
        "request_id": exchange.request_id,
    }
    if used is not None:
        body["memories_used"] = used
    return body


def _deadline(timeout: float):
    return Now() + timedelta(seconds=timeout)


@transaction.atomic
def do_claim_chat(
    member: Member, key: str, request_id: str, asked: str, timeout: float
) -> Claim:
    """Claim ``key`` for a new attempt ``request_id`` that must be stored within ``timeout``."""
    exchange, created = ChatExchange.objects.select_for_update().get_or_create(
        tenant=member.tenant, member=member, key=key,
        defaults={"request_id": request_id, "request_hash": asked,
                  "deadline": _deadline(timeout)},
    )
    if created:
        return Claim(request_id, None)
    if exchange.request_hash != asked:
        raise IdempotencyKeyReused()
    if exchange.state == State.DONE:
        return Claim(exchange.request_id, stored_answer(exchange))
    # abandoned, or pending past its deadline (its web process died): take the key over
    taken = ChatExchange.objects.filter(
        Q(state=State.ABANDONED) | Q(state=State.PENDING, deadline__lte=Now()), pk=exchange.pk
    ).update(state=State.PENDING, request_id=request_id, deadline=_deadline(timeout),
             updated_at=Now(), reserved_tokens=0,  # the previous attempt's worker may
             carried_tokens=F("carried_tokens") + F("reserved_tokens"))  # still bill it
    if not taken:
        raise ChatInProgress(retry_after=IN_PROGRESS_RETRY_AFTER)
    return Claim(request_id, None)


@transaction.atomic
def do_abandon_chat(member: Member, request_id: str, reason: str, *,
                    dispatched: bool = True) -> dict[str, Any] | None:
    """The web stops waiting for ``request_id``: no worker may store it from now on.
    Its budget reservation stays until its worker settles it (it may be generating),
    unless it was never ``dispatched``.

    Returns the stored answer instead when a worker stored it first."""
    exchange = (
        ChatExchange.objects.select_for_update(of=("self",))
        .filter(tenant=member.tenant, member=member, request_id=request_id)
        .select_related("reply").first()
    )
    if exchange is None:
        return None
    if exchange.state == State.DONE:
        return stored_answer(exchange)
    if exchange.state == State.PENDING:
        exchange.state = State.ABANDONED
        if not dispatched:
            exchange.reserved_tokens = 0
        exchange.save(update_fields=["state", "reserved_tokens", "updated_at"])
        audit(member.tenant, AuditEvent.CHAT_ABANDONED, actor=member.user, actor_kind="member",
              target=str(member), request_id=request_id, reason=reason)
        usage_rollup.account_chat(member, ok=False)
    return None


def claim_is_live(member_id: int, request_id: str) -> bool:
    """May a worker start ``request_id``? (its claim is pending and before its deadline)"""
    return ChatExchange.objects.filter(
        member_id=member_id, request_id=request_id, state=State.PENDING, deadline__gt=Now()
    ).exists()


def is_answered(member: Member, key: str) -> bool:
    """Is ``key`` a stored answer of the member's (a request with it is a replay)?"""
    return ChatExchange.objects.filter(tenant=member.tenant_id, member=member, key=key,
                                       state=State.DONE).exists()


def do_prune_claims(older_than_s: float, batch: int = 1000) -> int:
    """Delete dead claims: abandoned, or pending past their deadline (their web process
    died), untouched for ``older_than_s`` seconds on the database clock. Nothing can store
    under them any more (``take_claim`` needs a live pending row) and a retry with the
    same key claims it afresh, as it would take an abandoned one over. Returns how many."""
    stale = Now() - timedelta(seconds=older_than_s)
    dead = ChatExchange.objects.filter(
        Q(state=State.ABANDONED) | Q(state=State.PENDING, deadline__lte=stale),
        updated_at__lte=stale)
    pruned = 0
    while ids := list(dead.values_list("pk", flat=True)[:batch]):
        pruned += ChatExchange.objects.filter(pk__in=ids).delete()[0]
        if len(ids) < batch:
            break
    return pruned


def take_claim(member: Member, request_id: str) -> ChatExchange:
    """Lock the attempt's live claim for storing (call inside the storing transaction)."""
    exchange = (
        ChatExchange.objects.select_for_update()
        .filter(tenant=member.tenant, member=member, request_id=request_id,
                state=State.PENDING, deadline__gt=Now())
        .first()
    )
    if exchange is None:
        raise ChatAbandoned()
    return exchange
