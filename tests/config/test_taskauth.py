"""Task-message signatures (config.taskauth): what is signed, and what breaks them."""

from __future__ import annotations

import time

from config import taskauth
from config.celery import app

NAME = "gpu_worker.tasks.chat"
ARGS = (7, None, "What should I cook?", {"max_new_tokens": 4}, "req-1", time.time())


def test_a_signature_covers_name_id_and_every_argument(settings):
    sig = taskauth.signature(NAME, "req-1", ARGS, {})
    assert taskauth.is_authentic(NAME, "req-1", list(ARGS), {}, sig)  # as JSON delivers
    assert not taskauth.is_authentic(NAME, "req-1", (8, *ARGS[1:]), {}, sig)
    assert not taskauth.is_authentic(NAME, "req-2", ARGS, {}, sig)
    assert not taskauth.is_authentic("gpu_worker.tasks.playground", "req-1", ARGS, {}, sig)
    assert not taskauth.is_authentic(NAME, "req-1", ARGS, {"stream": True}, sig)
    assert not taskauth.is_authentic(NAME, "req-1", ARGS, {}, None)
    settings.KV_SIGNING_SECRET = "another deployment"
    assert not taskauth.is_authentic(NAME, "req-1", ARGS, {}, sig)


def test_the_key_is_derived_not_the_kv_secret_itself(settings):
    import hashlib
    import hmac

    plain = hmac.new(settings.KV_SIGNING_SECRET.encode(),
                     taskauth.canonical(NAME, "req-1", ARGS, {}), hashlib.sha256).hexdigest()
    assert taskauth.signature(NAME, "req-1", ARGS, {}) != plain


def test_every_publish_is_signed_by_the_celery_signal():
    """send_task by name (tenants.ports, tenants.playground) signs like apply_async."""
    from celery.signals import before_task_publish

    seen = []

    def capture(sender=None, headers=None, body=None, **_):
        seen.append((sender, dict(headers), body))

    before_task_publish.connect(capture, weak=False)
    try:
        with app.producer_or_acquire() as producer:
            app.send_task("gpu_worker.tasks.warm_member", args=(42,), producer=producer,
                          queue="kvi-test-taskauth-nobody")
    finally:
        before_task_publish.disconnect(capture)
        app.connection_for_write().default_channel.client.delete("kvi-test-taskauth-nobody")
    (name, headers, body), = seen
    assert name == "gpu_worker.tasks.warm_member"
    assert taskauth.is_authentic(name, headers["id"], body[0], body[1],
                                 headers[taskauth.HEADER])
