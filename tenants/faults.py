"""Outages of the backing services: which exceptions are one, and the error they answer.

A Postgres, Redis or broker fault is answered as the documented ``ServiceUnavailable``
(JSON 503), never a 500: by ``tenants.api.exceptions`` in DRF views and by
``tenants.api.middleware`` everywhere else; the worker client classifies with
:func:`outage` too.
"""

from __future__ import annotations

import logging

import redis
from django.db import InterfaceError as DbInterfaceError
from django.db import OperationalError as DbOperationalError
from kombu.exceptions import OperationalError as BrokerError

from tenants.errors import PlatformError, ServiceUnavailable

log = logging.getLogger(__name__)
RETRY_AFTER = 5  # seconds: services restart or fail over in about that time

DB_OUTAGES = (DbOperationalError, DbInterfaceError)
REDIS_OUTAGES = (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError, BrokerError)
OUTAGES = DB_OUTAGES + REDIS_OUTAGES


def outage(exc: BaseException | None) -> str | None:
    """``"database"`` or ``"redis"`` if ``exc`` is (or was caused by) an outage, else None."""
    for _ in range(5):  # the exception and a few of its causes
        if exc is None:
            return None
        if isinstance(exc, DB_OUTAGES):
            return "database"
        if isinstance(exc, REDIS_OUTAGES):
            return "redis"
        exc = exc.__cause__ or exc.__context__
    return None


def as_platform_error(exc: BaseException | None):
    """The ``ServiceUnavailable`` an outage answers, else None (our own errors stand)."""
    service = None if isinstance(exc, PlatformError) else outage(exc)
    if service is None:
        return None
    log.warning("%s unavailable: %s", service, type(exc).__name__)
    return ServiceUnavailable(f"The {service} is unavailable; retry later.",
                              retry_after=RETRY_AFTER)
