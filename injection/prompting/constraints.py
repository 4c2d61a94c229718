"""Decoding constraints: the standing instructions the platform can keep by itself.

A small model forgets "Always answer in lowercase." a few exchanges into a chat, whatever
the memory's place or the guide (bench_quality, standing instructions at depth 8: the
system message, the reminder and guidance all 7/43). Some standing instructions are a
property of every token of the reply, so the decoder can keep them at any depth, at the
cost of a map on the step's logits or a forced token (no second row, no prompt tokens):

* ``lowercase``: "Reply in lowercase only." / "never use capital letters": no token with an
  upper-case letter;
* ``uppercase``: "Write all your answers in capital letters.": upper-cased (``TRANSFORMS``);
* ``no_comma``: "Never use commas.": no token with a comma;
* ``ban:<word>``: "Never use the words 'very' or 'really'.": no token that is the word
  (any case; a quoted single word);
* ``start:<phrase>`` / ``end:<phrase>``: "Start every reply with 'Ahoy!'", "End each answer
  with the exact phrase 'Good luck!'" ("wrap your reply in double quotes": both ``"``):
  the phrase's tokens forced where the reply opens, and where it would end or where only
  they still fit (``engine/decoding/phrases.forced``);
* ``repeat``: "Begin every answer by repeating my question word for word.": the turn's
  user message as the opening phrase (``opening``, where the planner knows it);
* ``ps:<marker>``: "Always add a P.S. at the end of your answers.": a postscript line
  opened by the marker (``P.S.`` or ``P.P.S.``) where the reply would end, or where only
  it and a short note still fit, unless the reply already holds it; the model writes the
  note;
* ``title``: "Start every answer with a title in double angle brackets, like <<this>>.":
  ``<<`` opens the reply (after an opening phrase), the model writes the title, and ``>>``
  closes it at the title's first line break or after ``engine/decoding/phrases.TITLE_TOKENS`` tokens,
  unless the model closes it itself;
* ``choice:<a>|<b>|...``: "Only ever reply with 'Yes.', 'No.' or 'Maybe.'": the whole reply
  is one of the quoted options, the model choosing among them token by token
  (``engine/decoding/phrases.choices``); the other phrases do not apply to it;
* ``max_words:<k>``: "Keep every answer under 20 words." (k = 20; "at most 29 words",
  "never more than 29 words": k = 30): the reply ends, at a word's end, before its k-th
  word (counted as IFEval does: runs of letters and digits), at a sentence's end shortly
  before where it can;
* ``max_sentences:<n>``: "Answer in one or two sentences." (n = 2; "fewer than 3
  sentences": 2; "a one-sentence answer": 1): the reply ends after its n-th sentence, or
  at a sentence's end shortly before ``max_new_tokens`` would cut one; not beside bullet
  points or highlights (their lines and spans decide where the reply ends);
* ``bullets:<n>``: "Always answer as exactly 3 bullet points.": the reply is n lines, each
  opened by ``*`` (``engine/decoding/bullets.py``), and ends after the n-th;
* ``highlights:<n>``: "Highlight at least two phrases with markdown, like *this*.": the
  reply's sentences after its first open with a ``*highlighted*`` span until n are closed
  (``engine/decoding/highlights.py``); not beside ``bullets:`` (a line's star is a point);
* ``word:<word>:<n>``: "Work the word 'garden' into every answer." (n = 1), "Say 'indeed' at
  least twice." (n = 2): the word opens a sentence where the reply would end, until it holds
  it n times (``engine/decoding/keywords.py``); not where it is also banned;
* ``placeholders:<n>``: "Include at least two placeholders in square brackets, like
  [name].": the word the model starts after a determiner ("your", "the") becomes a
  ``[placeholder]`` until n are closed (``engine/decoding/placeholders.py``); not beside
  bullet points or highlights.

``detect`` reads them from the tenant's instructions and the member's memories (the
sentences and memories ``reminder.standing`` calls standing instructions), as data the
planner puts in the turn's sampling options; the
engine keeps them (``engine/decoding/bans.py``). Fail closed toward the tenant:
a constraint that a quoted literal in the tenant's instructions would break ("Start every
reply with 'Acme:'" against lowercase) is dropped, and so are contradictory ones and a
member's opening (closing) phrase where the tenant's instructions say how replies open
(close).
"""

from __future__ import annotations

from collections.abc import Sequence

from injection.prompting.asks import ABBREVIATION, PS, SENTENCE, SENTENCES, asked
from injection.prompting.intent import requests
from injection.prompting.readers import QUOTED, forbids
from injection.prompting.reminder import standing
from injection.prompting.verdicts import phrase, required, violates

__all__ = ["DEFAULT_ON", "FOLDS", "TRANSFORMS", "asked", "consistent", "detect", "instructed", "kept", "merge",
           "opening", "phrase", "required", "sentences", "tokenwise", "transform", "violates"]

# the platform-wide default where neither the request, the tenant nor the loaded model's
# profile says (``model/profiles.default_on``): on, measured on SmolLM2 (docs/BENCHMARKS.md)
DEFAULT_ON = True

# a case constraint kept token by token: how a token that breaks it is mended
# (``engine/decoding/bans.py``: "To" -> "to")
FOLDS = {"lowercase": str.lower}
# ... and one kept on the reply's text instead: the model writes as it would, the member
# gets it upper-cased (folded token by token, SmolLM2's capitals came out garbled:
# "TOKYLES: HERE")
TRANSFORMS = {"uppercase": str.upper}



def detect(memories: Sequence[str], instructions: str = "") -> tuple[str, ...]:
    """The constraints the tenant's ``instructions`` and the member's ``memories`` ask for,
    sorted: ``merge`` of each one's own (``asked`` of each standing memory, ``instructed``)."""
    tenant, literals = instructed(instructions)
    own = [asked(requests(t)) for t in memories if t and standing(t)]
    return tuple(sorted(set().union(*merge(own, tenant, literals))))


def sentences(instructions: str) -> list[str]:
    """A tenant's ``instructions``, sentence by sentence."""
    return SENTENCES.split(instructions or "")


def instructed(instructions: str) -> tuple[set[str], list[str]]:
    """The constraints a tenant's ``instructions`` ask for (its standing sentences'),
    without contradictions and those a quoted literal of the instructions breaks, and
    those literals: the quoted phrases its replies may hold ("Start every reply with
    'Acme:'"), not a word it forbids ("Never use the word 'basically'": kept as a ban)."""
    tenant = consistent(set().union(*(asked(s) for s in sentences(instructions)
                                       if standing(s))))
    literals = [m.group(1) for s in sentences(instructions) for m in QUOTED.finditer(s)
                if not forbids(s, *m.span())]  # "never use the word 'x'": not the reply's
    return {c for c in tenant if not _broken(c, literals)}, literals


def merge(members: Sequence[Sequence[str]], tenant: Sequence[str] = (),
          literals: Sequence[str] = ()) -> tuple[set[str], set[str]]:
    """``(tenant's, member's)`` constraints of a turn: ``tenant`` (the instructions', as
    ``instructed`` reads them) first; of the member's (one set per memory), a contradictory
    one is left out, and one that contradicts the tenant's case, that a quoted literal of
    the instructions (``literals``) breaks, or that says how replies open (close) where the
    tenant's say it."""
    tenant = set(tenant)
    member = consistent(set().union(*map(set, members)))
    said = {_opens(c) for c in tenant if _opens(c) is not None}
    cases = {"lowercase", "uppercase"}
    member = {c for c in member if _opens(c) not in said
              and not (c in cases and tenant & cases) and not _broken(c, literals)}
    return tenant, member


def kept(memory: str, found: Sequence[str]) -> bool:
    """Whether the decoder keeps what ``memory`` asks: each of its standing sentences (split
    outside quoted phrases) asks for a constraint, and only for ``found`` ones (what
    ``detect`` kept for the turn). One sentence asking for one kept and one other thing
    ("Answer in lowercase, in French.") counts as kept: the reader cannot tell the rest."""
    masked = memory
    for pattern in (QUOTED, PS, ABBREVIATION):  # nor do "P.S." and "e.g."
        masked = pattern.sub(lambda m: "_" * len(m.group()), masked)
    cuts = [0, *(i for m in SENTENCE.finditer(masked) for i in m.span()), len(memory)]
    parts = [memory[a:b] for a, b in zip(cuts[::2], cuts[1::2], strict=True)]
    wants, kept_now = [asked(p) for p in parts if standing(p)], set(found)
    return bool(wants) and all(a and a <= kept_now for a in wants)


def _broken(constraint: str, literals: Sequence[str]) -> bool:
    """Whether a quoted literal of the tenant's instructions breaks ``constraint`` (one
    on every token or the text; a phrase or a title never: where a literal stands in the
    reply says nothing)."""
    return ((tokenwise(constraint) or constraint in TRANSFORMS)
            and any(violates(constraint, lit) for lit in literals))


def _opens(constraint: str) -> str | None:
    """"start" / "end" / "ps" where ``constraint`` says how a reply opens or closes."""
    return "start" if constraint == "repeat" else (phrase(constraint) or (None,))[0]


def opening(constraints: Sequence[str], asked: str) -> tuple[str, ...]:
    """``constraints`` with ``repeat``'s opening phrase, the user's message ``asked``
    (folded as a case constraint asks), beside it (what ``kept`` reads); both dropped
    where it has no text."""
    asked = " ".join(asked.split())
    for name in (c for c in constraints if c in FOLDS):
        asked = FOLDS[name](asked)
    if "repeat" not in constraints:
        return tuple(constraints)
    if not asked:
        return tuple(c for c in constraints if c != "repeat")
    return tuple(sorted({*constraints, f"start:{asked}"}))


def consistent(found: set[str]) -> set[str]:
    """``found`` without contradictions: lowercase and capitals both asked: neither; bullet
    points and highlights: the points (a star opening a line is a point); a sentence limit
    or placeholders beside either: the points or spans (placeholders then not kept)."""
    if any(c.startswith("bullets:") for c in found):
        found = {c for c in found if not c.startswith("highlights:")}
    if any(c.startswith(("bullets:", "highlights:")) for c in found):
        found = {c for c in found if not c.startswith(("max_sentences:", "placeholders:"))}
    both = {w for w in (required(c) for c in found) if w and f"ban:{w[0]}" in found}
    found -= {f"ban:{w}" for w, _ in both} | {f"word:{w}:{n}" for w, n in both}
    return found - {"lowercase", "uppercase"} if {"lowercase", "uppercase"} <= found else found


def transform(constraints: Sequence[str], text: str) -> str:
    """``text`` as the member gets it under ``constraints`` (``TRANSFORMS``)."""
    for name in constraints:
        if name in TRANSFORMS:
            text = TRANSFORMS[name](text)
    return text


def tokenwise(constraint: str) -> bool:
    """Whether ``constraint`` is kept token by token (a token map: ``engine/decoding/bans.py``)."""
    return (constraint not in (*TRANSFORMS, "repeat", "title")
            and not constraint.startswith(("choice:", "max_words:", "max_sentences:", "bullets:",
                                             "highlights:", "word:", "placeholders:"))
            and phrase(constraint) is None)
