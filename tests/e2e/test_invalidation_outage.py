"""A preference edited while Redis is down still reaches every worker (durable outbox).

The session's real embedded Redis is stopped inside the test and started again on its
port (append-only file: queues and caches survive), then the test waits until it is
healthy. The worker's L1 is evicted during the outage from Postgres alone; L2 is
deleted once Redis is back; the next chat recomputes with the new text.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from urllib.parse import urlparse

import pytest
import redis

from gpu_worker.channels import control
from tenants import actions
from tenants.models import KVInvalidation
from tests.e2e.conftest import chat_now, l2_entries, member_with_preference, wait_for

# serial: it stops the embedded Redis that the other pytest process of `make test` uses too
pytestmark = [pytest.mark.e2e, pytest.mark.serial, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def redis_outage(redis_url):
    """Stop the session's embedded Redis for a block; restart it on its port after."""
    from config import embedded

    port = urlparse(redis_url).port
    if embedded.embedded_redis_port() != port:
        pytest.skip("REDIS_URL names an external Redis: this test stops the embedded one")

    @contextlib.contextmanager
    def outage():
        embedded.stop_embedded_redis()
        assert embedded.embedded_redis_port() is None
        try:
            yield
        finally:
            assert embedded.restart_embedded_redis() == port
            wait_for(lambda: embedded.embedded_redis_port() == port, 30, "Redis back")
            _drop_stale_connections()

    return outage


def _drop_stale_connections() -> None:
    """This process's pooled broker/backend connections died with the old server: later
    tests of the session must not pick one up (kombu does not retry a closed socket)."""
    from kombu import pools

    from config.celery import app

    pools.reset()  # closes every kombu pool and forgets them: the next use opens new ones
    app._pool = None
    app.amqp._producer_pool = None
    app.backend.client.connection_pool.disconnect()


def l1_by_worker(tenant_id) -> dict[str, int]:
    """Entries of the tenant in each live worker process's L1 (control-channel request)."""
    try:
        replies = control.request("stats", timeout=5)
    except redis.RedisError:
        return {}
    out = {}
    for r in replies:
        per = (((r.get("stats") or {}).get("l1") or {}).get("per_tenant")) or {}
        out[f"{r['worker']}/{r['pid']}"] = (per.get(str(tenant_id)) or {}).get("entries", 0)
    return out


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_edit_during_a_redis_outage_reaches_every_worker(gpu_worker, redis_outage, settings):
    settings.WORKER_AFFINITY_ENABLED = False  # shared queue: whichever worker is live
    member = member_with_preference("outage", "olga", "I am vegetarian.")
    tenant = member.tenant_id
    assert chat_now(member)["cache"]["tier"] == "compute"
    # the preference's K/V (a first turn's conversation is not kept: admission)
    wait_for(lambda: sum(l1_by_worker(tenant).values()) == 1, 20, "the entry in an L1")
    wait_for(lambda: l2_entries(tenant) == 1, 20, "the L2 write")
    needle = f"invalidated tenant={tenant} user={member.pk}"
    seen = gpu_worker.log_tail(100_000).count(needle)

    with redis_outage():
        actions.do_set_preference(member, text="I eat fish now.")  # stored and audited
        row = KVInvalidation.objects.filter(tenant_ref=tenant, member_ref=member.pk).latest("id")
        assert row.l2_done_at is None  # Redis is down: not acknowledged yet
        # The worker reads the outbox from Postgres: its L1 is evicted during the outage.
        deadline = time.monotonic() + 20
        while gpu_worker.log_tail(100_000).count(needle) <= seen:
            assert time.monotonic() < deadline, gpu_worker.log_tail()
            time.sleep(0.1)

    # Redis is back: an agent's sweep deletes L2 and acknowledges the row.
    wait_for(lambda: KVInvalidation.objects.get(pk=row.pk).l2_done_at is not None, 60,
             "the L2 deletion to be acknowledged")
    assert l2_entries(tenant) == 0
    counts = wait_for(lambda: l1_by_worker(tenant), 30, "stats from the reconnected workers")
    assert gpu_worker.hostname in {name.split("/")[0] for name in counts}
    assert set(counts.values()) == {0}, counts  # no worker holds an old entry

    cache = chat_now(member)["cache"]
    assert cache["tier"] == "compute" and cache["content_hash"] == sha("I eat fish now.")
