"""A hung Redis (SIGSTOP: accepts connections, never answers) gives deadlines, not hangs.

Everything here runs against a throwaway Redis of the test's own (never the session's):
the web in its own process, ``manage.py kvcache stats`` as a command. While Redis is
stopped a chat gets its documented JSON 503 within its deadline and the command exits
non-zero with a clear message; after SIGCONT both work again by themselves.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.throwaway import ThrowawayRedis, WebServer
from tests.workers import ROOT, WorkerProcess, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
# the deadlines this test holds the platform to (generous upper bounds: they are what a
# client may wait at most, not how fast this machine is)
CHAT_DEADLINE_S = 60
STATS_DEADLINE_S = 90
# CHAT_RESULT_TIMEOUT of the web under test: a 2-token chat answers well inside it; a web
# waiting on a hung Redis gives up by it at the latest (with the web's 1 s socket deadlines
# below, a socket error usually ends the wait first)
RESULT_TIMEOUT_S = 15


# the commands' and the web's Redis deadlines (3 s by default, config/deadlines.py) set
# shorter: what is proved is that each sets and honours its deadline, which a shorter one
# shows as well
COMMAND_DEADLINES = {"REDIS_SOCKET_TIMEOUT": "1", "REDIS_CONNECT_TIMEOUT": "1"}


@pytest.fixture(scope="module")
def hang_site(worker_base_env, tmp_path_factory):
    """A throwaway Redis, a worker and a web on it, for the module: each test stops and
    continues Redis (and the worker) itself and asserts that they recover by themselves."""
    tmp_path = tmp_path_factory.mktemp("redis-hang")
    rd = ThrowawayRedis(tmp_path / "redis").start()
    env = {**worker_base_env, "DJANGO_SETTINGS_MODULE": "config.settings", "REDIS_URL": rd.url,
           "KV_CACHE_REDIS_URL": rd.url,
           "CELERY_BROKER_URL": rd.url, "CELERY_RESULT_BACKEND": rd.url,
           "CHAT_RESULT_TIMEOUT": str(RESULT_TIMEOUT_S)}
    env.pop("KVI_TEST_REDIS_DB", None)
    worker = WorkerProcess("hang", env, tmp_path)
    # the web's Redis deadlines shorter, as the commands' (COMMAND_DEADLINES): it is proved to
    # set and honour them; the worker keeps the defaults
    web = WebServer({**env, **COMMAND_DEADLINES}, tmp_path / "web.log")
    try:
        # the session's Celery app cannot ping it (another broker): its log says it
        wait_for(lambda: " ready." in worker.log_tail(200), 180, "the worker to be ready")
        yield rd, web, env, worker
    finally:
        web.stop()
        worker.stop()
        rd.kill()


@pytest.fixture
def hung_site(hang_site):
    """The module's site and a member of its own (the database is emptied after each test)."""
    from tenants import actions

    rd, web, env, worker = hang_site
    tenant = actions.do_create_tenant("hang")
    key = actions.do_create_api_token(actions.do_add_member(tenant, "hal", preference="tea"))
    try:
        yield rd, web, env, {"Authorization": f"Token {key}"}, worker
    finally:
        for pid in (rd.proc.pid, worker.pid):  # never leave a stopped process behind
            os.kill(pid, signal.SIGCONT)


def timed(fn, *args, **kw):
    started = time.monotonic()
    out = fn(*args, **kw)
    return out, time.monotonic() - started


def kvcache_stats(env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", "kvcache", *(args or ["stats"])],
                          cwd=ROOT, env={**env, **COMMAND_DEADLINES}, capture_output=True,
                          text=True,
                          timeout=STATS_DEADLINE_S + 60)


def chat(web, auth):
    return timed(web.request, "POST", "/api/chat", {"message": "hi", "max_new_tokens": 2},
                 auth)


def test_a_stopped_redis_gives_json_503s_in_time_and_recovery_after(hung_site):
    rd, web, env, auth, _ = hung_site
    (status, body, _), _ = chat(web, auth)
    assert status == 200 and body["reply"] is not None, (status, body, web.log_tail())
    os.kill(rd.proc.pid, signal.SIGSTOP)
    try:
        (status, body, headers), took = chat(web, auth)
        print(f"chat while Redis is stopped: {status} in {took:.1f}s")
        assert status == 503, (status, body, web.log_tail())
        assert body["error"]["code"] == "worker_unavailable", body  # the task queue's
        assert body["error"]["idempotency_key"]  # retry with it: exactly once
        assert int(headers["Retry-After"]) > 0
        assert took < CHAT_DEADLINE_S, web.log_tail()
        out, took = timed(kvcache_stats, env)
        print(f"kvcache stats while Redis is stopped: rc={out.returncode} in {took:.1f}s")
        assert out.returncode != 0 and "Redis" in out.stderr, out.stdout + out.stderr
        assert took < STATS_DEADLINE_S
        out, took = timed(kvcache_stats, env, "clear", "--tenant", "hang")
        print(f"kvcache clear while Redis is stopped: rc={out.returncode} in {took:.1f}s")
        assert out.returncode != 0 and "Redis" in out.stderr, out.stdout + out.stderr
        assert took < STATS_DEADLINE_S
    finally:
        os.kill(rd.proc.pid, signal.SIGCONT)
    # recovered by itself: the same web process and worker answer again
    (status, body, _), took = chat(web, auth)
    print(f"chat after SIGCONT: {status} in {took:.1f}s")
    assert status == 200 and body["reply"] is not None, (status, body, web.log_tail())
    assert kvcache_stats(env).returncode == 0


def test_redis_stopped_while_the_web_waits_is_a_json_503_in_time(hung_site):
    import threading

    from tenants.models import ChatExchange

    rd, web, env, auth, worker = hung_site
    os.kill(worker.pid, signal.SIGSTOP)  # held: the web is certainly still waiting
    answer = []
    thread = threading.Thread(target=lambda: answer.append(chat_long(web, auth)))
    thread.start()
    claim = wait_for(lambda: ChatExchange.objects.filter(state="pending").first(), 60,
                     "the chat to be claimed")
    # the web subscribes to the result's channel, publishes, then waits for the result
    # (the published task may already sit in the stopped worker's socket: not observable)
    channel = f"celery-task-meta-{claim.request_id}"
    wait_for(lambda: dict(rd.client().pubsub_numsub(channel)).get(channel.encode()), 60,
             "the web to wait for the result")
    os.kill(rd.proc.pid, signal.SIGSTOP)
    try:
        thread.join(timeout=CHAT_DEADLINE_S + 60)
        assert answer, "no answer at all"
        (status, body, headers), took = answer[0]
        print(f"chat waiting when Redis stopped: {status} in {took:.1f}s")
        assert status == 503 and body["error"]["code"] == "worker_unavailable", body
        assert int(headers["Retry-After"]) > 0
        assert took < RESULT_TIMEOUT_S + 30  # the web's wait, plus its socket deadlines
    finally:
        os.kill(rd.proc.pid, signal.SIGCONT)
        os.kill(worker.pid, signal.SIGCONT)
    # the web gave the claim up before it answered: whenever the task reaches the worker
    # (at once, or when the broker restores a message caught in flight by the outage) it
    # can only be refused (tests/e2e/test_chat_faults.py watches a refusal happen)
    claim.refresh_from_db()
    assert claim.state == "abandoned"
    assert not ChatExchange.objects.filter(state="done").exists()


def chat_long(web, auth):
    return timed(web.request, "POST", "/api/chat", {"message": "hi", "max_new_tokens": 256},
                 auth)
