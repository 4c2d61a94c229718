"""The web's budget estimate counts the history the engine will keep, by its one rule
(``tenants.history``): whole turns within ``CHAT_HISTORY_TOKEN_BUDGET``, for ``/v1``'s
own messages as for a stored conversation."""

from __future__ import annotations

import pytest

from tenants.budgets.estimate import history_texts, prompt_estimate
from tenants.history import TEMPLATE_TOKENS_PER_MESSAGE, fit_counted
from tenants.models import Message

pytestmark = pytest.mark.django_db


def chat(turns: int) -> list[dict[str, str]]:
    return [m for i in range(turns) for m in (
        {"role": "user", "content": f"Question {i}: what should I cook with rice and beans?"},
        {"role": "assistant", "content": f"Answer {i}: a stew, slowly, with onions and thyme."})]


def test_a_long_v1_history_counts_only_the_turns_the_engine_keeps(acme, settings):
    settings.CHAT_HISTORY_TOKEN_BUDGET = 120
    bare = prompt_estimate(acme.user, None, "And dessert?", {"history": []})
    history = [{"role": "system", "content": "Be brief."}, *chat(40)]
    kept, _ = history_texts(acme.user, None, history)
    assert kept[0] == "Be brief." and 2 < len(kept) < 20  # the system message, some turns
    assert kept[1:] == [m["content"] for m in history[len(history) - len(kept) + 1:]]
    assert kept[1].startswith("Question")  # whole turns: a user message first
    longer = prompt_estimate(acme.user, None, "And dessert?", {"history": history})
    # everything past the bare prompt is the kept history: within the budget, beside the
    # system message the engine always keeps
    system = prompt_estimate(acme.user, None, "And dessert?", {"history": history[:1]})
    assert bare < system < longer <= system + settings.CHAT_HISTORY_TOKEN_BUDGET
    everything = sum(len(m["content"]) for m in history) // 4  # far more than the budget
    assert longer < bare + everything


def test_a_stored_conversation_counts_as_the_worker_keeps_it(acme, settings):
    settings.CHAT_HISTORY_TOKEN_BUDGET = 100
    conv = acme.conversation
    conv.messages.all().delete()
    for m in chat(30):
        Message.objects.create(tenant=acme.tenant, conversation=conv, role=m["role"],
                               content=m["content"], token_count=12)
    kept, tokens = history_texts(acme.user, conv.pk, None)
    counted = [{"role": m["role"], "tokens": 12} for m in chat(30)]
    assert len(kept) == len(fit_counted(counted, 100))
    assert 0 < len(kept) * (12 + TEMPLATE_TOKENS_PER_MESSAGE) <= 100 and len(kept) % 2 == 0
    assert kept == [m["content"] for m in chat(30)][-len(kept):]
    assert tokens > 0  # counted with the tokenizer once kept, as before
