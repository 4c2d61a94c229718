"""Signed control channel on real Redis pub/sub: request/reply, forged messages ignored."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from gpu_worker.channels import control


@pytest.fixture
def listener():
    calls = []

    def echo(message):
        calls.append(message)
        return {"worker": "unit", "echo": message["x"]}

    lis = control.ControlListener({"unit_echo": echo})
    lis.start()
    assert lis.ready.wait(5)
    yield lis, calls
    lis.stop()
    lis.join(5)


def test_request_collects_signed_replies(listener):
    lis, calls = listener
    replies = control.request("unit_echo", timeout=2, x=41)
    assert {"worker": "unit", "echo": 41} in replies
    assert calls[-1]["x"] == 41 and calls[-1]["reply_to"].startswith("kviw:reply:")


def test_unsigned_or_wrongly_signed_messages_are_never_dispatched(listener):
    lis, calls = listener
    client = control.redis_client()
    body = json.dumps({"op": "unit_echo", "x": 1})
    client.publish(control.channel(), json.dumps({"mac": "0" * 64, "body": body}))
    forged = hmac.new(b"not-the-secret", body.encode(), hashlib.sha256).hexdigest()
    client.publish(control.channel(), json.dumps({"mac": forged, "body": body}))
    client.publish(control.channel(), b"not json")
    control.request("unit_echo", timeout=2, x=2)  # a valid one, to know the others arrived
    assert [c["x"] for c in calls] == [2]
