"""The worker's streamed pieces written to Redis by a thread of their own.

A streamed reply's text comes from the batch engine's scheduler thread, between decoding
steps. Written there, every reply in the batch cost that thread a seal, a MAC and a Redis
round trip each step while the model waited: at 8 replies at once, about a tenth of the
scheduler's time (docs/benchmarks/vs-peer.md). Now a piece after the first only joins its
publisher's pending text (``Publisher.piece``), and one writer thread per process sends
every publisher's pending text in one pipeline, at most every ``interval`` seconds, so a
round carries what all the replies made meanwhile.

Order: a publisher's entries are taken and written under its ``write_lock``, so they reach
Redis in the order their text was made, whoever writes them (the writer, the first piece's
own thread, ``end``). A pipeline that fails marks its publishers broken, as one write did.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import redis

log = logging.getLogger(__name__)


class Pending(Protocol):
    """A publisher as the writer sees it (``streams.Publisher``)."""

    client: redis.Redis
    write_lock: threading.Lock
    broken: bool

    def take(self) -> list[dict]: ...

    def queue(self, pipe: Any, entries: list[dict]) -> None: ...

    def failed(self, exc: Exception) -> None: ...


class StreamWriter:
    """One thread that writes marked publishers' pending entries, in rounds at least
    ``interval`` seconds apart (``sleep``: how it waits between rounds)."""

    def __init__(self, interval: float, sleep: Callable[[float], None] = time.sleep) -> None:
        self.interval, self._sleep = interval, sleep
        self._cond = threading.Condition()
        self._marked: dict[Any, None] = {}  # publishers with pending text, in marking order
        self._thread: threading.Thread | None = None
        self.rounds = 0

    def mark(self, pub: Pending) -> None:
        """``pub`` has pending text: the next round writes it."""
        with self._cond:
            self._marked[pub] = None
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="kvi-stream-writer",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._marked:
                    self._cond.wait()
                pubs, self._marked = list(self._marked), {}
            try:
                write_round(pubs)
            except Exception:  # never lose the thread; the results carry the whole replies
                log.exception("stream writer: a round failed")
            self.rounds += 1
            self._sleep(self.interval)


def write_round(pubs: list[Pending]) -> None:
    """Every publisher's pending entries, one pipeline per Redis client."""
    by_client: dict[int, list[Pending]] = {}
    for pub in pubs:
        by_client.setdefault(id(pub.client), []).append(pub)
    for group in by_client.values():
        _write_group(group)


def _write_group(pubs: list[Pending]) -> None:
    held = []
    try:
        for pub in pubs:
            pub.write_lock.acquire()
            held.append(pub)
        live = [(pub, entries) for pub in pubs if not pub.broken and (entries := pub.take())]
        if not live:
            return
        pipe = live[0][0].client.pipeline(transaction=False)
        for pub, entries in live:
            pub.queue(pipe, entries)
        try:
            pipe.execute()
        except redis.RedisError as exc:
            for pub, _ in live:
                pub.failed(exc)
    finally:
        for pub in held:
            pub.write_lock.release()
