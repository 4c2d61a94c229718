"""Server-sent events for ``stream: true``: ``chat.completion.chunk`` events, then ``[DONE]``.

The events come from ``ports.stream_events`` (an async iterator on the ASGI event loop);
an error after the stream started is sent as an ``{"error": {...}}`` event, which the
openai SDK raises as ``APIError``.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from django.http import HttpResponseBase

from tenants.api.exceptions import openai_body
from tenants.api.streaming import event_stream
from tenants.v1.shapes import EXTENSION, finish_reason, usage


def _data(body: dict[str, Any] | str) -> bytes:
    text = body if isinstance(body, str) else json.dumps(body, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


async def sse(events: AsyncIterator, model: str, request_id: str,
              include_usage: bool) -> AsyncIterator[bytes]:
    base = {"id": f"chatcmpl-{request_id}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": model, "system_fingerprint": None}

    def chunk(delta: dict, finish: str | None = None, **extra: Any) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        more = {"usage": None} if include_usage else {}
        return _data({**base, "choices": [choice], **more, **extra})

    opened = False
    try:
        async for kind, value in events:
            if not opened:  # the role chunk once the relay runs: closing it now cancels
                opened = True
                yield chunk({"role": "assistant", "content": ""})
            if kind == "start":
                continue
            if kind == "delta":
                yield chunk({"content": value})
            elif kind == "error":
                yield _data(openai_body(value.code, value.message, value.status,
                                        **value.details))
                return
            else:  # done: the stored answer
                yield chunk({}, finish_reason(value.get("cache") or {}), **{EXTENSION: {
                    "conversation": value["conversation"], "request_id": value["request_id"]}})
                if include_usage:
                    yield _data({**base, "choices": [],
                                 "usage": usage(value.get("usage") or {})})
        yield _data("[DONE]")
    finally:  # a client that left closes the relay now (it cancels the generation)
        await events.aclose()


def sse_response(request, events: AsyncIterator, model: str, request_id: str,
                 include_usage: bool) -> HttpResponseBase:
    """Under ASGI the stream is handed over to ``tenants.api.streaming.StreamRelay`` (sent from
    the event loop after Django's request, and its thread, are done); else Django streams."""
    return event_stream(request, request_id, sse(events, model, request_id, include_usage))
