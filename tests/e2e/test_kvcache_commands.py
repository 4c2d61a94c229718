"""``manage.py kvcache`` against real Redis, Postgres and two real worker processes."""

from __future__ import annotations

import json
import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from gpu_worker.channels import kvstore
from gpu_worker.routing import registry
from tenants import actions
from tenants.models import AuditEvent, AuditLog
from tests.e2e.conftest import chat_now, l2_entries, only_these_consume, wait_for
from tests.workers import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def pair(worker_pair):
    with only_these_consume(worker_pair):
        yield worker_pair


@pytest.fixture
def shop():
    """Tenant with two warmable members, one disabled and one empty preference."""
    tenant = actions.do_create_tenant("shop")
    alice = actions.do_add_member(tenant, "shop-alice", preference="Vegetarian, no spice.")
    bob = actions.do_add_member(tenant, "shop-bob", preference="Loves long walks.")
    off = actions.do_add_member(tenant, "shop-off", preference="Not used.")
    actions.do_set_preference(off, enabled=False)
    actions.do_add_member(tenant, "shop-empty", preference="")
    return tenant, alice, bob


def kvcache(*args: str) -> dict:
    out = StringIO()
    call_command("kvcache", *args, "--json", stdout=out)
    return json.loads(out.getvalue())


def l1_of(report: dict, slug: str) -> dict:
    return report["tenants"][slug]["l1"]


def test_warm_precomputes_enabled_preferences_with_progress_and_summary(pair, shop):
    tenant, alice, bob = shop
    summary = kvcache("warm", "--tenant", "shop")
    assert summary["members"] == summary["warmed"] == 2 and summary["failed"] == []
    assert summary["tiers"] == {"compute": 2}
    assert set(summary["workers"]) <= {w.hostname for w in pair}
    wait_for(lambda: l2_entries(tenant.pk) == 2, 10, "L2 writes")
    assert AuditLog.objects.filter(tenant=tenant, event_type=AuditEvent.CACHE_WARMED).count() == 1

    out, err = StringIO(), StringIO()
    call_command("kvcache", "warm", "--tenant", "shop", stdout=out, stderr=err)
    assert "warming [" in err.getvalue() and "] 2/2" in err.getvalue()
    assert "warmed 2/2 members of shop (l1 2)" in out.getvalue()  # affinity: same workers

    reply = chat_now(alice)  # routed to the worker that warmed alice
    assert reply["cache"]["tier"] == "l1"
    assert reply["worker"] == registry.affinity(alice.pk)


def test_stats_reports_tiers_per_tenant_from_every_live_worker(pair, shop):
    tenant, alice, bob = shop
    kvcache("warm", "--tenant", "shop")
    wait_for(lambda: l2_entries(tenant.pk) == 2, 10, "L2 writes")
    chat_now(alice)

    report = kvcache("stats", "--tenant", "shop")
    l1, l2 = l1_of(report, "shop"), report["tenants"]["shop"]["l2"]
    # both preferences; alice's one-shot chat is not kept as a conversation (admission)
    assert l1["entries"] == 2 and l1["bytes"] > 0
    assert l1["hits"] >= 1 and 0 < l1["hit_rate"] <= 1
    assert l2["entries"] == 2 and l2["bytes"] > 0
    rows = {r["worker"]: r for r in report["workers"]}
    assert {w.hostname for w in pair} <= set(rows) <= set(report["live_workers"]) | set(rows)
    assert sum(rows[w.hostname]["l1"]["entries"] for w in pair) == 2
    # per kind (worker-wide): no instructions, so no tenant segment; the chat hit alice's
    kinds = report["kinds"]
    assert set(kinds) == {"tenant", "member", "lean", "conversation"}
    assert kinds["member"]["entries"] >= 2 and kinds["member"]["l1_hits"] >= 1
    assert kinds["conversation"]["entries"] == 0 and kinds["member"]["bytes"] > 0
    assert (kinds["tenant"]["l2_entries"], kinds["member"]["l2_entries"]) == (0, 2)
    assert kinds["member"]["pinned_bytes"] == 0  # CPU: nothing pinned, nothing rounded
    out = StringIO()
    call_command("kvcache", "stats", "--tenant", "shop", stdout=out)
    assert "conversation" in out.getvalue() and "member" in out.getvalue()
    assert all(rows[w.hostname]["pool"] == "solo" for w in pair)
    # the loaded model's profile (the demo model has none: guidance off)
    assert all(rows[w.hostname]["profile"]["name"] == "none" for w in pair)
    assert "model profile: none (model key " in out.getvalue()
    assert ("not calibrated), guidance default 0.0, reminder on, constraints on"
            in out.getvalue())  # no profile: guidance off, the platform's switches

    everyone = kvcache("stats")
    pools = [r["host_pool"] for r in everyone["workers"] if r["worker"] in rows]
    assert pools and all(p["overflow"] == 0 and p["pinned"] == 0 for p in pools)  # CPU
    assert "shop" in everyone["tenants"] and everyone["totals"]["l2"]["entries"] >= 2
    with pytest.raises(CommandError, match="Unknown tenant 'nope'"):
        kvcache("stats", "--tenant", "nope")


def test_clear_user_then_tenant_then_everything_drops_l1_and_l2(pair, shop):
    tenant, alice, bob = shop
    kvcache("warm", "--tenant", "shop")
    wait_for(lambda: l2_entries(tenant.pk) == 2, 10, "L2 writes")

    out = kvcache("clear", "--tenant", "shop", "--user", "shop-alice")
    assert out["l1_deleted"] == 1 and out["l2_deleted"] == 1
    assert len(out["workers"]) >= 2
    assert l1_of(kvcache("stats", "--tenant", "shop"), "shop")["entries"] == 1
    assert l2_entries(tenant.pk) == 1  # bob's entry stays
    assert chat_now(alice)["cache"]["tier"] == "compute"
    audit = AuditLog.objects.get(tenant=tenant, event_type=AuditEvent.CACHE_CLEARED)
    assert audit.target == "shop/shop-alice" and audit.data["l2_deleted"] == 1

    kvcache("clear", "--tenant", "shop")
    wait_for(lambda: l2_entries(tenant.pk) == 0, 10, "tenant L2 cleared")
    assert l1_of(kvcache("stats", "--tenant", "shop"), "shop")["entries"] == 0

    kvcache("warm", "--tenant", "shop")
    everything = kvcache("clear")
    assert everything["l1_deleted"] >= 2 and everything["scope"] == "*"  # earlier tests' too
    totals = kvcache("stats")["totals"]
    assert totals["l1"]["entries"] == 0 and totals["l2"]["entries"] == 0
    assert AuditLog.objects.filter(tenant=None, event_type=AuditEvent.CACHE_CLEARED).count() == 1

    with pytest.raises(CommandError, match="Unknown user 'ghost' in tenant 'shop'"):
        kvcache("clear", "--tenant", "shop", "--user", "ghost")
    with pytest.raises(CommandError, match="--user needs --tenant"):
        kvcache("clear", "--user", "shop-bob")


def test_verify_deletes_tampered_and_forged_entries_and_keeps_good_ones(pair, shop):
    tenant, alice, bob = shop
    kvcache("warm", "--tenant", "shop")
    wait_for(lambda: l2_entries(tenant.pk) == 2, 10, "L2 writes")
    client = kvstore.cache_client()  # the L2 entries' Redis
    signer = kvstore.signer()
    names = sorted(client.scan_iter(match=signer.entry_match(str(tenant.pk))))
    client.setrange(names[0], 100, b"\xff\x00\xff")  # flip payload bytes
    forged = f"{signer.tenant_prefix(str(tenant.pk))}e:{'ab' * 32}"
    client.set(forged, b"KVI\x00" + b"\x00" * 200)

    report = kvcache("verify", "--tenant", "shop")
    assert (report["scanned"], report["ok"], report["bad"], report["deleted"]) == (3, 1, 2, 2)
    assert set(report["bad_keys"]) == {names[0].decode(), forged}
    assert l2_entries(tenant.pk) == 1
    assert kvcache("verify", "--tenant", "shop")["bad"] == 0

    client.set(forged, b"junk")
    with pytest.raises(SystemExit) as exit_:
        call_command("kvcache", "verify", "--strict", stdout=StringIO())
    assert exit_.value.code == 3


def test_rotate_key_stops_serving_entries_signed_with_the_old_key(pair, shop):
    tenant, alice, bob = shop
    kvcache("warm", "--tenant", "shop")
    wait_for(lambda: l2_entries(tenant.pk) == 2, 10, "L2 writes")
    client = kvstore.cache_client()
    old = kvstore.signer()
    saved = {n: client.get(n) for n in client.scan_iter(match=old.entry_match(str(tenant.pk)))}

    out = kvcache("rotate-key")
    assert int(out["new_generation"]) == int(out["old_generation"]) + 1
    assert out["workers_switched"] == len(out["workers"]) >= 2
    assert out["l2_purged"] >= 2 and l2_entries(tenant.pk) == 0
    assert kvstore.key_generation() == out["new_generation"]
    assert AuditLog.objects.filter(tenant=None, event_type=AuditEvent.CACHE_KEY_ROTATED,
                                   data__new_generation=out["new_generation"]).exists()

    for name, blob in saved.items():  # an old-key entry put back is never served
        client.set(name, blob)
    reply = chat_now(alice)
    assert reply["cache"]["tier"] == "compute"  # not l1 (dropped), not l2 (old key)
    bad = kvcache("verify")
    assert {n.decode() for n in saved} <= set(bad["bad_keys"])


def test_commands_exit_non_zero_with_a_clear_message(scaleout_env):
    def run(*args):
        return subprocess.run([sys.executable, "manage.py", "kvcache", *args], cwd=ROOT,
                              env=scaleout_env, capture_output=True, text=True, timeout=120)

    bad_tenant = run("stats", "--tenant", "nope", "--json")
    assert bad_tenant.returncode == 1 and "Unknown tenant 'nope'" in bad_tenant.stderr
    no_tenant = run("clear", "--user", "someone")
    assert no_tenant.returncode == 1 and "--user needs --tenant" in no_tenant.stderr

