"""Prometheus: the web endpoint's access rule and the engine/queue figures it exports."""

from __future__ import annotations

import pytest
from django.test import RequestFactory
from prometheus_client import CollectorRegistry, generate_latest

from gpu_worker.ops import metrics
from gpu_worker.serving import host
from tenants.api.metrics import metrics_view


def _get(**headers):
    return metrics_view(RequestFactory().get("/metrics", headers=headers))


def test_metrics_endpoint_is_closed_without_a_token_outside_debug(settings):
    settings.DEBUG, settings.METRICS_TOKEN = False, ""
    assert _get().status_code == 403
    settings.METRICS_TOKEN = "s3cret-token"
    assert _get(Authorization="Bearer wrong").status_code == 403
    ok = _get(Authorization="Bearer s3cret-token")
    assert ok.status_code == 200
    body = ok.content.decode()
    assert 'kvi_queue_depth{queue="gpu"}' in body
    assert "kvi_workers_live" in body and "# TYPE kvi_chat_seconds histogram" in body


@pytest.fixture
def loaded_executor(demo_model_path, redis_client):
    from injection import build_executor, load_adapter

    ex = build_executor(load_adapter(str(demo_model_path), device="cpu"),
                        redis_client=redis_client, signing_secret="x" * 32)
    host._executor, saved = ex, host._executor
    yield ex
    ex.l2.close()
    host._executor = saved


def test_engine_collector_exports_tiers_l1_bytes_and_per_tenant_figures(loaded_executor):
    from injection import ExecutionRequest

    req = ExecutionRequest("t-7", "u-1", [{"role": "user", "content": "hello"}], "I like tea.", max_new_tokens=2)
    loaded_executor.execute(req)
    loaded_executor.execute(req)
    registry = CollectorRegistry()
    registry.register(metrics.EngineCollector())
    text = generate_latest(registry).decode()
    assert 'kvi_cache_hits_total{tier="l1"} 1.0' in text
    assert 'kvi_engine_requests_total{tier="compute"} 1.0' in text
    l1_bytes = loaded_executor.l1.bytes_used
    assert l1_bytes > 0 and f"kvi_l1_bytes {float(l1_bytes)}" in text
    assert f'kvi_l1_tenant_bytes{{tenant="t-7"}} {float(l1_bytes)}' in text
    # per kind: no instructions, so the member's segment is the whole injected turn
    assert f'kvi_kind_bytes{{kind="member"}} {float(l1_bytes)}' in text
    assert 'kvi_kind_hits_total{kind="member",tier="l1"} 1.0' in text
    assert 'kvi_kind_entries{kind="tenant"} 0.0' in text
    assert 'kvi_kind_pinned_bytes{kind="member"} 0.0' in text  # CPU: nothing pinned
    assert f'kvi_kind_tensor_bytes{{kind="member"}} {float(l1_bytes)}' in text
    assert 'kvi_host_pool_bytes{state="max"}' in text and "kvi_host_pool_overflow_total" in text
    assert "kvi_l2_rejects_total 0.0" in text
