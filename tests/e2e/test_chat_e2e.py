"""Real HTTP -> DRF -> Celery (real worker process) -> model -> reply -> Postgres."""

from __future__ import annotations

import pytest

from tenants import actions
from tenants.models import AuditEvent, AuditLog, Message
from tests.e2e.chat_http import post

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def post_chat(base: str, key: str | None, body) -> tuple[int, dict]:
    return post(base, "/api/chat", key, body)


def test_chat_round_trip_through_real_worker(live_server, gpu_worker, alice):
    member, key = alice
    status, body = post_chat(live_server.url, key, {"message": "What should I cook?",
                                                    "max_new_tokens": 8})
    assert status == 200, (body, gpu_worker.log_tail())
    assert isinstance(body["reply"], str)
    assert body["usage"]["completion_tokens"] >= 1
    assert body["usage"]["prompt_tokens"] > 0
    assert body["cache"]["tier"] in ("compute", "l2")  # first sight of this preference
    assert body["cache"]["kv_layers_count"] == 4
    assert body["cache"]["preference_version"] == member.preference.version

    # Second turn in the same conversation: K/V now served from the worker's L1.
    status, body2 = post_chat(live_server.url, key, {"message": "And tomorrow?",
                                                     "conversation": body["conversation"],
                                                     "max_new_tokens": 4})
    assert status == 200, body2
    assert body2["conversation"] == body["conversation"]
    assert body2["cache"]["tier"] == "l1"
    assert body2["cache"]["content_hash"] == body["cache"]["content_hash"]

    audits = AuditLog.objects.filter(tenant=member.tenant, event_type=AuditEvent.CHAT_REQUEST)
    assert audits.count() == 2
    row = audits.order_by("id").first()
    assert row.data["request_id"] == body["request_id"]
    assert row.data["cache_tier"] == body["cache"]["tier"]
    assert 0 < body["cache"]["ttft_ms"] <= body["cache"]["kv_fetch_latency_ms"] + body["cache"][
        "inference_latency_ms"]
    assert row.data["ttft_ms"] == round(body["cache"]["ttft_ms"], 1)  # -> usage TTFT p50/p95
    assert "message" not in row.data  # text only stored when the tenant opts in
    assert Message.objects.filter(conversation_id=body["conversation"]).count() == 4


def test_chat_rejects_bad_requests_without_reaching_worker(live_server, alice):
    _, key = alice
    status, body = post_chat(live_server.url, None, {"message": "hi"})
    assert status == 401 and body["error"]["code"] == "not_authenticated"
    status, body = post_chat(live_server.url, "kvi_wrong", {"message": "hi"})
    assert status == 401 and body["error"]["code"] == "authentication_failed"
    status, body = post_chat(live_server.url, key, b"{not json")
    assert status == 400 and body["error"]["code"] == "malformed_json"
    status, body = post_chat(live_server.url, key, {"message": ""})
    assert status == 400 and body["error"]["code"] == "invalid_input"
    status, body = post_chat(live_server.url, key, {"message": "hi", "max_new_tokens": 10**6})
    assert status == 400 and "max_new_tokens" in body["error"]["fields"]
    status, body = post_chat(live_server.url, key, {"message": "hi", "conversation": 999999})
    assert status == 404 and body["error"]["code"] == "not_found"
    assert not AuditLog.objects.filter(event_type=AuditEvent.CHAT_REQUEST).exists()


def test_instructions_history_and_context_limit_through_a_real_worker(
    live_server, gpu_worker, alice, demo_model_path, settings
):
    """The worker injects instructions + preference as one system turn, keeps the history
    in whole turns, and refuses (400, stored nothing) a message its context cannot hold."""
    member, key = alice
    actions.do_set_tenant_instructions(member.tenant, "You are Acme's cooking assistant.")
    status, first = post_chat(live_server.url, key, {"message": "Hi!", "max_new_tokens": 4})
    assert status == 200, (first, gpu_worker.log_tail())
    cache = first["cache"]
    assert cache["injection_mode"] == "system" and cache["instructions_version"] == 2
    assert cache["history_messages"] == 0 and cache["tier"] in ("compute", "l2")
    status, second = post_chat(live_server.url, key, {
        "message": "And dessert?", "conversation": first["conversation"], "max_new_tokens": 4})
    assert status == 200 and second["cache"]["history_messages"] == 2
    assert second["cache"]["tier"] == "l1"
    assert second["cache"]["segment_hash"] == cache["segment_hash"]

    # passes the web's lower bound (no template markup counted), fails the worker's exact check
    from tenants.api.context_limits import model_limits

    tokenizer, max_pos = model_limits(str(demo_model_path))
    fixed = sum(len(tokenizer.encode(t, add_special_tokens=False).ids)
                for t in ("You are Acme's cooking assistant.", "I am vegetarian, no spicy food."))
    message = "vegetables"
    while fixed + 8 + len(tokenizer.encode(message + " vegetables").ids) <= max_pos:
        message += " vegetables"
    settings.MODEL_PATH = str(demo_model_path)
    settings.CHAT_MAX_MESSAGE_CHARS = 100_000
    status, body = post_chat(live_server.url, key, {"message": message, "max_new_tokens": 8,
                                                    "conversation": first["conversation"]})
    assert status == 400 and body["error"]["code"] == "context_length_exceeded", body
    assert "needed_tokens" not in body["error"]  # the worker's exact check answered, not the web's
    assert Message.objects.filter(conversation_id=first["conversation"]).count() == 4
