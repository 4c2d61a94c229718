"""Token streams on real Redis: entries and cancel flags are authenticated before use.

Whoever can write to Redis but lacks KV_SIGNING_SECRET must not put text into a reply's
stream (the relay stops at a forged entry; the stored reply supplies the rest) nor stop a
generation with a cancel flag of their own.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import redis.asyncio as aredis
from django.conf import settings

from gpu_worker.channels import streams
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
        pub._flush(time.monotonic())
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
