"""Attention emphasis was removed (it never paid on the benchmarks: docs/BENCHMARKS.md,
docs/benchmarks/history.md). Old clients keep working through the real path (HTTP ->
Celery worker, demo model): /api/chat ``emphasis`` and /v1 ``kvinject.emphasis`` absent,
null or 0 are accepted and change nothing (the same greedy reply, token for token); any
other value is a 400 naming the field and saying it was removed, before any worker is
asked. Responses carry no ``emphasis_effective``."""

from __future__ import annotations

import pytest

from tenants.models import ChatExchange
from tests.e2e.chat_http import post

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def v1_body(extension: dict, **extra) -> dict:
    return {"model": "kvinject", "messages": [{"role": "user", "content": "What should I cook?"}],
            "kvinject": extension, **extra}


def test_any_other_value_is_a_400_naming_the_field(live_server, alice):
    _, key = alice
    for value in (2.5, 0.001, -0.5, 8, "0", "x", True, [0], {"e": 0}):
        status, body = post(live_server.url, "/api/chat", key,
                            {"message": "hi", "emphasis": value})
        assert status == 400 and "emphasis" in body["error"]["fields"], (value, body)
        assert "removed" in " ".join(body["error"]["fields"]["emphasis"]), body
    for value in (2.5, -0.5, "3", "x", "nan", True, [0]):
        status, body = post(live_server.url, "/v1/chat/completions", key,
                            v1_body({"emphasis": value}))
        assert status == 400 and body["error"]["param"] == "kvinject.emphasis", (value, body)
        assert "removed" in body["error"]["message"], body
    assert not ChatExchange.objects.exists()


def test_absent_null_or_zero_is_accepted_and_changes_nothing(
        live_server, gpu_worker, alice, settings, demo_model_path):
    settings.MODEL_PATH = str(demo_model_path)
    _, key = alice
    ask = {"message": "What should I cook?", "max_new_tokens": 6}
    replies = []
    for sent in ({}, {"emphasis": None}, {"emphasis": 0}, {"emphasis": 0.0}):
        status, body = post(live_server.url, "/api/chat", key, {**ask, **sent})
        assert status == 200, (sent, body, gpu_worker.log_tail())
        assert "emphasis_effective" not in body["cache"]
        replies.append(body["reply"])
    assert len(set(replies)) == 1 and replies[0], replies
    contents = []
    for sent in ({}, {"emphasis": None}, {"emphasis": 0}, {"emphasis": "0"}):
        status, body = post(live_server.url, "/v1/chat/completions", key,
                            v1_body(sent, max_tokens=6, temperature=0))
        assert status == 200, (sent, body)
        assert "emphasis_effective" not in body["kvinject"]["cache"]
        contents.append(body["choices"][0]["message"]["content"])
    assert len(set(contents)) == 1 and contents[0], contents
    assert ChatExchange.objects.count() == 8
