"""The admin playground: its audit row, and (only when asked) the exchange in history."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from tenants.actions.base import assert_actor_may_manage, audit
from tenants.models import AuditEvent, Conversation, Member, Message


@transaction.atomic
def do_record_playground(member: Member, *, message: str, results: dict[str, dict[str, Any]],
                         unsaved_preference: bool, save: bool, actor=None) -> int | None:
    """Audit one playground use; store the personalised exchange in the member's history
    only if ``save``. Returns the conversation id (None when nothing was stored)."""
    assert_actor_may_manage(actor, member.tenant)
    conversation = None
    personalised = results.get("personalised") or {}
    if save and personalised.get("reply") is not None:
        conversation = Conversation.objects.create(tenant=member.tenant, member=member,
                                                   title=f"playground: {message[:68]}")
        for role, content, n in (("user", message, 0),
                                 ("assistant", personalised["reply"],
                                  personalised.get("completion_tokens", 0))):
            Message.objects.create(tenant=member.tenant, conversation=conversation,
                                   role=role, content=content, token_count=n)
    data: dict[str, Any] = {
        "unsaved_preference": unsaved_preference,
        "saved_to_history": conversation.pk if conversation else None,
        **{variant: {k: r.get(k) for k in ("tier", "prompt_tokens", "kv_tokens",
                                           "completion_tokens", "latency_ms", "ttft_ms", "error")}
           for variant, r in results.items()},
    }
    if member.tenant.audit_message_text:
        data["message"] = message
    audit(member.tenant, AuditEvent.PLAYGROUND_USED, actor=actor, target=str(member), **data)
    return conversation.pk if conversation else None
