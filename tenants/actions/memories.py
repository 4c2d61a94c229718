"""A member's memories (issue 22): create, change, delete, reorder; audited with old/new.

The first memory is the member's preference: after each change the ``Preference`` row is
set to the first memory's text/enabled (``_sync_preference``; a ``QuerySet.update``, so no
second invalidation is queued, the database bumps its version). Each memory write
invalidates the member's cached segment durably (``tenants.signals`` on save/delete, the
outbox row in this transaction; reordering writes it here).
"""

from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.db.models import Max, QuerySet

from tenants import rules
from tenants.actions.base import assert_actor_may_manage, audit
from tenants.actions.cache import invalidate_on_commit, warm_on_commit
from tenants.errors import Conflict, InvalidInput, NotFound
from tenants.models import AuditEvent, Member, Memory, Preference

PK_MAX = 2**63 - 1


def max_chars() -> int:
    return int(getattr(settings, "MEMORY_MAX_CHARS", 4000))


def max_per_member() -> int:
    return int(getattr(settings, "MEMORY_MAX_PER_MEMBER", 100))


def clean_text(text) -> str:
    """Strict: a string, not blank, no NUL, at most ``MEMORY_MAX_CHARS`` characters."""
    if not isinstance(text, str):
        raise InvalidInput("text must be a string.", fields={"text": ["Not a string."]})
    limit = max_chars()
    if not text.strip():
        raise InvalidInput("A memory needs some text.", fields={"text": ["Blank."]})
    if "\x00" in text:
        raise InvalidInput("Text cannot contain NUL characters.",
                           fields={"text": ["Contains NUL."]})
    if len(text) > limit:
        raise InvalidInput(f"A memory is limited to {limit} characters.",
                           fields={"text": [f"At most {limit} characters."]})
    return text


def member_memories(member: Member) -> QuerySet:
    """The member's memories, in order (tenant and member scoped)."""
    return Memory.objects.filter(tenant=member.tenant_id, member=member).order_by("position", "id")


def get_memory(member: Member, pk: int, *, lock: bool = False) -> Memory:
    """One of the member's own memories; any other id (another member's, another tenant's,
    unknown) is the same 404."""
    qs = member_memories(member)
    if lock:
        qs = qs.select_for_update()
    memory = qs.filter(pk=pk).first() if 0 < pk <= PK_MAX else None
    if memory is None:
        raise NotFound("Unknown memory.")
    return memory


def snapshot(memory: Memory) -> dict:
    return {"text": memory.text, "enabled": memory.enabled, "pinned": memory.pinned,
            "position": memory.position}


def _lock_member(member: Member) -> None:
    """Serialise a member's memory writes (count limit, positions, preference sync)."""
    Member.objects.select_for_update().filter(pk=member.pk).values_list("pk").first()


def _sync_preference(member: Member) -> None:
    """The preference row reads the first memory (created when absent, "" when none)."""
    first = member_memories(member).values_list("text", "enabled").first()
    text, enabled = first if first is not None else ("", None)
    rows = Preference.objects.filter(tenant=member.tenant_id, member=member)
    if not rows.exists():
        if first is not None:  # bulk_create: no signal, the memory's own invalidation holds
            Preference.objects.bulk_create([Preference(tenant_id=member.tenant_id, member=member,
                                                       text=text, enabled=enabled)])
        return
    changes = {"text": text} if enabled is None else {"text": text, "enabled": enabled}
    rows.exclude(**changes).update(**changes)


@transaction.atomic
def do_create_memory(member: Member, *, text: str, enabled: bool = True, pinned: bool = False,
                     source: str = Memory.Source.MEMBER, actor=None) -> Memory:
    """Append a memory to the member's list (``MEMORY_MAX_PER_MEMBER`` at most)."""
    text = clean_text(text)
    assert_actor_may_manage(actor, member.tenant)
    _lock_member(member)
    existing = member_memories(member)
    limit = max_per_member()
    if existing.count() >= limit:
        raise InvalidInput(f"A member has at most {limit} memories; delete one first.",
                           fields={"text": [f"At most {limit} memories per member."]})
    last = existing.aggregate(last=Max("position"))["last"]
    memory = Memory.objects.create(
        tenant_id=member.tenant_id, member=member, text=text, enabled=enabled, pinned=pinned,
        position=0 if last is None else last + 1, source=source)
    audit(member.tenant, AuditEvent.MEMORY_CREATED, actor=actor, target=str(member),
          memory=memory.pk, source=source, new=snapshot(memory))
    _sync_preference(member)
    rules.store(member)  # what the text asks of replies, read once (issue 57)
    return memory


@transaction.atomic
def do_update_memory(member: Member, pk: int, *, text: str | None = None,
                     enabled: bool | None = None, pinned: bool | None = None,
                     actor=None) -> Memory:
    """Change some fields of one of the member's memories (omitted: unchanged)."""
    if text is not None:
        text = clean_text(text)
    assert_actor_may_manage(actor, member.tenant)
    _lock_member(member)
    memory = get_memory(member, pk, lock=True)
    old = snapshot(memory)
    for field, value in (("text", text), ("enabled", enabled), ("pinned", pinned)):
        if value is not None:
            setattr(memory, field, value)
    new = snapshot(memory)
    if new == old:
        return memory
    memory.save(update_fields=["text", "enabled", "pinned", "updated_at"])
    audit(member.tenant, AuditEvent.MEMORY_CHANGED, actor=actor, target=str(member),
          memory=memory.pk, old=old, new=new)
    _sync_preference(member)
    rules.store(member)  # a new text's rules (the database emptied the old ones)
    return memory


@transaction.atomic
def do_delete_memory(member: Member, pk: int, *, actor=None, reason: str = "") -> None:
    assert_actor_may_manage(actor, member.tenant)
    _lock_member(member)
    memory = get_memory(member, pk, lock=True)
    old = snapshot(memory)
    memory.delete()
    extra = {"reason": reason} if reason else {}
    audit(member.tenant, AuditEvent.MEMORY_DELETED, actor=actor, target=str(member),
          memory=pk, old=old, **extra)
    _sync_preference(member)


@transaction.atomic
def do_reorder_memories(member: Member, order: list[int], *, actor=None) -> list[Memory]:
    """Put the member's memories in ``order`` (exactly their ids, each once)."""
    assert_actor_may_manage(actor, member.tenant)
    _lock_member(member)
    memories = list(member_memories(member).select_for_update())
    by_id = {m.pk: m for m in memories}
    if len(order) != len(set(order)) or set(order) != set(by_id):  # e.g. changed meanwhile
        raise Conflict("order must list each of your current memory ids exactly once; "
                       "re-read /api/memories and retry.")
    old = [m.pk for m in memories]
    if old == list(order):
        return memories
    for position, pk in enumerate(order):
        by_id[pk].position = position
    Memory.objects.bulk_update(by_id.values(), ["position"])
    row = invalidate_on_commit(member.tenant_id, member.pk)  # bulk_update sends no signal
    warm_on_commit(member.pk, row)
    audit(member.tenant, AuditEvent.MEMORY_REORDERED, actor=actor, target=str(member),
          old=old, new=list(order))
    _sync_preference(member)
    return [by_id[pk] for pk in order]
