"""A guided reply's guide tokens through the real path: HTTP (/api/chat, /v1) -> Celery worker
(demo model, batch engine, contrast on) -> the usage's guide tokens, never inside
prompt_tokens or completion_tokens; the usage rollup holds them.

A member with one memory leans with the member's lean (``guidance/probe.py``): the reply that
measures it reports its probes' tokens, every later one none. A member with several memories
runs a guide row: its prefill, and one decoding step per reply token but the last until it
leaves (``lean.LEAN_AFTER``)."""

from __future__ import annotations

import pytest

from injection.engine.guidance import lean, probe
from tenants import actions
from tenants.models import UsageDay
from tests.e2e.chat_http import post

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

ASK = {"message": "What should I cook?", "max_new_tokens": 6}
V1 = {"model": "kvinject", "max_tokens": 6, "temperature": 0,
      "messages": [{"role": "user", "content": "What should I cook?"}],
      "kvinject": {"contrast": 1.5}}


def _guide(usage: dict) -> tuple[int, int]:
    return usage["guide_prefill_tokens"], usage["guide_decode_tokens"]


def test_a_leaning_members_probes_are_reported_once_then_no_guide_tokens(
        live_server, gpu_worker, alice, settings, demo_model_path):
    settings.MODEL_PATH = str(demo_model_path)
    member, key = alice
    status, plain = post(live_server.url, "/api/chat", key, {**ASK, "contrast": 0})
    assert status == 200, (plain, gpu_worker.log_tail())
    assert _guide(plain["usage"]) == (0, 0)
    status, measured = post(live_server.url, "/api/chat", key, {**ASK, "contrast": 1.5})
    assert status == 200 and measured["cache"]["contrast_effective"] == 1.5, measured
    assert measured["cache"]["extra"]["lean"] == "probe", measured["cache"]
    prefilled, decoded = _guide(measured["usage"])
    assert prefilled > 0 and 0 < decoded <= 2 * probe.PROBE_STEPS * len(probe.PROBES)
    assert measured["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"]
    status, v1 = post(live_server.url, "/v1/chat/completions", key, V1)
    assert status == 200, v1
    assert v1["usage"]["kvinject_guide_tokens_details"] == {"prefill_tokens": 0,
                                                            "decode_tokens": 0}
    assert v1["usage"]["kvinject_guide_tokens"] == 0
    assert v1["usage"]["total_tokens"] == (v1["usage"]["prompt_tokens"]
                                           + v1["usage"]["completion_tokens"])
    status, again = post(live_server.url, "/api/chat", key, {**ASK, "contrast": 1.5})
    assert status == 200 and again["cache"]["extra"]["lean"] == "l1", again["cache"]
    assert _guide(again["usage"]) == (0, 0) and again["reply"] == measured["reply"]
    row = UsageDay.objects.get(member_ref=member.pk)
    assert (row.guide_prefill_tokens, row.guide_decode_tokens) == (prefilled, decoded)


def test_a_guide_rows_tokens_are_reported_and_rolled_up(
        live_server, gpu_worker, alice, settings, demo_model_path):
    settings.MODEL_PATH = str(demo_model_path)
    member, key = alice
    actions.do_create_memory(member, text="Always answer in French.")
    status, guided = post(live_server.url, "/api/chat", key, {**ASK, "contrast": 1.5})
    assert status == 200 and guided["cache"]["contrast_effective"] == 1.5, (
        guided, gpu_worker.log_tail())
    assert "lean" not in guided["cache"]["extra"], guided["cache"]
    use = guided["usage"]
    assert use["guide_prefill_tokens"] > 0
    assert use["guide_decode_tokens"] == min(use["completion_tokens"] - 1, lean.LEAN_AFTER)
    status, v1 = post(live_server.url, "/v1/chat/completions", key, V1)
    assert status == 200, v1
    details = v1["usage"]["kvinject_guide_tokens_details"]
    assert details["prefill_tokens"] > 0
    assert details["decode_tokens"] == min(v1["usage"]["completion_tokens"] - 1, lean.LEAN_AFTER)
    assert v1["usage"]["kvinject_guide_tokens"] == sum(details.values())
    row = UsageDay.objects.get(member_ref=member.pk)
    assert (row.guide_prefill_tokens, row.guide_decode_tokens) == (
        use["guide_prefill_tokens"] + details["prefill_tokens"],
        use["guide_decode_tokens"] + details["decode_tokens"])
