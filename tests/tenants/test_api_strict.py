"""Strict input and a truthful schema (issue 9, finding 8): JSON bodies only, no type
coercion, every bound checked on the value as sent, strict pagination, and an OpenAPI
schema that states every bound and status the API answers with. Real Django/DRF and
Postgres; every request here is refused before a worker is involved."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from tenants.models import AuditLog, Conversation, Message, Preference
from tests.tenants.conftest import token_client

pytestmark = pytest.mark.django_db


def send(client: Client, method: str, url: str, body, content_type="application/json"):
    data = json.dumps(body) if content_type == "application/json" else body
    return getattr(client, method)(url, data=data, content_type=content_type)


def error(response) -> dict:
    assert response["Content-Type"].startswith("application/json"), response.content[:200]
    return response.json()["error"]


@pytest.mark.parametrize("method, url", [("post", "/api/chat"), ("put", "/api/preference"),
                                         ("patch", "/api/preference")])
@pytest.mark.parametrize("content_type, body", [
    ("application/x-www-form-urlencoded", "message=hi&text=form%20text"),
    ("multipart/form-data; boundary=BoUnDaRy",
     '--BoUnDaRy\r\nContent-Disposition: form-data; name="text"\r\n\r\nform text\r\n'
     '--BoUnDaRy\r\nContent-Disposition: form-data; name="message"\r\n\r\nhi\r\n'
     '--BoUnDaRy--\r\n'),
])
def test_form_and_multipart_bodies_are_415(acme, method, url, content_type, body):
    audits = AuditLog.objects.count()
    response = send(token_client(acme.user_key), method, url, body, content_type)
    assert response.status_code == 415, response.content
    assert error(response)["code"] == "unsupported_media_type"
    pref = Preference.objects.get(member=acme.user)
    assert pref.version == 1 and pref.text != "form text"  # nothing stored
    assert AuditLog.objects.count() == audits


@pytest.mark.parametrize("body, field", [
    ({"message": 42}, "message"),
    ({"message": 4.5}, "message"),
    ({"message": True}, "message"),
    ({"message": ["hi"]}, "message"),
    ({"message": {"text": "hi"}}, "message"),
    ({"message": "hi", "max_new_tokens": "5"}, "max_new_tokens"),
    ({"message": "hi", "max_new_tokens": True}, "max_new_tokens"),
    ({"message": "hi", "max_new_tokens": 5.5}, "max_new_tokens"),
    ({"message": "hi", "conversation": "1"}, "conversation"),
    ({"message": "hi", "temperature": "0.5"}, "temperature"),
    ({"message": "hi", "top_p": False}, "top_p"),
    ({"message": "hi", "alpha": "1"}, "alpha"),
    ({"message": "hi\x00there"}, "message"),
    ({"message": " " * 10 + "x" * 8000}, "message"),  # bounds apply to the value as sent
])
def test_chat_types_are_strict(acme, settings, body, field):
    settings.CHAT_MAX_MESSAGE_CHARS = 8000
    response = send(token_client(acme.user_key), "post", "/api/chat", body)
    assert response.status_code == 400, response.content
    assert error(response)["code"] == "invalid_input"
    assert field in error(response)["fields"]
    assert not Message.objects.filter(content__contains="hi").exclude(
        conversation=acme.conversation).exists()


@pytest.mark.parametrize("body, field", [
    ({"text": 42}, "text"),
    ({"text": None}, "text"),
    ({"text": "ok", "enabled": "true"}, "enabled"),
    ({"text": "ok", "enabled": 1}, "enabled"),
    ({"text": "ok", "alpha": "0.5"}, "alpha"),
    ({"text": "nul\x00byte"}, "text"),
])
def test_preference_types_are_strict(acme, body, field):
    for method in ("put", "patch"):
        response = send(token_client(acme.user_key), method, "/api/preference", body)
        assert response.status_code == 400, response.content
        assert field in error(response)["fields"]
    assert Preference.objects.get(member=acme.user).version == 1


def test_well_typed_writes_still_work(acme):
    client = token_client(acme.user_key)
    response = send(client, "put", "/api/preference", {"text": "", "enabled": False,
                                                       "alpha": 1})
    assert response.status_code == 200, response.content
    assert response.json()["text"] == "" and response.json()["alpha"] == 1.0


@pytest.mark.parametrize("query", ["limit=0", "limit=101", "limit=abc", "limit=-1",
                                   "offset=-1", "offset=x", "limit=1.5",
                                   f"offset={2**63}"])
def test_bad_pagination_is_400(acme, query):
    response = token_client(acme.user_key).get(f"/api/conversations?{query}")
    assert response.status_code == 400, response.content
    assert error(response)["code"] == "invalid_input"


def test_pagination_within_bounds(acme):
    Conversation.objects.create(tenant=acme.tenant, member=acme.user, title="second")
    client = token_client(acme.user_key)
    page = client.get("/api/conversations?limit=1").json()
    assert page["count"] == 2 and len(page["results"]) == 1 and page["next"]
    page = client.get("/api/conversations?limit=100&offset=1").json()
    assert [c["title"] for c in page["results"]] == ["acme dinner plans"]
    assert client.get(f"/api/conversations?offset={2**63 - 1}").json()["results"] == []


# --- the schema states what the API does ------------------------------------------------


@pytest.fixture
def schema(settings) -> dict:
    settings.CHAT_MAX_MESSAGE_CHARS, settings.CHAT_MAX_NEW_TOKENS = 1234, 77
    response = Client().get("/api/schema/?format=json")
    assert response.status_code == 200
    return response.json()


def responses(schema, path, method) -> set[str]:
    return set(schema["paths"][path][method]["responses"])


def test_schema_states_bounds_and_types(schema):
    comps = schema["components"]["schemas"]
    chat = comps["ChatRequest"]["properties"]
    assert chat["message"]["maxLength"] == 1234 and chat["message"]["pattern"]
    assert chat["max_new_tokens"] == {**chat["max_new_tokens"], "type": "integer",
                                      "minimum": 1, "maximum": 77}
    assert chat["conversation"]["minimum"] == 1 and chat["alpha"]["maximum"] == 1.0
    assert comps["PreferenceWrite"]["properties"]["text"]["maxLength"] == 4000
    assert comps["PreferenceWrite"]["properties"]["enabled"]["type"] == "boolean"
    for path, ops in schema["paths"].items():
        for op in ops.values():
            if "requestBody" in op:
                assert set(op["requestBody"]["content"]) == {"application/json"}, path


def test_schema_declares_the_paginated_list(schema):
    ok = schema["paths"]["/api/conversations"]["get"]["responses"]["200"]
    ref = ok["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
    page = schema["components"]["schemas"][ref]
    assert set(page["required"]) == {"count", "next", "previous", "results"}
    assert page["properties"]["results"]["type"] == "array"
    params = {p["name"]: p["schema"] for p in
              schema["paths"]["/api/conversations"]["get"]["parameters"]}
    assert params["limit"]["minimum"] == 1 and params["limit"]["maximum"] == 100


def test_schema_declares_every_status(schema):
    common = {"401", "403", "429", "503"}
    body = {"400", "413", "415"}
    assert responses(schema, "/api/chat", "post") == ({"200", "404", "409", "422", "502"}
                                                      | common | body)
    assert responses(schema, "/api/conversations", "get") == {"200", "400"} | common
    assert responses(schema, "/api/conversations/{id}", "get") == {"200", "404"} | common
    assert responses(schema, "/api/conversations/{id}", "delete") == {"204", "404"} | common
    assert responses(schema, "/api/preference", "get") == {"200", "404"} | common
    assert responses(schema, "/api/preference", "put") == {"200", "409"} | common | body
    assert responses(schema, "/api/preference", "patch") == ({"200", "404", "409"}
                                                             | common | body)
    assert responses(schema, "/api/me", "get") == {"200"} | common
    assert responses(schema, "/api/tenant/instructions", "get") == {"200"} | common
    assert responses(schema, "/api/tenant/instructions", "put") == {"200", "409"} | common | body


@pytest.mark.parametrize("method, url, key, body", [
    ("put", "/api/preference", "user_key", {"text": "tea", "colour": "red"}),
    ("patch", "/api/preference", "user_key", {"alpah": 0.5}),
    ("put", "/api/tenant/instructions", "admin_key", {"instructions": "Be brief.", "versoin": 1}),
])
def test_unknown_fields_are_400_on_preference_and_instructions(acme, method, url, key, body):
    """A typo is never silently dropped: 400 naming the field, and nothing stored."""
    from tenants.models import Tenant

    audits, pref = AuditLog.objects.count(), Preference.objects.get(member=acme.user)
    instructions = Tenant.objects.get(slug="acme").instructions
    response = send(token_client(getattr(acme, key)), method, url, body)
    assert response.status_code == 400, response.content
    err = error(response)
    assert err["code"] == "invalid_input"
    unknown = set(body) - {"text", "alpha", "instructions"}
    assert set(err["fields"]) == unknown
    after = Preference.objects.get(member=acme.user)
    assert (after.version, after.text) == (pref.version, pref.text)
    assert Tenant.objects.get(slug="acme").instructions == instructions
    assert AuditLog.objects.count() == audits
