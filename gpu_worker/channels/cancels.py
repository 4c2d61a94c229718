"""The cancel flags of every generation a worker process runs, read together.

Each generating row asks "cancelled?" every few tokens on the batch engine's scheduler
thread (``CancelWatch.cancelled``, called by ``injection.engine.stopping``). Asked one by
one that was a Redis GET per row every other step, on the one thread every row of the batch
waits for. A :class:`CancelBoard` (one per Redis client) answers them all from one
``MGET`` of every live watch's flag per round: the first watch to ask again after it has
read the last round's answer (or a watch the last round did not cover) starts the next
round, the others read it, so a batch of k rows costs one ``MGET`` per step, not k.

A circuit breaker keeps a faulty Redis off that thread: a round that fails (Redis down, a
socket timeout) or takes longer than ``slow_s`` opens it for ``open_s`` seconds, during which
every flag reads "not cancelled" without asking Redis (a request still ends by its own
limits: its tokens, its stop strings, its time limit; its reply is stored and billed as
usual). After ``open_s`` one round is tried again (half-open); it closes the breaker when it
succeeds in time.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import redis

__all__ = ["CancelBoard", "board_for"]

log = logging.getLogger(__name__)

SLOW_S = 0.1  # a round slower than this opens the breaker (its answer is still used)
OPEN_S = 5.0  # how long an open breaker keeps Redis unasked


class CancelBoard:
    """Rounds of one ``MGET`` over the flags of the live watches of one Redis client."""

    def __init__(self, client: redis.Redis, *, slow_s: float = SLOW_S, open_s: float = OPEN_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client, self.slow_s, self.open_s, self.clock = client, slow_s, open_s, clock
        self._lock = threading.Lock()
        self._watches: weakref.WeakSet[Any] = weakref.WeakSet()
        self._flags: dict[str, bytes | None] = {}  # the last round's, by flag key
        self.round = 0
        self.open_until = -1e18
        self.counters = {"rounds": 0, "faults": 0, "slow": 0, "skipped": 0}

    def add(self, watch: Any) -> None:
        """Read ``watch``'s flag in every round from now on, as long as it lives."""
        with self._lock:
            self._watches.add(watch)

    def flag(self, watch: Any) -> bytes | None:
        """``watch``'s flag value as of a round it has not read yet (None: no flag, or the
        breaker is open). ``watch``: a ``key`` and the ``seen`` round it last read."""
        with self._lock:
            self._watches.add(watch)
            if watch.seen >= self.round or watch.key not in self._flags:
                if not self._next_round():
                    return None
            watch.seen = self.round
            return self._flags.get(watch.key)

    @property
    def open(self) -> bool:
        return self.clock() < self.open_until

    def _next_round(self) -> bool:
        """One ``MGET`` of every live watch's flag (under the lock); False while the breaker
        is open or when the round failed (then it opens)."""
        if self.open:
            self.counters["skipped"] += 1
            return False
        keys = sorted({w.key for w in self._watches})
        started = self.clock()
        try:
            values = self.client.mget(keys)
        except redis.RedisError as exc:
            self._trip("faults", exc)
            return False
        self._flags = dict(zip(keys, values, strict=True))
        self.round += 1
        self.counters["rounds"] += 1
        if self.clock() - started > self.slow_s:
            self._trip("slow", f"a round took {self.clock() - started:.3f}s")
        return True

    def _trip(self, why: str, detail: Any) -> None:
        self.counters[why] += 1
        self.open_until = self.clock() + self.open_s
        log.warning("cancel flags: Redis %s (%s); read as not cancelled for %.0fs", why,
                    detail, self.open_s)


_BOARDS: weakref.WeakKeyDictionary[redis.Redis, CancelBoard] = weakref.WeakKeyDictionary()
_BOARDS_LOCK = threading.Lock()


def board_for(client: redis.Redis) -> CancelBoard:
    """The board of ``client`` (one per client, made on first use)."""
    with _BOARDS_LOCK:
        board = _BOARDS.get(client)
        if board is None:
            board = _BOARDS[client] = CancelBoard(client)
        return board
