"""Deleting a conversation drops its cached links only, through a real worker: the
worker applies the outbox row of kind "links" (issue 60, bounded work), so the member's
segment and lean stay in its L1 and the member's other conversation is still continued."""

from __future__ import annotations

import json
import time

import pytest
from django.test import Client

from tenants import actions
from tests.e2e.conftest import only_these_consume
from tests.tenants.conftest import clear_rate_limits

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
QUESTIONS = ["What should I cook?", "And for dessert?", "Which drink goes with it?"]


def converse(key: str, message: str, conversation: int | None = None) -> dict:
    body = {"message": message, "max_new_tokens": 3}
    if conversation is not None:
        body["conversation"] = conversation
    response = Client(HTTP_AUTHORIZATION=f"Token {key}").post(
        "/api/chat", json.dumps(body), content_type="application/json")
    assert response.status_code == 200, response.content
    return response.json()


def wait_log(worker, needle: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while needle not in worker.log_tail(100_000):
        assert time.monotonic() < deadline, f"{worker.name} never logged {needle!r}"
        time.sleep(0.05)


def test_a_deleted_conversation_drops_its_links_and_keeps_segment_and_lean(gpu_worker):
    clear_rate_limits()
    tenant = actions.do_create_tenant("acme")
    actions.do_update_tenant(tenant, memory_contrast=1.5)  # first turns lean (a lean to keep)
    member = actions.do_add_member(tenant, "alice", preference="I am vegetarian.")
    key = actions.do_create_api_token(member)
    with only_these_consume([gpu_worker]):
        convs = []
        for _ in range(2):  # two conversations of two turns: the second turn keeps a link
            conv = converse(key, QUESTIONS[0])["conversation"]
            converse(key, QUESTIONS[1], conv)
            convs.append(conv)
        deleted, kept = convs
        response = Client(HTTP_AUTHORIZATION=f"Token {key}").delete(
            f"/api/conversations/{deleted}")
        assert response.status_code == 204
        wait_log(gpu_worker, f"invalidated tenant={tenant.pk} user={member.pk} "
                             f"conversation=api:{deleted}:")
        going_on = converse(key, QUESTIONS[2], kept)["cache"]
        fresh = converse(key, QUESTIONS[0])["cache"]  # a new conversation's first turn
    assert going_on["reused_tokens"] > 0, going_on  # the other conversation's link stayed
    assert fresh["tier"] == "l1", fresh  # the member's segment was not dropped
    assert fresh["extra"]["lean"] == "l1", fresh  # nor its lean: not measured again
