"""Token streams on real Redis: entries and cancel flags are authenticated before use.

Whoever can write to Redis but lacks KV_SIGNING_SECRET must not put text into a reply's
stream (the relay stops at a forged entry; the stored reply supplies the rest) nor stop a
generation with a cancel flag of their own.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid

import pytest
import redis
import redis.asyncio as aredis
from django.conf import settings

from gpu_worker.channels import stream_writer, streams
from gpu_worker.client import relay
from gpu_worker.routing import registry


@pytest.fixture
def request_id():
    rid = uuid.uuid4().hex
    yield rid
    registry.redis_client().delete(streams.stream_key(rid), streams.cancel_key(rid))


def _relayed(request_id: str) -> list[str]:
    async def read():
        conn = aredis.Redis.from_url(settings.REDIS_URL)
        try:
            return [p async for p in relay._pieces(conn, request_id, lambda: True,
                                                   time.monotonic() + 5)]
        finally:
            await conn.aclose()

    return asyncio.run(read())


def test_the_workers_pieces_are_relayed_in_order(request_id):
    pub = streams.Publisher(registry.redis_client(), request_id)
    for piece in ("Hello", ", ", "wörld"):
        pub.piece(piece)
        pub.flush()
    pub.end("done")
    key = streams.stream_key(request_id)
    assert registry.redis_client().exists(key)
    assert "".join(_relayed(request_id)) == "Hello, wörld"
    assert not registry.redis_client().exists(key)  # read to its end: deleted, not left to expire


def _forgeries(request_id: str, offset: int) -> dict[str, dict]:
    genuine = streams.sign(request_id, {"o": offset, "t": "FORGED"})
    return {
        "no MAC": {"o": offset, "t": "FORGED"},
        "made up MAC": {"o": offset, "t": "FORGED", "m": "0" * 32},
        "another request's MAC": streams.sign("other-request", {"o": offset, "t": "FORGED"}),
        "text changed": {**genuine, "t": "FORGED!"},
    }


@pytest.mark.parametrize("kind", ["no MAC", "made up MAC", "another request's MAC",
                                  "text changed"])
def test_a_forged_entry_ends_the_relay_before_its_text(request_id, kind):
    client = registry.redis_client()
    pub = streams.Publisher(client, request_id)
    pub.piece("genuine ")
    client.xadd(streams.stream_key(request_id), _forgeries(request_id, pub.sent)[kind])
    pub.sent += len("FORGED")
    pub.piece("tail")
    pub.end("done")
    assert _relayed(request_id) == ["genuine "]


def test_only_a_signed_cancel_flag_stops_the_generation(request_id):
    client = registry.redis_client()
    pub = streams.Publisher(client, request_id, cancel_every=1)
    client.set(streams.cancel_key(request_id), "1")  # e.g. another tenant's process
    assert pub.cancelled() is False
    client.set(streams.cancel_key(request_id), streams.cancel_token(uuid.uuid4().hex))
    assert pub.cancelled() is False
    client.set(streams.cancel_key(request_id), streams.cancel_token(request_id))
    assert pub.cancelled() is True


def test_a_piece_is_stored_sealed_and_one_sealed_under_another_key_ends_the_relay(
        request_id, settings):
    client = registry.redis_client()
    pub = streams.Publisher(client, request_id)
    pub.piece("pistachio ")  # the first piece is flushed at once
    [(_, fields)] = client.xrange(streams.stream_key(request_id))
    assert b"pistachio" not in b"".join(fields.values())  # the broker holds no text
    real = settings.KV_SIGNING_SECRET
    settings.KV_SIGNING_SECRET = "an old secret"
    sealed_before = streams.seal_piece(request_id, pub.sent, "FORGED")
    settings.KV_SIGNING_SECRET = real
    client.xadd(streams.stream_key(request_id),
                streams.sign(request_id, {"o": pub.sent, "t": sealed_before}))  # MAC valid
    pub.sent += len("FORGED")
    pub.piece("tail")
    pub.end("done")
    assert _relayed(request_id) == ["pistachio "]


class HeldWriter(streams.StreamWriter):
    """The process's writer with its thread held: a round runs when the test says."""

    def __init__(self):
        super().__init__(0.0)
        self.marked = []

    def mark(self, pub):
        self.marked.append(pub)

    def round(self):
        pubs, self.marked = list(dict.fromkeys(self.marked)), []
        stream_writer.write_round(pubs)


@pytest.fixture
def held_writer(monkeypatch):
    writer = HeldWriter()
    monkeypatch.setattr(streams, "_WRITER", writer)
    return writer


def _entries(request_id):
    return registry.redis_client().xrange(streams.stream_key(request_id))


def test_later_pieces_wait_for_the_writer_and_arrive_together_in_order(request_id, held_writer):
    """The engine's thread writes only a reply's first piece; the writer sends what the
    reply made meanwhile as one entry, at the right offset."""
    pub = streams.Publisher(registry.redis_client(), request_id)
    pub.piece("Hello")
    assert len(_entries(request_id)) == 1  # the first piece: at once (time to first token)
    pub.piece(", ")
    pub.piece("wörld")
    assert len(_entries(request_id)) == 1  # nothing written by the engine's thread
    held_writer.round()
    entries = _entries(request_id)
    assert [int(f[b"o"]) for _, f in entries] == [0, 5]
    pub.piece("!")
    pub.end("done")  # writes what is pending, then the end mark
    assert "".join(_relayed(request_id)) == "Hello, wörld!"
    held_writer.round()  # the mark left by "!" finds nothing: no entry after the end
    assert not registry.redis_client().exists(streams.stream_key(request_id))


def test_one_round_writes_every_replys_pending_text(held_writer):
    rids = [uuid.uuid4().hex for _ in range(3)]
    client = registry.redis_client()
    try:
        pubs = [streams.Publisher(client, rid) for rid in rids]
        for i, pub in enumerate(pubs):
            pub.piece(f"reply {i}: ")
            pub.piece("one ")
            pub.piece("two")
        held_writer.round()
        for i, (pub, rid) in enumerate(zip(pubs, rids, strict=True)):
            pub.end("done")
            assert "".join(_relayed(rid)) == f"reply {i}: one two"
    finally:
        client.delete(*(streams.stream_key(r) for r in rids))


def test_the_writer_thread_keeps_each_replys_order_while_replies_end(monkeypatch):
    """The real writer thread: whatever the interleaving of its rounds with the pieces
    and with ``end``, every reply arrives whole and in order."""
    writer = streams.StreamWriter(0.0, sleep=lambda s: time.sleep(0.0005))
    monkeypatch.setattr(streams, "_WRITER", writer)
    rids = [uuid.uuid4().hex for _ in range(4)]
    client = registry.redis_client()
    words = [f"w{i} " for i in range(150)]

    def reply(rid):
        pub = streams.Publisher(client, rid)
        for w in words:
            pub.piece(w)
        pub.end("done")

    try:
        threads = [threading.Thread(target=reply, args=(rid,)) for rid in rids]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for rid in rids:
            assert "".join(_relayed(rid)) == "".join(words)
    finally:
        client.delete(*(streams.stream_key(r) for r in rids))


def test_a_redis_that_fails_stops_the_stream_not_the_generation(request_id, held_writer):
    dead = redis.Redis(host="127.0.0.1", port=_free_port(), socket_connect_timeout=0.2)
    pub = streams.Publisher(dead, request_id)
    pub.piece("first")  # written at once: fails, marks the stream broken, raises nothing
    pub.piece(" second")
    held_writer.round()
    pub.end("done")
    assert pub.broken


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
