"""Outages anywhere in a request are the documented JSON 503, never a 500.

A Postgres, Redis or broker fault can surface in a DRF view (mapped by
``tenants.api.exceptions.api_exception_handler``), in a plain Django view
(``process_exception`` below) or in middleware before any view runs (session lookup,
CSRF, ...), where Django turns it into a 500 response itself; ``got_request_exception``
marks the request and :class:`FaultMiddleware`, the outermost middleware, replaces that
500 with the 503.
"""

from __future__ import annotations

import sys

from django.core.signals import got_request_exception
from django.dispatch import receiver

from tenants.api.exceptions import json_error
from tenants.faults import as_platform_error


class FaultMiddleware:
    """Outermost middleware: an outage anywhere in the request is a JSON 503."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        fault = getattr(request, "_kvi_fault", None)
        if fault is not None and response.status_code >= 500:
            return json_error(fault, openai=request.path.startswith("/v1/"))
        return response

    def process_exception(self, request, exception):
        fault = as_platform_error(exception)
        if fault is None:
            return None
        return json_error(fault, openai=request.path.startswith("/v1/"))


@receiver(got_request_exception, dispatch_uid="tenants.faults.remember")
def _remember_fault(sender, request=None, **_):
    """Django is turning an exception into a 500: remember it if it was an outage."""
    fault = as_platform_error(sys.exc_info()[1])
    if fault is not None and request is not None:
        request._kvi_fault = fault
