"""A changed preference is used by the very next chat, whatever the write path, with two
real worker processes; an admin "clear K/V cache" empties the L1 of both.

The worker reports the SHA-256 of the preference text it injected and the row version it
read; both must be the new ones right after the change.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import subprocess
import sys
import time

import pytest
from django.db import connection
from django.test import Client

from tenants import actions
from tenants.models import Preference
from tests.tenants.conftest import clear_rate_limits
from tests.workers import ROOT, database_url_from_settings, worker_env

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def w2(worker_factory):
    return worker_factory("w2")


@pytest.fixture
def workers(gpu_worker, w2):
    return [gpu_worker, w2]


@pytest.fixture
def acme():
    clear_rate_limits()
    tenant = actions.do_create_tenant("acme")
    actions.do_add_member(tenant, "acme-admin", admin=True, password="pw-admin-123")
    member = actions.do_add_member(tenant, "alice", preference="I am vegetarian.")
    return member, actions.do_create_api_token(member)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def chat(key: str) -> dict:
    response = Client(HTTP_AUTHORIZATION=f"Token {key}").post(
        "/api/chat", json.dumps({"message": "What should I cook?", "max_new_tokens": 3}),
        content_type="application/json")
    assert response.status_code == 200, response.content
    return response.json()["cache"]


def admin() -> Client:
    client = Client()
    assert client.login(username="acme-admin", password="pw-admin-123")
    return client


def assert_next_chat_uses(key: str, member) -> dict:
    pref = Preference.objects.get(member=member)
    cache = chat(key)
    assert cache["preference_version"] == pref.version
    if pref.enabled and pref.text:
        assert cache["content_hash"] == sha(pref.text)
        assert cache["tier"] in ("compute", "l2", "l1")
    else:
        assert cache["tier"] == "none"
    return cache


@contextlib.contextmanager
def only(worker):
    """Every other live worker stops consuming the shared queue for the block."""
    from config.celery import app

    others = [host for reply in app.control.ping(timeout=1.0) for host in reply
              if host != worker.hostname]
    if others:
        app.control.cancel_consumer("gpu", destination=others, reply=True, timeout=10)
    try:
        yield
    finally:
        if others:
            app.control.add_consumer("gpu", destination=others, reply=True, timeout=10)


def log_count(worker, needle: str) -> int:
    return worker.log_tail(100_000).count(needle)


def wait_log(worker, needle: str, at_least: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while log_count(worker, needle) < at_least:
        assert time.monotonic() < deadline, f"{worker.name} never logged {needle!r}"
        time.sleep(0.05)


def test_every_write_path_is_seen_by_the_next_chat(acme, workers):
    member, key = acme
    first = assert_next_chat_uses(key, member)
    assert chat(key)["content_hash"] == first["content_hash"]  # now cached somewhere

    # 1. API (PUT /api/preference)
    Client(HTTP_AUTHORIZATION=f"Token {key}").put(
        "/api/preference", json.dumps({"text": "I eat fish now."}),
        content_type="application/json")
    assert assert_next_chat_uses(key, member)["content_hash"] == sha("I eat fish now.")

    # 2. Admin change form
    pref = Preference.objects.get(member=member)
    response = admin().post(f"/admin/tenants/preference/{pref.pk}/change/", {
        "text": "Vegan, please.", "enabled": "on", "alpha": "1.0",
        "seen_version": pref.version})
    assert response.status_code == 302
    assert assert_next_chat_uses(key, member)["content_hash"] == sha("Vegan, please.")

    # 3. Admin bulk actions (disable, then enable again)
    for action in ("disable_injection", "enable_injection"):
        admin().post("/admin/tenants/preference/", {"action": action,
                                                    "_selected_action": [pref.pk]})
        assert_next_chat_uses(key, member)

    # 4. QuerySet.update(): no signal at all; the content-hash key still cannot match.
    Preference.objects.filter(pk=pref.pk).update(text="Only durian.")
    cache = assert_next_chat_uses(key, member)
    assert cache["content_hash"] == sha("Only durian.") and cache["tier"] != "l1"

    # 5. A shell in another process (model save; its signal invalidates on commit).
    code = (f"from tenants.models import Preference; p = Preference.objects.get(pk={pref.pk}); "
            "p.text = 'Gluten free.'; p.save()")
    env = worker_env(database_url_from_settings(connection.settings_dict), "unused")
    subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=ROOT, env=env,
                   check=True, capture_output=True, timeout=120)
    assert assert_next_chat_uses(key, member)["content_hash"] == sha("Gluten free.")
    assert Preference.objects.get(pk=pref.pk).version == 7


def test_admin_clear_empties_l1_of_both_workers(acme, workers, settings):
    member, key = acme
    settings.WORKER_AFFINITY_ENABLED = False  # shared queue only: `only()` picks the worker
    expected = sha("I am vegetarian.")
    for worker in workers:  # each worker computes or loads from L2 into its L1
        with only(worker):
            assert chat(key)["content_hash"] == expected
    for worker in workers:
        with only(worker):
            assert chat(key)["tier"] == "l1", worker.name

    needle = f"invalidated tenant={member.tenant_id} user={member.pk}"
    before = {w.name: log_count(w, needle) for w in workers}
    response = admin().post("/admin/tenants/member/", {"action": "clear_kv_cache",
                                                       "_selected_action": [member.pk]})
    assert response.status_code == 302
    for worker in workers:  # each worker's listener applied it
        wait_log(worker, needle, before[worker.name] + 1)

    tiers = []
    for worker in workers:
        with only(worker):
            cache = chat(key)
        assert cache["content_hash"] == expected
        tiers.append(cache["tier"])
    # L2 was deleted too: the first worker recomputes; neither served from its old L1.
    assert tiers[0] == "compute" and tiers[1] in ("compute", "l2"), tiers


def test_admin_warm_precomputes_so_the_first_chat_does_not(acme, workers):
    member, key = acme
    done = re.compile(r"Task gpu_worker\.tasks\.warm_member\[[^\]]+\] succeeded")

    def warmed() -> int:
        return sum(len(done.findall(w.log_tail(100_000))) for w in workers)

    before = warmed()
    response = admin().post("/admin/tenants/member/", {"action": "warm_kv_cache",
                                                       "_selected_action": [member.pk]})
    assert response.status_code == 302
    deadline = time.monotonic() + 60
    while warmed() == before:
        assert time.monotonic() < deadline, "no worker ran warm_member"
        time.sleep(0.1)
    cache = chat(key)  # the member's very first chat: its K/V is already cached
    assert cache["tier"] in ("l1", "l2"), cache
    assert cache["content_hash"] == sha("I am vegetarian.")
