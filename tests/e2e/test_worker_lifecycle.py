"""Worker faults with real processes: SIGKILL mid-generation, poison tasks, warm shutdown.

The workers run the GPU configuration: the threads pool feeding the batch engine.

Workers here allow 2 deliveries per task (WORKER_MAX_DELIVERIES=2). Tasks are sent to a
chosen worker's own queue, so the test knows which process runs them; other workers of
the session stop consuming the shared queue for the module.
"""

from __future__ import annotations

import signal

import pytest

from gpu_worker.client import dispatch as client
from gpu_worker.routing import registry
from tenants.errors import GenerationFailed
from tenants.models import AuditEvent, AuditLog, Message
from tests.e2e.conftest import (
    LONG_TOKENS,
    heartbeat,
    member_with_preference,
    only_these_consume,
    send_chat,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
MAX_DELIVERIES = 2


@pytest.fixture(scope="module")
def crew(start_workers):
    """Three workers; the tests kill or stop them, and start more, in order."""
    workers = start_workers("k1", "k2", "k3", pool="threads", WORKER_BATCH_MAX=4,
                            WORKER_MAX_DELIVERIES=MAX_DELIVERIES)
    crew = {w.name: w for w in workers}
    with only_these_consume(workers):
        yield crew
    for w in crew.values():  # k4 too: no worker of this module outlives it
        w.stop()


def _deliveries(task_id: str) -> int:
    return int(registry.redis_client().get(registry.deliveries_key(task_id)) or 0)


def _wait_running(worker, task_id: str, delivery: int) -> None:
    """Until ``worker`` holds the task and has started its ``delivery``-th run."""
    inflight = registry.redis_client().hexists
    wait_for(lambda: inflight(registry.inflight_key(worker.hostname), task_id)
             and _deliveries(task_id) >= delivery, 60, f"{task_id} running on {worker.name}")


def _long_chat(member, worker):
    return send_chat(member, "Tell me a long story.", queue=registry.worker_queue(worker.hostname),
                     max_new_tokens=LONG_TOKENS)


def test_killed_workers_request_is_redelivered_and_answered_by_another(crew):
    member = member_with_preference("faults", "gina", "I love soup.")
    victim = crew["k1"]
    sent = _long_chat(member, victim)
    _wait_running(victim, sent.result.id, 1)
    victim.kill()  # SIGKILL mid-generation: no ack, no cleanup

    reply = client.wait_chat(sent, timeout=120)
    assert reply["worker"] in (crew["k2"].hostname, crew["k3"].hostname)
    assert reply["usage"]["completion_tokens"] == LONG_TOKENS
    assert _deliveries(sent.result.id) == 2
    assert heartbeat(victim.hostname) is None
    # answered exactly once: one exchange stored, one audit row
    assert Message.objects.filter(conversation_id=reply["conversation"]).count() == 2
    assert AuditLog.objects.filter(event_type=AuditEvent.CHAT_REQUEST,
                                   data__request_id=sent.result.id).count() == 1


def test_poison_task_fails_with_a_clear_error_after_bounded_deliveries(crew, start_workers):
    member = member_with_preference("faults", "hank", "Spicy food.")
    first, second = crew["k2"], crew["k3"]
    sent = _long_chat(member, first)
    _wait_running(first, sent.result.id, 1)
    first.kill()
    _wait_running(second, sent.result.id, 2)  # redelivered to the only other consumer
    second.kill()

    # a fresh worker recovers the task and refuses its third delivery
    (fresh,) = start_workers("k4", pool="threads", WORKER_BATCH_MAX=4,
                             WORKER_MAX_DELIVERIES=MAX_DELIVERIES)
    crew["k4"] = fresh
    with pytest.raises(GenerationFailed, match="abandoned after 2 deliveries"):
        client.wait_chat(sent, timeout=120)
    assert _deliveries(sent.result.id) == MAX_DELIVERIES + 1
    assert not Message.objects.filter(tenant=member.tenant, conversation__member=member).exists()
    assert "failing it as poison" in fresh.log_tail(200)


def test_warm_shutdown_finishes_the_running_request(crew):
    member = member_with_preference("faults", "ivy", "Short answers.")
    worker = crew["k4"]
    sent = _long_chat(member, worker)
    _wait_running(worker, sent.result.id, 1)
    worker.proc.send_signal(signal.SIGTERM)

    reply = client.wait_chat(sent, timeout=120)
    assert reply["worker"] == worker.hostname
    assert reply["usage"]["completion_tokens"] == LONG_TOKENS
    assert worker.proc.wait(timeout=60) == 0
    assert _deliveries(sent.result.id) == 1  # finished, not redelivered
    assert heartbeat(worker.hostname) is None
    assert not registry.redis_client().exists(registry.inflight_key(worker.hostname))
