"""One error contract: a Postgres outage on any endpoint is a JSON 503 with Retry-After.

The web runs in its own process against a throwaway PostgreSQL and Redis, so stopping them
inside the test leaves the session's servers alone. With DEBUG on (the demo) Django's HTML
debug page used to answer, with DEBUG off (production) a JSON 500 ``server_error``.
"""

from __future__ import annotations

import os

import pytest

from tests.throwaway import ThrowawayPostgres, ThrowawayRedis, WebServer, manage

pytestmark = [pytest.mark.e2e]

SEED = """
from tenants import actions
tenant = actions.do_create_tenant("pgfault-%(mode)s")
member = actions.do_add_member(tenant, "pat-%(mode)s", preference="tea")
print(actions.do_create_api_token(member))
"""
SESSION = {"Cookie": "sessionid=" + "a1" * 16}  # any session: looked up in Postgres


PRODUCTION = {"DJANGO_DEBUG": "0", "DJANGO_SECRET_KEY": "s" * 50, "KV_SIGNING_SECRET": "k" * 50}


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    """A throwaway PostgreSQL (migrated once) and Redis, shared by both modes' webs: each
    test stops Postgres, starts it again and asserts that the web reconnects by itself."""
    pg = ThrowawayPostgres()
    rd = ThrowawayRedis(tmp_path_factory.mktemp("pgfault") / "redis").start()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings",
           "DATABASE_URL": pg.url, "REDIS_URL": rd.url, "CELERY_BROKER_URL": rd.url,
           "KV_CACHE_REDIS_URL": rd.url,
           "CELERY_RESULT_BACKEND": rd.url}
    try:
        manage({**env, "DJANGO_DEBUG": "1"}, "migrate", "--noinput")
        yield pg, env
    finally:
        rd.kill()
        pg.cleanup()


@pytest.fixture(params=["debug", "production"])
def outage_site(request, services, tmp_path):
    pg, env = services
    mode = PRODUCTION if request.param == "production" else {"DJANGO_DEBUG": "1"}
    env = {**env, **mode}
    seed = SEED % {"mode": request.param}  # each mode's member: usernames are global
    key = manage(env, "shell", "-c", seed).strip().splitlines()[-1]
    web = WebServer(env, tmp_path / "web.log")
    yield pg, web, {"Authorization": f"Token {key}"}, f"pat-{request.param}"
    web.stop()


def assert_unavailable(answer, web) -> None:
    status, body, headers = answer
    assert status == 503, (status, body, web.log_tail())
    assert body["error"]["code"] == "service_unavailable", body
    assert int(headers["Retry-After"]) > 0
    assert body["error"]["retry_after"] == int(headers["Retry-After"])


def test_postgres_stop_is_a_json_503_everywhere_and_recovers(outage_site):
    pg, web, auth, username = outage_site
    assert web.get("/api/me", auth)[0] == 200
    pg.stop()
    try:
        assert_unavailable(web.get("/api/me", auth), web)  # token lookup before the view
        assert_unavailable(web.get("/api/conversations", auth), web)
        assert_unavailable(web.request("POST", "/api/chat", {"message": "hi"}, auth), web)
        assert_unavailable(web.get("/api/me", SESSION), web)  # session lookup (DRF auth)
        assert_unavailable(web.get("/admin/", SESSION), web)  # plain Django view
        status, body, _ = web.get("/readyz")
        assert status == 503 and body["checks"]["postgres"]["ok"] is False
    finally:
        pg.start()
    status, body, _ = web.get("/api/me", auth)  # reconnects on its own
    assert status == 200 and body["username"] == username, body
