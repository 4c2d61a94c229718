"""Outages of the backing services, answered as the documented JSON 503, never a 500.

A Postgres, Redis or broker fault can surface anywhere: in a DRF view (mapped by
``tenants.errors.api_exception_handler``), in a plain Django view (``process_exception``
below) or in middleware before any view runs (session lookup, CSRF, ...), where Django
turns it into a 500 response itself; ``got_request_exception`` marks the request and
:class:`FaultMiddleware`, the outermost middleware, replaces that 500 with the 503.
"""

from __future__ import annotations

import logging
import sys

import redis
from django.core.signals import got_request_exception
from django.db import InterfaceError as DbInterfaceError
from django.db import OperationalError as DbOperationalError
from django.dispatch import receiver
from kombu.exceptions import OperationalError as BrokerError

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
    from tenants.errors import PlatformError, ServiceUnavailable

    service = None if isinstance(exc, PlatformError) else outage(exc)
    if service is None:
        return None
    log.warning("%s unavailable: %s", service, type(exc).__name__)
    return ServiceUnavailable(f"The {service} is unavailable; retry later.",
                              retry_after=RETRY_AFTER)


class FaultMiddleware:
    """Outermost middleware: an outage anywhere in the request is a JSON 503."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        fault = getattr(request, "_kvi_fault", None)
        if fault is not None and response.status_code >= 500:
            from tenants.errors import json_error

            return json_error(fault, openai=request.path.startswith("/v1/"))
        return response

    def process_exception(self, request, exception):
        fault = as_platform_error(exception)
        if fault is None:
            return None
        from tenants.errors import json_error

        return json_error(fault, openai=request.path.startswith("/v1/"))


@receiver(got_request_exception, dispatch_uid="tenants.faults.remember")
def _remember_fault(sender, request=None, **_):
    """Django is turning an exception into a 500: remember it if it was an outage."""
    fault = as_platform_error(sys.exc_info()[1])
    if fault is not None and request is not None:
        request._kvi_fault = fault
