"""Long /api/chat conversations keep continuing their cached K/V with memories as people
write them (issue 32): a member whose preference is one 60-word text, and one whose
preference is a text of nearly 4,000 characters (the limit), hold a 30-turn conversation
through the web and a real worker (the platform's defaults: the memory reminder, the
1,024-token history budget; 24-token replies). At least 80 % of turns 2-30 have half their prompt or more
served from cache: the reminder is bounded, and the history is cut in blocks sized with
each turn's reminder, so the kept history stays a prefix of the next turn."""

from __future__ import annotations

import pytest

from tenants import actions
from tests.e2e.test_chat_e2e import post_chat
from tests.injection.test_memory_shapes_reuse import LONG, SIXTY_WORDS

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
TURNS = 30
NEAR_LIMIT = LONG[:LONG.rindex(" ", 0, 3990)]  # within MEMORY_MAX_CHARS (4,000)


@pytest.mark.parametrize("preference", [SIXTY_WORDS, NEAR_LIMIT],
                         ids=["60-words", "3990-chars"])
def test_a_long_conversation_keeps_reusing_its_kv(live_server, gpu_worker, settings,
                                                  preference):
    settings.CHAT_RATE_PER_MEMBER = "600/min"  # 30 turns back to back
    tenant = actions.do_create_tenant("shapes")
    member = actions.do_add_member(tenant, "pat", preference=preference)
    key = actions.do_create_api_token(member)
    conversation, shares = None, []
    for k in range(TURNS):
        body = {"message": f"Turn {k}: what could I cook on a rainy evening this week?",
                "max_new_tokens": 24, **({"conversation": conversation} if conversation else {})}
        status, reply = post_chat(live_server.url, key, body)
        assert status == 200, (reply, gpu_worker.log_tail())
        conversation = reply["conversation"]
        usage = reply["usage"]
        shares.append(usage["cached_tokens"] / usage["prompt_tokens"])
    later = shares[1:]
    assert sum(s >= 0.5 for s in later) / len(later) >= 0.8, [round(s, 2) for s in shares]
    assert reply["cache"]["history_messages"] > 0  # deep in the chat, history still kept
