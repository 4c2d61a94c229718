"""Superseded conversation links, announced to the other workers.

A worker that continues a conversation replaces its K/V link (``ConversationStore.keep``):
in its own L1 and in Redis at once, but the other workers' L1 may still hold the old
link (``/v1``: under the previous messages' key, now unreachable; ``/api/chat``: a
shorter copy under the same key). :class:`LinkBroadcaster` publishes each replacement
on the signed control channel (op ``conv_link``) from a background thread, off the
request path and bounded (a full queue drops the announcement: the copies then age out
of the LRU as before); every worker's handler drops its stale copies
(``ConversationStore.drop_stale``), keeping a copy that is the new link or extends it.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import TYPE_CHECKING, Any

from gpu_worker.channels import control
from injection.base import CacheKey

if TYPE_CHECKING:  # the web imports this module through the handlers: no torch there
    from injection.kvcache.packed import PackedKV

log = logging.getLogger(__name__)
OP = "conv_link"


class LinkBroadcaster:
    """``ConversationStore.on_replaced`` for a serving worker process."""

    def __init__(self, maxsize: int = 1024) -> None:
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue(maxsize)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.published = self.skipped = 0

    def __call__(self, old: CacheKey, new: CacheKey, kv: PackedKV) -> None:
        from injection.kvcache.conversation import link_digest  # worker side only (torch)

        if old.tenant != new.tenant:
            return  # never: a link is replaced within its tenant
        msg = {"tenant": new.tenant, "old": list(old), "new": list(new),
               "tokens": kv.num_tokens, "digest": link_digest(kv.token_ids)}
        try:
            self._queue.put_nowait(msg)
        except queue.Full:
            self.skipped += 1
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="kvi-linkcast",
                                                daemon=True)
                self._thread.start()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued announcement was published (tests, shutdown)."""
        done = threading.Event()
        threading.Thread(target=lambda: (self._queue.join(), done.set()), daemon=True).start()
        return done.wait(timeout)

    def _run(self) -> None:
        while True:
            msg = self._queue.get()
            try:
                control.publish(OP, **msg)  # logs and returns 0 when Redis is down
                self.published += 1
            except Exception:  # noqa: BLE001 - the thread must outlive a bad message
                log.exception("conv_link: publish failed")
            finally:
                self._queue.task_done()


def key_of(fields: Any) -> CacheKey:
    """A CacheKey from a message's list of four strings (ValueError otherwise)."""
    if not isinstance(fields, list) or len(fields) != 4 or not all(
            isinstance(f, str) and f for f in fields):
        raise ValueError("a cache key is four non-empty strings")
    return CacheKey(*fields)
