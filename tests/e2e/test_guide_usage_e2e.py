"""A guided reply's guide row through the real path: HTTP (/api/chat, /v1) -> Celery worker
(demo model, batch engine, contrast on) -> the usage's guide tokens (the guide's prefill,
and one decoding step per reply token but the last, until it leaves: ``lean.LEAN_AFTER``),
never inside prompt_tokens or completion_tokens; the usage rollup holds them."""

from __future__ import annotations

import pytest

from injection.engine.guidance import lean
from tenants.models import UsageDay
from tests.e2e.chat_http import post

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_a_guided_reply_reports_its_guide_rows_tokens(
        live_server, gpu_worker, alice, settings, demo_model_path):
    settings.MODEL_PATH = str(demo_model_path)
    member, key = alice
    ask = {"message": "What should I cook?", "max_new_tokens": 6}
    status, plain = post(live_server.url, "/api/chat", key, {**ask, "contrast": 0})
    assert status == 200, (plain, gpu_worker.log_tail())
    assert (plain["usage"]["guide_prefill_tokens"], plain["usage"]["guide_decode_tokens"]) == (
        0, 0)
    status, guided = post(live_server.url, "/api/chat", key, {**ask, "contrast": 1.5})
    assert status == 200 and guided["cache"]["contrast_effective"] == 1.5, guided
    use = guided["usage"]
    assert use["guide_prefill_tokens"] > 0
    assert use["guide_decode_tokens"] == min(use["completion_tokens"] - 1, lean.LEAN_AFTER)
    assert use["prompt_tokens"] == plain["usage"]["prompt_tokens"]  # the reply's own prompt
    status, v1 = post(live_server.url, "/v1/chat/completions", key, {
        "model": "kvinject", "max_tokens": 6, "temperature": 0,
        "messages": [{"role": "user", "content": "What should I cook?"}],
        "kvinject": {"contrast": 2}})
    assert status == 200, v1
    details = v1["usage"]["kvinject_guide_tokens_details"]
    assert details["prefill_tokens"] > 0
    assert details["decode_tokens"] == min(v1["usage"]["completion_tokens"] - 1, lean.LEAN_AFTER)
    assert v1["usage"]["kvinject_guide_tokens"] == sum(details.values())
    assert v1["usage"]["total_tokens"] == (v1["usage"]["prompt_tokens"]
                                           + v1["usage"]["completion_tokens"])
    row = UsageDay.objects.get(member_ref=member.pk)
    assert (row.guide_prefill_tokens, row.guide_decode_tokens) == (
        use["guide_prefill_tokens"] + details["prefill_tokens"],
        use["guide_decode_tokens"] + details["decode_tokens"])
