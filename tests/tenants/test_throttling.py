"""Per-member / per-tenant rate limits on real Redis counters.

Chat requests here carry an empty message: the throttle runs before validation, so each
one is counted (400) without reaching a worker, and the first refused one is a 429.
"""

from __future__ import annotations

import json
import threading

import pytest
import redis
from django.conf import settings as django_settings

from tenants.api import throttling
from tests.tenants.conftest import token_client

pytestmark = pytest.mark.django_db


def chat(key: str):
    return token_client(key).post("/api/chat", data=json.dumps({"message": ""}),
                                  content_type="application/json")


def test_parse_rate():
    assert throttling.parse_rate("30/min") == (30, 60)
    assert throttling.parse_rate("5/10s") == (5, 10)
    assert throttling.parse_rate("100/h") == (100, 3600)
    assert throttling.parse_rate("") is None and throttling.parse_rate(None) is None
    with pytest.raises(ValueError):
        throttling.parse_rate("lots/min")


def test_member_limit_then_429_with_retry_after(acme, settings):
    settings.CHAT_RATE_PER_MEMBER = "3/min"
    settings.CHAT_RATE_PER_TENANT = "100/min"
    assert [chat(acme.user_key).status_code for _ in range(3)] == [400, 400, 400]
    response = chat(acme.user_key)
    assert response.status_code == 429
    error = response.json()["error"]
    assert error["code"] == "throttled" and error["scope"] == "member"
    assert 1 <= int(response["Retry-After"]) <= 120
    assert error["retry_after"] == int(response["Retry-After"])
    # Another member of the same tenant still has their own budget.
    assert chat(acme.other_key).status_code == 400


def test_tenant_limit_shared_by_members_and_isolated_from_other_tenants(acme, globex, settings):
    settings.CHAT_RATE_PER_MEMBER = "10/min"
    settings.CHAT_RATE_PER_TENANT = "4/min"
    statuses = [chat(k).status_code for k in (acme.user_key, acme.other_key) * 2]
    assert statuses == [400] * 4
    response = chat(acme.admin_key)
    assert response.status_code == 429 and response.json()["error"]["scope"] == "tenant"
    assert chat(globex.user_key).status_code == 400  # globex is not affected by acme


def test_refused_requests_are_not_counted(acme, settings):
    settings.CHAT_RATE_PER_MEMBER = "2/min"
    settings.CHAT_RATE_PER_TENANT = "3/min"
    assert [chat(acme.user_key).status_code for _ in range(4)] == [400, 400, 429, 429]
    # The member's refused attempts did not spend the tenant's budget.
    assert chat(acme.other_key).status_code == 400
    assert chat(acme.other_key).status_code == 429  # now the tenant's 3 are used


def test_counting_is_atomic_under_concurrency(acme, settings):
    settings.CHAT_RATE_PER_MEMBER = "5/min"
    settings.CHAT_RATE_PER_TENANT = None
    results: list[bool] = []
    lock = threading.Lock()

    def hit():
        try:
            throttling.check("chat", acme.tenant.pk, acme.user.pk)
            ok = True
        except throttling.Throttled:
            ok = False
        with lock:
            results.append(ok)

    threads = [threading.Thread(target=hit) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(True) == 5 and results.count(False) == 15


def test_sliding_window_weighs_the_previous_window(acme, settings):
    settings.CHAT_RATE_PER_MEMBER = "4/3600s"
    settings.CHAT_RATE_PER_TENANT = None
    client = redis.Redis.from_url(django_settings.REDIS_URL)

    def elapsed() -> tuple[int, float]:
        sec, usec = client.time()
        now = sec + usec / 1e6
        return int(now // 3600), (now % 3600) / 3600

    window, before = elapsed()
    # 4 requests in the previous hour: (1 - elapsed) * 4 of them still count now.
    client.set(f"kvi:rl:chat:m:{acme.user.pk}:{window - 1}", 4, ex=7200)
    allowed = 0
    for _ in range(4):
        try:
            throttling.check("chat", acme.tenant.pk, acme.user.pk)
            allowed += 1
        except throttling.Throttled as exc:
            assert exc.details["retry_after"] >= 1
            break
    _, after = elapsed()

    def budget(e: float) -> int:
        return sum(1 for cur in range(4) if 4 * (1 - e) + cur + 1 <= 4)

    assert budget(before) <= allowed <= budget(after) < 4


def test_other_endpoints_use_the_api_scope(acme, settings):
    settings.API_RATE_PER_MEMBER = "2/min"
    client = token_client(acme.user_key)
    assert [client.get("/api/me").status_code for _ in range(3)] == [200, 200, 429]
    assert chat(acme.user_key).status_code == 400  # chat has its own scope


def test_redis_down_fails_open_by_default_or_closed_when_configured(acme, settings, caplog):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    settings.CHAT_RATE_PER_MEMBER = "1/min"
    throttling._last_warning = 0.0
    assert [chat(acme.user_key).status_code for _ in range(3)] == [400, 400, 400]
    assert "failing open" in caplog.text
    settings.THROTTLE_FAIL_OPEN = False
    response = chat(acme.user_key)
    assert response.status_code == 503 and response.json()["error"]["code"] == \
        "worker_unavailable"
