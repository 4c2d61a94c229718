"""The project's error family and the one DRF exception handler that maps it to HTTP.

Every API error is JSON: ``{"error": {"code": "...", "message": "...", ...}}``.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import JsonResponse
from rest_framework import exceptions as drf_exc
from rest_framework.response import Response

log = logging.getLogger(__name__)


class PlatformError(Exception):
    """Base of every error the platform raises on purpose."""

    status = 400
    code = "bad_request"
    default_message = "Bad request."

    def __init__(self, message: str | None = None, **details: Any) -> None:
        self.message = message or self.default_message
        self.details = details
        super().__init__(self.message)


class InvalidInput(PlatformError):
    status, code, default_message = 400, "invalid_input", "Invalid input."


class NotAuthenticated(PlatformError):
    status, code, default_message = 401, "not_authenticated", "Authentication required."


class Forbidden(PlatformError):
    status, code, default_message = 403, "forbidden", "Not allowed."


class InactiveAccount(PlatformError):
    status, code, default_message = 403, "inactive", "This account or tenant is inactive."


class NotFound(PlatformError):
    # Used for foreign ids too: 404, never 403, so other tenants' ids are not confirmed.
    status, code, default_message = 404, "not_found", "Not found."


class Conflict(PlatformError):
    status, code, default_message = 409, "conflict", "Already exists."


class PayloadTooLarge(PlatformError):
    status, code, default_message = 413, "payload_too_large", "The request body is too large."


class Throttled(PlatformError):
    status, code, default_message = 429, "throttled", "Too many requests."


class WorkerUnavailable(PlatformError):
    status, code, default_message = 503, "worker_unavailable", "No worker answered in time."


class GenerationFailed(PlatformError):
    status, code, default_message = 502, "generation_failed", "The model failed to answer."


_DRF_CODES = {
    drf_exc.ParseError: "malformed_json",
    drf_exc.NotAuthenticated: "not_authenticated",
    drf_exc.AuthenticationFailed: "authentication_failed",
    drf_exc.PermissionDenied: "forbidden",
    drf_exc.NotFound: "not_found",
    drf_exc.MethodNotAllowed: "method_not_allowed",
    drf_exc.UnsupportedMediaType: "unsupported_media_type",
    drf_exc.Throttled: "throttled",
    drf_exc.ValidationError: "invalid_input",
}


def _body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **extra}}


def api_exception_handler(exc: Exception, context: dict) -> Response | None:
    """Map PlatformError and DRF's own exceptions to the JSON error shape."""
    if isinstance(exc, RequestDataTooBig):  # raised by Django while DRF reads the body
        exc = PayloadTooLarge()
    if isinstance(exc, PlatformError):
        headers = {}
        if "retry_after" in exc.details:
            headers["Retry-After"] = str(int(exc.details["retry_after"]))
        return Response(_body(exc.code, exc.message, **exc.details), exc.status, headers=headers)
    from rest_framework.views import exception_handler as drf_default_handler  # avoid cycle

    response = drf_default_handler(exc, context)
    if response is None:
        return None
    code = next((c for t, c in _DRF_CODES.items() if isinstance(exc, t)), "error")
    if isinstance(exc, drf_exc.ValidationError):
        response.data = _body(code, "Invalid input.", fields=exc.detail)
    else:
        detail = getattr(exc, "detail", str(exc))
        response.data = _body(code, str(detail))
    return response


# --- plain Django views (outside DRF): unknown URLs and crashes under /api/ stay JSON ----


def _is_api(request) -> bool:
    return request.path.startswith("/api/")


def json_404(request, exception=None):
    if _is_api(request):
        return JsonResponse(_body("not_found", "No such endpoint."), status=404)
    from django.views.defaults import page_not_found

    return page_not_found(request, exception)


def json_500(request):
    if _is_api(request):
        return JsonResponse(_body("server_error", "Internal error."), status=500)
    from django.views.defaults import server_error

    return server_error(request)
