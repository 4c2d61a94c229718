"""Warms queued after an edit, held in the worker process until its engine is idle.

A background ``warm_member`` (``KV_WARM_ON_EDIT``) must not run beside live chats (its
segment's prefill and its lean's 8 probes filled the batch: docs/BENCHMARKS.md, warm on
edit). It used to be put back on the broker when the worker was busy, every 5-15 s for up to
``KV_WARM_EXPIRES``: about 60 re-published messages per edited member under load. Now the
task acknowledges at once and hands the warm to :class:`IdleWarms`, which holds it here
(one per member: the latest edit's outbox row wins; at most ``max_members``, further ones
dropped and counted) and runs them one at a time on a thread of its own, each once the
engine has been idle for ``quiet_s``. A warm held longer than ``expires_s`` is dropped, as
its message expired in the queue before. What is held is lost when the process stops: the
member's next chat computes the segment and lean itself, as it would have without the warm.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

__all__ = ["Held", "IdleWarms"]

log = logging.getLogger(__name__)


class Held(NamedTuple):
    member_id: int
    after_outbox: int | None  # the latest edit's invalidation, applied first
    worker: str  # the worker name the task ran under (its affinity)
    since: float  # monotonic seconds when it was first held


class IdleWarms:
    """Warms held until ``idle()``; ``run(held)`` computes one (on this object's thread)."""

    def __init__(self, run: Callable[[Held], None], idle: Callable[[], bool], *,
                 max_members: int = 1024, quiet_s: float = 0.5, expires_s: float = 600.0,
                 clock: Callable[[], float] = time.monotonic,
                 count: Callable[[str], None] = lambda outcome: None,
                 tidy: Callable[[], None] = lambda: None) -> None:
        """``tidy``: called on the thread around each pass (its database connections)."""
        self.run, self.idle, self.clock, self.count = run, idle, clock, count
        self.tidy = tidy
        self.max_members, self.quiet_s, self.expires_s = max_members, quiet_s, expires_s
        self._held: OrderedDict[int, Held] = OrderedDict()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, member_id: int, after_outbox: int | None, worker: str, *,
            start: bool = True) -> bool:
        """Hold a warm of ``member_id`` (one a member: a later edit's outbox row replaces an
        earlier's); False when it was dropped (``max_members`` held). ``start``: the thread
        that runs them (off: ``run_ready`` is called by hand)."""
        with self._cond:
            held = self._held.get(member_id)
            if held is not None:
                after = max((a for a in (held.after_outbox, after_outbox) if a is not None),
                            default=None)
                self._held[member_id] = held._replace(after_outbox=after, worker=worker)
                self.count("merged")
                return True
            if len(self._held) >= self.max_members:
                self.count("dropped")
                return False
            self._held[member_id] = Held(member_id, after_outbox, worker, self.clock())
            self.count("held")
            self._cond.notify()
        if start:
            self._start()
        return True

    def pending(self) -> list[int]:
        with self._cond:
            return list(self._held)

    def run_ready(self) -> int:
        """Run held warms, oldest first, while the engine is idle; returns how many ran
        (expired ones are dropped, not run)."""
        ran = 0
        while True:
            held = self._next()
            if held is None:
                return ran
            if self.clock() - held.since > self.expires_s:
                self.count("expired")
                continue
            try:
                self.run(held)
                ran += 1
            except Exception:  # one warm's failure (Postgres down, …) never stops the rest
                self.count("failed")
                log.warning("held warm of member %s failed", held.member_id, exc_info=True)

    def _next(self) -> Held | None:
        with self._cond:
            if not self._held:
                return None
        if not self.idle():  # outside the lock: it may wait for the engine to stay idle
            return None
        with self._cond:
            return self._held.popitem(last=False)[1] if self._held else None

    def _start(self) -> None:
        with self._cond:
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(target=self._loop, name="idle-warms", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._held:
                    self._cond.wait()
            self.tidy()
            try:
                self.run_ready()
            finally:
                self.tidy()
            time.sleep(self.quiet_s)  # busy (or just ran one): look again after a while
