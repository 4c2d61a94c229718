"""The rules read from a member's memories (issue 57): stored when a text is saved, switched
off or on per memory by the member or a tenant admin (the memory stays), audited.

Nothing cached depends on a memory's rules: the member's segment K/V is keyed by its text,
their lean by the segment it was measured on (``injection/engine/guidance/probe.py``), a
conversation's K/V by its tokens; which of them a turn uses (a guide, a lean, a reminder,
the decoder's constraints) is planned per turn from the rules the worker reads from
Postgres with the memories. So a switch writes no invalidation (and drops no cached
segment): the member's next chat has the rules as switched. Switching rules back on asks a
worker to warm the member (``warm_on_commit``): where they ask for guidance, the lean is
then measured ahead of the next chat, as after an edit.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from injection.prompting.rules import READER_VERSION
from tenants import rules
from tenants.actions.base import assert_actor_may_manage, audit
from tenants.actions.cache import warm_on_commit
from tenants.actions.memories import (
    _lock_member,
    do_update_memory,
    get_memory,
    member_memories,
)
from tenants.actions.preferences import do_set_preference
from tenants.errors import InvalidInput
from tenants.models import AuditEvent, Member, Memory, Preference


def _switch(value) -> bool:
    if not isinstance(value, bool):
        raise InvalidInput("rules_enabled must be true or false.",
                           fields={"rules_enabled": ["Must be a boolean."]})
    return value


@transaction.atomic
def do_set_memory_rules_enabled(member: Member, pk: int, enabled: bool, *,
                                actor=None) -> Memory:
    """Switch the rules read from one of ``member``'s memories off (``enabled`` False: the
    memory stays in replies, no rule of it is applied) or back on; audited."""
    enabled = _switch(enabled)
    assert_actor_may_manage(actor, member.tenant)
    _lock_member(member)
    memory = get_memory(member, pk, lock=True)
    if memory.rules_enabled == enabled:
        return memory
    # an update, not save(): no signal, so no invalidation of what does not depend on it
    Memory.objects.filter(pk=memory.pk).update(rules_enabled=enabled, updated_at=timezone.now())
    memory.refresh_from_db(fields=["rules_enabled", "updated_at"])
    read = {k: v for k, v in rules.memory_shown(memory).items() if k != "enabled"}
    audit(member.tenant, AuditEvent.MEMORY_RULES_SWITCHED, actor=actor, target=str(member),
          memory=memory.pk, old={"rules_enabled": not enabled},
          new={"rules_enabled": enabled}, rules=read)
    if enabled:
        warm_on_commit(member.pk)
    return memory


@transaction.atomic
def do_change_memory(member: Member, pk: int, *, rules_enabled: bool | None = None,
                     actor=None, **fields) -> Memory:
    """``do_update_memory`` of ``fields`` and the rules switch, in one transaction (PATCH)."""
    memory = do_update_memory(member, pk, actor=actor, **fields) if fields else None
    if rules_enabled is not None:
        memory = do_set_memory_rules_enabled(member, pk, rules_enabled, actor=actor)
    return memory if memory is not None else get_memory(member, pk)


@transaction.atomic
def do_change_preference(member: Member, *, rules_enabled: bool | None = None, actor=None,
                         **fields) -> Preference:
    """``do_set_preference`` of ``fields``, then the preference's rules switch: its first
    memory's (the preference is the first memory)."""
    pref = do_set_preference(member, actor=actor, **fields)
    if rules_enabled is not None:
        first = member_memories(member).values_list("pk", flat=True).first()
        if first is None:
            raise InvalidInput("Your preference has no text: it holds no rules to switch.",
                               fields={"rules_enabled": ["No preference text."]})
        do_set_memory_rules_enabled(member, first, rules_enabled, actor=actor)
    return pref


def preference_rules(member: Member) -> dict:
    """The preference's rules as shown: its first memory's (none without a text)."""
    first = member_memories(member).first()
    if first is None:
        return rules.shown(None, READER_VERSION, "", True)
    return rules.memory_shown(first)
