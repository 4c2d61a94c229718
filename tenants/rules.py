"""A memory's (and a tenant's instructions') rules: read once when the text is saved, stored
beside it, shown, and switchable (issue 57).

``injection.prompting.rules`` reads a text into ``MemoryRules`` (the decoding constraints
it asks for, a language, whether it is a standing instruction). The ``do_*`` action that
saves a text stores ``fields(text)`` with it (``rules``, ``rules_version``); a database
trigger empties them whenever the text changes by any other path (the preference trigger,
``QuerySet.update()``), so stored rules are the text's whenever ``rules_version`` is the
current ``READER_VERSION``. Where they are used (the worker's request, the API, the admin)
``current`` takes them as stored, or reads the text again when they are missing or were
read by an older reader (the row is left as it is: the next save, or ``manage.py read_rules``,
stores them).
``applied`` is what the engine gets: ``NONE`` where the member or the admin switched the
memory's rules off (``rules_enabled``; the memory itself stays in replies).
"""

from __future__ import annotations

from typing import Any

from injection.prompting import rules as reader

__all__ = ["applied", "current", "fields", "instruction_fields", "memory_shown", "read_stale",
           "shown", "store"]


def fields(text: str) -> dict[str, Any]:
    """A member memory's stored rules, read from ``text`` now."""
    return {"rules": reader.to_json(reader.read(text)), "rules_version": reader.READER_VERSION}


def instruction_fields(text: str) -> dict[str, Any]:
    """A tenant's stored instruction rules, read from ``text`` now."""
    return {"instruction_rules": reader.to_json(reader.read_instructions(text)),
            "instruction_rules_version": reader.READER_VERSION}


def current(stored: Any, version: int, text: str, *,
            instructions: bool = False) -> reader.MemoryRules:
    """The rules of ``text``: ``stored`` where they were read by this reader, else read now
    (a malformed stored object too)."""
    if stored is not None and version == reader.READER_VERSION:
        try:
            return reader.from_json(stored)
        except ValueError:
            pass
    return (reader.read_instructions if instructions else reader.read)(text or "")


def applied(stored: Any, version: int, text: str, enabled: bool, *,
            instructions: bool = False) -> reader.MemoryRules:
    """What the engine is given: the text's rules, or ``NONE`` where they are switched off."""
    if not enabled:
        return reader.NONE
    return current(stored, version, text, instructions=instructions)


def shown(stored: Any, version: int, text: str, enabled: bool, *,
          instructions: bool = False) -> dict[str, Any]:
    """The rules as the API and the admin show them: what was read (also while switched
    off, so a member sees what switching on would apply) and the switch."""
    rules = current(stored, version, text, instructions=instructions)
    return {"constraints": list(rules.constraints), "language": rules.language,
            "standing": rules.standing, "enabled": bool(enabled)}


def memory_shown(memory: Any) -> dict[str, Any]:
    """``shown`` for a ``Memory`` row."""
    return shown(memory.rules, memory.rules_version, memory.text, memory.rules_enabled)


def store(member: Any) -> int:
    """Read and store the rules of ``member``'s memories that have none stored by this
    reader (a text saved just now: the database emptied them); how many were read. The
    ``do_*`` actions call it in the transaction that saved the text, after saving it."""
    from tenants.models import Memory

    mine = Memory.objects.filter(tenant=member.tenant_id, member=member.pk)
    stale = mine.exclude(rules_version=reader.READER_VERSION, rules__isnull=False)
    return sum(mine.filter(pk=pk, text=text).update(**fields(text))
               for pk, text in stale.values_list("pk", "text"))


def read_stale() -> tuple[int, int]:
    """Read again every memory's and tenant's rules not stored by this reader (after an
    upgrade that changed ``READER_VERSION``, or texts the database emptied); how many
    ``(memories, tenants)``. Plain updates: nothing cached depends on the rules."""
    from tenants.models import Memory, Tenant

    stale = Memory.objects.exclude(rules_version=reader.READER_VERSION, rules__isnull=False)
    memories = sum(Memory.objects.filter(pk=pk, text=text).update(**fields(text))
                   for pk, text in stale.values_list("pk", "text").iterator())
    stale_t = Tenant.objects.exclude(instruction_rules_version=reader.READER_VERSION,
                                     instruction_rules__isnull=False)
    tenants = sum(Tenant.objects.filter(pk=pk, instructions=text).update(
        **instruction_fields(text)) for pk, text in stale_t.values_list("pk", "instructions"))
    return memories, tenants
