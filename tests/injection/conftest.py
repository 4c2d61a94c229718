"""Engine fixtures: the locally built demo model and adapters on it (fp32).

The ``adapter`` the engine tests share runs on ``KVI_TEST_DEVICE`` (default ``cpu``):
``make test-gpu`` runs the engine's tests again with ``KVI_TEST_DEVICE=cuda``, so the
batch engine, contrast, chunked and grouped prefill and the conversation store
are checked on CUDA against the same references (computed on the same device).
"""

from __future__ import annotations

import os

import pytest

from injection.model.adapter import ModelAdapter
from injection.model.demo_model import build_demo_model
from injection.model.loading import load_adapter

TEST_DEVICE = os.environ.get("KVI_TEST_DEVICE", "cpu")


@pytest.fixture(scope="session")
def demo_model_path(tmp_path_factory):
    """The default demo model (4 layers, 8 query heads, 2 KV heads: GQA)."""
    return build_demo_model(tmp_path_factory.mktemp("demo_model"))


@pytest.fixture(scope="session")
def adapter(demo_model_path) -> ModelAdapter:
    return load_adapter(str(demo_model_path), device=TEST_DEVICE, dtype="fp32")


@pytest.fixture(scope="session")
def mqa_model_path(tmp_path_factory):
    """A tiny multi-query variant (1 KV head) with another seed."""
    return build_demo_model(
        tmp_path_factory.mktemp("mqa_model"),
        seed=1, num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=1,
    )


@pytest.fixture(scope="session")
def chat_messages() -> list[dict[str, str]]:
    return [{"role": "user", "content": "What should I cook tonight?"}]


@pytest.fixture(scope="session")
def chat_prompt(adapter, chat_messages) -> str:
    return adapter.render_chat(chat_messages)


@pytest.fixture(scope="session")
def preference() -> str:
    return "I am a vegetarian and I do not like spicy food. I prefer quiet restaurants."


@pytest.fixture(scope="module")
def smol_tok(real_model_path):
    """SmolLM2's tokenizer (the decoding constraints' step tests)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(real_model_path))
