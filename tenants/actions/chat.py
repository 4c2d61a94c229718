"""Conversations: lookup, deletion and recording a chat exchange."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import IntegrityError, transaction

from tenants.actions.base import audit
from tenants.actions.budgets import note_usage
from tenants.actions.exchanges import take_claim
from tenants.budgets import ledger, tpm
from tenants.budgets.estimate import served_model
from tenants.errors import NotFound
from tenants.models import AuditEvent, ChatExchange, Conversation, Member, Message, Tenant
from tenants.usage import accounting as usage_rollup

BILLED_ONCE = "audit_chat_billed_once"  # the constraint (tenants.models.AuditLog)
GUIDE_FIELDS = usage_rollup.GUIDE_FIELDS  # the guide row's tokens (docs/API.md, "Usage")


def get_conversation(member: Member, conversation_id: int) -> Conversation:
    """The member's own conversation; NotFound for unknown and foreign ids alike."""
    conv = Conversation.objects.filter(
        pk=conversation_id, tenant=member.tenant, member=member
    ).first()
    if conv is None:
        raise NotFound("Unknown conversation.")
    return conv


@transaction.atomic
def do_delete_conversation(member: Member, conversation_id: int, *, actor=None) -> None:
    conv = get_conversation(member, conversation_id)
    count = conv.messages.count()
    conv.delete()
    audit(member.tenant, AuditEvent.CONVERSATION_DELETED, actor=actor, target=str(member),
          conversation=conversation_id, messages=count)


@transaction.atomic
def do_record_chat(
    member: Member,
    conversation: Conversation | None,
    *,
    message: str,
    reply: str,
    usage: dict[str, int],
    cache: dict[str, Any],
    latency_ms: float,
    request_id: str,
    prior: Sequence[dict[str, str]] = (),
    end_user: str | None = None,
    memories_used: list[dict[str, Any]] | None = None,
) -> Conversation:
    """Store the exchange and its audit row (message text only if the tenant opted in).

    ``prior``: the messages a client sent before ``message`` (``/v1``: the request is the
    conversation), stored first when the exchange starts a new conversation. ``end_user``:
    the client's own id for its end user (OpenAI's ``user``), audited.

    Only under the attempt's own live claim (``ChatAbandoned`` otherwise, nothing stored;
    the worker then bills what it generated, ``do_record_discarded``): the claim row is
    locked until commit, so the web cannot abandon it half-way."""
    claim = take_claim(member, request_id)
    conversation, answer = _store_exchange(member, conversation, message, reply, usage, prior)
    data = _chat_row(member.tenant, conversation, usage, cache, latency_ms, request_id,
                     end_user, message, reply)
    audit(member.tenant, AuditEvent.CHAT_REQUEST, actor=member.user, actor_kind="member",
          target=str(member), **data)
    _account_chat(member, data)
    # the claim's cache keeps the memories the reply used, so a replay answers them too
    _fill_claim(claim, conversation, answer, usage,
                cache if memories_used is None else {**cache, "memories_used": memories_used})
    return conversation


def _store_exchange(member: Member, conversation: Conversation | None, message: str,
                    reply: str, usage: dict[str, int],
                    prior: Sequence[dict[str, str]]) -> tuple[Conversation, Message]:
    """The message and its reply stored (a new conversation first, ``prior`` in it)."""
    tenant = member.tenant
    if conversation is None:
        conversation = Conversation.objects.create(
            tenant=tenant, member=member, title=message[:80]
        )
        for m in prior:
            Message.objects.create(tenant=tenant, conversation=conversation, role=m["role"],
                                   content=m["content"])
    Message.objects.create(
        tenant=tenant, conversation=conversation, role=Message.Role.USER, content=message,
        token_count=usage.get("message_tokens", 0),
    )
    answer = Message.objects.create(
        tenant=tenant, conversation=conversation, role=Message.Role.ASSISTANT, content=reply,
        token_count=usage.get("completion_tokens", 0),
    )
    conversation.save(update_fields=["updated_at"])
    return conversation, answer


def _chat_row(tenant: Tenant, conversation: Conversation, usage: dict[str, int],
              cache: dict[str, Any], latency_ms: float, request_id: str,
              end_user: str | None, message: str, reply: str) -> dict[str, Any]:
    """The ``chat.request`` audit row's data (the texts only if the tenant opted in)."""
    data: dict[str, Any] = {
        "conversation": conversation.pk,
        "request_id": request_id,
        "prompt_tokens": usage.get("prompt_tokens", 0),
        "completion_tokens": usage.get("completion_tokens", 0),
        "cached_tokens": usage.get("cached_tokens", 0),  # absent on old workers: none
        # the contrastive guide row's work, beside the reply's tokens (never inside them);
        # only on guided chats
        **{k: usage[k] for k in GUIDE_FIELDS if usage.get(k)},
        "model": served_model(),
        "cache_tier": cache.get("tier"),
        "preference_version": cache.get("preference_version"),
        "latency_ms": round(latency_ms, 1),
        "finish_reason": cache.get("finish_reason"),
    }
    if cache.get("ttft_ms") is not None:  # the engine's time to first token
        data["ttft_ms"] = round(float(cache["ttft_ms"]), 1)
    if end_user:
        data["end_user"] = end_user
    if tenant.audit_message_text:
        data["message"] = message
        data["reply"] = reply
    return data


def _account_chat(member: Member, data: dict[str, Any]) -> None:
    """The stored chat (its audit row's ``data``) in the usage rollup, the budgets'
    thresholds and, once committed, the TPM window."""
    usage_rollup.account_chat(member, ok=True, prompt_tokens=data["prompt_tokens"],
                              completion_tokens=data["completion_tokens"],
                              cached_tokens=data["cached_tokens"], model=data["model"],
                              **{k: data.get(k, 0) for k in GUIDE_FIELDS},
                              tier=data["cache_tier"], latency_ms=data["latency_ms"],
                              ttft_ms=data.get("ttft_ms"))
    note_usage(member)  # budget thresholds crossed by this chat (audited once)
    spent = data["prompt_tokens"] + data["completion_tokens"]
    transaction.on_commit(lambda: tpm.record(member.tenant_id, member.pk, spent))


@transaction.atomic
def do_record_cancelled(member: Member, request_id: str, *, completion_tokens: int,
                        prompt_tokens: int = 0, cached_tokens: int = 0, **guide: int) -> bool:
    """A generation stopped on its cancel flag (a streaming client disconnected, or the
    web stopped waiting for a reply): nothing is stored, the claim is abandoned (a retry
    with the same key generates again) and audited. The tokens it used are billed and
    count against the budgets, as neither a reply nor a failure. False (nothing billed)
    when this attempt was billed already (``bill_unstored``)."""
    return bill_unstored(member, request_id, AuditEvent.CHAT_CANCELLED,
                         prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                         cached_tokens=cached_tokens, **guide)


@transaction.atomic
def do_record_discarded(member: Member, request_id: str, *, prompt_tokens: int,
                        completion_tokens: int, cached_tokens: int = 0,
                        finish_reason: str | None = None, **guide: int) -> bool:
    """A reply generated to its end whose claim was abandoned meanwhile (the web gave up
    waiting, its streaming client left after the last token, or the claim's deadline
    passed): ``do_record_chat`` refused to store it (``ChatAbandoned``), so it is billed
    here instead, in its own transaction: usage, budgets, TPM and a ``chat.discarded``
    audit row, counted neither as a reply nor as a failure. False (nothing billed) when
    this attempt was billed already."""
    return bill_unstored(member, request_id, AuditEvent.CHAT_DISCARDED,
                         prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                         cached_tokens=cached_tokens, finish_reason=finish_reason, **guide)


@transaction.atomic
def do_record_failed(member: Member, request_id: str, *, prompt_tokens: int,
                     completion_tokens: int, error: str) -> bool:
    """A generation that failed after generating (its soft time limit, an accelerator OOM,
    the engine's watchdog): nothing is stored, and the tokens it generated (and its prompt)
    are billed once as a ``chat.failed`` audit row: usage, budgets and TPM, as for a
    cancelled one. The claim is left to the web, which abandons it when it gets the failure
    and counts the error there (one error a failed attempt). False when billed already."""
    return bill_unstored(member, request_id, AuditEvent.CHAT_FAILED, abandon=False,
                         prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                         cached_tokens=0, error=error)


def bill_unstored(member: Member, request_id: str, event: AuditEvent, *, prompt_tokens: int,
                  completion_tokens: int, cached_tokens: int, guide_prefill_tokens: int = 0,
                  guide_decode_tokens: int = 0, abandon: bool = True, **extra: Any) -> bool:
    """Bill the tokens of an attempt that stored no reply (call inside a transaction).

    Exactly once per attempt: the audit row is unique per (tenant, request id) among the
    billing events (``audit_chat_billed_once``: ``chat.request``, ``chat.cancelled``,
    ``chat.discarded``, ``chat.failed``), so a duplicate run of the same task, whose first
    run stored or billed it, bills nothing. Returns whether it billed. ``abandon``: the
    claim is abandoned too (its web stopped waiting, or gives up at once)."""
    if abandon:
        ChatExchange.objects.filter(tenant=member.tenant, member=member, request_id=request_id,
                                    state=ChatExchange.State.PENDING).update(
            state=ChatExchange.State.ABANDONED)
    ledger.release(member.pk, request_id)  # the usage below counts instead
    model = served_model()
    guide = {k: v for k, v in (("guide_prefill_tokens", guide_prefill_tokens),
                               ("guide_decode_tokens", guide_decode_tokens)) if v}
    try:
        with transaction.atomic():  # a savepoint: a refused row leaves the rest intact
            audit(member.tenant, event, actor=member.user, target=str(member),
                  request_id=request_id, completion_tokens=completion_tokens,
                  prompt_tokens=prompt_tokens, cached_tokens=cached_tokens, model=model,
                  **guide, **extra)
    except IntegrityError as exc:
        if _constraint(exc) != BILLED_ONCE:
            raise
        return False
    usage_rollup.account_tokens(member, prompt_tokens=prompt_tokens,
                                completion_tokens=completion_tokens,
                                cached_tokens=cached_tokens, model=model, **guide)
    note_usage(member)
    spent = prompt_tokens + completion_tokens
    transaction.on_commit(lambda: tpm.record(member.tenant_id, member.pk, spent))
    return True


def _constraint(exc: IntegrityError) -> str | None:
    diag = getattr(exc.__cause__, "diag", None)
    return getattr(diag, "constraint_name", None)


def _fill_claim(claim, conversation, answer: Message, usage: dict, cache: dict) -> None:
    claim.state = claim.State.DONE
    claim.reserved_tokens = claim.carried_tokens = 0  # settled: the usage counts instead
    claim.conversation, claim.reply, claim.cache = conversation, answer, cache
    claim.usage = {k: usage.get(k, 0) for k in ("prompt_tokens", "completion_tokens")}
    for key in ("cached_tokens", *GUIDE_FIELDS):  # a replay answers what the first did
        if key in usage:
            claim.usage[key] = usage[key]
    claim.save(update_fields=["state", "reserved_tokens", "carried_tokens", "conversation",
                              "reply", "usage", "cache", "updated_at"])
