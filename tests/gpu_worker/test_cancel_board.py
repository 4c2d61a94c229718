"""The cancel flags of a batch's rows, read together on real Redis (``channels.cancels``):
one MGET per step for k rows, not a GET per row; a Redis that is down or slow opens a breaker
under which flags read "not cancelled" without a command sent, until one try after
``open_s``."""

from __future__ import annotations

import uuid

import pytest
import redis
from django.conf import settings

from gpu_worker.channels import cancels, streams
from tests.throwaway import ThrowawayRedis


class CountingRedis(redis.Redis):
    """The real client, counting the commands it sends (and failed to send)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.commands: list[str] = []
        self.on_command = None

    def execute_command(self, *args, **options):
        self.commands.append(str(args[0]).upper())
        if self.on_command is not None:
            self.on_command()
        return super().execute_command(*args, **options)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def client():
    c = CountingRedis.from_url(settings.REDIS_URL, socket_timeout=2)
    ids = [uuid.uuid4().hex for _ in range(5)]
    yield c, ids
    c.delete(*(streams.cancel_key(r) for r in ids))
    c.close()


def _board(c: redis.Redis, clock: Clock) -> cancels.CancelBoard:
    board = cancels.CancelBoard(c, clock=clock)
    cancels._BOARDS[c] = board  # the watches of ``c`` read this one
    return board


def test_k_rows_cost_one_mget_per_step_and_each_reads_its_own_flag(client):
    c, ids = client
    board = _board(c, Clock())
    watches = [streams.CancelWatch(c, r, cancel_every=1) for r in ids]
    for r in ids[1:3]:
        c.set(streams.cancel_key(r), streams.cancel_token(r))
    c.set(streams.cancel_key(ids[3]), streams.cancel_token(ids[0]))  # another's: no
    c.commands.clear()
    steps = [[w.cancelled() for w in watches] for _ in range(3)]  # as the scheduler asks
    assert steps == [[False, True, True, False, False]] * 3
    assert c.commands == ["MGET"] * 3 and board.counters["rounds"] == 3
    # a flag set between two steps is seen at the next
    c.set(streams.cancel_key(ids[4]), streams.cancel_token(ids[4]))
    c.commands.clear()
    assert [w.cancelled() for w in watches][4] is True and c.commands == ["MGET"]


def test_a_watch_asking_every_other_token_reads_every_other_round(client):
    c, ids = client
    _board(c, Clock())
    watches = [streams.CancelWatch(c, r) for r in ids]  # the worker's default: every 2
    c.commands.clear()
    for _ in range(4):
        assert not any(w.cancelled() for w in watches)
    assert c.commands == ["MGET"] * 2


def test_a_redis_that_is_down_opens_the_breaker_and_flags_read_not_cancelled(tmp_path):
    server = ThrowawayRedis(tmp_path / "redis").start()
    c = CountingRedis.from_url(server.url, socket_timeout=0.5, socket_connect_timeout=0.5)
    clock = Clock()
    board = _board(c, clock)
    rid = uuid.uuid4().hex
    watch = streams.CancelWatch(c, rid, cancel_every=1)
    try:
        c.set(streams.cancel_key(rid), streams.cancel_token(rid))
        assert watch.cancelled() is True
        server.kill()
        c.commands.clear()
        assert watch.cancelled() is False and board.open  # the failed round opens it
        tried = len(c.commands)
        assert [watch.cancelled() for _ in range(20)] == [False] * 20
        assert len(c.commands) == tried  # nothing sent while open
        assert board.counters["faults"] == 1 and board.counters["skipped"] == 20
        clock.now += cancels.OPEN_S + 0.1  # half-open: one try, which fails again
        assert watch.cancelled() is False and len(c.commands) > tried
        assert board.counters["faults"] == 2 and board.open
    finally:
        server.kill()
        c.close()


def test_a_slow_redis_opens_the_breaker_too(client):
    c, ids = client
    clock = Clock()
    board = _board(c, clock)
    watch = streams.CancelWatch(c, ids[0], cancel_every=1)
    c.set(streams.cancel_key(ids[0]), streams.cancel_token(ids[0]))

    def slow() -> None:  # each command answers 0.2 s later on the board's clock
        clock.now += 0.2

    c.on_command = slow
    assert watch.cancelled() is True  # the slow round's answer is used
    assert board.open and board.counters["slow"] == 1
    c.commands.clear()
    assert watch.cancelled() is False and c.commands == []
