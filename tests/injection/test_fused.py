"""Stacked projections (``injection/model/fused.py``): where oneDNN's packed kernel serves,
a layer's q/k/v and gate/up are one product each, and the logits and K/V stay the unfused
model's bit for bit; nothing is held twice; nothing is stacked where the kernel is not the
packed one."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM

from injection.model import cpu_matmul, fused
from injection.model.lean_step import lean_step
from injection.model.loading import load_adapter

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                reason="oneDNN's packed kernel is a CPU build's")


def _logits(forward, ids, cache=None):
    with torch.inference_mode():
        return forward(ids, DynamicCache() if cache is None else cache)


def _lean(adapter):
    return lambda ids, cache: adapter.lean(ids, None, None, cache)


def _model(adapter):
    return lambda ids, cache: adapter.model(input_ids=ids, past_key_values=cache,
                                            use_cache=True).logits[:, -1]


def _agree(stacked, plain, rows: int, tokens: int) -> None:
    """Prefill ``rows`` x ``tokens`` random ids, then one decoding step: the stacked model's
    lean forward and the unfused model's own forward give equal logits and K/V."""
    gen = torch.Generator().manual_seed(rows * 100 + tokens)
    vocab = stacked.model.config.vocab_size
    ids = torch.randint(3, vocab, (rows, tokens), generator=gen)
    caches = DynamicCache(), DynamicCache()
    a, b = _logits(_lean(stacked), ids, caches[0]), _logits(_model(plain), ids, caches[1])
    assert torch.equal(a, b)
    step = torch.randint(3, vocab, (rows, 1), generator=gen)
    a, b = _logits(_lean(stacked), step, caches[0]), _logits(_model(plain), step, caches[1])
    assert torch.equal(a, b)
    for x, y in zip(caches[0].layers, caches[1].layers, strict=True):
        assert torch.equal(x.keys, y.keys) and torch.equal(x.values, y.values)


@pytest.fixture(scope="module")
def pair(demo_model_path):
    """The demo model with every product on the packed kernel: stacked (lean step) and
    as loaded (no lean step: nothing stacked)."""
    stacked = load_adapter(str(demo_model_path), device="cpu", dtype="fp32", cpu_matmul="packed")
    plain = load_adapter(str(demo_model_path), device="cpu", dtype="fp32", cpu_matmul="packed",
                         lean_step=False)
    return stacked, plain


def test_every_layers_groups_are_stacked_and_the_lean_step_uses_them(pair):
    stacked, plain = pair
    layers = stacked.model.model.layers
    assert stacked.fused == 2 * len(layers) and plain.fused == 0
    assert all(p.qkv is not None and p.gate_up is not None for p in stacked.lean._layers)
    assert fused.stacked_of(plain.model.model.layers[0].self_attn) is None


@pytest.mark.parametrize(("rows", "tokens"), [(1, 9), (2, 5), (8, 3), (3, 40)])
def test_logits_and_kv_bit_for_bit_the_unfused_models(pair, rows, tokens):
    _agree(*pair, rows, tokens)


def test_nothing_is_held_twice(pair):
    stacked, _ = pair
    attn = stacked.model.model.layers[1].self_attn
    whole = fused.stacked_of(attn).layer.weight
    for part in (attn.q_proj, attn.k_proj, attn.v_proj):
        assert part.weight.untyped_storage().data_ptr() == whole.untyped_storage().data_ptr()
        assert part not in cpu_matmul._PACKED  # its reordered copy: the stacked one's


def test_a_deep_copy_multiplies_by_its_own_weights(pair):
    stacked, _ = pair
    twin = copy.deepcopy(stacked.model)
    x = torch.randn(3, twin.config.hidden_size)
    original = stacked.model.model.layers[0].self_attn.k_proj
    copied = twin.model.layers[0].self_attn.k_proj
    with torch.inference_mode():
        want = original(x)
        copied.weight.mul_(2)
        assert torch.equal(copied(x), torch.nn.functional.linear(x, copied.weight))
        assert torch.allclose(copied(x), 2 * want, atol=1e-5)
        assert torch.equal(original(x), want)  # the original's weights are its own


@pytest.mark.parametrize("mode", ["wxt", "linear"])
def test_nothing_is_stacked_where_the_packed_kernel_does_not_serve(demo_model_path, mode):
    adapter = load_adapter(str(demo_model_path), device="cpu", dtype="fp32", cpu_matmul=mode)
    assert adapter.fused == 0
    assert all(p.qkv is None for p in adapter.lean._layers)


def test_a_qwen2_models_biased_projections():
    """Biased q/k/v (Qwen2): the biases are stacked with the weights."""
    torch.manual_seed(5)
    cfg = Qwen2Config(vocab_size=300, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256)
    model = Qwen2ForCausalLM(cfg).eval()
    twin = copy.deepcopy(model)
    cpu_matmul.setup(twin, torch.device("cpu"), "packed")
    assert fused.fuse(model, cpu_matmul.setup(model, torch.device("cpu"), "packed")) == 4
    assert model.model.layers[0].self_attn.q_proj.bias is not None
    lean = lean_step(model)
    ids = torch.randint(3, 300, (2, 6))
    caches = DynamicCache(), DynamicCache()
    with torch.inference_mode():
        a = lean(ids, None, None, caches[0])
        b = twin(input_ids=ids, past_key_values=caches[1], use_cache=True).logits[:, -1]
    assert torch.equal(a, b)


@pytest.mark.slow
@pytest.mark.real_model
def test_smollm2_stacked_bit_for_bit(real_model_path):
    stacked = load_adapter(str(real_model_path), device="cpu", dtype="fp32", cpu_matmul="packed")
    plain = load_adapter(str(real_model_path), device="cpu", dtype="fp32", cpu_matmul="packed",
                         lean_step=False)
    assert stacked.fused == 60
    _agree(stacked, plain, 2, 24)
    _agree(stacked, plain, 8, 3)
