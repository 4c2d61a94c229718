"""Memories through the real stack (issue 22): HTTP -> DRF -> Celery worker -> engine.
A "remember that ..." with memory writes on is stored before the chat is dispatched and
reported; with writes off (the default) nothing is stored; the reply names only the
member's own memories."""

from __future__ import annotations

import pytest

from tenants import actions
from tenants.models import AuditEvent, AuditLog, Memory
from tests.e2e.test_chat_e2e import post_chat

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def alice():
    tenant = actions.do_create_tenant("acme", "Acme")
    member = actions.do_add_member(tenant, "alice", preference="I am vegetarian.")
    actions.do_add_member(tenant, "bob", preference="bob's secret memory")
    return member, actions.do_create_api_token(member)


def test_memory_writes_from_chat_off_then_on(live_server, gpu_worker, alice):
    member, key = alice
    message = {"message": "Remember that I live in Lyon. What should I visit?",
               "max_new_tokens": 4}
    status, body = post_chat(live_server.url, key, message)
    assert status == 200, (body, gpu_worker.log_tail())
    assert "memory_write" not in body
    assert list(member.memories.values_list("text", flat=True)) == ["I am vegetarian."]

    actions.do_update_tenant(member.tenant, memory_writes_enabled=True)
    status, body = post_chat(live_server.url, key, message)
    assert status == 200, (body, gpu_worker.log_tail())
    write = body["memory_write"]
    assert (write["op"], write["text"]) == ("remembered", "I live in Lyon")
    memory = Memory.objects.get(pk=write["id"])
    assert (memory.member_id, memory.source) == (member.pk, "chat")
    assert AuditLog.objects.filter(event_type=AuditEvent.MEMORY_CREATED,
                                   data__memory=memory.pk).exists()
    own = dict(member.memories.values_list("pk", "text"))
    used = {u["id"]: u["text"] for u in body["memories_used"]}
    # the new memory is already in this reply (stored before dispatch); only alice's own
    assert used and set(used) <= set(own) and memory.pk in used
    assert all(own[pk] == text for pk, text in used.items())
    assert "bob's secret" not in str(body)
