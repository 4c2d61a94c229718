"""Token streams between a GPU worker and the web, per request, over Redis.

* ``kvi:stream:<request_id>``: a Redis stream the worker appends to while it generates:
  ``{o: offset, t: text}`` per piece (``o`` = characters sent before it, so the reader
  detects a lost piece; ``t`` sealed, :func:`seal_piece`), then ``{end: done|cancelled|error}``. It expires ``STREAM_TTL``
  seconds after the last write. The first piece is written at once; later ones by the
  process's writer thread (``stream_writer``), every reply's pending text in one pipeline
  per round, rounds ``FLUSH_S`` apart: fewer Redis writes and SSE events, same text, and
  no Redis round trip on the batch engine's thread.
* ``kvi:cancel:<request_id>``: set by the web when its client went away or when it stops
  waiting for the result (:func:`flag_cancelled`; streamed or not); the worker's stopping
  criterion polls it (:class:`CancelWatch`) and ends the generation within a few tokens.

Request ids are random 128-bit values made by the web per request, never chosen by a
client, so a stream can only be read by the web process that dispatched it. The stream
is a fast path: the task's result (and the reply stored in Postgres) stays authoritative.

Both are authenticated like the L2 cache: every entry carries ``m``, an HMAC (key derived
from ``KV_SIGNING_SECRET`` and the request id) over its fields, checked before the reader
uses it (:func:`verify`); the cancel flag's value is such a MAC too. Whoever can write to
Redis without the secret can neither put text in a reply's stream nor stop a generation.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
from typing import Any

import redis
from django.conf import settings

from config import security
from gpu_worker.channels import cancels
from gpu_worker.channels.stream_writer import StreamWriter
from tenants import sealing

log = logging.getLogger(__name__)
STREAM_TTL = 300  # seconds
CANCEL_TTL = 300
MAX_ENTRIES = 8192  # approximate cap per stream
FLUSH_S = 0.02  # the writer's rounds, at least this far apart: pieces after the first coalesce


def stream_key(request_id: str) -> str:
    return f"kvi:stream:{request_id}"


def cancel_key(request_id: str) -> str:
    return f"kvi:cancel:{request_id}"


def _mac(request_id: str, *parts: bytes, secret: bytes | None = None) -> bytes:
    secret = settings.KV_SIGNING_SECRET.encode() if secret is None else secret
    key = hmac.new(secret, b"kvi-stream\0" + request_id.encode(), hashlib.sha256).digest()
    return hmac.new(key, b"\0".join(parts), hashlib.sha256).hexdigest()[:32].encode()


def _genuine(tag: bytes | None, request_id: str, *parts: bytes) -> bool:
    """``tag`` is the MAC under KV_SIGNING_SECRET or, while a rotation rolls out, a fallback."""
    return tag is not None and any(
        hmac.compare_digest(tag, _mac(request_id, *parts, secret=s))
        for s in security.secrets_accepted())


def sign(request_id: str, fields: dict) -> dict:
    """``fields`` (``o``/``t`` or ``end``) with their MAC ``m``."""
    parts = [f"{k}={v}".encode() for k, v in sorted(fields.items())]
    return {**fields, "m": _mac(request_id, *parts)}


def verify(request_id: str, fields: dict[bytes, bytes]) -> bool:
    """Is this entry (as read back from Redis) the worker's?"""
    tag = fields.get(b"m")
    parts = [k + b"=" + v for k, v in sorted(fields.items()) if k != b"m"]
    return _genuine(tag, request_id, *parts)


def seal_piece(request_id: str, offset: int, text: str) -> str:
    """A piece's text as stored in the stream: sealed (``tenants.sealing``) for this
    request and offset, so the broker's disk never holds the reply."""
    return sealing.seal_bytes(sealing.STREAM_PIECE, f"{request_id}:{offset}", text.encode())


def open_piece(request_id: str, offset: int, stored: bytes) -> str:
    """The text of a piece read back (SealedPayloadRejected when it does not open)."""
    return sealing.open_bytes(sealing.STREAM_PIECE, f"{request_id}:{offset}", stored).decode()


def cancel_token(request_id: str) -> bytes:
    """The value of a genuine cancel flag for ``request_id``."""
    return _mac(request_id, b"cancel")


class CancelWatch:
    """Worker side of one request's cancel flag, for a generation that is not streamed.
    Read with every other running request's in one round (``cancels.CancelBoard``: one MGET
    per step for the whole batch, behind a circuit breaker). Redis faults never fail the
    generation (it runs on, and its result is stored)."""

    def __init__(self, client: redis.Redis, request_id: str, *, cancel_every: int = 2) -> None:
        self.client, self.request_id = client, request_id
        self.key, self.seen = cancel_key(request_id), 0  # the board's round last read
        self.cancel_every = max(1, cancel_every)
        self._polls = 0
        self._board = cancels.board_for(client)
        self._board.add(self)

    def cancelled(self) -> bool:
        """Has the client gone away, or the web stopped waiting? (polled by the stopping
        criterion every token; the flag is read every ``cancel_every`` polls; a Redis that
        fails or is slow reads as not cancelled: the generation goes on to its own end)"""
        self._polls += 1
        if self._polls % self.cancel_every:
            return False
        return _genuine(self._board.flag(self), self.request_id, b"cancel")


class Publisher(CancelWatch):
    """Worker side of one request's stream (and its cancel flag). The first piece is
    written at once by the thread that made it (the time to the first token); later ones
    join the pending text, which the process's writer sends in rounds (``stream_writer``);
    ``end`` writes what is pending, then the end mark. Redis faults never fail the
    generation."""

    def __init__(self, client: redis.Redis, request_id: str, *, cancel_every: int = 2) -> None:
        super().__init__(client, request_id, cancel_every=cancel_every)
        self.stream = stream_key(request_id)
        self.sent = 0  # characters taken into entries so far
        self.broken = False
        self.write_lock = threading.Lock()  # held while entries are taken and written
        self._buf_lock = threading.Lock()
        self._buf, self._started = "", False

    def piece(self, text: str) -> None:
        with self._buf_lock:
            self._buf += text
            first, self._started = not self._started, True
        if first:
            self.flush()
        else:
            _WRITER.mark(self)

    def flush(self) -> None:
        """Write the pending text now."""
        with self.write_lock:
            self._write(self.take())

    def end(self, status: str) -> None:
        with self.write_lock:
            self._write([*self.take(), {"end": status}])

    def take(self) -> list[dict]:
        """The pending text as an entry (none if there is none); ``write_lock`` held."""
        with self._buf_lock:
            text, self._buf = self._buf, ""
        if not text:
            return []
        entry = {"o": self.sent, "t": seal_piece(self.request_id, self.sent, text)}
        self.sent += len(text)
        return [entry]

    def queue(self, pipe: Any, entries: list[dict]) -> None:
        for fields in entries:
            pipe.xadd(self.stream, sign(self.request_id, fields), maxlen=MAX_ENTRIES,
                      approximate=True)
        pipe.expire(self.stream, STREAM_TTL)

    def failed(self, exc: Exception) -> None:  # the final result still carries the reply
        self.broken = True
        log.warning("stream %s: Redis unavailable, streaming stops: %s", self.stream, exc)

    def _write(self, entries: list[dict]) -> None:
        if self.broken or not entries:
            return
        try:
            pipe = self.client.pipeline(transaction=False)
            self.queue(pipe, entries)
            pipe.execute()
        except redis.RedisError as exc:
            self.failed(exc)


_WRITER = StreamWriter(FLUSH_S)
_client: redis.Redis | None = None


def _shared() -> redis.Redis:
    """The process's stream client (short timeouts: Redis faults never hold a request)."""
    global _client
    if _client is None:
        from gpu_worker.channels.control import make_client

        _client = make_client(0.5, settings.REDIS_URL)
    return _client


def publisher(request_id: str) -> Publisher:
    """A publisher on the worker's shared stream client."""
    return Publisher(_shared(), request_id)


def cancel_watch(request_id: str) -> CancelWatch:
    """The cancel flag's watch for a generation that is not streamed."""
    return CancelWatch(_shared(), request_id)


def flag_cancelled(request_id: str) -> bool:
    """Web side (sync): tell the worker running ``request_id`` to stop, because nobody will
    read its reply (the web stopped waiting). Never raises: False when Redis refused
    (the worker then generates to its end, and its reply is billed, not stored)."""
    try:
        _shared().set(cancel_key(request_id), cancel_token(request_id), ex=CANCEL_TTL)
    except redis.RedisError as exc:
        log.warning("could not flag %s cancelled: %s", request_id, exc)
        return False
    return True
