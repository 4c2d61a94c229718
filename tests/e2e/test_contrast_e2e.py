"""Contrastive guidance through the real path: HTTP (/api/chat ``contrast``, /v1
``kvinject.contrast``) -> Celery worker (demo model, batch engine) -> the cache block's
``contrast_effective``; the tenant's ``memory_contrast`` when the request sends none;
out-of-range values are a 400 naming the field before any worker is asked; the playground
sends it and shows what was applied."""

from __future__ import annotations

import pytest

from tenants import actions
from tenants.errors import InvalidInput
from tenants.models import ChatExchange, Tenant
from tests.e2e.chat_http import post

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_contrast_out_of_range_is_a_400_naming_the_field(live_server, alice):
    member, key = alice
    for value, text in ((-0.5, -0.5), (4.5, 4.5), ("1", "x")):
        status, body = post(live_server.url, "/api/chat", key,
                            {"message": "hi", "contrast": value})
        assert status == 400 and "contrast" in body["error"]["fields"], body
        value = text  # /v1 takes numbers sent as strings, as OpenAI's fields do
        status, body = post(live_server.url, "/v1/chat/completions", key, {
            "model": "kvinject", "messages": [{"role": "user", "content": "hi"}],
            "kvinject": {"contrast": value}})
        assert status == 400 and body["error"]["param"] == "kvinject.contrast", body
    assert not ChatExchange.objects.exists()
    with pytest.raises(InvalidInput, match="memory_contrast"):
        actions.do_update_tenant(member.tenant, memory_contrast=5.0)


def test_request_then_tenant_then_model_default(live_server, gpu_worker, alice,
                                                settings, demo_model_path):
    settings.MODEL_PATH = str(demo_model_path)
    member, key = alice
    ask = {"message": "What should I cook?", "max_new_tokens": 6}
    status, on = post(live_server.url, "/api/chat", key, {**ask, "contrast": 1.5})
    assert status == 200, (on, gpu_worker.log_tail())
    assert on["cache"]["contrast_effective"] == 1.5
    status, default = post(live_server.url, "/api/chat", key, ask)
    assert status == 200 and default["cache"]["contrast_effective"] == 0.0  # demo model: off
    actions.do_update_tenant(Tenant.objects.get(pk=member.tenant_id), memory_contrast=0.5)
    status, tenant = post(live_server.url, "/api/chat", key, ask)
    assert status == 200 and tenant["cache"]["contrast_effective"] == 0.5
    status, override = post(live_server.url, "/api/chat", key, {**ask, "contrast": 0})
    assert status == 200 and override["cache"]["contrast_effective"] == 0.0  # request wins
    status, v1 = post(live_server.url, "/v1/chat/completions", key, {
        "model": "kvinject", "max_tokens": 6, "temperature": 0,
        "messages": [{"role": "user", "content": "What should I cook?"}],
        "kvinject": {"contrast": 2}})
    assert status == 200, v1
    assert v1["kvinject"]["cache"]["contrast_effective"] == 2.0


def test_several_memories_are_guided_on_first_turns_unless_the_tenant_has_instructions(
        live_server, gpu_worker, alice, settings, demo_model_path):
    """Memories from Postgres, instructions from the tenant: a member with several memories
    is guided on a conversation's first turns (against the turn without its reminder),
    deeper only its first token (anchor.py), and never where the tenant has instructions
    (they keep precedence)."""
    settings.MODEL_PATH = str(demo_model_path)
    member, key = alice
    for text in ("Reply in French.", "My dog is called Biscuit."):
        actions.do_create_memory(member, text=text)
    ask = {"message": "What should I cook?", "max_new_tokens": 4, "contrast": 1.0}
    status, first = post(live_server.url, "/api/chat", key, ask)
    assert status == 200, (first, gpu_worker.log_tail())
    assert first["cache"]["contrast_effective"] == 1.0
    conv, effective = first["conversation"], []
    for message in ("And for dessert?", "And tomorrow?"):
        status, body = post(live_server.url, "/api/chat", key,
                            {**ask, "message": message, "conversation": conv})
        assert status == 200, body
        effective.append((body["cache"]["contrast_effective"],
                          body["usage"]["guide_decode_tokens"] > 0,
                          body["usage"]["guide_prefill_tokens"] > 0))
    # the second turn still guided; the third runs no guide row, its first token anchored
    assert effective == [(1.0, True, True), (1.0, False, True)]
    actions.do_set_tenant_instructions(Tenant.objects.get(pk=member.tenant_id),
                                       "Always answer politely.")
    status, ruled = post(live_server.url, "/api/chat", key, ask)
    assert status == 200 and ruled["cache"]["contrast_effective"] == 0.0, ruled


def test_the_playground_sends_and_shows_the_contrast(gpu_worker):
    from tests.tenants.conftest import admin_client, make_world

    world = make_world("acme", "acme-secret vegetarian, no spicy food")
    client = admin_client("acme-admin", "pw-admin-123")
    form = {"member": world.user.pk, "message": "What should I cook?",
            "preference": world.user.preference.text}
    refused = client.post("/admin/playground/", {**form, "contrast": "5"})
    assert "contrast" in refused.context["form"].errors
    response = client.post("/admin/playground/", {**form, "contrast": "1.5"})
    results = response.context["results"]
    mine, plain = results["personalised"], results["plain"]
    assert "error" not in mine, (results, gpu_worker.log_tail())
    assert mine["contrast_effective"] == 1.5 and plain["contrast_effective"] == 0.0
    assert '<dd class="kvi-contrast">1.5</dd>' in response.content.decode()
