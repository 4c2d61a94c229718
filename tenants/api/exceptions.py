"""The one mapping of the error family to HTTP: DRF's exception handlers, plain JSON errors.

Every API error is JSON: ``{"error": {"code": "...", "message": "...", ...}}`` under
``/api/``, OpenAI's ``{"error": {"message", "type", "code", "param"}}`` under ``/v1/``.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import JsonResponse
from rest_framework import exceptions as drf_exc
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_default_handler

from tenants.errors import PayloadTooLarge, PlatformError
from tenants.faults import as_platform_error

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


# OpenAI's error ``type`` by HTTP status (the /v1 API's shape; ``code`` stays ours).
OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "not_found_error", 409: "conflict_error",
                413: "invalid_request_error", 422: "invalid_request_error",
                429: "rate_limit_error", 502: "api_error", 503: "service_unavailable_error"}
# Codes whose OpenAI ``type`` is not their status's (a spent budget is a quota, as OpenAI's).
OPENAI_TYPES_BY_CODE = {"budget_exceeded": "insufficient_quota"}


def openai_body(code: str, message: str, status: int = 400, **extra: Any) -> dict[str, Any]:
    """``{"error": {"message", "type", "code", "param", ...}}`` as OpenAI's clients expect."""
    param = extra.pop("param", None)
    fields = extra.get("fields")
    if param is None and isinstance(fields, dict) and fields:
        param, problem = _first_problem(fields)
        message = f"{param}: {problem}"
    kind = OPENAI_TYPES_BY_CODE.get(code) or OPENAI_TYPES.get(status, "api_error")
    return {"error": {"message": message, "type": kind,
                      "code": code, "param": param, **extra}}


def _first_problem(fields: dict, prefix: str = "") -> tuple[str, str]:
    """The first field error of DRF's nested detail as ("messages.0.role", "text")."""
    key, value = next(iter(fields.items()))
    name = f"{prefix}{key}"
    if isinstance(value, dict) and value:
        return _first_problem(value, f"{name}.")
    if isinstance(value, list) and value and isinstance(value[0], dict | list):
        first = next((i for i, v in enumerate(value) if v), 0)
        if isinstance(value[first], dict) and value[first]:
            return _first_problem(value[first], f"{name}.{first}.")
    return name, str(value[0] if isinstance(value, list) and value else value)


def _native(code: str, message: str, status: int, **extra: Any) -> dict[str, Any]:
    return _body(code, message, **extra)


def _headers(exc: PlatformError) -> dict[str, str]:
    if "retry_after" in exc.details:
        return {"Retry-After": str(int(exc.details["retry_after"]))}
    return {}


def json_error(exc: PlatformError, *, openai: bool = False) -> JsonResponse:
    """A PlatformError as a plain Django response (outside DRF views)."""
    shape = openai_body if openai else _native
    return JsonResponse(shape(exc.code, exc.message, exc.status, **exc.details),
                        status=exc.status, headers=_headers(exc))


def api_exception_handler(exc: Exception, context: dict) -> Response | None:
    """Map PlatformError, outages (tenants.faults) and DRF's own exceptions to JSON."""
    return _handle(exc, context, _native)


def openai_exception_handler(exc: Exception, context: dict) -> Response | None:
    """The same mapping in OpenAI's error shape (the /v1 views)."""
    return _handle(exc, context, openai_body)


def _handle(exc: Exception, context: dict, shape) -> Response | None:
    if isinstance(exc, RequestDataTooBig):  # raised by Django while DRF reads the body
        exc = PayloadTooLarge()
    exc = as_platform_error(exc) or exc
    if isinstance(exc, PlatformError):
        return Response(shape(exc.code, exc.message, exc.status, **exc.details), exc.status,
                        headers=_headers(exc))
    response = drf_default_handler(exc, context)
    if response is None:
        return None
    code = next((c for t, c in _DRF_CODES.items() if isinstance(exc, t)), "error")
    status = response.status_code
    if isinstance(exc, drf_exc.ValidationError):
        response.data = shape(code, "Invalid input.", status, fields=exc.detail)
    else:
        response.data = shape(code, str(getattr(exc, "detail", str(exc))), status)
    return response


# --- plain Django views (outside DRF): unknown URLs and crashes under /api/ stay JSON ----


def _is_api(request) -> bool:
    return request.path.startswith(("/api/", "/v1/"))


def json_404(request, exception=None):
    if request.path.startswith("/v1/"):
        return JsonResponse(openai_body("not_found", "No such endpoint.", 404), status=404)
    if _is_api(request):
        return JsonResponse(_body("not_found", "No such endpoint."), status=404)
    from django.views.defaults import page_not_found

    return page_not_found(request, exception)


def json_500(request):
    if _is_api(request):
        return JsonResponse(_body("server_error", "Internal error."), status=500)
    from django.views.defaults import server_error

    return server_error(request)
