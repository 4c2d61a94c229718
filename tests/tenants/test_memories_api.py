"""/api/memories (issue 22): CRUD of the caller's own memories, scoping (another member's
or tenant's id is a 404), strict validation, limits, /api/preference reading and writing
the first memory, and memory writes from chat (off unless the tenant enables them).
Real Django/DRF and Postgres."""

from __future__ import annotations

import json

import pytest

from tenants import actions
from tenants.models import AuditEvent, AuditLog, Memory, Preference
from tests.tenants.conftest import token_client

pytestmark = pytest.mark.django_db


def send(client, method: str, url: str, body=None):
    if body is None:
        return getattr(client, method)(url)
    return getattr(client, method)(url, data=json.dumps(body), content_type="application/json")


def listing(client) -> list[str]:
    response = client.get("/api/memories")
    assert response.status_code == 200, response.content
    return [m["text"] for m in response.json()["results"]]


def test_crud_of_own_memories(acme):
    client = token_client(acme.user_key)
    assert listing(client) == ["acme-secret vegetarian, no spicy food"]
    response = send(client, "post", "/api/memories", {"text": "I live in Lyon.", "pinned": True})
    assert response.status_code == 201, response.content
    created = response.json()
    assert (created["text"], created["pinned"], created["enabled"], created["source"]) == (
        "I live in Lyon.", True, True, "member")
    url = f"/api/memories/{created['id']}"
    assert client.get(url).json()["text"] == "I live in Lyon."
    response = send(client, "patch", url, {"text": "I live in Paris.", "enabled": False})
    assert response.status_code == 200 and response.json()["enabled"] is False
    row = AuditLog.objects.filter(event_type=AuditEvent.MEMORY_CHANGED).get()
    assert (row.data["old"]["text"], row.data["new"]["text"]) == ("I live in Lyon.",
                                                                  "I live in Paris.")
    assert row.actor_id == acme.user.user_id and row.actor_kind == "member"
    body = client.get("/api/memories").json()
    assert body["count"] == 2 and body["limit"] == 100
    assert send(client, "delete", url).status_code == 204
    assert client.get(url).status_code == 404
    assert listing(client) == ["acme-secret vegetarian, no spicy food"]


def test_reorder_through_the_api(acme):
    client = token_client(acme.user_key)
    first = actions.member_memories(acme.user).get().pk
    second = send(client, "post", "/api/memories", {"text": "I live in Lyon."}).json()["id"]
    response = send(client, "put", "/api/memories/order", {"order": [second, first]})
    assert response.status_code == 200, response.content
    assert [m["id"] for m in response.json()["results"]] == [second, first]
    assert client.get("/api/preference").json()["text"] == "I live in Lyon."
    response = send(client, "put", "/api/memories/order", {"order": [second]})
    assert response.status_code == 409 and response.json()["error"]["code"] == "conflict"
    response = send(client, "put", "/api/memories/order", {"order": ["1"], "x": 1})
    assert response.status_code == 400 and set(response.json()["error"]["fields"]) == {"x"}


def test_other_members_and_tenants_ids_are_404(acme, globex):
    mine = actions.member_memories(acme.user).get()
    for key in (acme.other_key, globex.user_key, acme.admin_key):
        client = token_client(key)
        url = f"/api/memories/{mine.pk}"
        assert client.get(url).status_code == 404
        assert send(client, "patch", url, {"text": "hijacked"}).status_code == 404
        assert send(client, "delete", url).status_code == 404
        assert "acme-secret vegetarian, no spicy food" not in listing(client)
    for url in ("/api/memories/999999999", f"/api/memories/{2**63}"):
        assert token_client(acme.user_key).get(url).status_code == 404
    assert Memory.objects.get(pk=mine.pk).text == "acme-secret vegetarian, no spicy food"


@pytest.mark.parametrize("body, field", [
    ({}, "text"),
    ({"text": ""}, "text"),
    ({"text": "   "}, "text"),
    ({"text": 42}, "text"),
    ({"text": ["a"]}, "text"),
    ({"text": "a\x00b"}, "text"),
    ({"text": "ok", "enabled": "yes"}, "enabled"),
    ({"text": "ok", "pinned": 1}, "pinned"),
    ({"text": "ok", "position": 3}, "position"),
    ({"text": "ok", "source": "chat"}, "source"),
    ({"txt": "ok"}, "txt"),
])
def test_bad_bodies_are_400_naming_the_field(acme, body, field):
    before = Memory.objects.count(), AuditLog.objects.count()
    response = send(token_client(acme.user_key), "post", "/api/memories", body)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_input" and field in error["fields"], error
    assert (Memory.objects.count(), AuditLog.objects.count()) == before


def test_patch_validates_too(acme):
    client = token_client(acme.user_key)
    url = f"/api/memories/{actions.member_memories(acme.user).get().pk}"
    for body, field in (({"text": ""}, "text"), ({"enabled": None}, "enabled"),
                        ({"id": 5}, "id")):
        response = send(client, "patch", url, body)
        assert response.status_code == 400 and field in response.json()["error"]["fields"]
    response = client.patch(url, data="text=x", content_type="application/x-www-form-urlencoded")
    assert response.status_code == 415


def test_limits_are_400(acme, settings):
    settings.MEMORY_MAX_CHARS = 20
    settings.MEMORY_MAX_PER_MEMBER = 2
    client = token_client(acme.user_key)
    response = send(client, "post", "/api/memories", {"text": "x" * 21})
    assert response.status_code == 400 and "20 characters" in str(response.json())
    assert send(client, "post", "/api/memories", {"text": "x" * 20}).status_code == 201
    response = send(client, "post", "/api/memories", {"text": "one too many"})
    assert response.status_code == 400 and "at most 2 memories" in str(response.json())


def test_preference_endpoint_reads_and_writes_the_first_memory(acme):
    client = token_client(acme.admin_key)  # no preference yet
    assert client.get("/api/preference").status_code == 404
    assert send(client, "put", "/api/preference", {"text": "Call me Sam."}).status_code == 200
    assert listing(client) == ["Call me Sam."]
    send(client, "post", "/api/memories", {"text": "I live in Lyon."})
    send(client, "patch", "/api/preference", {"text": "Call me Samantha.", "alpha": 0.5})
    assert listing(client) == ["Call me Samantha.", "I live in Lyon."]
    first = actions.member_memories(acme.admin).first()
    send(client, "patch", f"/api/memories/{first.pk}", {"text": "Call me Sam again."})
    pref = client.get("/api/preference").json()
    assert (pref["text"], pref["alpha"]) == ("Call me Sam again.", 0.5)
    send(client, "put", "/api/preference", {"text": ""})  # empty: the memory goes
    assert listing(client) == ["I live in Lyon."]
    assert send(client, "delete", "/api/preference").status_code == 204
    assert listing(client) == ["I live in Lyon."]  # "" had no memory left to delete
    assert not Preference.objects.filter(member=acme.admin).exists()


def test_chat_memory_writes_are_off_by_default(acme):
    assert actions.do_memory_from_chat(acme.user, "Remember that I live in Lyon.") is None
    assert listing(token_client(acme.user_key)) == ["acme-secret vegetarian, no spicy food"]


def test_chat_memory_writes_when_enabled(acme):
    actions.do_update_tenant(acme.tenant, memory_writes_enabled=True)
    acme.user.refresh_from_db()
    user = acme.user.user
    got = actions.do_memory_from_chat(acme.user, "Please remember that I live in Lyon. "
                                      "Any museum tips?", actor=user)
    assert got["op"] == "remembered" and got["text"] == "I live in Lyon"
    memory = Memory.objects.get(pk=got["id"])
    assert (memory.member_id, memory.source) == (acme.user.pk, "chat")
    again = actions.do_memory_from_chat(acme.user, "Remember that I live in Lyon.", actor=user)
    assert again["id"] == memory.pk  # said twice (or a retried request): one memory
    assert actions.do_memory_from_chat(acme.user, "What should I cook?") is None
    assert actions.do_memory_from_chat(acme.user, "Forget that my budget is tight.")["op"] == (
        "not_found")
    got = actions.do_memory_from_chat(acme.user, "forget that I live in Lyon", actor=user)
    assert (got["op"], got["id"]) == ("forgotten", memory.pk)
    memory.refresh_from_db()
    assert memory.enabled is False  # visible in /api/memories, disabled
    assert [m["enabled"] for m in token_client(acme.user_key).get(
        "/api/memories").json()["results"]] == [True, False]
    events = list(AuditLog.objects.filter(event_type__startswith="memory.").order_by(
        "id").values_list("event_type", "data__source", "actor_id"))
    assert events == [("memory.created", "chat", user.pk), ("memory.changed", None, user.pk)]
    assert actions.member_memories(acme.other).count() == 1  # nobody else's


def test_tenant_field_defaults(acme):
    assert acme.tenant.memory_writes_enabled is False
