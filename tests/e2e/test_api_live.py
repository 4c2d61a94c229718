"""The member API over real HTTP with a real worker: conversations stored per member and
never visible across tenants; each tenant's chat injects only its own preference;
/readyz is ready once a worker answers."""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request

import pytest

from tenants import actions
from tests.tenants.conftest import clear_rate_limits

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def call(base: str, method: str, path: str, key: str | None = None, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{base}{path}", data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Token {key}")
    try:
        with urllib.request.urlopen(req, timeout=180) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None, raw
    except urllib.error.HTTPError as err:
        raw = err.read()
        return err.code, json.loads(raw), raw


@pytest.fixture
def two_tenants():
    clear_rate_limits()
    out = {}
    for slug, text in (("acme", "acme likes tofu"), ("globex", "globex likes durian")):
        tenant = actions.do_create_tenant(slug)
        member = actions.do_add_member(tenant, f"{slug}-user", preference=text)
        out[slug] = (member, actions.do_create_api_token(member), text)
    return out


def test_readyz_ready_with_a_worker(live_server, gpu_worker):
    status, body, _ = call(live_server.url, "GET", "/readyz")
    assert status == 200, body
    assert body["status"] == "ready" and body["checks"]["worker"]["workers"] >= 1


def test_conversations_and_preferences_stay_in_their_tenant(live_server, gpu_worker,
                                                           two_tenants):
    base = live_server.url
    _, acme_key, acme_text = two_tenants["acme"]
    _, globex_key, globex_text = two_tenants["globex"]

    status, first, _ = call(base, "POST", "/api/chat", acme_key,
                            {"message": "acme question one", "max_new_tokens": 3})
    assert status == 200, first
    assert first["cache"]["content_hash"] == hashlib.sha256(acme_text.encode()).hexdigest()
    conv = first["conversation"]
    status, second, _ = call(base, "POST", "/api/chat", acme_key,
                             {"message": "acme question two", "conversation": conv,
                              "max_new_tokens": 3})
    assert status == 200 and second["conversation"] == conv

    status, listing, _ = call(base, "GET", "/api/conversations", acme_key)
    assert status == 200 and [c["id"] for c in listing["results"]] == [conv]
    assert listing["results"][0]["message_count"] == 4
    status, detail, _ = call(base, "GET", f"/api/conversations/{conv}", acme_key)
    assert [m["content"] for m in detail["messages"] if m["role"] == "user"] == [
        "acme question one", "acme question two"]

    # globex: cannot read, continue or delete acme's conversation; its own chat injects
    # only its own preference.
    for method, path, body in (
        ("GET", f"/api/conversations/{conv}", None),
        ("DELETE", f"/api/conversations/{conv}", None),
        ("POST", "/api/chat", {"message": "hi", "conversation": conv, "max_new_tokens": 3}),
    ):
        status, err, raw = call(base, method, path, globex_key, body)
        assert status == 404 and err["error"]["code"] == "not_found", (method, path)
        assert b"acme" not in raw
    status, listing, raw = call(base, "GET", "/api/conversations", globex_key)
    assert listing["count"] == 0 and b"acme" not in raw
    status, theirs, _ = call(base, "POST", "/api/chat", globex_key,
                             {"message": "globex question", "max_new_tokens": 3})
    assert status == 200
    assert theirs["cache"]["content_hash"] == hashlib.sha256(globex_text.encode()).hexdigest()
    status, pref, raw = call(base, "GET", "/api/preference", globex_key)
    assert pref["text"] == globex_text and b"tofu" not in raw
