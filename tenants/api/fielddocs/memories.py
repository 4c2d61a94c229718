"""``/api/memories`` and ``/api/preference``: what a memory's rules fields mean."""

from __future__ import annotations

# GET /api/memories (each memory), GET /api/preference: the rules read from the text; PATCH
# of either: the switch (issue 57)
MEMORY_RULES = {
    "rules": "What the text asks of every reply, read once when it was saved: `constraints` "
             "the decoder keeps (e.g. `lowercase`), the reply `language`, `standing` (an "
             "instruction on how to answer) and `enabled` (your switch).",
    "rules_enabled": "`false` switches the rules off: the text stays in your replies as a "
                     "memory, but no constraint, language guidance or standing instruction "
                     "comes from it; `true` switches them on again. Audited.",
}
