"""The worker's side of memories (issue 22): the request carries the member's enabled
memories in order (their own only), and ``memories_used`` reports only those."""

from __future__ import annotations

import pytest

from gpu_worker.serving.chat_service import build_request, load_memories, memories_used
from injection.base import ExecutionResult, MemoryItem, Tier
from injection.prompting.rules import NONE
from tenants import actions
from tenants.models import Preference

pytestmark = pytest.mark.django_db


@pytest.fixture
def members():
    tenant = actions.do_create_tenant("acme")
    alice = actions.do_add_member(tenant, "alice", preference="I am vegetarian.")
    bob = actions.do_add_member(tenant, "bob", preference="bob's secret")
    return alice, bob


def test_enabled_memories_in_order_own_only(members):
    alice, bob = members
    lyon = actions.do_create_memory(alice, text="I live in Lyon.", pinned=True)
    off = actions.do_create_memory(alice, text="disabled one", enabled=False)
    first = actions.member_memories(alice).first()
    actions.do_reorder_memories(alice, [lyon.pk, off.pk, first.pk])
    assert load_memories(alice) == (  # neither asks anything of replies: no rules
        MemoryItem(str(lyon.pk), "I live in Lyon.", True, NONE),
        MemoryItem(str(first.pk), "I am vegetarian.", False, NONE))
    assert [m.text for m in load_memories(bob)] == ["bob's secret"]


def test_request_carries_memories_and_injects_them_without_the_preference(members):
    alice, _ = members
    first = actions.member_memories(alice).get()
    actions.do_create_memory(alice, text="I live in Lyon.")
    actions.do_update_memory(alice, first.pk, enabled=False)  # the preference: disabled
    pref = Preference.objects.get(member=alice)
    assert pref.enabled is False
    memories = load_memories(alice)
    req = build_request(alice, pref, [{"role": "user", "content": "hi"}], {}, None, None,
                        memories)
    assert [m.text for m in req.memories] == ["I live in Lyon."]
    assert req.injection_enabled  # the other memory still counts
    req = build_request(alice, pref, [{"role": "user", "content": "hi"}], {})
    assert req.memories == () and not req.injection_enabled  # as before issue 22


def test_memories_used_names_only_the_members_own(members):
    alice, bob = members
    mine = load_memories(alice)
    theirs = load_memories(bob)
    result = ExecutionResult(text="", tier=Tier.COMPUTE, prompt_tokens=1, completion_tokens=1,
                             extra={"memories_used": [
                                 {"id": mine[0].id, "how": "segment"},
                                 {"id": theirs[0].id, "how": "recalled"},
                                 {"id": "999999", "how": "recalled"}, "junk"]})
    assert memories_used(result, mine) == [
        {"id": int(mine[0].id), "text": "I am vegetarian.", "how": "segment"}]
    empty = ExecutionResult(text="", tier=Tier.COMPUTE, prompt_tokens=1, completion_tokens=1)
    assert memories_used(empty, mine) == []
