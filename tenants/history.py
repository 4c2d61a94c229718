"""The history a chat turn keeps, decided from stored token counts: the engine's one rule.

``injection.prompting.history.fit_history`` decides which history fits a turn: leading
system messages always, then the newest whole turns (a user message and the replies
after it) within ``CHAT_HISTORY_TOKEN_BUDGET``, dropped oldest first in blocks of half
the budget so the kept start (and its cached K/V) stays put for many turns. The engine
counts the rendered prompt (template, context, memory reminders); here counts come from
the stored ``token_count`` of each message, so no model and no template is needed:

- the worker's pre-cut of a stored conversation (:func:`precut`): the rule at
  ``PRECUT_FACTOR`` times the budget, counting the stored tokens alone (less than the
  engine counts), so it only bounds what is read and rendered; the engine's own cut,
  made on what the worker sends, stays the same turn after turn;
- the web's estimate (:func:`fit_counted`): the rule at the budget on that pre-cut, each
  message counted as its tokens plus ``TEMPLATE_TOKENS_PER_MESSAGE`` of markup: what the
  engine keeps wherever its count agrees. The model's context limit is the engine's alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from injection.prompting.history import fit_history, whole_turns
from tenants.models import Message

__all__ = ["PRECUT_FACTOR", "TEMPLATE_TOKENS_PER_MESSAGE", "fit_counted", "precut",
           "stored_history"]

TEMPLATE_TOKENS_PER_MESSAGE = 8  # role markers and separators of a chat template
PRECUT_FACTOR = 2  # the worker's pre-cut keeps up to this many budgets of stored tokens
WINDOW = 1600  # the newest stored messages read: the rule decides within them
MAX_MESSAGES = 400  # the most the worker sends (messages stored without a count: /v1's)

Counted = dict[str, Any]  # a message's "role" and its "tokens" (other keys ride along)


def fit_counted(messages: Sequence[Counted], budget: int | None) -> list[Counted]:
    """The messages (oldest first, before the new one) the engine keeps under ``budget``
    history tokens (None: all), each counted as its tokens plus template markup."""
    return _fit(messages, budget, lambda msgs: sum(
        int(m["tokens"]) + TEMPLATE_TOKENS_PER_MESSAGE for m in msgs))


def precut(messages: Sequence[Counted], budget: int | None) -> list[Counted]:
    """The worker's pre-cut: the rule at ``PRECUT_FACTOR`` budgets of stored tokens,
    then at most ``MAX_MESSAGES`` messages (newest whole turns)."""
    cap = None if budget is None else PRECUT_FACTOR * budget
    return _at_most(_fit(messages, cap, lambda msgs: sum(int(m["tokens"]) for m in msgs)),
                    MAX_MESSAGES)


def stored_history(tenant_id: int, member_id: int, conversation_id: int,
                   budget: int | None, *, as_kept: bool = False) -> list[dict[str, str]]:
    """The member's stored conversation (role, content; oldest first) as the worker sends
    it to the engine (:func:`precut` of its newest ``WINDOW`` messages) or, ``as_kept``,
    as the engine will keep it (:func:`fit_counted` of that). Only the texts of the
    messages returned are read."""
    rows = (Message.objects.filter(tenant=tenant_id, conversation_id=conversation_id,
                                   conversation__member=member_id)
            .order_by("-created_at", "-id").values_list("pk", "role", "token_count")[:WINDOW])
    kept = precut([{"pk": pk, "role": role, "tokens": tokens}
                   for pk, role, tokens in list(rows)[::-1]], budget)
    if as_kept:
        kept = fit_counted(kept, budget)
    texts = dict(Message.objects.filter(tenant=tenant_id, pk__in=[m["pk"] for m in kept])
                 .values_list("pk", "content"))
    return [{"role": m["role"], "content": texts[m["pk"]]} for m in kept]


def _fit(messages: Sequence[Counted], cap: int | None,
         count: Callable[[list[Counted]], int]) -> list[Counted]:
    """``fit_history`` with ``count``, the leading system messages kept as the engine
    keeps them (its head)."""
    messages = list(messages)
    n_head = _head_len(messages)
    return fit_history(count, messages[n_head:], [], limit=None, history_cap=cap,
                       head=messages[:n_head])


def _at_most(messages: list[Counted], n: int) -> list[Counted]:
    """The head and the newest whole turns of ``messages`` within ``n`` messages."""
    if len(messages) <= n:
        return messages
    n_head = _head_len(messages)
    kept: list[Counted] = []
    for turn in reversed(whole_turns(messages[n_head:])):
        if n_head + len(kept) + len(turn) > n:
            break
        kept[:0] = turn
    return messages[:n_head] + kept


def _head_len(messages: list[Counted]) -> int:
    return next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages))
