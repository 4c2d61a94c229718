"""cached_tokens through a real worker: /v1 (plain and streamed) and /api/chat report the
prompt tokens served from the K/V cache; a member's second request reads its chain from
cache, a new member of the tenant starts with the tenant's shared segment cached."""

from __future__ import annotations

import json
import urllib.request

import openai
import pytest

from tenants import actions

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

INSTRUCTIONS = ("You are the assistant of Acme Foods, a grocery chain. Answer briefly, "
                "kindly and with practical cooking advice for home cooks.")


@pytest.fixture
def tenant():
    tenant = actions.do_create_tenant("acme", "Acme")
    actions.do_set_tenant_instructions(tenant, INSTRUCTIONS)
    return tenant


def client_for(live_server, tenant, username, preference):
    member = actions.do_add_member(tenant, username, preference=preference)
    return openai.OpenAI(base_url=f"{live_server.url}/v1", max_retries=0, timeout=180,
                         api_key=actions.do_create_api_token(member))


def ask(client, text="What should I cook?", **kw):
    return client.chat.completions.create(
        model="kvinject", max_tokens=4, messages=[{"role": "user", "content": text}], **kw)


def cached(usage) -> int:
    return usage.prompt_tokens_details.cached_tokens


def test_v1_reports_cached_tokens_cold_warm_and_shared(live_server, gpu_worker, tenant):
    alice = client_for(live_server, tenant, "alice", "I am vegetarian.")
    cold = ask(alice).usage
    warm = ask(alice).usage
    # cold: nothing of this new tenant is cached yet, and never more than was read
    assert cold.prompt_tokens > 0 and cached(cold) == 0
    assert warm.prompt_tokens == cold.prompt_tokens  # the same prompt, the injected turn counted
    assert 0 < cached(warm) <= warm.prompt_tokens
    # a new member: the tenant's instructions segment is shared, only their own is computed
    bob = client_for(live_server, tenant, "bob", "I live in Oslo.")
    first = ask(bob).usage
    assert 0 < cached(first) < cached(warm) <= first.prompt_tokens
    # the streamed answer's final usage chunk carries it too
    chunks = list(ask(alice, stream=True, stream_options={"include_usage": True}))
    final = chunks[-1].usage
    assert chunks[-1].choices == [] and final.prompt_tokens == warm.prompt_tokens
    assert cached(final) == cached(warm)


def test_api_chat_reports_cached_tokens_in_usage_and_cache(live_server, gpu_worker, tenant):
    member = actions.do_add_member(tenant, "carol", preference="I do not eat fish.")
    key = actions.do_create_api_token(member)

    def chat(message):  # a new conversation each time (a new opening message)
        req = urllib.request.Request(
            f"{live_server.url}/api/chat", method="POST", headers={
                "Content-Type": "application/json", "Authorization": f"Token {key}"},
            data=json.dumps({"message": message, "max_new_tokens": 3}).encode())
        with urllib.request.urlopen(req, timeout=180) as resp:
            return json.loads(resp.read())

    cold, warm = chat("Dinner idea?"), chat("Lunch idea?")
    assert cold["usage"]["cached_tokens"] == cold["cache"]["cached_tokens"] == 0
    assert cold["cache"]["kv_tokens"] < cold["usage"]["prompt_tokens"]
    assert 0 < warm["cache"]["cached_tokens"] == warm["usage"]["cached_tokens"]
    assert warm["usage"]["cached_tokens"] <= warm["usage"]["prompt_tokens"]
    assert warm["cache"]["extra"]["segments"] == {"tenant": "l1", "member": "l1"}


def test_v1_conversation_continues_its_link_by_the_messages_hash_chain(live_server, gpu_worker,
                                                                       tenant):
    alice = client_for(live_server, tenant, "alice", "I am vegetarian.")
    msgs = [{"role": "user", "content": "What should I cook?"}]
    cached_by_turn = []
    for follow_up in ("And for dessert?", "Which drink goes with it?", "How long?"):
        r = alice.chat.completions.create(model="kvinject", max_tokens=4, temperature=0,
                                          messages=msgs)
        cached_by_turn.append((cached(r.usage), r.usage.prompt_tokens))
        msgs += [{"role": "assistant", "content": r.choices[0].message.content},
                 {"role": "user", "content": follow_up}]
    (c1, _), (c2, p2), (c3, p3) = cached_by_turn
    # turn 1: nothing cached; turn 2: the segments (its link is then kept); turn 3 also
    # continues turn 2's link: more of a longer prompt comes from cache
    assert c1 == 0 and 0 < c2 < p2 and c2 < c3 < p3
