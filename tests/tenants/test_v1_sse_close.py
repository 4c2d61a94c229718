"""/v1 server-sent events (tenants/v1/stream.py): a client that leaves at any point closes
a relay that has started, so the relay's cancel path (the worker told to stop, the claim
abandoned) always runs. A generator closed before it started runs none of its body: the
role chunk is therefore sent only once the relay is running (it opens with "start")."""

from __future__ import annotations

import asyncio

from tenants.v1.stream import sse


def relay(log: list[str], events):
    async def gen():
        try:
            for event in events:
                log.append(f"yield {event[0]}")
                yield event
        finally:
            log.append("relay closed")  # the real relay cancels the generation here

    return gen()


def run(body, reads: int) -> list[bytes]:
    async def go():
        got = [await body.__anext__() for _ in range(reads)]
        await body.aclose()  # the client went away
        return got

    return asyncio.run(go())


def test_leaving_right_after_the_role_chunk_closes_the_started_relay():
    log: list[str] = []
    body = sse(relay(log, [("start", None), ("delta", "Hi")]), "m", "r1", False)
    got = run(body, 1)
    assert b'"role":"assistant"' in got[0]
    assert log == ["yield start", "relay closed"]


def test_the_stream_itself_is_unchanged():
    log: list[str] = []
    done = {"cache": {}, "conversation": 7, "request_id": "r1", "usage": {}}
    body = sse(relay(log, [("start", None), ("delta", "Hi"), ("done", done)]), "m", "r1", False)

    async def all_chunks():
        return [c async for c in body]

    chunks = asyncio.run(all_chunks())
    assert b'"role":"assistant"' in chunks[0] and b'"content":"Hi"' in chunks[1]
    assert b"finish_reason" in chunks[2] and chunks[-1] == b"data: [DONE]\n\n"
    assert len(chunks) == 4 and b"start" not in b"".join(chunks)
