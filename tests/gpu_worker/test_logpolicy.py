"""What Celery logs of a task never carries its text: the enqueued message's argsrepr
(read back from the real Redis broker) and the consumer's discarded-message lines."""

from __future__ import annotations

import base64
import json
import logging
import uuid

import pytest
import redis
from django.conf import settings

from gpu_worker.client import dispatch
from gpu_worker.tasks import chat, warm_member
from tenants import sealing

SECRET = "kumquat-" + uuid.uuid4().hex


@pytest.fixture
def broker():
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    queue = f"kvi.test.nobody.{uuid.uuid4().hex[:8]}"  # no worker consumes it
    yield client, queue
    client.delete(queue)
    client.close()


def _enqueued(client, queue: str) -> list[dict]:
    return [json.loads(raw) for raw in client.lrange(queue, 0, -1)]


def test_enqueued_chat_carries_its_text_sealed_only(broker):
    client, queue = broker
    params = {"max_new_tokens": 4, "temperature": 0.0}
    args = dispatch.chat_args(7, None, SECRET, params, "t1")
    chat.apply_async(args=args, queue=queue, task_id="t1")
    [msg] = _enqueued(client, queue)
    headers = msg["headers"]
    assert SECRET not in json.dumps(headers) and "kumquat" not in json.dumps(headers)
    assert headers["argsrepr"] == repr([7, None, f"<str:{len(args[2])}>", "<str:2>", args[4]])
    body = base64.b64decode(msg["body"])
    assert b"kumquat" not in body  # sealed in the message body too (tenants.sealing)
    sent, _, _ = json.loads(body)
    # the worker still gets the message itself
    assert sealing.open_sealed(sealing.CHAT_TURN, "t1", sent[2]) == {"message": SECRET,
                                                                       "params": params}


def test_explicit_argsrepr_is_kept(broker):
    client, queue = broker
    warm_member.apply_async(args=(3,), queue=queue, argsrepr="(member 3)")
    [msg] = _enqueued(client, queue)
    assert msg["headers"]["argsrepr"] == "(member 3)"


def test_task_result_line_is_redacted(caplog):
    from celery.app import trace

    with caplog.at_level(logging.INFO, logger="celery.app.trace"):
        trace.logger.info(trace.LOG_SUCCESS, {
            "id": "t1", "name": "gpu_worker.tasks.chat", "runtime": 0.1,
            "return_value": repr({"reply": SECRET}), "args": SECRET, "kwargs": SECRET,
        })
    assert "succeeded in 0.1s" in caplog.text and SECRET not in caplog.text


def test_discarded_message_body_is_not_logged(caplog):
    from celery.worker.consumer import consumer

    with caplog.at_level(logging.WARNING, logger=consumer.logger.name):
        consumer.logger.error(consumer.UNKNOWN_TASK_ERROR, KeyError("x.y"),
                              repr({"args": [SECRET]}), {}, None)
    assert "discarded a task message (unknown task)" in caplog.text
    assert SECRET not in caplog.text
