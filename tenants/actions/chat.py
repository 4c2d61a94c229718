"""Conversations: lookup, deletion and recording a chat exchange."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from tenants.actions.base import audit
from tenants.errors import NotFound
from tenants.models import AuditEvent, Conversation, Member, Message


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
) -> Conversation:
    """Store the exchange and its audit row (message text only if the tenant opted in)."""
    tenant = member.tenant
    if conversation is None:
        conversation = Conversation.objects.create(
            tenant=tenant, member=member, title=message[:80]
        )
    Message.objects.create(
        tenant=tenant, conversation=conversation, role=Message.Role.USER, content=message,
        token_count=usage.get("message_tokens", 0),
    )
    Message.objects.create(
        tenant=tenant, conversation=conversation, role=Message.Role.ASSISTANT, content=reply,
        token_count=usage.get("completion_tokens", 0),
    )
    conversation.save(update_fields=["updated_at"])
    data: dict[str, Any] = {
        "conversation": conversation.pk,
        "request_id": request_id,
        "prompt_tokens": usage.get("prompt_tokens", 0),
        "completion_tokens": usage.get("completion_tokens", 0),
        "cache_tier": cache.get("tier"),
        "preference_version": cache.get("preference_version"),
        "latency_ms": round(latency_ms, 1),
    }
    if tenant.audit_message_text:
        data["message"] = message
        data["reply"] = reply
    audit(tenant, AuditEvent.CHAT_REQUEST, actor=member.user, target=str(member), **data)
    return conversation
