"""ASGI wrapper: relays streamed replies after Django's request has finished.

Django runs each ASGI request's sync code (middleware, DRF views) in an executor thread
of its own that lives until the response is fully sent, so a streaming response served
by Django keeps one parked thread per open stream. Instead, the /v1 view (which
authenticates, validates, claims and dispatches as usual) hands the stream over: it
answers a placeholder carrying ``x-kvi-relay: <id>`` and registers the relay job with
:func:`hand_over`. This wrapper holds that placeholder back, lets Django finish (its
thread goes away), then sends the headers and the SSE body itself from the event loop,
watching for the client's disconnect (which cancels the relay: the worker is told to stop).

Under WSGI (tests' live server, ``runserver``) nothing is handed over: the view streams
through Django as usual (``scope`` has no ``kvi.relay`` flag).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

log = logging.getLogger(__name__)
MARKER = b"x-kvi-relay"
FLAG = "kvi.relay"
_jobs: dict[str, AsyncIterator[bytes]] = {}
_lock = threading.Lock()


def can_hand_over(request) -> bool:
    """Is this request served by :class:`StreamRelay` (ASGI)?"""
    return bool(getattr(request, "scope", {}).get(FLAG))


def hand_over(relay_id: str, body: AsyncIterator[bytes]) -> None:
    """Register the SSE body the wrapper sends once Django's response is done."""
    with _lock:
        _jobs[relay_id] = body


def _take(relay_id: str) -> AsyncIterator[bytes] | None:
    with _lock:
        return _jobs.pop(relay_id, None)


def event_stream(request, relay_id: str, body: AsyncIterator[bytes]):
    """A ``text/event-stream`` response of ``body``: handed over to :class:`StreamRelay`
    under ASGI (sent from the event loop once Django's request is done), else streamed by
    Django. ``relay_id`` must be unique (a request or task id)."""
    from django.http import HttpResponse, StreamingHttpResponse

    if can_hand_over(request):
        hand_over(relay_id, body)
        response = HttpResponse(content_type="text/event-stream")
        response[MARKER.decode()] = relay_id
    else:
        response = StreamingHttpResponse(body, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass events through as they come
    return response


class StreamRelay:
    def __init__(self, app: Callable) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        held: dict[str, Any] = {}

        async def capture(message: dict) -> None:
            if message["type"] == "http.response.start":
                relay_id = dict(message.get("headers") or []).get(MARKER)
                if relay_id is not None:
                    held.update(start=message, id=relay_id.decode())
                    return
            if "start" in held:
                return  # the placeholder's (empty) body
            await send(message)

        await self.app({**scope, FLAG: True}, receive, capture)
        if "start" in held:
            body = _take(held["id"])
            if body is not None:
                await _relay(held["start"], body, receive, send)


async def _relay(start: dict, body: AsyncIterator[bytes], receive, send) -> None:
    # the placeholder's Content-Length (0, set by CommonMiddleware) is not the stream's
    headers = [(k, v) for k, v in start["headers"]
               if k.lower() not in (MARKER, b"content-length")]
    await send({"type": "http.response.start", "status": start["status"], "headers": headers})
    pump = asyncio.create_task(_pump(body, send))
    gone = asyncio.create_task(_disconnected(receive))
    done, _ = await asyncio.wait({pump, gone}, return_when=asyncio.FIRST_COMPLETED)
    if pump not in done:  # the client left: cancelling the relay tells the worker to stop
        pump.cancel()
    else:
        gone.cancel()
    results = await asyncio.gather(pump, gone, return_exceptions=True)
    for result in results:
        if isinstance(result, Exception) and not isinstance(result, OSError):
            log.error("stream relay failed: %r", result)


async def _pump(body: AsyncIterator[bytes], send) -> None:
    try:
        async for chunk in body:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        await body.aclose()


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
