"""Worker shutdown closes the executor so queued L2 writes land (issue 9, finding 9).

In process: the real executor (demo model, real Redis) queues an L2 write while its writer
is held on an event; Celery's real ``worker_shutdown`` signal must not return before that
write has landed. Then a real worker process, stopped with SIGTERM,
reports its queued writes flushed on the way out."""

from __future__ import annotations

import threading
import time

import pytest
from celery.signals import worker_shutdown

from gpu_worker.channels import kvstore
from gpu_worker.serving import host


def l2_entries(tenant: str) -> int:
    return kvstore.l2_tier().stats(scan=True, tenants=[tenant])["per_tenant"][tenant]["entries"]


def test_worker_shutdown_signal_waits_for_queued_l2_writes(settings, demo_model_path,
                                                           redis_url):
    """The L2 writer is held on an event (no Redis pause racing the warm's compute): the
    shutdown signal, sent while the write is queued, returns only once it has landed."""
    settings.MODEL_PATH, settings.MODEL_DEVICE, settings.MODEL_DTYPE = str(demo_model_path), "", ""
    settings.KV_L2_ENABLED = True
    executor = host.get_executor()  # loads the model; signer and key generation set up
    tenant = "shutdown-flush"
    assert l2_entries(tenant) == 0
    writer, release = executor.l2._writer, threading.Event()
    write = writer._fn

    def held(key, value):
        release.wait(120)
        return write(key, value)

    writer._fn = held
    signal = threading.Thread(target=worker_shutdown.send, kwargs={"sender": None})
    try:
        executor.warm(tenant, "u1", "I like long walks on quiet beaches.")
        assert writer.inflight == 1  # queued, not written
        signal.start()  # what Celery sends as the worker exits
        while host.current_executor() is not None and signal.is_alive():
            time.sleep(0.01)  # until the signal has taken the executor to close it
        assert signal.is_alive() and l2_entries(tenant) == 0  # waiting for the write
        release.set()
        signal.join(60)
        assert not signal.is_alive()
        assert l2_entries(tenant) == 1  # the write landed before the signal returned
        assert host.current_executor() is None
    finally:
        release.set()
        writer._fn = write
        if signal.is_alive():
            signal.join(60)
        kvstore.l2_tier().evict(tenant)


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
