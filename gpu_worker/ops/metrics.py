"""Prometheus metrics for web processes (``/metrics``) and workers (``WORKER_METRICS_PORT``).

Process counters are prometheus_client objects; engine and queue figures are read at
scrape time (``EngineCollector`` from the executor's ``stats()``, ``QueueCollector``
from Redis), so they are exact and cost nothing between scrapes. Tenant labels carry
the tenant id, never its slug.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import redis
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpu_worker.ops.l2metrics import L2Collector

log = logging.getLogger(__name__)
_SECONDS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120)

# web side
CHAT_DISPATCH = Counter("kvi_chat_dispatch", "Chat requests dispatched, by route", ["route"])
CHAT_REQUESTS = Counter("kvi_chat_requests", "Chat requests answered, by outcome", ["outcome"])
CHAT_SECONDS = Histogram("kvi_chat_seconds", "Chat round trip seen by the web", buckets=_SECONDS)
STREAMS = Counter("kvi_chat_streams", "Streamed chats relayed by the web, by outcome", ["outcome"])
# worker side
CHAT_CANCELLED = Counter("kvi_chat_cancelled", "Generations stopped because the client left "
                         "or the web stopped waiting")
TASKS = Counter("kvi_worker_tasks", "GPU tasks run, by task and outcome", ["task", "outcome"])
BACKGROUND_WARMS = Counter("kvi_warms", "warm_member tasks: asked (an admin's); queued after an "
                           "edit: held, merged, ran, dropped, expired or failed", ["outcome"])
TASKS_REFUSED = Counter("kvi_worker_task_messages_refused",
                        "Task messages refused unrun: missing or bad signature", ["task"])
TASK_SECONDS = Histogram("kvi_worker_task_seconds", "GPU task run time", ["task"],
                         buckets=_SECONDS)
QUEUE_WAIT = Histogram("kvi_worker_queue_wait_seconds", "Time from enqueue to start",
                       buckets=_SECONDS)
ENGINE_WATCHDOG = Counter("kvi_engine_watchdog_trips", "Batch engine schedulers found stuck "
                          "or dead (the worker then restarts), by reason", ["reason"])


def warm_backlog() -> str:
    """The Redis list the warms queued after edits wait in (``tenants.ports.enqueue_warm``:
    ``KV_WARM_QUEUE`` at the background priority, kombu's name for it)."""
    from django.conf import settings

    from tenants.ports import BACKGROUND_PRIORITY

    return f"{settings.KV_WARM_QUEUE}\x06\x16{BACKGROUND_PRIORITY}"


class QueueCollector:
    """Shared queue depth, each live worker's own queue depth and in-flight tasks."""

    def collect(self) -> Iterator[Metric]:
        from gpu_worker.routing import registry

        depth = GaugeMetricFamily("kvi_queue_depth", "Messages waiting in a queue", labels=["queue"])
        inflight = GaugeMetricFamily("kvi_worker_inflight", "Tasks a worker holds",
                                     labels=["worker"])
        live = GaugeMetricFamily("kvi_workers_live", "Workers with a fresh heartbeat")
        try:
            client = registry.redis_client()
            depth.add_metric([registry.SHARED_QUEUE], client.llen(registry.SHARED_QUEUE))
            depth.add_metric(["warm"], client.llen(warm_backlog()))  # after edits, behind chats
            workers = registry.live_workers(client)
        except redis.RedisError as exc:
            log.warning("metrics: Redis unavailable: %s", exc)
            return
        for name, info in workers.items():
            depth.add_metric([info["queue"]], info["queued"])
            inflight.add_metric([name], info["inflight"])
        live.add_metric([], len(workers))
        yield from (depth, inflight, live)


def _counter(name: str, doc: str, value: float, labels: dict[str, str] | None = None):
    fam = CounterMetricFamily(name, doc, labels=list(labels or {}))
    fam.add_metric(list((labels or {}).values()), value)
    return fam


def _host_pool() -> Iterator[Metric]:
    """The process's pool of host buffers for device-to-host K/V copies."""
    from injection.hostmem import HOST_POOL

    s = HOST_POOL.stats()
    held = GaugeMetricFamily("kvi_host_pool_bytes", "Host K/V buffer pool bytes",
                             labels=["state"])
    for state in ("held", "in_use", "max"):
        held.add_metric([state], s[f"{state}_bytes"])
    yield held
    yield _counter("kvi_host_pool_overflow", "K/V copies that found the pool full "
                   "(pageable memory instead)", s["overflow"])
    yield _counter("kvi_host_pool_reused", "K/V copies into a reused pool buffer", s["reused"])


class EngineCollector:
    """This process's executor: requests by tier, per-tier hits/misses/evictions, L1 bytes."""

    def collect(self) -> Iterator[Metric]:
        from gpu_worker.ops.modelinfo import profile_info  # imports torch: workers only
        from gpu_worker.serving import host

        ex = host.current_executor()
        if ex is None:
            return
        stats = ex.stats()
        c = stats["metrics"]["counters"]
        requests = CounterMetricFamily("kvi_engine_requests", "Executions by K/V tier",
                                       labels=["tier"])
        hits = CounterMetricFamily("kvi_cache_hits", "Cache hits by tier", labels=["tier"])
        misses = CounterMetricFamily("kvi_cache_misses", "Cache misses by tier", labels=["tier"])
        for tier in ("l1", "l2", "compute", "none"):
            requests.add_metric([tier], c.get(f"requests_tier_{tier}", 0))
        for tier in ("l1", "l2"):
            hits.add_metric([tier], c.get(f"{tier}_hits", 0))
            misses.add_metric([tier], c.get(f"{tier}_misses", 0))
        yield from (requests, hits, misses, profile_info(ex.adapter))
        yield _counter("kvi_cache_computes", "Preference K/V recomputed", c.get("computes", 0))
        yield _counter("kvi_invalidations", "Invalidations handled", c.get("invalidations", 0))
        per_token = (stats.get("kv") or {}).get("bytes_per_token")
        if per_token:
            yield GaugeMetricFamily("kvi_kv_bytes_per_token", "K/V bytes of one cached token "
                                    "for the loaded model and dtype", value=per_token)
        yield from self._batch(stats.get("batch") or {})
        yield from self._l1(stats.get("l1") or {})
        yield from self._l2(stats.get("l2") or {})
        yield from self._kinds(stats.get("kinds") or {})

    def _kinds(self, kinds: dict) -> Iterator[Metric]:
        """Tenant segments, member segments and conversation links: L1 size, hits/misses."""
        size = GaugeMetricFamily("kvi_kind_bytes", "L1 bytes by kind", labels=["kind"])
        count = GaugeMetricFamily("kvi_kind_entries", "L1 entries by kind", labels=["kind"])
        pinned = GaugeMetricFamily("kvi_kind_pinned_bytes", "L1 bytes in pinned host memory "
                                   "(as allocated) by kind", labels=["kind"])
        tensor = GaugeMetricFamily("kvi_kind_tensor_bytes", "L1 bytes of the tensors "
                                   "themselves (before allocator rounding) by kind",
                                   labels=["kind"])
        hits = CounterMetricFamily("kvi_kind_hits", "Hits by kind and tier",
                                   labels=["kind", "tier"])
        misses = CounterMetricFamily("kvi_kind_misses", "Misses by kind and tier",
                                     labels=["kind", "tier"])
        for kind, k in kinds.items():
            size.add_metric([kind], k.get("bytes", 0))
            count.add_metric([kind], k.get("entries", 0))
            pinned.add_metric([kind], k.get("pinned_bytes", 0))
            tensor.add_metric([kind], k.get("tensor_bytes", 0))
            for tier in ("l1", "l2"):
                hits.add_metric([kind, tier], k.get(f"{tier}_hits", 0))
                misses.add_metric([kind, tier], k.get(f"{tier}_misses", 0))
        yield from (size, count, pinned, tensor, hits, misses)
        yield from _host_pool()

    def _batch(self, batch: dict) -> Iterator[Metric]:
        """The batch engine's contained failures (rows failed alone, OOM shrinks, ...)."""
        faults = CounterMetricFamily("kvi_engine_faults", "Batch engine failures contained, "
                                     "by kind", labels=["kind"])
        for kind in ("row_failures", "step_failures", "oom_shrinks", "resumed",
                     "keep_kv_failures", "watchdog_trips", "forward_failures", "forward_ooms",
                     "forward_oom_failures"):  # the last three: forwards of no row
            if kind in batch:
                faults.add_metric([kind], batch[kind])
        yield faults

    def _l1(self, l1: dict) -> Iterator[Metric]:
        if "bytes" not in l1:
            return
        yield _counter("kvi_cache_evictions", "Entries evicted for room", l1.get("evictions", 0),
                       {"tier": "l1"})
        yield GaugeMetricFamily("kvi_l1_bytes", "Bytes of K/V held in L1", value=l1["bytes"])
        yield GaugeMetricFamily("kvi_l1_entries", "Entries held in L1", value=l1["entries"])
        per_bytes = GaugeMetricFamily("kvi_l1_tenant_bytes", "L1 bytes by tenant",
                                      labels=["tenant"])
        per_hits = CounterMetricFamily("kvi_l1_tenant_hits", "L1 hits by tenant",
                                       labels=["tenant"])
        per_misses = CounterMetricFamily("kvi_l1_tenant_misses", "L1 misses by tenant",
                                         labels=["tenant"])
        for tenant, t in (l1.get("per_tenant") or {}).items():
            per_bytes.add_metric([tenant], t.get("bytes", 0))
            per_hits.add_metric([tenant], t.get("hits", 0))
            per_misses.add_metric([tenant], t.get("misses", 0))
        yield from (per_bytes, per_hits, per_misses)

    def _l2(self, l2: dict) -> Iterator[Metric]:
        if "rejects" not in l2:
            return
        yield _counter("kvi_l2_rejects", "L2 entries rejected (bad MAC/header)", l2["rejects"])
        yield _counter("kvi_l2_errors", "L2 Redis faults", l2.get("errors", 0))
        yield _counter("kvi_l2_writes", "L2 entries written", l2.get("writes", 0))
        yield _counter("kvi_l2_skipped_writes", "L2 writes skipped (queue full)",
                       l2.get("skipped_writes", 0))
        yield _counter("kvi_l2_refused_writes", "L2 writes refused: the cache Redis full or "
                       "an entry over its tenant's budget", l2.get("refused_writes", 0))
        for kind, what in (("link", "Conversation links"), ("entry", "Segments and leans")):
            yield _counter(f"kvi_l2_{kind}_evictions", f"{what} a tenant's own writes deleted "
                           "from Redis for room", l2.get(f"{kind}_evictions", 0))
        yield GaugeMetricFamily("kvi_l2_writer_bytes", "K/V bytes waiting for the L2 writer",
                                value=l2.get("inflight_bytes", 0))


def web_registry() -> CollectorRegistry:
    """The web's registry: multiprocess-aggregated when PROMETHEUS_MULTIPROC_DIR is set."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        registry.register(QueueCollector())
        return registry
    _register_once(REGISTRY, QueueCollector())
    return REGISTRY


# the cache Redis' figures: a registry of their own (the process-wide one is read by other
# code, which must not trigger a scan), one collector per process (its scan is cached)
_L2_REGISTRY = CollectorRegistry()
_L2_REGISTRY.register(L2Collector())


def web_exposition() -> tuple[bytes, str]:
    """The web registry in Prometheus' text format, and its content type (``/metrics``)."""
    return generate_latest(web_registry()) + generate_latest(_L2_REGISTRY), CONTENT_TYPE_LATEST


def start_worker_server(port: int, addr: str = "0.0.0.0", tries: int = 16) -> int | None:
    """Serve this process's metrics on ``port`` (or the next free one); returns it."""
    from prometheus_client import start_http_server

    _register_once(REGISTRY, QueueCollector())
    _register_once(REGISTRY, EngineCollector())
    for p in range(port, port + tries):
        try:
            start_http_server(p, addr=addr)
        except OSError:
            continue
        log.info("worker metrics on http://%s:%d/metrics", addr, p)
        return p
    log.warning("worker metrics: no free port in %d..%d", port, port + tries - 1)
    return None


_registered: set[tuple[int, type]] = set()


def _register_once(registry: CollectorRegistry, collector) -> None:
    key = (id(registry), type(collector))
    if key not in _registered:
        registry.register(collector)
        _registered.add(key)
