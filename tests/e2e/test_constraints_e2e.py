"""Decoding constraints through the real path: HTTP (/api/chat ``constraints``, /v1
``kvinject.constraints``) -> Celery worker (demo model, batch engine) -> a reply that keeps
the member's standing instructions, listed in ``cache.constraints``; the request's switch
over the tenant's ``decoding_constraints`` over the default (on); a bad value is a 400
naming the field before any worker is asked."""

from __future__ import annotations

import pytest

from injection.prompting.constraints import violates
from tenants import actions
from tenants.errors import InvalidInput
from tenants.models import ChatExchange, Tenant
from tests.e2e.chat_http import post

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

RULE = "Never use capital letters or commas when you reply. Work the word 'harbour' into each answer."
KEPT = ["lowercase", "no_comma", "word:harbour:1"]


@pytest.fixture
def carol():
    tenant = actions.do_create_tenant("acme", "Acme")
    member = actions.do_add_member(tenant, "carol", preference=RULE)
    return member, actions.do_create_api_token(member)


def test_a_bad_constraints_switch_is_a_400_naming_the_field(live_server, carol):
    member, key = carol
    status, body = post(live_server.url, "/api/chat", key, {"message": "hi", "constraints": 1})
    assert status == 400 and "constraints" in body["error"]["fields"], body
    status, body = post(live_server.url, "/v1/chat/completions", key, {
        "model": "kvinject", "messages": [{"role": "user", "content": "hi"}],
        "kvinject": {"constraints": "maybe"}})
    assert status == 400 and body["error"]["param"] == "kvinject.constraints", body
    assert not ChatExchange.objects.exists()
    with pytest.raises(InvalidInput, match="decoding_constraints"):
        actions.do_update_tenant(member.tenant, decoding_constraints="off")


def _chat(base: str, key: str, **switch) -> dict:
    status, body = post(base, "/api/chat", key, {
        "message": "Tell me a long story about a city.", "max_new_tokens": 24, "contrast": 0,
        **switch})
    assert status == 200, body
    return body


def test_request_then_tenant_then_default(live_server, gpu_worker, carol, settings,
                                          demo_model_path):
    settings.MODEL_PATH = str(demo_model_path)
    member, key = carol
    on, off = _chat(live_server.url, key), _chat(live_server.url, key, constraints=False)
    assert on["cache"]["constraints"] == KEPT, gpu_worker.log_tail()
    assert on["reply"] and not any(violates(c, on["reply"]) for c in KEPT)
    assert off["cache"]["constraints"] == [] and off["reply"] != on["reply"]
    tenant = actions.do_update_tenant(Tenant.objects.get(pk=member.tenant_id),
                                      decoding_constraints=False)
    assert _chat(live_server.url, key)["reply"] == off["reply"]  # the tenant's switch
    assert _chat(live_server.url, key, constraints=True)["reply"] == on["reply"]
    actions.do_update_tenant(tenant, decoding_constraints=None)
    status, body = post(live_server.url, "/v1/chat/completions", key, {
        "model": "kvinject", "max_tokens": 24, "temperature": 0,
        "messages": [{"role": "user", "content": "Tell me a long story about a city."}],
        "kvinject": {"contrast": 0}})
    assert status == 200, body
    reply = body["choices"][0]["message"]["content"]
    assert reply and not any(violates(c, reply) for c in KEPT)  # /v1: the default, on


def test_a_repeated_question_through_the_worker(live_server, gpu_worker, settings,
                                                demo_model_path):
    """The one constraint built from the request itself: the planner in the worker opens
    the reply with this turn's message, and the client sees both in ``cache.constraints``;
    off, the reply does not open with it."""
    settings.MODEL_PATH = str(demo_model_path)
    tenant = actions.do_create_tenant("acme", "Acme")
    member = actions.do_add_member(
        tenant, "erin", preference="Begin every answer by repeating my question word for word.")
    key, ask = actions.do_create_api_token(member), "Where is the old harbour?"
    bodies = []
    for switch in ({}, {"constraints": False}):
        status, body = post(live_server.url, "/api/chat", key, {
            "message": ask, "max_new_tokens": 24, "contrast": 0, **switch})
        assert status == 200, (body, gpu_worker.log_tail())
        bodies.append(body)
    on, off = bodies
    assert on["cache"]["constraints"] == ["repeat", f"start:{ask}"]
    assert on["reply"].startswith(ask) and not off["reply"].startswith(ask)
    assert off["cache"]["constraints"] == []


def test_bullet_points_through_the_worker(live_server, gpu_worker, settings, demo_model_path):
    """A count of bullet points read from the member's memory in the worker and kept: the
    /v1 reply is exactly that many points as IFEval counts them, every line a ``* `` point;
    ``/api/chat`` lists it in ``cache.constraints``, and off the model writes no such list."""
    settings.MODEL_PATH = str(demo_model_path)
    tenant = actions.do_create_tenant("acme", "Acme")
    member = actions.do_add_member(
        tenant, "dana", preference="Always answer in exactly 3 bullet points.")
    key, ask = actions.do_create_api_token(member), "How do I keep a garden alive?"
    status, body = post(live_server.url, "/v1/chat/completions", key, {
        "model": "kvinject", "max_tokens": 48, "temperature": 0,
        "messages": [{"role": "user", "content": ask}]})
    assert status == 200, (body, gpu_worker.log_tail())
    reply = body["choices"][0]["message"]["content"]
    assert not violates("bullets:3", reply), reply
    assert all(line.startswith("* ") for line in reply.strip().split("\n")), reply
    bodies = [post(live_server.url, "/api/chat", key, {
        "message": ask, "max_new_tokens": 48, **switch})[1] for switch in ({}, {"constraints": False})]
    assert bodies[0]["cache"]["constraints"] == ["bullets:3"], bodies[0]
    assert bodies[0]["reply"] == reply  # greedy: the same reply through both APIs
    assert bodies[1]["cache"]["constraints"] == [] and violates("bullets:3", bodies[1]["reply"])


def test_the_loop_guard_request_then_tenant_then_default(live_server, gpu_worker, carol,
                                                         settings, demo_model_path):
    """``loop_guard`` (/api/chat, /v1 ``kvinject``) over the tenant's ``loop_guard`` over
    the model's default (the demo model has no profile: off). The random model loops, so
    the guarded reply differs; a bad value is a 400 naming the field."""
    settings.MODEL_PATH = str(demo_model_path)
    member, key = carol
    status, body = post(live_server.url, "/api/chat", key, {"message": "hi", "loop_guard": 1})
    assert status == 400 and "loop_guard" in body["error"]["fields"], body
    with pytest.raises(InvalidInput, match="loop_guard"):
        actions.do_update_tenant(member.tenant, loop_guard="on")
    ask = {"constraints": False}
    default, on, off = (_chat(live_server.url, key, **ask, **switch)["reply"]
                        for switch in ({}, {"loop_guard": True}, {"loop_guard": False}))
    assert default == off != on, gpu_worker.log_tail()
    tenant = actions.do_update_tenant(Tenant.objects.get(pk=member.tenant_id), loop_guard=True)
    assert _chat(live_server.url, key, **ask)["reply"] == on  # the tenant's switch
    assert _chat(live_server.url, key, **ask, loop_guard=False)["reply"] == off
    actions.do_update_tenant(tenant, loop_guard=None)
    status, body = post(live_server.url, "/v1/chat/completions", key, {
        "model": "kvinject", "max_tokens": 24, "temperature": 0,
        "messages": [{"role": "user", "content": "Tell me a long story about a city."}],
        "kvinject": {"contrast": 0, "constraints": False, "loop_guard": True}})
    assert status == 200 and body["choices"][0]["message"]["content"] == on, body
