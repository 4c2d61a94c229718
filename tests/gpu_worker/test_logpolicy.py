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

from gpu_worker.tasks import chat, warm_member

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


def test_enqueued_chat_carries_its_text_in_the_body_only(broker):
    client, queue = broker
    params = {"max_new_tokens": 4, "temperature": 0.0}
    chat.apply_async(args=(7, None, SECRET, params, "rid-1", 1.5), queue=queue, task_id="t1")
    [msg] = _enqueued(client, queue)
    headers = msg["headers"]
    assert SECRET not in json.dumps(headers) and "kumquat" not in json.dumps(headers)
    assert headers["argsrepr"] == repr([7, None, f"<str:{len(SECRET)}>",
                                        {"max_new_tokens": 4, "temperature": 0.0},
                                        "<str:5>", 1.5])
    args, kwargs, _ = json.loads(base64.b64decode(msg["body"]))
    assert args[2] == SECRET  # the worker still gets the message itself


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
