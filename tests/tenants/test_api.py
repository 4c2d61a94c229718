"""The member API over real Django/DRF and Postgres: scoping, validation and error codes.

Chat requests that would reach a worker are covered by tests/e2e; here every chat request
is refused before dispatch (or times out on purpose), so no worker is needed.
"""

from __future__ import annotations

import json

import pytest
from django.test import Client

from tenants import actions
from tenants.models import AuditEvent, AuditLog, Conversation, Preference
from tests.tenants.conftest import token_client

pytestmark = pytest.mark.django_db


def post_json(client: Client, url: str, body, **extra):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return client.post(url, data=data, content_type="application/json", **extra)


def error_code(response) -> str:
    assert response["Content-Type"].startswith("application/json"), response.content[:200]
    return response.json()["error"]["code"]


# --- authentication and tenant resolution ------------------------------------------------


@pytest.mark.parametrize("url", ["/api/chat", "/api/conversations", "/api/preference",
                                 "/api/me", "/api/conversations/1"])
def test_every_endpoint_needs_auth(url, acme):
    client = Client()
    response = client.post(url) if url == "/api/chat" else client.get(url)
    assert response.status_code == 401 and error_code(response) == "not_authenticated"
    response = token_client("kvi_forged").get(url)
    assert response.status_code == 401 and error_code(response) == "authentication_failed"


def test_revoked_token_refused(acme):
    token = acme.user.api_tokens.get()
    actions.do_revoke_api_token(token)
    response = token_client(acme.user_key).get("/api/me")
    assert response.status_code == 401


def test_token_last_used_is_recorded_at_most_once_a_minute(acme):
    from datetime import timedelta

    from tenants.models import ApiToken

    token = acme.user.api_tokens.get()
    assert token.last_used_at is None
    client = token_client(acme.user_key)
    assert client.get("/api/me").status_code == 200
    token.refresh_from_db()
    first = token.last_used_at
    assert first is not None
    assert client.get("/api/me").status_code == 200
    token.refresh_from_db()
    assert token.last_used_at == first  # within the minute: no write
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=first - timedelta(minutes=2))
    assert client.get("/api/me").status_code == 200
    token.refresh_from_db()
    assert token.last_used_at > first


def test_me_and_session_auth(acme):
    body = token_client(acme.user_key).get("/api/me").json()
    assert body == {"username": "acme-user", "tenant": "acme", "tenant_name": "Acme",
                    "role": "user"}
    session = Client()
    assert session.login(username="acme-user", password="pw-user-123")
    assert session.get("/api/me").json()["username"] == "acme-user"


def test_user_without_member_fails_closed(superuser):
    client = Client()
    client.force_login(superuser)
    response = client.get("/api/conversations")
    assert response.status_code == 401 and error_code(response) == "not_authenticated"


@pytest.mark.parametrize("what", ["tenant", "member", "user"])
def test_inactive_tenant_or_member_is_403(acme, what):
    if what == "tenant":
        actions.do_update_tenant(acme.tenant, active=False)
    elif what == "member":
        actions.do_change_member(acme.user, active=False)
    else:
        acme.user.user.is_active = False
        acme.user.user.save()
    client = token_client(acme.user_key)
    for response in (client.get("/api/preference"), post_json(client, "/api/chat",
                                                                {"message": "hi"})):
        assert response.status_code == 403 and error_code(response) == "inactive"


# --- chat validation (refused before any worker is involved) ----------------------------


@pytest.mark.parametrize("body, field", [
    ({}, "message"),
    ({"message": ""}, "message"),
    ({"message": "   "}, "message"),
    ({"message": "x" * 8001}, "message"),
    ({"message": "hi", "max_new_tokens": 0}, "max_new_tokens"),
    ({"message": "hi", "max_new_tokens": 257}, "max_new_tokens"),
    ({"message": "hi", "temperature": -0.1}, "temperature"),
    ({"message": "hi", "temperature": 2.5}, "temperature"),
    ({"message": "hi", "top_p": 0}, "top_p"),
    ({"message": "hi", "top_p": 1.5}, "top_p"),
    ({"message": "hi", "alpha": -1}, "alpha"),
    ({"message": "hi", "alpha": 1.01}, "alpha"),
    ({"message": "hi", "conversation": 0}, "conversation"),
    ({"message": "hi", "conversation": 2**63}, "conversation"),
    ({"message": "hi", "conversation": "abc"}, "conversation"),
])
def test_chat_rejects_out_of_range(acme, settings, body, field):
    settings.CHAT_MAX_MESSAGE_CHARS = 8000
    settings.CHAT_MAX_NEW_TOKENS = 256
    response = post_json(token_client(acme.user_key), "/api/chat", body)
    assert response.status_code == 400, response.content
    assert error_code(response) == "invalid_input"
    assert field in response.json()["error"]["fields"]


def test_chat_malformed_and_wrong_shapes(acme):
    client = token_client(acme.user_key)
    for raw, code in ((b"{not json", "malformed_json"), (b'{"message": "hi", "alpha": NaN}',
                                                         "malformed_json"),
                      (b"", "invalid_input")):
        response = post_json(client, "/api/chat", raw)
        assert response.status_code == 400 and error_code(response) == code, raw
    response = post_json(client, "/api/chat", [1, 2])
    assert response.status_code == 400 and error_code(response) == "invalid_input"
    response = client.post("/api/chat", data="message=hi", content_type="text/plain")
    assert response.status_code == 415 and error_code(response) == "unsupported_media_type"
    response = client.get("/api/chat")
    assert response.status_code == 405 and error_code(response) == "method_not_allowed"


def test_chat_oversized_body_is_413(acme, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    response = post_json(token_client(acme.user_key), "/api/chat", {"message": "x" * 20_000})
    assert response.status_code == 413 and error_code(response) == "payload_too_large"


def test_chat_foreign_or_unknown_conversation_is_404(acme, globex):
    client = token_client(acme.user_key)
    for conv_id in (globex.conversation.pk, 10**9):
        response = post_json(client, "/api/chat", {"message": "hi", "conversation": conv_id})
        assert response.status_code == 404 and error_code(response) == "not_found"
    # Same tenant, other member: still 404 (conversations are per member).
    other_conv = Conversation.objects.create(tenant=acme.tenant, member=acme.other)
    response = post_json(client, "/api/chat", {"message": "hi", "conversation": other_conv.pk})
    assert response.status_code == 404
    assert not AuditLog.objects.filter(event_type=AuditEvent.CHAT_REQUEST).exists()


def test_chat_worker_timeout_is_503_with_retry_after(acme, settings):
    settings.CHAT_RESULT_TIMEOUT = 0.001  # no worker can answer in a millisecond
    response = post_json(token_client(acme.user_key), "/api/chat", {"message": "hello"})
    assert response.status_code == 503
    assert error_code(response) == "worker_unavailable"
    assert int(response["Retry-After"]) > 0
    assert response.json()["error"]["retry_after"] == int(response["Retry-After"])


def test_unknown_api_url_is_json_404(acme):
    response = token_client(acme.user_key).get("/api/nope")
    assert response.status_code == 404 and error_code(response) == "not_found"


# --- conversations -------------------------------------------------------------------------


def test_conversations_list_and_detail_are_the_members_own(acme, globex):
    client = token_client(acme.user_key)
    body = client.get("/api/conversations").json()
    assert body["count"] == 1
    [row] = body["results"]
    assert row["id"] == acme.conversation.pk and row["message_count"] == 2
    detail = client.get(f"/api/conversations/{acme.conversation.pk}").json()
    assert [m["role"] for m in detail["messages"]] == ["user", "assistant"]
    assert detail["messages"][0]["content"] == "acme private question"
    # The other acme user has none; globex's conversation is invisible.
    assert token_client(acme.other_key).get("/api/conversations").json()["count"] == 0
    for key in (acme.other_key, globex.user_key, globex.admin_key, acme.admin_key):
        response = token_client(key).get(f"/api/conversations/{acme.conversation.pk}")
        assert response.status_code == 404 and error_code(response) == "not_found"
        assert b"acme private" not in response.content


def test_conversation_pagination(acme):
    for i in range(5):
        Conversation.objects.create(tenant=acme.tenant, member=acme.user, title=f"c{i}")
    body = token_client(acme.user_key).get("/api/conversations?limit=2&offset=1").json()
    assert body["count"] == 6 and len(body["results"]) == 2 and body["next"]


def test_conversation_delete_scoped_and_audited(acme, globex):
    response = token_client(globex.user_key).delete(f"/api/conversations/{acme.conversation.pk}")
    assert response.status_code == 404
    assert Conversation.objects.filter(pk=acme.conversation.pk).exists()
    response = token_client(acme.user_key).delete(f"/api/conversations/{acme.conversation.pk}")
    assert response.status_code == 204
    assert not Conversation.objects.filter(pk=acme.conversation.pk).exists()
    row = AuditLog.objects.get(event_type=AuditEvent.CONVERSATION_DELETED)
    assert row.tenant == acme.tenant and row.actor == acme.user.user
    assert row.data == {"conversation": acme.conversation.pk, "messages": 2}


def test_huge_conversation_id_in_url_is_404(acme):
    response = token_client(acme.user_key).get(f"/api/conversations/{2**70}")
    assert response.status_code == 404 and error_code(response) == "not_found"


# --- preference --------------------------------------------------------------------------


def test_preference_get_put_patch_delete(acme, globex):
    client = token_client(acme.user_key)
    body = client.get("/api/preference").json()
    assert body["text"] == "acme-secret vegetarian, no spicy food" and body["version"] == 1
    response = client.put("/api/preference", data=json.dumps({"text": "vegan"}),
                          content_type="application/json")
    assert response.status_code == 200
    body = response.json()
    assert (body["text"], body["version"], body["enabled"]) == ("vegan", 2, True)
    import hashlib

    assert body["content_hash"] == hashlib.sha256(b"vegan").hexdigest()
    response = client.patch("/api/preference", data=json.dumps({"alpha": 0.5}),
                            content_type="application/json")
    assert response.json()["alpha"] == 0.5 and response.json()["version"] == 3
    row = AuditLog.objects.filter(event_type=AuditEvent.PREFERENCE_CHANGED).first()
    assert row.actor == acme.user.user and row.data["new"]["alpha"] == 0.5
    # The globex user's preference is untouched and never shown to acme.
    assert Preference.objects.get(member=globex.user).text == "globex-secret loves durian"
    assert client.delete("/api/preference").status_code == 204
    response = client.get("/api/preference")
    assert response.status_code == 404 and error_code(response) == "not_found"
    assert client.patch("/api/preference", data="{}",
                        content_type="application/json").status_code == 404
    response = client.put("/api/preference", data=json.dumps({"text": "tea"}),
                          content_type="application/json")
    assert response.status_code == 200 and response.json()["version"] == 1


@pytest.mark.parametrize("body, field", [
    ({}, "text"),
    ({"text": "x" * 4001}, "text"),
    ({"text": "ok", "alpha": 1.5}, "alpha"),
    ({"text": "ok", "enabled": "maybe"}, "enabled"),
])
def test_preference_validation(acme, body, field):
    client = token_client(acme.user_key)
    response = client.put("/api/preference", data=json.dumps(body),
                          content_type="application/json")
    assert response.status_code == 400 and field in response.json()["error"]["fields"]
    assert Preference.objects.get(member=acme.user).version == 1


# --- schema --------------------------------------------------------------------------------


def test_openapi_schema_lists_endpoints_and_docs_render():
    client = Client()
    response = client.get("/api/schema/?format=json")
    assert response.status_code == 200
    schema = response.json()
    assert {"/api/chat", "/api/conversations", "/api/conversations/{id}", "/api/preference",
            "/api/me"} <= set(schema["paths"])
    chat = schema["paths"]["/api/chat"]["post"]
    assert {"200", "400", "401", "403", "404", "429", "503"} <= set(chat["responses"])
    assert "tokenAuth" in schema["components"]["securitySchemes"]
    assert "Bearer" in schema["components"]["securitySchemes"]["tokenAuth"]["description"]
    v1 = schema["paths"]["/v1/chat/completions"]["post"]
    example = v1["requestBody"]["content"]["application/json"]["examples"]["Chat"]["value"]
    assert example["model"] == "kvinject"  # an alias the server accepts: "Try it out" works
    assert {"200", "400", "401", "404", "429", "503"} <= set(v1["responses"])
    assert "/v1/models" in schema["paths"]
    assert client.get("/api/docs/").status_code == 200


def test_schema_generation_has_no_warnings(tmp_path):
    from django.core.management import call_command

    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(out))
    assert "/api/conversations/{id}" in out.read_text()
