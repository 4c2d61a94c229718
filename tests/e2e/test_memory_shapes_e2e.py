"""Long /api/chat conversations keep continuing their cached K/V with memories as people
write them (issue 32): a member whose preference is one 60-word text, and one whose
preference is a text of nearly 4,000 characters (the limit), hold a 30-turn conversation
through the web and a real worker (the platform's defaults: the memory reminder, the
1,024-token history budget; 24-token replies). At least 80 % of turns 2-30 have half their prompt or more
served from cache: the reminder is bounded, and the history is cut in blocks sized with
each turn's reminder, so the kept history stays a prefix of the next turn. A member with
twenty memories, past the cached segment's budget: those re-stated before each message
change from message to message, and the history before it stays cached."""

from __future__ import annotations

import pytest

from tenants import actions
from tests.e2e.test_chat_e2e import post_chat
from tests.injection.test_memory_shapes_reuse import LONG, SIXTY_WORDS, TWENTY

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
TURNS = 30
NEAR_LIMIT = LONG[:LONG.rindex(" ", 0, 3990)]  # within MEMORY_MAX_CHARS (4,000)


def converse(base: str, worker, key: str) -> tuple[list[float], dict]:
    """A TURNS-turn /api/chat conversation: each turn's cached share, the last reply."""
    conversation, shares = None, []
    for k in range(TURNS):
        body = {"message": f"Turn {k}: what could I cook on a rainy evening this week?",
                "max_new_tokens": 24, **({"conversation": conversation} if conversation else {})}
        status, reply = post_chat(base, key, body)
        assert status == 200, (reply, worker.log_tail())
        conversation = reply["conversation"]
        usage = reply["usage"]
        shares.append(usage["cached_tokens"] / usage["prompt_tokens"])
    return shares, reply


@pytest.mark.parametrize("preference", [SIXTY_WORDS, NEAR_LIMIT],
                         ids=["60-words", "3990-chars"])
def test_a_long_conversation_keeps_reusing_its_kv(live_server, gpu_worker, settings,
                                                  preference):
    settings.CHAT_RATE_PER_MEMBER = "600/min"  # 30 turns back to back
    tenant = actions.do_create_tenant("shapes")
    member = actions.do_add_member(tenant, "pat", preference=preference)
    shares, reply = converse(live_server.url, gpu_worker, actions.do_create_api_token(member))
    later = shares[1:]
    assert sum(s >= 0.5 for s in later) / len(later) >= 0.8, [round(s, 2) for s in shares]
    assert reply["cache"]["history_messages"] > 0  # deep in the chat, history still kept


def test_twenty_memories_keep_reusing_their_kv(live_server, gpu_worker, settings):
    settings.CHAT_RATE_PER_MEMBER = "600/min"
    tenant = actions.do_create_tenant("shapes")
    member = actions.do_add_member(tenant, "pat", preference=TWENTY[0])
    for text in TWENTY[1:]:
        actions.do_create_memory(member, text=text)
    shares, reply = converse(live_server.url, gpu_worker, actions.do_create_api_token(member))
    later = shares[1:]
    assert sum(s >= 0.5 for s in later) / len(later) >= 0.8, [round(s, 2) for s in shares]
    assert reply["cache"]["history_messages"] > 0
    segment = [m for m in reply["memories_used"] if m["how"] == "segment"]
    assert 0 < len(segment) < 20  # the rest are past the segment's budget
