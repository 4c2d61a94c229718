"""Web-side Prometheus endpoint ``/metrics`` (the exposition comes through ``tenants.ports``)."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from tenants import ports


def _allowed(request: HttpRequest) -> bool:
    """With METRICS_TOKEN: its bearer token only. Without: DEBUG only (fail closed)."""
    token = settings.METRICS_TOKEN
    if not token:
        return settings.DEBUG
    given = request.headers.get("Authorization", "")
    return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    if not _allowed(request):
        return HttpResponse("metrics: forbidden\n", status=403, content_type="text/plain")
    body, content_type = ports.metrics_exposition()
    return HttpResponse(body, content_type=content_type)
