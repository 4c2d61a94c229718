"""Rotating secrets without dropping work (docs/OPERATIONS.md, "Rotating secrets"): a session
signed with the previous DJANGO_SECRET_KEY stays logged in while it is a fallback; a task
message or control request signed with the previous KV_SIGNING_SECRET is accepted while it
is a fallback, and one signed with a secret that is neither is refused."""

from __future__ import annotations

import json

import pytest

from config import taskauth
from gpu_worker.channels import control

OLD, NEW, FOREIGN = ("old secret of 48 characters or so " * 2, "new secret rotated in " * 3,
                     "some other deployment's secret " * 2)
TASK = ("gpu_worker.tasks.chat", "req-rot", (7, None, "hi", {}, "req-rot", 0.0), {})


@pytest.mark.django_db
def test_a_session_signed_with_the_previous_key_survives_while_it_is_a_fallback(settings):
    from django.test import Client

    from tenants import actions

    tenant = actions.do_create_tenant("acme")
    actions.do_add_member(tenant, "acme-admin", admin=True, password="pw-admin-123")
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = OLD, []
    during, after = Client(), Client()
    for client in (during, after):
        assert client.login(username="acme-admin", password="pw-admin-123")
        assert client.get("/admin/").status_code == 200

    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = NEW, [OLD]
    assert during.get("/admin/").status_code == 200  # still logged in, now under NEW
    settings.SECRET_KEY_FALLBACKS = []  # the rotation finished
    assert during.get("/admin/").status_code == 200
    # a session not seen during the overlap holds only OLD's signature: it ends
    response = after.get("/admin/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_a_task_message_of_the_previous_kv_secret_is_accepted_while_it_is_a_fallback(settings):
    settings.KV_SIGNING_SECRET, settings.KV_SIGNING_SECRET_FALLBACKS = OLD, []
    old_sig = taskauth.signature(*TASK)
    settings.KV_SIGNING_SECRET = NEW
    assert not taskauth.is_authentic(*TASK, old_sig)
    settings.KV_SIGNING_SECRET_FALLBACKS = [OLD]
    assert taskauth.is_authentic(*TASK, old_sig)
    new_sig = taskauth.signature(*TASK)
    assert new_sig != old_sig and taskauth.is_authentic(*TASK, new_sig)  # signs with NEW
    settings.KV_SIGNING_SECRET, settings.KV_SIGNING_SECRET_FALLBACKS = OLD, [NEW]
    assert taskauth.is_authentic(*TASK, new_sig)  # the first step: old signs, new accepted

    settings.KV_SIGNING_SECRET, settings.KV_SIGNING_SECRET_FALLBACKS = FOREIGN, []
    foreign_sig = taskauth.signature(*TASK)
    settings.KV_SIGNING_SECRET, settings.KV_SIGNING_SECRET_FALLBACKS = NEW, [OLD]
    assert not taskauth.is_authentic(*TASK, foreign_sig)
    altered = (*TASK[:2], (8, *TASK[2][1:]), {})
    assert not taskauth.is_authentic(*altered, old_sig)  # a fallback signs nothing new


def test_a_control_request_of_the_previous_kv_secret_is_accepted_while_it_is_a_fallback(
    settings
):
    message = {"op": "clear_all", "ts": 1.0}
    settings.KV_SIGNING_SECRET, settings.KV_SIGNING_SECRET_FALLBACKS = OLD, []
    old_raw = control.sign(message)
    settings.KV_SIGNING_SECRET = FOREIGN
    foreign_raw = control.sign(message)
    settings.KV_SIGNING_SECRET = NEW
    assert control.verify(old_raw) is None
    settings.KV_SIGNING_SECRET_FALLBACKS = [OLD]
    assert control.verify(old_raw) == message
    assert control.verify(foreign_raw) is None
    outer = json.loads(old_raw)
    outer["body"] = outer["body"].replace("clear_all", "stats")
    assert control.verify(json.dumps(outer).encode()) is None


def test_the_settings_read_rotation_and_proxy_variables_from_the_environment():
    import os
    import subprocess
    import sys

    from tests.workers import ROOT

    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings",
           "DJANGO_SECRET_KEY_FALLBACKS": f"{OLD}, {FOREIGN}",
           "KV_SIGNING_SECRET_FALLBACKS": OLD, "DJANGO_SECURE_PROXY_SSL_HEADER": "on",
           "DJANGO_CSRF_TRUSTED_ORIGINS": "https://chat.example.com,https://x.example:8443",
           "DJANGO_HSTS_SECONDS": "3600"}
    code = ("import json, django; django.setup(); from django.conf import settings as s; "
            "print(json.dumps([s.SECRET_KEY_FALLBACKS, s.KV_SIGNING_SECRET_FALLBACKS, "
            "s.SECURE_PROXY_SSL_HEADER, s.CSRF_TRUSTED_ORIGINS, s.SESSION_COOKIE_SECURE, "
            "s.CSRF_COOKIE_SECURE, s.SECURE_HSTS_SECONDS]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == [
        [OLD.strip(), FOREIGN.strip()], [OLD.strip()], ["HTTP_X_FORWARDED_PROTO", "https"],
        ["https://chat.example.com", "https://x.example:8443"], True, True, 3600]


def test_a_stream_entry_and_cancel_flag_of_the_previous_kv_secret_are_accepted_as_fallback(
    settings
):
    from gpu_worker.channels import streams

    def as_read(fields):  # what the web reads back from Redis
        return {k.encode(): v if isinstance(v, bytes) else str(v).encode()
                for k, v in fields.items()}

    settings.KV_SIGNING_SECRET, settings.KV_SIGNING_SECRET_FALLBACKS = OLD, []
    entry, flag = as_read(streams.sign("req-rot", {"o": 0, "t": "x"})), \
        streams.cancel_token("req-rot")
    settings.KV_SIGNING_SECRET = FOREIGN
    foreign = as_read(streams.sign("req-rot", {"o": 0, "t": "x"}))
    settings.KV_SIGNING_SECRET = NEW
    assert not streams.verify("req-rot", entry)
    settings.KV_SIGNING_SECRET_FALLBACKS = [OLD]
    assert streams.verify("req-rot", entry) and not streams.verify("req-rot", foreign)
    assert not streams.verify("req-other", entry)  # bound to its request
    assert streams._genuine(flag, "req-rot", b"cancel")
    assert not streams._genuine(flag, "req-other", b"cancel")
