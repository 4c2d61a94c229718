"""Probes: ``/healthz`` (the process answers) and ``/readyz`` (Postgres, Redis, a worker).

Plain Django views: no authentication, no tenant data, no internal addresses in the body
(failures are reported by exception class; details go to the log).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from django.conf import settings
from django.db import connection
from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from injection.kvcache.redis_client import connect

log = logging.getLogger(__name__)


class NoWorker(Exception):
    pass


def _postgres() -> dict:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return {}


def _redis() -> dict:
    client = connect(settings.REDIS_URL, socket_timeout=1.0, socket_connect_timeout=1.0)
    try:
        client.ping()
    finally:
        client.close()
    return {}


def _worker() -> dict:
    """At least one Celery worker answers a control ping (returns on the first reply)."""
    from config.celery import app

    timeout = float(getattr(settings, "READYZ_WORKER_TIMEOUT", 1.0))
    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, interval_start=0, timeout=timeout)
        replies = app.control.ping(timeout=timeout, limit=1, connection=conn)
    if not replies:
        raise NoWorker()
    return {"workers": len(replies)}


def _run(name: str, check: Callable[[], dict]) -> dict:
    started = time.monotonic()
    try:
        result = {"ok": True, **check()}
    except Exception as exc:  # a probe reports, never raises
        log.warning("readyz: %s check failed: %r", name, exc)
        result = {"ok": False, "error": type(exc).__name__}
    result["ms"] = round((time.monotonic() - started) * 1000, 1)
    return result


@never_cache
@require_GET
def healthz(request):
    return JsonResponse({"status": "ok"})


@never_cache
@require_GET
def readyz(request):
    checks = {"postgres": _run("postgres", _postgres), "redis": _run("redis", _redis),
              "worker": _run("worker", _worker)}
    ready = all(c["ok"] for c in checks.values())
    return JsonResponse({"status": "ready" if ready else "unavailable", "checks": checks},
                        status=200 if ready else 503)
