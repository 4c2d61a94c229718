"""A changed preference is used by the very next chat, whatever the write path, with two
real worker processes; an admin "clear K/V cache" empties the L1 of both.

The worker reports the SHA-256 of the preference text it injected and the row version it
read; both must be the new ones right after the change.
"""

from __future__ import annotations

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
from tests.e2e.conftest import only_these_consume
from tests.tenants.conftest import clear_rate_limits
from tests.workers import ROOT, database_url_from_settings, worker_env

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def w2(worker_factory):
    return worker_factory("w2")


@pytest.fixture
def workers(gpu_worker, w2):
    """w1 and w2, the only workers consuming the shared queue (another file of this pytest
    process may have left workers running)."""
    with only_these_consume([gpu_worker, w2]):
        yield [gpu_worker, w2]


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
    settings.WORKER_AFFINITY_ENABLED = False  # shared queue only: `only_these_consume` picks the worker
    expected = sha("I am vegetarian.")
    for worker in workers:  # each worker computes or loads from L2 into its L1
        with only_these_consume([worker]):
            assert chat(key)["content_hash"] == expected
    for worker in workers:
        with only_these_consume([worker]):
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
        with only_these_consume([worker]):
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


def test_an_edit_warms_its_member_so_the_next_chat_finds_segment_and_lean_cached(
        gpu_worker, w2, settings):
    """``KV_WARM_ON_EDIT``: the edit's commit queues a background warm behind it; the warming
    worker applies the edit's invalidation first (its broadcast or the warm, whichever comes
    first), so the member's next chat computes neither the segment nor the lean."""
    settings.KV_WARM_ON_EDIT = True
    clear_rate_limits()
    tenant = actions.do_create_tenant("acme")
    # guidance at the tenant's strength, so first turns lean (the demo model has no default)
    actions.do_update_tenant(tenant, memory_contrast=1.5)
    member = actions.do_add_member(tenant, "alice")  # nothing to warm yet
    key = actions.do_create_api_token(member)
    done = re.compile(rf"background warm of member {member.pk} ran")
    with only_these_consume([gpu_worker]):
        before = len(done.findall(gpu_worker.log_tail(100_000)))
        actions.do_set_preference(member, text="Always answer in French.")
        deadline = time.monotonic() + 120  # (held until the worker is idle: idlewarms)
        while len(done.findall(gpu_worker.log_tail(100_000))) == before:
            assert time.monotonic() < deadline, gpu_worker.log_tail()
            time.sleep(0.1)
        cache = chat(key)  # the first chat after the edit
    assert cache["content_hash"] == sha("Always answer in French.")
    assert cache["tier"] == "l1", cache  # the warm's, on this worker: not evicted by the edit
    assert cache["extra"]["lean"] == "l1", cache  # measured by the warm, not by this chat


def test_a_warm_that_runs_before_its_edits_broadcast_is_not_evicted_by_it(gpu_worker, w2):
    """The race ``after_outbox`` closes: the warm reaches its worker before the edit's
    broadcast. The worker applies the edit's row once, first (``OutboxFollower.apply_once``),
    so the late broadcast evicts nothing there and the warmed K/V serves the next chat
    (from L1: the web's late L2 deletion took the L2 copy)."""
    from django.db.models.expressions import RawSQL

    from gpu_worker.channels import control, kvstore
    from gpu_worker.routing import registry
    from gpu_worker.tasks import warm_member
    from tenants.actions.cache import CURRENT_TXID
    from tenants.models import KVInvalidation

    clear_rate_limits()
    tenant = actions.do_create_tenant("acme")
    member = actions.do_add_member(tenant, "alice", preference="I am vegetarian.")
    key = actions.do_create_api_token(member)
    scope = {"tenant": str(tenant.pk), "user": str(member.pk)}
    row = KVInvalidation.objects.create(  # an edit's row, committed, its broadcast not sent
        tenant_ref=tenant.pk, member_ref=member.pk, txid=RawSQL(CURRENT_TXID, ()))
    with only_these_consume([gpu_worker]):
        warmed = warm_member.apply_async(args=(member.pk,), kwargs={"after_outbox": row.pk},
                                         queue=registry.worker_queue(gpu_worker.hostname))
        assert warmed.get(timeout=120)["tier"] == "compute"
        kvstore.l2_tier().evict(scope["tenant"], scope["user"])  # the web's part, late
        replies = control.request("invalidate", outbox=row.pk, **scope)
        mine = [r for r in replies if r.get("worker") == gpu_worker.hostname]
        assert mine and all(r["evicted"] == "applied before" for r in mine), list(replies)
        cache = chat(key)
    assert cache["tier"] == "l1", cache


# the busy worker's chat: long enough that the edit's warm (milliseconds after the chat is
# seen running) arrives while it runs
LONG_REPLY = 2000


@pytest.fixture(scope="module")
def threads_worker(start_workers):
    """A worker as deployed (threads pool: a task arrives while another runs)."""
    (w,) = start_workers("warm1", pool="threads", WORKER_BATCH_MAX=4,
                         CHAT_MAX_NEW_TOKENS=LONG_REPLY)
    yield w
    w.stop()  # later modules count on knowing which workers consume the shared queue


def test_a_warm_that_finds_its_worker_busy_is_held_then_runs(threads_worker, settings):
    """A chat runs on the worker when the edit's warm arrives: the warm is acknowledged and
    held in the worker (not run beside the chat, not put back on the broker) and runs once
    the worker is idle; the member's next chat finds it in L1."""
    import threading

    from tests.e2e.conftest import worker_stats

    settings.KV_WARM_ON_EDIT, settings.CHAT_MAX_NEW_TOKENS = True, LONG_REPLY
    clear_rate_limits()
    tenant = actions.do_create_tenant("acme")
    busy, member = (actions.do_add_member(tenant, n) for n in ("bo", "alice"))  # no memory yet
    busy_key, key = actions.do_create_api_token(busy), actions.do_create_api_token(member)
    done = re.compile(rf"background warm of member {member.pk} ran")
    held = f"background warm of member {member.pk} held until the worker is idle"

    answered = []

    def long_chat() -> None:  # the demo model writes every token of it (about 1 s per 500)
        answered.append(Client(HTTP_AUTHORIZATION=f"Token {busy_key}").post(
            "/api/chat", json.dumps({"message": "Tell me a long story.",
                                     "max_new_tokens": LONG_REPLY}),
            content_type="application/json"))

    with only_these_consume([threads_worker]):
        before = len(done.findall(threads_worker.log_tail(100_000)))
        talker = threading.Thread(target=long_chat)
        talker.start()
        deadline = time.monotonic() + 120
        while not ((worker_stats(threads_worker.hostname)["stats"] or {}).get("batch") or {}).get(
                "active"):
            assert time.monotonic() < deadline and talker.is_alive(), (
                [(r.status_code, r.json().get("cache")) for r in answered],
                threads_worker.log_tail())
            time.sleep(0.02)
        actions.do_set_preference(member, text="I am vegetarian.")  # its warm: now
        while held not in threads_worker.log_tail(100_000):
            assert time.monotonic() < deadline, threads_worker.log_tail()
            time.sleep(0.05)
        seen = threads_worker.log_tail(100_000)
        if talker.is_alive():  # the chat ran all along: the held warm has not run beside it
            assert len(done.findall(seen)) == before, seen[-2000:]
        talker.join(120)
        while len(done.findall(threads_worker.log_tail(100_000))) == before:
            assert time.monotonic() < deadline, threads_worker.log_tail()
            time.sleep(0.1)
        cache = chat(key)
    assert cache["tier"] == "l1" and cache["content_hash"] == sha("I am vegetarian."), cache
