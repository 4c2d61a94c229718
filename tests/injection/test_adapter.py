"""ModelAdapter on the real demo model: K/V shape, injection traps, exactness, dtypes."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, Cache, DynamicCache

from injection.errors import InvalidRequest
from injection.kvcache.packed import PackedKV
from injection.model.adapter import resolve_dtype
from injection.model.loading import load_adapter

PROMPTS = ["What should I cook tonight?", "Plan a rainy day in Lisbon for me."]


def plain_ids(adapter, input_ids: list[int], n: int) -> list[int]:
    """Greedy generation on explicit ids, no injection (the reference)."""
    ids = torch.tensor([input_ids], device=adapter.device)
    out = adapter.model.generate(
        input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False
    )
    return out[0, len(input_ids) :].tolist()


def test_compute_kv_shape_gqa_bos_cpu(adapter, preference):
    kv = adapter.compute_kv(preference)
    cfg = adapter.model.config
    ids = adapter.tokenizer(preference)["input_ids"]
    assert kv.token_ids == tuple(ids) and ids[0] == adapter.tokenizer.bos_token_id
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    assert kv.shape == (cfg.num_hidden_layers, cfg.num_key_value_heads, len(ids), head_dim)
    assert cfg.num_key_value_heads < cfg.num_attention_heads  # really grouped-query
    assert kv.is_cpu and kv.dtype == torch.float32
    assert not kv.keys.is_inference()  # ordinary tensors: safe to cache and reuse


def test_compute_kv_equals_the_models_own_cache(adapter, preference):
    kv = adapter.compute_kv(preference)
    with torch.no_grad():
        out = adapter.model(input_ids=torch.tensor([list(kv.token_ids)], device=adapter.device),
                            use_cache=True)
    for i, layer in enumerate(out.past_key_values.layers):
        assert torch.equal(layer.keys[0].cpu(), kv.keys[i])
        assert torch.equal(layer.values[0].cpu(), kv.values[i])


@pytest.mark.parametrize("alpha", [0.4, 1.0])
def test_build_cache_is_a_dynamic_cache_with_value_only_scaling(adapter, preference, alpha):
    kv = adapter.compute_kv(preference)
    cache = adapter.build_cache(kv, alpha)
    assert isinstance(cache, DynamicCache) and isinstance(cache, Cache)
    assert not isinstance(cache, tuple)
    assert len(cache.layers) == kv.num_layers
    assert cache.get_seq_length() == kv.num_tokens
    for i, layer in enumerate(cache.layers):
        assert torch.equal(layer.keys[0].cpu(), kv.keys[i])  # keys never scaled
        torch.testing.assert_close(layer.values[0].cpu(), kv.values[i] * alpha, rtol=0, atol=0)
        # fresh storage: growing the cache can never write into the cached PackedKV
        assert layer.keys.data_ptr() != kv.keys[i].data_ptr()
        assert layer.values.data_ptr() != kv.values[i].data_ptr()


def test_build_cache_copies_even_if_update_kept_the_callers_tensors(adapter, preference,
                                                                   monkeypatch):
    """Were ``DynamicLayer.update`` to keep the tensors it is given (no concatenation),
    the cache would still never share the cached PackedKV's storage, at alpha 1 too."""
    from transformers.cache_utils import DynamicLayer

    def keep(self, key_states, value_states, *args, **kwargs):
        self.lazy_initialization(key_states, value_states)
        self.keys, self.values = key_states, value_states
        return self.keys, self.values

    monkeypatch.setattr(DynamicLayer, "update", keep)
    kv = adapter.compute_kv(preference)
    cache = adapter.build_cache(kv, 1.0)
    storages = {kv.keys.untyped_storage().data_ptr(), kv.values.untyped_storage().data_ptr()}
    for i, layer in enumerate(cache.layers):
        assert layer.keys.untyped_storage().data_ptr() not in storages
        assert layer.values.untyped_storage().data_ptr() not in storages
        assert torch.equal(layer.values[0].cpu(), kv.values[i])


@pytest.mark.parametrize("prompt", PROMPTS)
def test_exactness_alpha_one_equals_plain_on_prefix_plus_prompt(adapter, preference, prompt):
    chat = adapter.render_chat([{"role": "user", "content": prompt}])
    kv = adapter.compute_kv(preference)
    out = adapter.generate(chat, kv, 1.0, 16)
    assert out.prompt_token_ids == adapter.tokenizer(chat, add_special_tokens=False)["input_ids"]
    reference = plain_ids(adapter, list(kv.token_ids) + out.prompt_token_ids, 16)
    assert out.token_ids == reference
    assert len(out.token_ids) == 16  # the demo tokenizer has eos, but greedy random weights don't stop


def test_prefix_plus_prompt_ids_reach_the_model(adapter, preference, chat_prompt):
    """generate derives cache_position from input_ids: the prompt must follow the prefix ids."""
    kv = adapter.compute_kv(preference)
    seen = []

    def hook(module, args, kwargs):
        pos = kwargs.get("position_ids")
        pos = kwargs["cache_position"] if pos is None else pos[0]
        seen.append((kwargs["input_ids"].shape[1], int(pos[0])))

    handle = adapter.model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        out = adapter.generate(chat_prompt, kv, 1.0, 3)
    finally:
        handle.remove()
    # first step: exactly the prompt tokens, positioned after the T cached ones
    assert seen[0] == (len(out.prompt_token_ids), kv.num_tokens)
    assert seen[1] == (1, kv.num_tokens + len(out.prompt_token_ids))


def test_passing_only_prompt_ids_silently_drops_tokens(adapter, preference, chat_prompt):
    """The trap our generate avoids: prompt ids alone (with their own mask) lose tokens."""
    kv = adapter.compute_kv(preference)
    prompt_ids = adapter.tokenizer(chat_prompt, add_special_tokens=False)["input_ids"]
    right = adapter.generate(chat_prompt, kv, 1.0, 8).token_ids
    seen = []
    handle = adapter.model.register_forward_pre_hook(
        lambda m, a, kw: seen.append(kw["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        ids = torch.tensor([prompt_ids], device=adapter.device)  # as **tokenizer(prompt)
        wrong = adapter.model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
            past_key_values=adapter.build_cache(kv, 1.0), do_sample=False,
        )[0, len(prompt_ids) :].tolist()
    finally:
        handle.remove()
    assert seen[0] < len(prompt_ids)  # cache_position came from input_ids: tokens dropped
    assert wrong != right


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_request_never_mutates_cached_packedkv(adapter, preference, chat_prompt, alpha):
    kv = adapter.compute_kv(preference)
    keys, values, ids, nbytes = kv.keys.clone(), kv.values.clone(), kv.token_ids, kv.nbytes
    for _ in range(2):
        adapter.generate(chat_prompt, kv, alpha, 12)
    assert torch.equal(kv.keys, keys) and torch.equal(kv.values, values)
    assert kv.token_ids == ids and kv.nbytes == nbytes and kv.num_tokens == len(ids)


def test_alpha_changes_generation_but_plain_ignores_alpha(adapter, preference, chat_prompt):
    kv = adapter.compute_kv(preference)
    full = adapter.generate(chat_prompt, kv, 1.0, 12).token_ids
    low = adapter.generate(chat_prompt, kv, 0.3, 12).token_ids
    assert full != low
    plain = adapter.generate(chat_prompt, None, 1.0, 12)
    assert plain.prompt_token_ids[0] == adapter.tokenizer.bos_token_id  # plain: with BOS
    assert adapter.generate(chat_prompt, None, 0.3, 12).token_ids == plain.token_ids


def test_sampling_is_seeded(adapter, preference, chat_prompt):
    kv = adapter.compute_kv(preference)
    a = adapter.generate(chat_prompt, kv, 0.7, 12, temperature=1.5, top_p=0.95, seed=7)
    b = adapter.generate(chat_prompt, kv, 0.7, 12, temperature=1.5, top_p=0.95, seed=7)
    c = adapter.generate(chat_prompt, kv, 0.7, 12, temperature=1.5, top_p=0.95, seed=8)
    assert a.token_ids == b.token_ids != c.token_ids


def test_mqa_model(mqa_model_path, preference):
    mqa = load_adapter(str(mqa_model_path), device="cpu")
    kv = mqa.compute_kv(preference)
    assert kv.num_heads == 1 == mqa.model.config.num_key_value_heads
    chat = mqa.render_chat([{"role": "user", "content": PROMPTS[0]}])
    out = mqa.generate(chat, kv, 1.0, 10)
    assert out.token_ids == plain_ids(mqa, list(kv.token_ids) + out.prompt_token_ids, 10)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_half_dtypes_preserved(demo_model_path, adapter, preference, chat_prompt, dtype):
    half = load_adapter(str(demo_model_path), device="cpu", dtype=dtype)
    want = resolve_dtype(dtype, device=torch.device("cpu"), config=None)
    assert half.dtype == want == half.model.dtype
    kv = half.compute_kv(preference)
    assert kv.dtype == want
    assert half.fingerprint != adapter.fingerprint  # dtype is part of the identity
    out = half.generate(chat_prompt, kv, 0.7, 4)
    assert len(out.token_ids) == 4
    with pytest.raises(InvalidRequest, match="dtype"):
        adapter.generate(chat_prompt, kv, 0.7, 4)  # a bf16 entry never feeds an fp32 model


def test_fingerprint_stable_and_sensitive(demo_model_path, mqa_model_path, adapter):
    again = load_adapter(str(demo_model_path), device="cpu")
    assert again.fingerprint == adapter.fingerprint and len(adapter.fingerprint) == 64
    assert load_adapter(str(mqa_model_path)).fingerprint != adapter.fingerprint
    with torch.no_grad():
        again.model.model.layers[0].mlp.up_proj.weight[0, 0] += 1.0
    from injection.model.fingerprint import model_fingerprint

    changed = model_fingerprint(again.model, again.tokenizer, again.dtype)
    assert changed != adapter.fingerprint  # the strided sample starts at element 0


def test_incompatible_or_empty_input_is_rejected(adapter, mqa_model_path, preference, chat_prompt):
    other = load_adapter(str(mqa_model_path)).compute_kv(preference)
    with pytest.raises(InvalidRequest, match="model expects"):
        adapter.generate(chat_prompt, other, 1.0, 4)
    kv = adapter.compute_kv(preference)
    with pytest.raises(InvalidRequest, match="empty"):
        adapter.generate("", kv, 1.0, 4)
    with pytest.raises(InvalidRequest, match="positions"):
        adapter.generate(chat_prompt, kv, 1.0, 5000)


def test_render_chat_and_count_tokens(adapter):
    text = adapter.render_chat([{"role": "user", "content": "Hello"}])
    assert text.startswith("<|user|>\nHello") and text.endswith("<|assistant|>\n")
    assert adapter.count_tokens(text) == len(adapter.tokenizer(text, add_special_tokens=False)["input_ids"])
    assert adapter.count_tokens("") == 0


def test_load_defaults_and_dtype_strings(demo_model_path):
    cfg = AutoModelForCausalLM.from_pretrained(demo_model_path).config
    cpu = torch.device("cpu")
    assert resolve_dtype(None, device=cpu, config=cfg) == torch.float32
    assert resolve_dtype("BF16", device=cpu, config=cfg) == torch.bfloat16
    assert resolve_dtype(torch.float16, device=cpu, config=cfg) == torch.float16
    with pytest.raises(ValueError):
        resolve_dtype("int8", device=cpu, config=cfg)
    a = load_adapter(str(demo_model_path))
    assert a.device.type == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.gpu
def test_cuda_compute_kv_pinned_and_exact(demo_model_path, preference):
    gpu = load_adapter(str(demo_model_path), device="cuda", dtype="fp32")
    kv = gpu.compute_kv(preference)
    assert kv.is_cpu and kv.is_pinned()
    chat = gpu.render_chat([{"role": "user", "content": PROMPTS[0]}])
    out = gpu.generate(chat, kv, 1.0, 8)
    ids = torch.tensor([list(kv.token_ids) + out.prompt_token_ids], device="cuda")
    ref = gpu.model.generate(input_ids=ids, max_new_tokens=8, do_sample=False)
    assert out.token_ids == ref[0, ids.shape[1] :].tolist()
    assert out.kv_bytes_gpu >= kv.nbytes and out.kv_transfer_ms > 0


def test_packedkv_roundtrip_through_entries_is_injectable(adapter, preference, chat_prompt):
    kv = adapter.compute_kv(preference)
    rebuilt = PackedKV.from_entries(kv.to_entries(), kv.token_ids)
    a, b = adapter.generate(chat_prompt, rebuilt, 1.0, 6), adapter.generate(chat_prompt, kv, 1.0, 6)
    assert (a.text, a.token_ids) == (b.text, b.token_ids)
