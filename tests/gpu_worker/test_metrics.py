"""Prometheus: the web endpoint's access rule and the engine/queue figures it exports."""

from __future__ import annotations

import pytest
from django.test import RequestFactory
from prometheus_client import CollectorRegistry, generate_latest

from gpu_worker.ops import l2metrics, metrics
from gpu_worker.serving import host
from tenants.api.metrics import metrics_view


def _get(**headers):
    return metrics_view(RequestFactory().get("/metrics", headers=headers))


@pytest.mark.django_db  # the cache Redis' figures by kind name the tenants (L2Collector)
def test_metrics_endpoint_is_closed_without_a_token_outside_debug(settings):
    settings.DEBUG, settings.METRICS_TOKEN = False, ""
    assert _get().status_code == 403
    settings.METRICS_TOKEN = "s3cret-token"
    assert _get(Authorization="Bearer wrong").status_code == 403
    ok = _get(Authorization="Bearer s3cret-token")
    assert ok.status_code == 200
    body = ok.content.decode()
    assert 'kvi_queue_depth{queue="gpu"}' in body and 'kvi_queue_depth{queue="warm"}' in body
    assert "kvi_workers_live" in body and "# TYPE kvi_chat_seconds histogram" in body
    assert 'kvi_l2_kind_bytes{kind="conversation"}' in body  # the cache Redis by kind


@pytest.fixture
def loaded_executor(demo_model_path, redis_client):
    from injection import build_executor, load_adapter
    from injection.metrics import METRICS

    ex = build_executor(load_adapter(str(demo_model_path), device="cpu"),
                        redis_client=redis_client, signing_secret="x" * 32)
    METRICS.reset()  # process-wide counters: what executors of earlier tests counted
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


def test_engine_collector_exports_bytes_per_token_and_refused_l2_writes(loaded_executor):
    import torch

    from injection.base import CacheKey
    from injection.kvcache.packed import PackedKV

    ex = loaded_executor
    k = torch.zeros(ex.adapter.num_layers, ex.adapter.num_kv_heads, 3, 4)
    ex.l2.links.quota_bytes = 1  # every link is larger than this tenant budget
    ex.l2.put(CacheKey("t-8", "u-1", "conv", "fp"), PackedKV(k, k, range(3)), link=True)
    assert ex.l2.flush(10)
    registry = CollectorRegistry()
    registry.register(metrics.EngineCollector())
    text = generate_latest(registry).decode()
    assert "kvi_l2_refused_writes_total 1.0" in text
    per_token = ex.stats()["kv"]["bytes_per_token"]
    cfg = ex.adapter.model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    assert per_token == 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 4  # fp32
    assert f"kvi_kv_bytes_per_token {float(per_token)}" in text


@pytest.mark.django_db
def test_web_metrics_show_what_the_cache_redis_holds_by_kind():
    import torch

    from gpu_worker.channels import kvstore
    from injection.base import CacheKey
    from injection.kvcache.packed import PackedKV
    from tenants import actions

    tenant = actions.do_create_tenant("metrics-kinds")
    tid = str(tenant.pk)
    tier = kvstore.l2_tier()
    k = torch.zeros(2, 1, 6, 4)
    link = CacheKey(tid, "5", "conv", "fp")
    try:
        assert tier.put(link, PackedKV(k, k, range(6)), link=True)
        tier.client.delete(l2metrics.FIGURES_KEY)  # the figures an earlier scrape shared
        registry = CollectorRegistry()
        registry.register(metrics.L2Collector())
        text = generate_latest(registry).decode()
        size = tier.client.strlen(tier.signer.redis_key(link))
        assert f'kvi_l2_kind_bytes{{kind="conversation"}} {float(size)}' in text
        assert 'kvi_l2_kind_entries{kind="conversation"} 1.0' in text
    finally:
        tier.evict(tid)


def test_the_loaded_models_profile_is_an_info_metric_and_in_the_workers_stats(
        loaded_executor, monkeypatch):
    from gpu_worker.serving.handlers import on_stats
    from injection.model import profiles
    from injection.model.fingerprint import model_key

    key = model_key(loaded_executor.adapter)
    registry = CollectorRegistry()
    registry.register(metrics.EngineCollector())
    text = generate_latest(registry).decode()
    assert "kvi_model_profile_info{" in text  # the demo model has none: guidance off
    assert f'model_key="{key}"' in text and 'name="none"' in text
    assert 'calibrated="false"' in text and 'guidance_default="0.0"' in text
    assert 'reminder_default="on"' in text and 'constraints_default="on"' in text  # platform
    assert on_stats({})["stats"]["profile"]["name"] == "none"
    mine = profiles.Profile("mine", key, 0.5, True, "test", {"guidance": {"default": 0.5},
                                                            "reminder": {"default": "off"}})
    monkeypatch.setattr(loaded_executor.adapter, "_profile", mine, raising=False)
    text = generate_latest(registry).decode()
    assert 'name="mine"' in text and 'guidance_default="0.5"' in text
    assert 'reminder_default="off"' in text and 'constraints_default="on"' in text
    stats = on_stats({})["stats"]["profile"]
    assert stats["defaults"] == {"guidance": 0.5, "reminder": "off"}
    assert (stats["reminder"], stats["constraints"]) == (False, True)
