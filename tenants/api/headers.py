"""Headers on every response: ``x-request-id`` and the caller's ``x-ratelimit-*``.

The request id is made here, never taken from the client (it names the chat's Celery
task and audit rows, so it must be unguessable and unique); a chat answer reports the
same id in its body. The rate-limit headers describe the tightest of the member's and
the tenant's limits (tenants.api.throttling) after this request, in OpenAI's names
(``-requests``; ``-tokens``: the tokens-per-minute limits, as counted before it).
"""

from __future__ import annotations

import uuid

from asgiref.sync import iscoroutinefunction, markcoroutinefunction


def new_request_id() -> str:
    return uuid.uuid4().hex


def _decorate(request, response):
    response.headers.setdefault("x-request-id", request.kvi_request_id)
    state = getattr(request, "kvi_ratelimit", None)
    if state is not None:
        response.headers["x-ratelimit-limit-requests"] = str(state.limit)
        response.headers["x-ratelimit-remaining-requests"] = str(max(0, state.remaining))
        response.headers["x-ratelimit-reset-requests"] = f"{state.reset_s}s"
    tokens = getattr(request, "kvi_tpm", None)  # tokens-per-minute limits, when set
    if tokens is not None:
        response.headers["x-ratelimit-limit-tokens"] = str(tokens.limit)
        response.headers["x-ratelimit-remaining-tokens"] = str(max(0, tokens.remaining))
        response.headers["x-ratelimit-reset-tokens"] = f"{tokens.reset_s}s"
    return response


class RequestHeadersMiddleware:
    """Outermost middleware (sync and async): ids every request, decorates every response."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self.is_async:
            return self._acall(request)
        request.kvi_request_id = new_request_id()
        return _decorate(request, self.get_response(request))

    async def _acall(self, request):
        request.kvi_request_id = new_request_id()
        return _decorate(request, await self.get_response(request))
