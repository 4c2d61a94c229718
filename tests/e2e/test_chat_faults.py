"""Exactly-once chats under faults: Redis and the only worker die mid-chat.

A web process and a worker run against the session's test database and a throwaway
Redis (tests/throwaway.py), which the tests kill and restart. After every fault the
client's answer and Postgres must agree: a 503 leaves no exchange behind (not even one a
restarted worker finishes later), a 200 is stored exactly once, and a retry with the
same Idempotency-Key generates at most once and then replays the stored answer.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest

from tenants import actions
from tenants.models import AuditEvent, AuditLog, ChatExchange, Message
from tests.e2e.conftest import FAST_HEARTBEAT, LONG_TOKENS, member_with_preference
from tests.throwaway import ThrowawayRedis, WebServer
from tests.workers import WorkerProcess, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
RESULT_TIMEOUT = 40  # the web's wait (and each claim's deadline): a retry generates LONG_TOKENS on a loaded 2-core machine
# the wait of a web that only has to give up (its worker killed): the attempt starts well
# inside it, and the test then waits it out
GIVE_UP_TIMEOUT = 12
STORY = {"message": "Tell me a long story.", "max_new_tokens": LONG_TOKENS}


@pytest.fixture(scope="module")
def site(worker_base_env, tmp_path_factory):
    """Throwaway Redis + one worker + one web process (the test database is shared)."""
    base = tmp_path_factory.mktemp("chatfaults")
    redis_server = ThrowawayRedis(base / "redis").start()
    env = {**worker_base_env, **FAST_HEARTBEAT, "DJANGO_SETTINGS_MODULE": "config.settings",
           "REDIS_URL": redis_server.url, "CELERY_BROKER_URL": redis_server.url,
           "KV_CACHE_REDIS_URL": redis_server.url,
           "CELERY_RESULT_BACKEND": redis_server.url, "DJANGO_DEBUG": "1",
           "CHAT_RESULT_TIMEOUT": str(RESULT_TIMEOUT), "CHAT_MAX_NEW_TOKENS": str(LONG_TOKENS)}
    env.pop("KVI_TEST_REDIS_DB", None)
    site = {"redis": redis_server, "env": env, "logs": base, "web": WebServer(env, base / "web.log")}
    site["worker"] = start_worker(site)
    yield site
    site["worker"].stop()
    site["web"].stop()
    redis_server.kill()


def start_worker(site) -> WorkerProcess:
    worker = WorkerProcess("cf1", site["env"], site["logs"])
    wait_for(lambda: pings(site["redis"].url, worker), 120, "worker ready", interval=0.5)
    return worker


def pings(url: str, worker: WorkerProcess) -> bool:
    from celery import Celery

    if worker.proc.poll() is not None:
        raise AssertionError(f"worker exited:\n{worker.log_tail()}")
    probe = Celery("probe", broker=url, set_as_current=False)  # never the tests' app
    try:
        return bool(probe.control.ping(destination=[worker.hostname], timeout=1.0))
    except Exception:  # broker still down
        return False
    finally:
        probe.close()


@pytest.fixture
def give_up_web(site):
    """A second web process on the same services whose wait is GIVE_UP_TIMEOUT: the 503
    after a killed worker comes when the web gives up, whatever its wait (the retries, which
    generate LONG_TOKENS, go to the site's web)."""
    web = WebServer({**site["env"], "CHAT_RESULT_TIMEOUT": str(GIVE_UP_TIMEOUT)},
                    site["logs"] / "give-up-web.log")
    yield web
    web.stop()


def chat(site, auth: dict, key: str, body=STORY, web=None):
    web = web or site["web"]
    return web.request("POST", "/api/chat", body, {**auth, "Idempotency-Key": key})


def chat_in_background(site, auth, key, web=None) -> tuple[threading.Thread, list]:
    answer: list = []
    thread = threading.Thread(target=lambda: answer.append(chat(site, auth, key, web=web)))
    thread.start()
    return thread, answer


def started_attempt(site, member, key: str) -> str:
    """The request id of the attempt for ``key``, once the worker has started it."""
    from gpu_worker.routing import registry

    def running():
        row = ChatExchange.objects.filter(member=member, key=key).first()
        return row and site["redis"].client().exists(registry.deliveries_key(row.request_id))

    wait_for(running, 60, f"{key} running on the worker")
    return ChatExchange.objects.get(member=member, key=key).request_id


def stored(member) -> tuple[list[str], int]:
    replies = list(Message.objects.filter(conversation__member=member, role="assistant")
                   .values_list("content", flat=True))
    audits = AuditLog.objects.filter(event_type=AuditEvent.CHAT_REQUEST, target=str(member))
    return replies, audits.count()


def assert_unavailable(answer, key: str) -> None:
    status, body, headers = answer
    assert status == 503, (status, body)
    assert body["error"]["code"] == "worker_unavailable"
    assert int(headers["Retry-After"]) > 0 and body["error"]["idempotency_key"] == key


def assert_retries_answer_exactly_once(site, auth, member, key) -> dict:
    status, first, headers = chat(site, auth, key)
    assert status == 200, (first, site["worker"].log_tail())
    status, again, replay_headers = chat(site, auth, key)
    assert status == 200 and again == first  # replayed, not generated again
    assert replay_headers["Idempotent-Replayed"] == "true"
    assert stored(member) == ([first["reply"]], 1)  # one exchange, usage counted once
    return first


def refused_in_log(worker: WorkerProcess, request_id: str) -> bool:
    return f"chat request_id={request_id} refused" in worker.log_tail(100_000)  # whole log


def in_transaction_elsewhere() -> bool:
    """Does another connection to the test database hold an open transaction (the worker
    paused inside one: admitting the prompt locks the claim row)?"""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%%'")
        return cur.fetchone()[0] > 0


def pause_generating(worker: WorkerProcess) -> None:
    """SIGSTOP the worker while it generates, not inside a database transaction: paused
    holding the claim's row lock, it would hold the web's give-up (and this test's subject)
    up for the database's statement timeout instead."""
    def paused_outside() -> bool:
        os.kill(worker.pid, signal.SIGSTOP)
        if not in_transaction_elsewhere():
            return True
        os.kill(worker.pid, signal.SIGCONT)  # let it commit, and pause it again
        return False

    wait_for(paused_outside, 60, "the worker paused outside a transaction")


def test_redis_dies_while_the_web_waits_for_a_slow_worker(site):
    """The worker is paused past the web's give-up: its late reply must not be stored."""
    member = member_with_preference("chatfaults", "rita", "I love soup.")
    auth = {"Authorization": f"Token {actions.do_create_api_token(member)}"}
    thread, answer = chat_in_background(site, auth, "story-redis")
    request_id = started_attempt(site, member, "story-redis")
    worker = site["worker"]
    pause_generating(worker)  # a slow worker: still generating after the 503
    site["redis"].kill()
    try:
        thread.join(timeout=180)
        assert_unavailable(answer[0], "story-redis")  # was: HTTP 500
        # other endpoints during the outage: reads work, a new chat is a clean 503
        assert site["web"].get("/api/me", auth)[0] == 200
        assert_unavailable(chat(site, auth, "while-down", {"message": "hi"}), "while-down")
        status, ready, _ = site["web"].get("/readyz")
        assert status == 503 and ready["checks"]["redis"]["ok"] is False
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    wait_for(lambda: refused_in_log(worker, request_id), 120, "worker refusal")
    assert stored(member) == ([], 0)  # no ghost: the late reply was not stored
    restart_redis(site)
    assert_retries_answer_exactly_once(site, auth, member, "story-redis")


def test_redis_dies_while_the_web_waits(site):
    """Whichever wins, the web's give-up or the worker's store, client and Postgres agree."""
    member = member_with_preference("chatfaults", "rory", "I love stew.")
    auth = {"Authorization": f"Token {actions.do_create_api_token(member)}"}
    thread, answer = chat_in_background(site, auth, "story-race")
    request_id = started_attempt(site, member, "story-race")
    site["redis"].kill()  # mid-generation
    thread.join(timeout=180)
    status, body, _ = answer[0]
    if status == 200:  # the worker stored before the web gave up: the web returned it
        assert stored(member) == ([body["reply"]], 1)
    else:
        assert_unavailable(answer[0], "story-race")
        wait_for(lambda: refused_in_log(site["worker"], request_id), 120, "worker refusal")
        assert stored(member) == ([], 0)
    restart_redis(site)
    reply = assert_retries_answer_exactly_once(site, auth, member, "story-race")
    assert status != 200 or reply == body


def restart_redis(site) -> None:
    site["redis"].start()  # back on its port, empty (no persistence)
    wait_for(lambda: pings(site["redis"].url, site["worker"]), 120, "worker reconnected",
               interval=0.5)


def test_the_only_worker_is_killed_and_its_task_restored_after_the_503(site, give_up_web):
    member = member_with_preference("chatfaults", "walt", "Short answers.")
    auth = {"Authorization": f"Token {actions.do_create_api_token(member)}"}
    thread, answer = chat_in_background(site, auth, "story-kill", web=give_up_web)
    request_id = started_attempt(site, member, "story-kill")
    site["worker"].kill()  # SIGKILL mid-generation: no ack, no cleanup
    thread.join(timeout=180)
    assert_unavailable(answer[0], "story-kill")

    site["worker"] = start_worker(site)  # same hostname: restores the unacked task
    wait_for(lambda: refused_in_log(site["worker"], request_id), 120, "restored task refused")
    assert stored(member) == ([], 0)  # the restored task was not run to a ghost reply
    assert AuditLog.objects.filter(event_type=AuditEvent.CHAT_ABANDONED,
                                   data__request_id=request_id).count() == 1
    assert_retries_answer_exactly_once(site, auth, member, "story-kill")
