"""Worker shutdown closes the executor so queued L2 writes land (issue 9, finding 9).

In process: the real executor (demo model, real Redis) queues an L2 write while Redis
refuses writes (CLIENT PAUSE WRITE); Celery's real ``worker_shutdown`` signal must not
return before that write has landed. Then a real worker process, stopped with SIGTERM,
reports its queued writes flushed on the way out."""

from __future__ import annotations

import pytest
import redis
from celery.signals import worker_shutdown

from gpu_worker.channels import kvstore
from gpu_worker.serving import host

PAUSE_MS = 1500


def l2_entries(tenant: str) -> int:
    return kvstore.l2_tier().stats(scan=True, tenants=[tenant])["per_tenant"][tenant]["entries"]


def test_worker_shutdown_signal_waits_for_queued_l2_writes(settings, demo_model_path,
                                                           redis_url):
    settings.MODEL_PATH, settings.MODEL_DEVICE, settings.MODEL_DTYPE = str(demo_model_path), "", ""
    settings.KV_L2_ENABLED = True
    executor = host.get_executor()  # loads the model; signer and key generation set up
    tenant = "shutdown-flush"
    assert l2_entries(tenant) == 0
    client = redis.Redis.from_url(settings.KV_CACHE_REDIS_URL)  # the L2 entries' Redis
    client.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")  # the L2 writer blocks
    try:
        executor.warm(tenant, "u1", "I like long walks on quiet beaches.")
        assert executor.l2.stats()["inflight"] == 1  # queued, not written
        worker_shutdown.send(sender=None)  # what Celery sends as the worker exits
        assert l2_entries(tenant) == 1  # the write landed before the signal returned
        assert host.current_executor() is None
    finally:
        client.execute_command("CLIENT", "UNPAUSE")
        kvstore.l2_tier().evict(tenant)
        client.close()


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_real_worker_flushes_l2_writes_on_sigterm(worker_factory):
    from gpu_worker.routing import registry
    from tests.e2e.conftest import chat_now, member_with_preference

    # only its private queue (+ an idle one): a task another test left on the shared queue
    # must not be what this worker is finishing when SIGTERM arrives
    worker = worker_factory("wshut", queues="wshut-idle")
    member = member_with_preference("shutflush", "shut-user", "tea, not coffee")
    body = chat_now(member, queue=registry.worker_queue(worker.hostname))
    assert body["cache"]["tier"] == "compute"  # its K/V was computed and queued for L2
    worker.stop(timeout=90.0)
    assert worker.proc.returncode == 0, (worker.proc.returncode, worker.log_tail())
    assert "executor closed at shutdown: L2 writes flushed" in worker.log_path.read_text()
