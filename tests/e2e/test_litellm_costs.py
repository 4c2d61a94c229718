"""A LiteLLM gateway in front of /v1 prices what the platform reports (issue 33, section 4):
its SDK (what its proxy calls a backend with) -> live HTTP server -> real Celery worker
(demo model) -> Postgres. LiteLLM reads ``prompt_tokens_details.cached_tokens`` and prices
them at the model's cache-read price, the rest of the prompt at the input price; the
platform's own usage fields pass through without changing the price."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# $ per token, as a LiteLLM config's model_info would say (docs/CLIENTS.md)
PRICES = {"input_cost_per_token": 1e-6, "cache_read_input_token_cost": 1e-7,
          "output_cost_per_token": 4e-6}


@pytest.fixture
def litellm(monkeypatch):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import
    import litellm

    monkeypatch.setattr(litellm, "model_cost", dict(litellm.model_cost))  # undone after
    litellm.register_model({"openai/kvinject": {**PRICES, "litellm_provider": "openai",
                                                "mode": "chat"}})
    return litellm


def price(usage, cached: int) -> float:
    return ((usage.prompt_tokens - cached) * PRICES["input_cost_per_token"]
            + cached * PRICES["cache_read_input_token_cost"]
            + usage.completion_tokens * PRICES["output_cost_per_token"])


def test_litellm_prices_cached_prompt_tokens_at_the_cache_read_price(
        litellm, live_server, gpu_worker, member_key, settings, demo_model_path):
    settings.MODEL_PATH = str(demo_model_path)
    ask = dict(model="openai/kvinject", api_base=f"{live_server.url}/v1",
               api_key=member_key[1], messages=[{"role": "user", "content": "What to cook?"}],
               max_tokens=4, temperature=0, num_retries=0, timeout=180)
    cold = litellm.completion(**ask)  # the member's segment is computed, then cached
    warm = litellm.completion(**ask)  # ... and served from the cache
    for answer in (cold, warm):
        usage = answer.usage
        cached = usage.prompt_tokens_details.cached_tokens
        assert 0 <= cached <= usage.prompt_tokens
        assert litellm.completion_cost(completion_response=answer) == pytest.approx(
            price(usage, cached))
        assert answer._hidden_params["response_cost"] == pytest.approx(price(usage, cached))
        assert usage.kvinject_guide_tokens == 0  # the platform's field, passed through
    hit = warm.usage.prompt_tokens_details.cached_tokens
    assert hit > cold.usage.prompt_tokens_details.cached_tokens
    assert warm.usage.prompt_tokens == cold.usage.prompt_tokens
    # the cache hit is what makes the warm request cheaper, by the two prices' difference
    saved = (litellm.completion_cost(completion_response=cold)
             - litellm.completion_cost(completion_response=warm))
    assert saved == pytest.approx(
        (hit - cold.usage.prompt_tokens_details.cached_tokens)
        * (PRICES["input_cost_per_token"] - PRICES["cache_read_input_token_cost"])
        + (cold.usage.completion_tokens - warm.usage.completion_tokens)
        * PRICES["output_cost_per_token"])
