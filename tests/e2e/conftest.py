"""Scale-out fixtures: groups of real `celery worker` processes with fast heartbeats.

``start_workers("r1", "r2", pool=..., **env)`` starts real workers in parallel against the
test database and Redis (``pool`` "solo" or "threads": the batching GPU configuration;
env overrides, e.g. WORKER_MAX_DELIVERIES) and waits until each
answers a ping and heartbeats. ``only_these_consume(workers)`` makes every other live
worker of the session (e.g. the chat test's ``w1``) stop consuming the shared queue for
the duration, so a test knows exactly which processes can take a task.
"""

from __future__ import annotations

import contextlib

import pytest

from tests.workers import wait_for

FAST_HEARTBEAT = {"WORKER_HEARTBEAT_INTERVAL": "0.5", "WORKER_HEARTBEAT_TTL": "4"}


@pytest.fixture(autouse=True)
def _fresh_kv_cache():
    """Tenant and member ids restart with every test database: K/V entries an earlier test
    left under the same ids (segments and conversation links, in Redis and in the session's
    workers' L1) are dropped first, so a test's counts and tiers are its own."""
    import redis

    from gpu_worker.channels import control, kvstore

    try:
        kvstore.l2_tier().evict_all()
        control.request("clear_all", timeout=3)
    except redis.RedisError:  # a test that takes Redis down cleans up after itself
        pass
    yield
LONG_TOKENS = 1800  # a few seconds of generation on the demo model: time to kill mid-way


@pytest.fixture(scope="session")
def scaleout_env(worker_base_env):
    return {**worker_base_env, **FAST_HEARTBEAT}


@pytest.fixture(scope="session")
def start_workers(scaleout_env, tmp_path_factory):
    from tests.workers import WorkerProcess

    log_dir = tmp_path_factory.mktemp("scaleout-logs")
    started: list[WorkerProcess] = []

    def start(*names: str, pool: str = "solo", **env_overrides) -> list[WorkerProcess]:
        env = {**scaleout_env, **{k: str(v) for k, v in env_overrides.items()}}
        extra = ["--concurrency", env.get("WORKER_BATCH_MAX", "16")] if pool == "threads" else []
        workers = [WorkerProcess(n, env, log_dir, pool=pool, extra=extra) for n in names]
        started.extend(workers)
        for w in workers:
            w.wait_ready()
            wait_for(lambda w=w: heartbeat(w.hostname) is not None, 30, f"{w.name} heartbeat")
        return workers

    yield start
    for w in started:
        w.stop()


@pytest.fixture(scope="module")
def worker_pair(start_workers):
    """Two workers for a module of the routing, kvcache and task-auth tests (with metrics
    servers), stopped after it: a test file that does not start workers meets only w1."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pair = start_workers("r1", "r2", WORKER_METRICS_PORT=port, WORKER_METRICS_ADDR="127.0.0.1")
    yield pair
    for w in pair:
        w.stop()


@contextlib.contextmanager
def only_these_consume(workers):
    """Other live workers stop consuming the shared queue until the block ends."""
    from config.celery import app
    from gpu_worker.routing import registry

    keep = {w.hostname for w in workers}
    # a heartbeat or a ping reply: on a loaded machine either alone can miss a live worker
    seen = set(registry.live_workers()) | {
        host for reply in app.control.ping(timeout=2.0) for host in reply}
    others = sorted(seen - keep)
    if others:
        app.control.cancel_consumer(registry.SHARED_QUEUE, destination=others, reply=True,
                                    timeout=10)
    try:
        yield
    finally:
        alive = [n for n in others if n in registry.live_workers()]
        if alive:
            app.control.add_consumer(registry.SHARED_QUEUE, destination=alive, reply=True,
                                     timeout=10)


def heartbeat(worker: str):
    from gpu_worker.routing import registry

    return registry.live_workers().get(worker)


@pytest.fixture
def member_key():
    """A vegetarian member of tenant "acme" and their API token (the /v1 tests)."""
    from tenants import actions

    tenant = actions.do_create_tenant("acme", "Acme")
    member = actions.do_add_member(tenant, "alice", preference="I am vegetarian.")
    return member, actions.do_create_api_token(member)


def member_with_preference(slug: str, username: str, text: str):
    from tenants import actions
    from tenants.models import Tenant

    tenant = Tenant.objects.filter(slug=slug).first() or actions.do_create_tenant(slug)
    return actions.do_add_member(tenant, username, preference=text)


def send_chat(member, message: str = "What should I cook?", *, queue: str | None = None,
              max_new_tokens: int = 4, conversation: int | None = None):
    """Claim and dispatch a chat turn like the API does (routing unless ``queue`` is given)."""
    from gpu_worker.client import dispatch as client
    from gpu_worker.routing.affinity import Route
    from gpu_worker.tasks import chat

    params = {"max_new_tokens": max_new_tokens}
    request_id = client.claim_chat(member, conversation, message, params).request_id
    if queue is None:
        return client.dispatch_chat(member.pk, conversation, message, params, request_id)
    res = chat.apply_async(
        args=client.chat_args(member.pk, conversation, message, params, request_id),
        queue=queue, task_id=request_id,
    )
    return client.Dispatched(res, Route(queue, "explicit"))


def chat_now(member, message: str = "What should I cook?", **kw) -> dict:
    from gpu_worker.client import dispatch as client

    return client.wait_chat(send_chat(member, message, **kw), timeout=120)


def worker_stats(hostname: str) -> dict:
    """The live stats reply of one worker process (control-channel request)."""
    from gpu_worker.channels import control

    for reply in control.request("stats", timeout=5):
        if reply.get("worker") == hostname:
            return reply
    raise AssertionError(f"no stats reply from {hostname}")


def l1_entries(hostname: str, tenant_id) -> int:
    per = ((worker_stats(hostname)["stats"] or {})["l1"] or {}).get("per_tenant") or {}
    return (per.get(str(tenant_id)) or {}).get("entries", 0)


def l2_entries(tenant_id) -> int:
    from gpu_worker.channels import kvstore

    stats = kvstore.l2_tier().stats(scan=True, tenants=[str(tenant_id)])
    return stats["per_tenant"][str(tenant_id)]["entries"]


ASGI_METRICS_TOKEN = "e2e-metrics"


@pytest.fixture(scope="session")
def asgi_server(worker_base_env, tmp_path_factory):
    """uvicorn serving the web app against the test database (long replies allowed)."""
    from tests.workers import AsgiServer

    env = {**worker_base_env, "CHAT_MAX_NEW_TOKENS": "2000",
           "METRICS_TOKEN": ASGI_METRICS_TOKEN}
    server = AsgiServer(env, tmp_path_factory.mktemp("asgi-logs"))
    server.wait_ready()
    yield server
    server.stop()


@pytest.fixture
def alice():
    """Tenant "acme", member "alice" with a preference, and her API token."""
    from tenants import actions

    tenant = actions.do_create_tenant("acme", "Acme")
    member = actions.do_add_member(tenant, "alice", preference="I am vegetarian, no spicy food.")
    return member, actions.do_create_api_token(member)
