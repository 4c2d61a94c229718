"""Member text sealed for Redis (tenants.sealing): what a box hides, what it is bound to,
and a key rotation failing closed: a chat task sealed under the old KV_SIGNING_SECRET is
refused by the worker before anything runs and answered once, with a clear 503."""

from __future__ import annotations

import uuid

import pytest
from celery.exceptions import Reject

from gpu_worker import tasks
from gpu_worker.client import dispatch
from tenants import actions, sealing
from tenants.errors import SealedPayloadRejected
from tenants.models import ChatExchange, Message

TEXT = "my secret is pistachio-" + uuid.uuid4().hex


def test_a_box_hides_its_text_and_opens_for_its_own_request_only():
    box = sealing.seal(sealing.CHAT_TURN, "req-1", {"message": TEXT})
    assert "pistachio" not in box and TEXT not in box
    assert box != sealing.seal(sealing.CHAT_TURN, "req-1", {"message": TEXT})  # fresh nonce
    assert sealing.open_sealed(sealing.CHAT_TURN, "req-1", box) == {"message": TEXT}
    for purpose, ident in ((sealing.CHAT_TURN, "req-2"), (sealing.CHAT_RESULT, "req-1")):
        with pytest.raises(SealedPayloadRejected, match="failed authentication"):
            sealing.open_sealed(purpose, ident, box)  # moved to another request or use


@pytest.mark.parametrize("box", [None, 7, "", "plain text", {"message": TEXT}])
def test_what_is_not_a_box_is_refused(box):
    with pytest.raises(SealedPayloadRejected, match="missing or malformed"):
        sealing.open_sealed(sealing.CHAT_TURN, "req-1", box)


def test_an_altered_box_is_refused():
    version, kid, body = sealing.seal(sealing.CHAT_TURN, "req-1", TEXT).split(".")
    flipped = body[:20] + ("A" if body[20] != "A" else "B") + body[21:]
    with pytest.raises(SealedPayloadRejected, match="failed authentication"):
        sealing.open_sealed(sealing.CHAT_TURN, "req-1", f"{version}.{kid}.{flipped}")


def test_after_a_rotation_an_old_box_fails_closed(settings):
    box = sealing.seal(sealing.CHAT_RESULT, "req-1", {"reply": TEXT})
    old = sealing.key_id()
    settings.KV_SIGNING_SECRET = "a rotated secret " + uuid.uuid4().hex
    assert sealing.key_id() != old
    with pytest.raises(SealedPayloadRejected, match="rotated") as err:
        sealing.open_sealed(sealing.CHAT_RESULT, "req-1", box)
    assert err.value.status == 503 and err.value.code == "sealed_payload_rejected"
    assert TEXT not in err.value.message


def test_while_a_rotation_rolls_out_the_old_secret_still_opens_as_a_fallback(settings):
    old = settings.KV_SIGNING_SECRET
    box = sealing.seal(sealing.CHAT_TURN, "req-1", {"message": TEXT})
    settings.KV_SIGNING_SECRET = "the new secret " + uuid.uuid4().hex
    settings.KV_SIGNING_SECRET_FALLBACKS = [old]
    assert sealing.open_sealed(sealing.CHAT_TURN, "req-1", box) == {"message": TEXT}
    new_box = sealing.seal(sealing.CHAT_TURN, "req-1", {"message": TEXT})
    assert new_box.split(".")[1] == sealing.key_id() != box.split(".")[1]  # sealed anew
    settings.KV_SIGNING_SECRET_FALLBACKS = []  # the rotation is over
    with pytest.raises(SealedPayloadRejected, match="rotated"):
        sealing.open_sealed(sealing.CHAT_TURN, "req-1", box)


def _run_chat(args: tuple):
    """The chat task's body in this process, as a worker runs it (its own task id)."""
    tasks.chat.push_request(id=args[3])
    try:
        return tasks.chat.run(*args)
    finally:
        tasks.chat.pop_request()


@pytest.mark.django_db
def test_a_chat_sealed_before_a_rotation_is_refused_unrun_and_answered_once(settings):
    tenant = actions.do_create_tenant("acme")
    member = actions.do_add_member(tenant, "alice", preference="I am vegetarian.")
    actions.do_set_budget(tenant, member=member, tokens=10_000, period="month")
    params = {"max_new_tokens": 4}
    claim = dispatch.claim_chat(member, None, TEXT, params)
    args = dispatch.chat_args(member.pk, None, TEXT, params, claim.request_id)
    assert ChatExchange.objects.get(request_id=claim.request_id).reserved_tokens > 0
    settings.KV_SIGNING_SECRET = "a rotated secret " + uuid.uuid4().hex  # web and workers

    # the worker: refused before any work (no model is loaded in this process), and its
    # reservation released; Celery stores the error as the task's failure (not retried)
    with pytest.raises(SealedPayloadRejected, match="rotated") as err:
        _run_chat(args)
    assert ChatExchange.objects.get(request_id=claim.request_id).reserved_tokens == 0
    assert not Message.objects.filter(tenant=tenant).exists()

    # the web: the failure, re-raised by class name, is the documented 503, once
    answered = dispatch._remote_error(err.value)
    assert isinstance(answered, SealedPayloadRejected) and answered.status == 503
    with pytest.raises(SealedPayloadRejected, match="rotated") as web:
        dispatch.stopped_waiting(member, claim.request_id, claim.request_id, answered,
                                 running=True)
    assert web.value.details["idempotency_key"] == claim.request_id
    assert ChatExchange.objects.get(request_id=claim.request_id).state == "abandoned"


def test_a_message_refused_for_its_signature_is_answered_as_the_same_clear_503():
    """After a rotation a message signed under the old secret is refused before its seal is
    even read (gpu_worker.ops.taskauth); Celery stores that refusal as the task's failure."""
    answered = dispatch._remote_error(Reject("unauthenticated task message", requeue=False))
    assert isinstance(answered, SealedPayloadRejected) and answered.status == 503
    assert "KV_SIGNING_SECRET" in answered.message and "nothing was run" in answered.message
