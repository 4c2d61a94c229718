"""Exactly-once chats in Postgres: claim, store under the claim, abandon, replay (no mocks)."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction

from tenants import actions
from tenants.errors import ChatAbandoned, ChatInProgress, IdempotencyKeyReused
from tenants.models import AuditEvent, AuditLog, ChatExchange, Message

pytestmark = pytest.mark.django_db
PARAMS = {"max_new_tokens": 4}


def claim(member, key="k-1", message="What should I cook?", timeout=60.0, request_id=None):
    import uuid

    asked = actions.request_hash(message, None, PARAMS)
    return actions.do_claim_chat(member, key, request_id or uuid.uuid4().hex, asked, timeout)


def store(member, request_id, reply="Soup."):
    return actions.do_record_chat(
        member, None, message="What should I cook?", reply=reply,
        usage={"prompt_tokens": 5, "completion_tokens": 2, "message_tokens": 4},
        cache={"tier": "compute", "preference_version": 1}, latency_ms=1.0,
        request_id=request_id,
    )


def stored_rows(member) -> tuple[int, int]:
    chats = AuditLog.objects.filter(tenant=member.tenant, event_type=AuditEvent.CHAT_REQUEST,
                                    target=str(member)).count()
    return Message.objects.filter(conversation__member=member).count(), chats


def test_a_retry_replays_the_stored_answer_instead_of_generating_again(acme):
    first = claim(acme.user)
    conv = store(acme.user, first.request_id)
    again = claim(acme.user)
    assert again.request_id == first.request_id
    assert again.replay == {"reply": "Soup.", "conversation": conv.pk,
                            "usage": {"prompt_tokens": 5, "completion_tokens": 2},
                            "cache": {"tier": "compute", "preference_version": 1},
                            "request_id": first.request_id}
    with pytest.raises(ChatAbandoned):  # a second store of the same attempt is refused
        store(acme.user, first.request_id)
    assert stored_rows(acme.user) == (2 + 2, 1)  # the fixture's 2 messages + this exchange


def test_a_key_reused_for_another_request_or_still_running_is_refused(acme):
    claim(acme.user)
    with pytest.raises(ChatInProgress) as running:
        claim(acme.user)
    assert running.value.status == 409 and running.value.details["retry_after"] > 0
    with pytest.raises(IdempotencyKeyReused):
        claim(acme.user, message="Something else")


def test_an_abandoned_attempt_is_never_stored_and_the_key_can_be_retried(acme):
    before = stored_rows(acme.user)
    first = claim(acme.user)
    assert actions.do_abandon_chat(acme.user, first.request_id, reason="timeout") is None
    assert not actions.claim_is_live(acme.user.pk, first.request_id)
    with pytest.raises(ChatAbandoned):
        store(acme.user, first.request_id)  # the late worker: refused, nothing written
    assert stored_rows(acme.user) == before
    assert AuditLog.objects.filter(event_type=AuditEvent.CHAT_ABANDONED,
                                   data__request_id=first.request_id).count() == 1

    retry = claim(acme.user)
    assert retry.replay is None and retry.request_id != first.request_id
    store(acme.user, retry.request_id)
    assert stored_rows(acme.user) == (before[0] + 2, before[1] + 1)


def test_abandoning_after_the_worker_stored_returns_the_stored_answer(acme):
    first = claim(acme.user)
    store(acme.user, first.request_id, reply="Stew.")
    stored = actions.do_abandon_chat(acme.user, first.request_id, reason="backend_down")
    assert stored["reply"] == "Stew." and stored["request_id"] == first.request_id
    assert not AuditLog.objects.filter(event_type=AuditEvent.CHAT_ABANDONED).exists()


def test_past_its_deadline_an_attempt_is_neither_started_nor_stored(acme):
    late = claim(acme.user, timeout=0.0)
    assert not actions.claim_is_live(acme.user.pk, late.request_id)
    with pytest.raises(ChatAbandoned):
        store(acme.user, late.request_id)
    # its web process is gone (nobody abandoned it): a retry takes the key over
    assert claim(acme.user).request_id != late.request_id


def test_keys_are_scoped_to_tenant_and_member_and_unique_in_postgres(acme, globex):
    mine = claim(acme.user, key="shared")
    store(acme.user, mine.request_id)
    for other in (acme.other, globex.user):  # same key elsewhere: independent, no replay
        assert claim(other, key="shared").replay is None
    row = ChatExchange.objects.get(member=acme.user, key="shared")
    with pytest.raises(IntegrityError), transaction.atomic():
        ChatExchange.objects.create(tenant=row.tenant, member=row.member, key="shared",
                                    request_id="another", request_hash=row.request_hash,
                                    deadline=row.deadline)


# --- through the API (no worker needed: these answers never reach one) ----------------


def api_chat(member_key: str, key: str | None, message: str = "What should I cook?"):
    from tests.tenants.conftest import token_client

    headers = {} if key is None else {"HTTP_IDEMPOTENCY_KEY": key}
    return token_client(member_key).post("/api/chat", data={"message": message},
                                         content_type="application/json", **headers)


def view_claim(member, key: str, message: str = "What should I cook?"):
    """Claim ``key`` with exactly what the view asks for ``{"message": message}``."""
    import uuid

    from django.conf import settings

    params = {"max_new_tokens": settings.CHAT_DEFAULT_MAX_NEW_TOKENS, "temperature": 0.0,
              "top_p": 1.0, "alpha": None}
    asked = actions.request_hash(message, None, params)
    return actions.do_claim_chat(member, key, uuid.uuid4().hex, asked, 60.0)


def test_api_replays_a_stored_answer_with_the_replayed_header(acme):
    first = view_claim(acme.user, "order-42")
    conv = store(acme.user, first.request_id, reply="Lentil soup.")
    before = stored_rows(acme.user)
    response = api_chat(acme.user_key, "order-42")
    assert response.status_code == 200 and response["Idempotent-Replayed"] == "true"
    assert response.json()["reply"] == "Lentil soup." and response.json()["conversation"] == conv.pk
    assert stored_rows(acme.user) == before  # nothing generated, stored or counted again


def test_api_answers_409_while_running_and_422_for_a_reused_key(acme):
    view_claim(acme.user, "order-43")
    response = api_chat(acme.user_key, "order-43")
    assert response.status_code == 409 and response.json()["error"]["code"] == "chat_in_progress"
    assert int(response["Retry-After"]) > 0
    response = api_chat(acme.user_key, "order-43", "Something else entirely")
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "idempotency_key_reused"


@pytest.mark.parametrize("key", ["", "has space", "ü-not-ascii", "k" * 129])
def test_api_refuses_malformed_idempotency_keys(acme, key):
    response = api_chat(acme.user_key, key)
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_input"
    assert not ChatExchange.objects.filter(member=acme.user).exists()
