"""Attention emphasis through the real path: HTTP (/api/chat ``emphasis``, /v1
``kvinject.emphasis``) -> Celery worker (demo model, batch engine) -> the cache block's
``emphasis_effective``; the tenant's ``memory_emphasis`` when the request sends none;
out-of-range values are a 400 naming the field before any worker is asked."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from tenants import actions
from tenants.models import ChatExchange, Tenant

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def post(base: str, path: str, key: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(f"{base}{path}", data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    req.add_header("Authorization", f"Token {key}")
    try:
        with urllib.request.urlopen(req, timeout=180) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture
def alice():
    tenant = actions.do_create_tenant("acme", "Acme")
    member = actions.do_add_member(tenant, "alice", preference="I am vegetarian, no spicy food.")
    return member, actions.do_create_api_token(member)


def test_emphasis_out_of_range_is_a_400_naming_the_field(live_server, alice):
    _, key = alice
    for value in (-0.5, 8.5, "2"):
        status, body = post(live_server.url, "/api/chat", key,
                            {"message": "hi", "emphasis": value})
        assert status == 400 and "emphasis" in body["error"]["fields"], body
    for value in (-0.5, 8.5, "x"):
        status, body = post(live_server.url, "/v1/chat/completions", key, {
            "model": "kvinject", "messages": [{"role": "user", "content": "hi"}],
            "kvinject": {"emphasis": value}})
        assert status == 400 and body["error"]["param"] == "kvinject.emphasis", body
    for path, body in (("/api/chat", {"message": "hi", "emphasis": float("nan")}),
                       ("/v1/chat/completions", {
                           "model": "kvinject", "messages": [{"role": "user", "content": "hi"}],
                           "kvinject": {"emphasis": float("inf")}})):
        status, _ = post(live_server.url, path, key, body)  # not JSON: refused as malformed
        assert status == 400
    assert not ChatExchange.objects.exists()


def test_request_then_tenant_then_model_default(live_server, gpu_worker, alice, settings,
                                                demo_model_path):
    settings.MODEL_PATH = str(demo_model_path)
    member, key = alice
    ask = {"message": "What should I cook?", "max_new_tokens": 6}
    status, on = post(live_server.url, "/api/chat", key, {**ask, "emphasis": 3.0})
    assert status == 200, (on, gpu_worker.log_tail())
    assert on["cache"]["emphasis_effective"] == 3.0
    status, off = post(live_server.url, "/api/chat", key, {**ask, "emphasis": 0})
    assert status == 200 and off["cache"]["emphasis_effective"] == 0.0
    status, default = post(live_server.url, "/api/chat", key, ask)
    assert status == 200
    assert 0.0 <= default["cache"]["emphasis_effective"] <= 8.0  # the model's default
    Tenant.objects.filter(pk=member.tenant_id).update(memory_emphasis=2.0)
    status, tenant = post(live_server.url, "/api/chat", key, ask)
    assert status == 200 and tenant["cache"]["emphasis_effective"] == 2.0
    status, override = post(live_server.url, "/api/chat", key, {**ask, "emphasis": 0.0})
    assert status == 200 and override["cache"]["emphasis_effective"] == 0.0  # request wins
    status, v1 = post(live_server.url, "/v1/chat/completions", key, {
        "model": "kvinject", "max_tokens": 6, "temperature": 0,
        "messages": [{"role": "user", "content": "What should I cook?"}],
        "kvinject": {"emphasis": 1.5}})
    assert status == 200, v1
    assert v1["kvinject"]["cache"]["emphasis_effective"] == 1.5


def test_the_playground_sends_and_shows_the_emphasis(gpu_worker):
    from tests.tenants.conftest import admin_client, make_world

    world = make_world("acme", "acme-secret vegetarian, no spicy food")
    client = admin_client("acme-admin", "pw-admin-123")
    form = {"member": world.user.pk, "message": "What should I cook?",
            "preference": world.user.preference.text}
    refused = client.post("/admin/playground/", {**form, "emphasis": "9"})
    assert "emphasis" in refused.context["form"].errors
    response = client.post("/admin/playground/", {**form, "emphasis": "2.5"})
    results = response.context["results"]
    mine, plain = results["personalised"], results["plain"]
    assert "error" not in mine, (results, gpu_worker.log_tail())
    assert mine["emphasis_effective"] == 2.5 and plain["emphasis_effective"] == 0.0
    assert '<dd class="kvi-emphasis">2.5</dd>' in response.content.decode()
