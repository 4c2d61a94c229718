"""Memory writes from chat (issue 22): an explicit "remember that ..." / "forget ..." at the
start of a member's message adds a memory (source chat) or disables the memory it names.

Off unless ``Tenant.memory_writes_enabled``. Runs in the web request before the chat is
dispatched (the reply already uses the change); never in the engine. Detection is the
conservative parser of ``tenants.memory_requests``. Each write is a ``do_*_memory`` action
(audited, the member's segment invalidated), so it is listed in /api/memories; a forgotten
memory is disabled, not deleted: the member sees it and may enable it again.
"""

from __future__ import annotations

from django.db import transaction

from tenants import memory_requests
from tenants.actions.memories import (
    do_create_memory,
    do_update_memory,
    max_chars,
    max_per_member,
    member_memories,
)
from tenants.errors import InvalidInput
from tenants.models import Member, Memory


@transaction.atomic
def do_memory_from_chat(member: Member, message: str, *, actor=None) -> dict | None:
    """Apply the memory request ``message`` opens with; what happened, or None (no request,
    or memory writes are off for the tenant)."""
    if not member.tenant.memory_writes_enabled:
        return None
    request = memory_requests.parse(message)
    if request is None:
        return None
    if request.op == "remember":
        return _remember(member, request.text, actor)
    return _forget(member, request.text, actor)


def _remember(member: Member, text: str, actor) -> dict:
    same = member_memories(member).filter(text=text).first()
    if same is not None:  # a retried request, or said twice: one memory
        if not same.enabled:
            do_update_memory(member, same.pk, enabled=True, actor=actor)
        return {"op": "remembered", "id": same.pk, "text": same.text}
    if len(text) > max_chars() or member_memories(member).count() >= max_per_member():
        return {"op": "refused", "text": text[:200],
                "reason": "memory limit reached" if len(text) <= max_chars()
                else "memory too long"}
    try:
        memory = do_create_memory(member, text=text, source=Memory.Source.CHAT, actor=actor)
    except InvalidInput as exc:
        return {"op": "refused", "text": text[:200], "reason": exc.message}
    return {"op": "remembered", "id": memory.pk, "text": memory.text}


def _forget(member: Member, text: str, actor) -> dict:
    enabled = list(member_memories(member).filter(enabled=True).values_list("pk", "text"))
    pk = memory_requests.best_match(text, enabled)
    if pk is None:
        return {"op": "not_found", "text": text[:200]}
    memory = do_update_memory(member, pk, enabled=False, actor=actor)
    return {"op": "forgotten", "id": memory.pk, "text": memory.text}
