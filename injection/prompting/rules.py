"""The rules a memory holds, read once and kept as data.

A member's memory ("Always answer in lowercase.") or a tenant's instructions may ask the
assistant something about every reply: decoding constraints the engine keeps itself
(``constraints.py``: ``lowercase``, ``ban:very``, ``max_words:15``, ...), a language its
replies are guided toward (``engine/guidance/contrast.py``), and whether it is a standing
instruction at all (re-stated in every reminder: ``reminder.py``). ``read`` (a memory)
and ``read_instructions`` (a tenant's) turn a text into a :class:`MemoryRules`; the
platform stores it beside the text when the text is saved (``to_json``/``from_json``,
plain JSON), with ``READER_VERSION`` so rows read by older readers are read again, and
hands it to the engine on ``MemoryItem.rules`` / ``ExecutionRequest.instruction_rules``.
``NONE`` is what a memory whose rules were switched off gets: no rule at all. Where no
rules come with a text (None), the engine reads the text itself, once per turn.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from injection.prompting import constraints as _c
from injection.prompting.intent import requests
from injection.prompting.readers import asked_language
from injection.prompting.reminder import standing as _standing

__all__ = ["NONE", "READER_VERSION", "MemoryRules", "TurnRules", "for_request", "from_json",
           "guided", "read", "read_instructions", "to_json"]

# Bumped whenever the readers change what they read from a text: stored rules of an older
# version are read again from their text.
READER_VERSION = 9


class MemoryRules(NamedTuple):
    """What one memory (or a tenant's instructions) asks of every reply."""

    # the decoding constraints it asks for, sorted, as ``constraints.py`` names them
    # (before the turn's merge: the tenant's take precedence, contradictions dropped)
    constraints: tuple[str, ...] = ()
    # it is a standing instruction to the assistant about its replies
    standing: bool = False
    # the language it asks replies in ("French"), else None
    language: str | None = None
    # a standing part of it asks for something no decoding constraint keeps (so the
    # decoder keeping its constraints does not keep all of it)
    unkept: bool = False
    # a tenant's instructions: the quoted literals its replies may have to hold ("Start
    # every reply with 'Acme:'"): a case or word constraint they would break is dropped
    literals: tuple[str, ...] = ()


NONE = MemoryRules()


def read(text: str) -> MemoryRules:
    """The rules of a member's memory ``text``: read from its requests to the assistant
    (``intent.py``) alone; ``NONE`` where it asks nothing."""
    asking = requests(text)
    if not asking:
        return NONE
    found = _c.asked(asking)
    return MemoryRules(tuple(sorted(found)), True, asked_language(asking),
                       not _c.kept(asking, tuple(found)))


def read_instructions(text: str) -> MemoryRules:
    """The rules of a tenant's instructions ``text``: sentence by sentence, contradictions
    and constraints its own quoted literals break left out."""
    text = text or ""
    parts = [s for s in _c.sentences(text) if _standing(s)]
    if not parts:
        return NONE
    found, literals = _c.instructed(text)
    language = next((lang for s in parts if (lang := asked_language(s))), None)
    return MemoryRules(tuple(sorted(found)), True, language,
                       not all(_c.kept(s, tuple(found)) for s in parts), tuple(literals))


class TurnRules(NamedTuple):
    """A turn's rules, each text read once: the member's per memory (in the request's order;
    its preference text where it has no memories) and the tenant's."""

    member: tuple[MemoryRules, ...]
    tenant: MemoryRules

    def decoding(self, personal: bool) -> tuple[set[str], set[str]]:
        """``(tenant's, member's)`` decoding constraints of the turn (``constraints.merge``);
        the member's only where their memories are injected (``personal``)."""
        return _c.merge([r.constraints for r in self.member] if personal else [],
                        self.tenant.constraints, self.tenant.literals)


def for_request(req: Any) -> TurnRules:
    """``req``'s rules: those stored with each memory (``MemoryItem.rules``) and with the
    instructions (``instruction_rules``), the text read where none came."""
    memories = getattr(req, "memories", ()) or ()
    member = tuple(m.rules if m.rules is not None else read(m.text) for m in memories) or (
        read(req.preference_text),)
    tenant = getattr(req, "instruction_rules", None)
    return TurnRules(member, tenant if tenant is not None else read_instructions(
        req.instructions))


def guided(rules: MemoryRules, found: tuple[str, ...] | list[str]) -> bool:
    """Whether guidance pays for a memory of ``rules`` beside the turn's decoding
    constraints ``found`` (``engine/guidance/contrast.py``): a standing instruction that
    names a language or asks for a constraint, not kept whole by ``found``."""
    if not rules.standing:
        return False
    kept = (rules.language is None and not rules.unkept and bool(rules.constraints)
            and set(rules.constraints) <= set(found))  # a language: never the decoder's
    return not kept and (rules.language is not None or bool(_c.consistent(
        set(rules.constraints))))


def to_json(rules: MemoryRules) -> dict[str, Any]:
    """``rules`` as a plain JSON object."""
    return {"constraints": list(rules.constraints), "standing": rules.standing,
            "language": rules.language, "unkept": rules.unkept,
            "literals": list(rules.literals)}


def from_json(d: dict[str, Any]) -> MemoryRules:
    """The rules ``to_json`` wrote (missing keys: their defaults); ValueError on a
    malformed object."""
    if not isinstance(d, dict):
        raise ValueError("rules must be a JSON object")
    cons, lits = d.get("constraints", []), d.get("literals", [])
    language = d.get("language")
    if (not isinstance(cons, list) or not all(isinstance(c, str) for c in cons)
            or not isinstance(lits, list) or not all(isinstance(x, str) for x in lits)
            or not (language is None or isinstance(language, str))
            or not isinstance(d.get("standing", False), bool)
            or not isinstance(d.get("unkept", False), bool)):
        raise ValueError("malformed rules")
    return MemoryRules(tuple(sorted(cons)), d.get("standing", False), language,
                       d.get("unkept", False), tuple(lits))
