"""Web side of a streamed chat: claim and dispatch (sync), then relay the worker's pieces.

:func:`start_chat` runs in the request's thread like ``client.run_chat``. :func:`events`
is an async generator that runs on the ASGI event loop (no thread per open stream): it
reads the request's Redis stream (``gpu_worker.channels.streams``) with blocking ``XREAD`` and
yields ``("delta", text)`` pieces, then the authoritative result as ``("done", body)``
(or ``("error", PlatformError)``). If a piece is lost or Redis is slow, it stops relaying
and the final result supplies the rest of the reply. If the client goes away, it sets the
request's cancel flag (the worker stops within a few tokens) and abandons the claim.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, NamedTuple

import redis
import redis.asyncio as aredis
from asgiref.sync import sync_to_async
from django.conf import settings

from gpu_worker.channels import streams
from gpu_worker.client import dispatch as client
from gpu_worker.ops import metrics
from tenants import actions, errors

log = logging.getLogger(__name__)
POLL_MS = 500  # XREAD block; the task's state is checked between reads


class Started(NamedTuple):
    request_id: str
    key: str
    dispatched: client.Dispatched | None  # None when replayed
    replay: dict[str, Any] | None


def start_chat(member, conversation_id, message: str, params: dict, key: str | None,
               request_id: str) -> Started:
    """Claim (or replay) and dispatch a streamed chat turn; errors are ``tenants.errors``."""
    claim = client.claim_chat(member, conversation_id, message, params, key, request_id)
    key = key or claim.request_id
    if claim.replay is not None:
        metrics.CHAT_REQUESTS.labels("replayed").inc()
        return Started(claim.request_id, key, None, claim.replay)
    try:
        dispatched = client.dispatch_chat(member.pk, conversation_id, message,
                                          {**params, "stream": True}, claim.request_id)
    except errors.PlatformError as exc:
        stored = client.stopped_waiting(member, claim.request_id, key, exc)
        return Started(claim.request_id, key, None, stored)
    return Started(claim.request_id, key, dispatched, None)


async def events(member, started: Started) -> AsyncIterator[tuple[str, Any]]:
    if started.replay is not None:
        yield "delta", started.replay["reply"]
        yield "done", started.replay
        return
    conn = _connect()
    relayed: list[str] = []
    outcome = "error"
    deadline = time.monotonic() + settings.CHAT_RESULT_TIMEOUT
    try:
        # first, inside the try: a client gone before any text still cancels the worker
        # (a generator closed before it started runs none of its body)
        yield "start", None
        async for piece in _pieces(conn, started.request_id, started.dispatched.result.ready,
                                   deadline):
            relayed.append(piece)
            yield "delta", piece
        try:
            body = await sync_to_async(_final, thread_sensitive=False)(
                member, started, max(1.0, deadline - time.monotonic()))
        except errors.PlatformError as exc:
            yield "error", exc
            return
        rest = _rest(body["reply"], "".join(relayed))
        if rest:
            yield "delta", rest
        outcome = "ok"
        yield "done", body
    except (asyncio.CancelledError, GeneratorExit):
        outcome = "disconnected"
        await _cancel(conn, member, started.request_id)
        raise
    finally:
        metrics.STREAMS.labels(outcome).inc()
        await conn.aclose()


async def task_events(task_id: str, timeout: float,
                      wait: Callable[[str, float], dict[str, Any]]) -> AsyncIterator[tuple[str, Any]]:
    """Any streamed task (the admin playground): ("delta", text)..., then ("done", ``wait``'s
    outcome for the task). A reader that goes away sets the task's cancel flag."""
    from celery.result import AsyncResult

    from config.celery import app

    ready = AsyncResult(task_id, app=app).ready
    conn = _connect()
    deadline = time.monotonic() + timeout
    try:
        async for piece in _pieces(conn, task_id, ready, deadline):
            yield "delta", piece
        left = max(1.0, deadline - time.monotonic())
        yield "done", await sync_to_async(wait, thread_sensitive=False)(task_id, left)
    except (asyncio.CancelledError, GeneratorExit):
        await _flag_cancelled(conn, task_id)
        raise
    finally:
        await conn.aclose()


async def _pieces(conn, request_id: str, ready: Callable[[], bool],
                  deadline: float) -> AsyncIterator[str]:
    """The worker's pieces in order, until its end mark, a gap, a fault or the deadline."""
    key, last, sent = streams.stream_key(request_id), "0-0", 0
    while time.monotonic() < deadline:
        try:
            reply = await conn.xread({key: last}, count=256, block=POLL_MS)
        except redis.RedisError as exc:
            log.warning("stream %s unreadable (%s); waiting for the result", key, exc)
            return
        if not reply:
            if await sync_to_async(ready, thread_sensitive=False)():
                return  # finished, but its end mark never came
            continue
        for entry_id, fields in reply[0][1]:
            last = entry_id
            if not streams.verify(request_id, fields):  # not the worker's: use nothing more
                metrics.STREAMS.labels("forged").inc()
                log.warning("stream %s: an entry failed authentication; relaying stops", key)
                return
            if b"end" in fields:  # read to its end by its only reader: gone now, not in
                await _drop(conn, key)  # STREAM_TTL (an idle platform keeps no streams)
                return
            if int(fields[b"o"]) != sent:  # a lost piece: the result supplies the rest
                metrics.STREAMS.labels("gap").inc()
                return
            try:
                text = streams.open_piece(request_id, sent, fields[b"t"])
            except errors.SealedPayloadRejected:  # another key: the result supplies the rest
                metrics.STREAMS.labels("forged").inc()
                log.warning("stream %s: a piece did not open; relaying stops", key)
                return
            sent += len(text)
            yield text


async def _drop(conn, key: str) -> None:
    try:
        await conn.delete(key)
    except redis.RedisError as exc:  # it expires anyway (streams.STREAM_TTL)
        log.warning("stream %s not deleted (%s); it expires", key, exc)


def _final(member, started: Started, timeout: float) -> dict[str, Any]:
    body = client.finish_chat(member, started.dispatched, started.request_id, started.key,
                              timeout)
    body.pop("worker", None)
    return body


def _rest(reply: str, relayed: str) -> str:
    """What the client has not seen yet (nothing if what it saw is not the reply's start)."""
    if reply.startswith(relayed):
        return reply[len(relayed):]
    metrics.STREAMS.labels("diverged").inc()  # e.g. a post-filter changed the text
    log.warning("streamed text is not a prefix of the stored reply")
    return ""


def _connect() -> aredis.Redis:
    return aredis.Redis.from_url(settings.REDIS_URL, socket_timeout=POLL_MS / 1000 + 2,
                                 socket_connect_timeout=1)


async def _flag_cancelled(conn, request_id: str) -> None:
    """Tell the worker to stop (its stopping criterion polls the signed flag)."""
    try:
        await conn.set(streams.cancel_key(request_id), streams.cancel_token(request_id),
                       ex=streams.CANCEL_TTL)
    except redis.RedisError as exc:
        log.warning("could not flag %s cancelled: %s", request_id, exc)


async def _cancel(conn, member, request_id: str) -> None:
    """The client left: tell the worker to stop, and never store the reply."""
    await _flag_cancelled(conn, request_id)
    await sync_to_async(actions.do_abandon_chat, thread_sensitive=False)(
        member, request_id, "client_disconnected")
