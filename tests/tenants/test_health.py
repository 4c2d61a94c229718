"""Liveness and readiness probes (the worker-answering case is in tests/e2e)."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def test_healthz_is_plain_ok():
    response = Client().get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}
    assert "no-cache" in response["Cache-Control"]
    assert Client().post("/healthz").status_code == 405


def test_readyz_503_when_redis_is_down_and_says_nothing_internal(settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    response = Client().get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable"
    assert body["checks"]["postgres"]["ok"] is True
    assert body["checks"]["redis"] == {"ok": False, "error": "ConnectionError",
                                       "ms": body["checks"]["redis"]["ms"]}
    assert "127.0.0.1" not in response.content.decode()


def test_readyz_reports_each_check():
    body = Client().get("/readyz").json()
    assert set(body["checks"]) == {"postgres", "redis", "worker"}
    assert body["checks"]["postgres"]["ok"] and body["checks"]["redis"]["ok"]
    # Ready exactly when a worker answered the ping.
    assert (body["status"] == "ready") == body["checks"]["worker"]["ok"]
