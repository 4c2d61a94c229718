"""The cache Redis' contents by kind on the web's ``/metrics``, scanned once for all.

Each web process scrapes ``/metrics``; what the cache Redis holds (tenant segments, member
segments, conversation links: entries and bytes) takes a SCAN of its whole keyspace. Here
one web process at a time makes it, at most every ``METRICS_L2_SCAN_SECONDS``: the first to
find the shared figures older than that takes a lock in the cache Redis (``SET NX`` with an
expiry, so a process that dies while scanning holds it no longer than ``LOCK_TTL``), scans
once (``RedisKVTier.stats``: one pass bucketed by tenant), and leaves the figures there for
every other process; the others serve the last shared figures meanwhile. The figures are
sums over tenants (no tenant named); a process-local lock keeps concurrent scrapes of one
process from scanning twice.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import redis
from prometheus_client.core import GaugeMetricFamily, Metric

__all__ = ["FIGURES_KEY", "LOCK_KEY", "L2Collector"]

log = logging.getLogger(__name__)

FIGURES_KEY = "kvi-metrics:l2-kinds"  # outside the tier's namespace (``kvi:``)
LOCK_KEY = "kvi-metrics:l2-kinds:lock"
LOCK_TTL = 300  # seconds: longer than a scan of a large cache takes


class L2Collector:
    """``kvi_l2_kind_bytes``/``kvi_l2_kind_entries`` from the shared figures."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock  # wall time: the figures' age is compared across processes
        self._lock = threading.Lock()
        self.scans = 0  # scans this process made

    def collect(self) -> Iterator[Metric]:
        kinds = self.kinds()
        if kinds is None:
            return
        size = GaugeMetricFamily("kvi_l2_kind_bytes", "Bytes in the cache Redis by kind",
                                 labels=["kind"])
        count = GaugeMetricFamily("kvi_l2_kind_entries", "Entries in the cache Redis by kind",
                                  labels=["kind"])
        for kind, row in kinds.items():
            size.add_metric([kind], row["bytes"])
            count.add_metric([kind], row["entries"])
        yield from (size, count)

    def kinds(self) -> dict[str, dict[str, int]] | None:
        """The shared figures, scanned again first when they are stale and no other process
        is scanning; None when the cache Redis (or Postgres) did not answer."""
        from django.conf import settings

        from gpu_worker.channels import kvstore

        try:
            client = kvstore.cache_client()
            every = settings.METRICS_L2_SCAN_SECONDS
            with self._lock:
                shared = _read(client)
                stale = shared is None or self.clock() - shared["at"] >= every
                if stale and client.set(LOCK_KEY, b"1", nx=True, ex=LOCK_TTL):
                    shared = self._scan_and_share(client, every)
            return shared["kinds"] if shared is not None else None
        except redis.RedisError as exc:
            log.warning("metrics: cache sizes unavailable: %s", exc)
            return None  # a scrape never fails for them

    def _scan_and_share(self, client: redis.Redis, every: float) -> dict[str, Any] | None:
        try:
            kinds = _scan()
            if kinds is None:
                return _read(client)
            shared = {"at": self.clock(), "kinds": kinds}
            client.set(FIGURES_KEY, json.dumps(shared), ex=max(60, int(every * 10)))
            self.scans += 1
            return shared
        finally:
            client.delete(LOCK_KEY)


def _read(client: redis.Redis) -> dict[str, Any] | None:
    raw = client.get(FIGURES_KEY)
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None  # not ours: scanned again


def _scan() -> dict[str, dict[str, int]] | None:
    from django.db import DatabaseError

    from gpu_worker.channels import kvstore
    from gpu_worker.ops.cachestats import l2_kind_sizes
    from tenants.models import Tenant

    try:
        ids = [str(pk) for pk in Tenant.objects.values_list("pk", flat=True)]
        tier = kvstore.l2_tier()
        return l2_kind_sizes(tier, ids, tier.stats(scan=True, tenants=ids))
    except DatabaseError as exc:
        log.warning("metrics: cache sizes unavailable: %s", exc)
        return None
