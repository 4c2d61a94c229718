"""A member switches a memory's rules off and on through the real path (issue 57): HTTP
``PATCH /api/memories/<id>`` -> the audited action -> the Celery worker (demo model, batch
engine) reading the rules stored with the memory. Switched off, the next chat keeps no
constraint and its reply is, token for token, the one the decoder's constraints switched
off give; switched on again, the constraint and its reply are back. Nothing is invalidated
in between: nothing cached depends on the rules. (Capitals, not lowercase: the demo model's
reply to this question is lowercase already, so a lowercase rule would change nothing.)"""

from __future__ import annotations

import json
import urllib.request

import pytest

from tenants import actions
from tenants.models import AuditEvent, AuditLog, KVInvalidation
from tests.e2e.chat_http import post

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

RULE = "Always answer in capital letters."


def patch(base: str, path: str, key: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(f"{base}{path}", data=json.dumps(body).encode(),
                                 method="PATCH")
    req.add_header("Content-Type", "application/json")
    req.add_header("Authorization", f"Token {key}")
    with urllib.request.urlopen(req, timeout=60) as resp:
        return resp.status, json.loads(resp.read())


def chat(base: str, key: str, **switch) -> dict:
    status, body = post(base, "/api/chat", key, {
        "message": "Tell me a long story about a city.", "max_new_tokens": 24, "contrast": 0,
        **switch})
    assert status == 200, body
    return body


def test_switching_a_memorys_rules_off_and_on(live_server, gpu_worker, settings,
                                              demo_model_path):
    settings.MODEL_PATH = str(demo_model_path)
    tenant = actions.do_create_tenant("acme", "Acme")
    member = actions.do_add_member(tenant, "carol", preference=RULE)
    key, base = actions.do_create_api_token(member), live_server.url
    memory = actions.member_memories(member).get()
    on, off = chat(base, key), chat(base, key, constraints=False)
    assert on["cache"]["constraints"] == ["uppercase"], gpu_worker.log_tail()
    assert on["reply"] == on["reply"].upper() and off["reply"] != on["reply"]
    assert off["cache"]["constraints"] == []
    outbox = KVInvalidation.objects.count()

    status, body = patch(base, f"/api/memories/{memory.pk}", key, {"rules_enabled": False})
    assert status == 200 and body["rules"]["enabled"] is False and body["enabled"] is True
    vetoed = chat(base, key)
    assert vetoed["cache"]["constraints"] == [], gpu_worker.log_tail()
    assert vetoed["reply"] == off["reply"]  # as if the decoder's constraints were off
    assert vetoed["memories_used"] == on["memories_used"]  # the memory itself stays

    status, body = patch(base, f"/api/memories/{memory.pk}", key, {"rules_enabled": True})
    assert status == 200 and body["rules"]["enabled"] is True
    back = chat(base, key)
    assert back["cache"]["constraints"] == ["uppercase"] and back["reply"] == on["reply"]
    assert KVInvalidation.objects.count() == outbox  # nothing cached depends on the rules
    assert list(AuditLog.objects.filter(event_type=AuditEvent.MEMORY_RULES_SWITCHED).order_by(
        "id").values_list("data__new__rules_enabled", flat=True)) == [False, True]
