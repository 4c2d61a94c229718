"""The decoding step's lean forward (``injection/model/lean_step.py``) gives the model's
own logits bit for bit, and leaves the batch's K/V as the model's forward leaves it: on the
demo model (llama, GQA), a random Qwen2 (biased projections), and both shipped models;
models it does not reproduce get none."""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM

from injection import build_executor
from injection.base import ExecutionRequest
from injection.engine.batchcache import BatchCache
from injection.metrics import Metrics
from injection.model import lean_step as lean_mod
from injection.model.lean_step import lean_step
from injection.model.loading import load_adapter

PARITY = {"reminder": False, "contrast": 0.0, "constrain": False, "loop_guard": False}


def _batch(model, lengths: list[int], seed: int) -> BatchCache:
    """Rows of ``lengths`` random tokens prefilled by the model, joined (left-padded)."""
    gen = torch.Generator().manual_seed(seed)
    batch = BatchCache()
    for n in lengths:
        ids = torch.randint(3, model.config.vocab_size, (1, n), generator=gen)
        with torch.inference_mode():
            out = model(input_ids=ids, past_key_values=DynamicCache(), use_cache=True)
        batch.add(out.past_key_values)
    return batch


def _steps_agree(model, lean, lengths: list[int], steps: int = 4) -> None:
    """The same batch decoded twice, by the model's forward and by ``lean``: every step's
    logits equal bit for bit, and so is every layer's K/V after."""
    ours, theirs = _batch(model, lengths, 0), _batch(model, lengths, 0)
    last = torch.full((len(lengths), 1), 5)
    for _ in range(steps):
        outs = []
        for batch, use_lean in ((theirs, False), (ours, True)):
            batch.reserve(1)
            mask, positions, cache_position = batch.step_inputs(torch.device("cpu"))
            with torch.inference_mode():
                if use_lean:
                    outs.append(lean(last, mask, positions, batch.cache))
                else:
                    outs.append(model(input_ids=last, attention_mask=mask,
                                      position_ids=positions, cache_position=cache_position,
                                      past_key_values=batch.cache, use_cache=True).logits[:, -1])
        assert outs[1].shape == outs[0].shape
        assert torch.equal(outs[1], outs[0])
        last = outs[0].argmax(-1, keepdim=True)
    for a, b in zip(ours.cache.layers, theirs.cache.layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


@pytest.fixture(scope="module")
def qwen2_tiny():
    torch.manual_seed(3)
    cfg = Qwen2Config(vocab_size=300, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256)
    return Qwen2ForCausalLM(cfg).eval()


@pytest.mark.parametrize("lengths", [[9], [9, 4, 13]], ids=["one row", "padded rows"])
def test_the_demo_models_logits_bit_for_bit(adapter, lengths):
    assert adapter.lean is not None  # load_adapter gives the llama demo model one
    _steps_agree(adapter.model, adapter.lean, lengths)


@pytest.mark.parametrize("lengths", [[7], [7, 12]], ids=["one row", "padded rows"])
def test_a_qwen2_models_logits_bit_for_bit(qwen2_tiny, lengths):
    assert qwen2_tiny.model.layers[0].self_attn.q_proj.bias is not None
    _steps_agree(qwen2_tiny, lean_step(qwen2_tiny), lengths)


def _forwards_agree(adapter, ids, mask, pos, batch, twin) -> None:
    """``ids`` after ``batch`` by the lean step and after its ``twin`` by the model's forward:
    the same last logits and the same K/V in every layer, bit for bit."""
    with torch.inference_mode():
        got = adapter.lean(ids, mask, pos, batch.cache)
        want = adapter.model(input_ids=ids, attention_mask=mask, position_ids=pos,
                             past_key_values=twin.cache, use_cache=True,
                             logits_to_keep=1).logits[:, -1]
    assert torch.equal(got, want)
    for a, b in zip(batch.cache.layers, twin.cache.layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_a_prefill_after_a_prefix_bit_for_bit(adapter, demo_model_path):
    """Multi-token forwards (a segment's K/V, a continuation after a parent, a row's
    prefill with its logits) give the model forward's K/V and logits exactly."""
    plain = load_adapter(str(demo_model_path), device="cpu", dtype="fp32", lean_step=False)
    text = "You are the assistant of a cooking school. I am vegetarian."
    ours, theirs = adapter.compute_kv(text), plain.compute_kv(text)
    assert torch.equal(ours.keys, theirs.keys) and torch.equal(ours.values, theirs.values)
    more = adapter.tokenizer("And I like quiet places.")["input_ids"]
    ours, theirs = adapter.compute_kv_ids(more, ours), plain.compute_kv_ids(more, theirs)
    assert torch.equal(ours.keys, theirs.keys) and torch.equal(ours.values, theirs.values)
    ids = torch.tensor([more])
    for padded in (False, True):  # one row; two rows, the shorter one left-padded
        batch = _batch(adapter.model, [11] if not padded else [11, 6], 1)
        twin = _batch(adapter.model, [11] if not padded else [11, 6], 1)
        rows = ids.expand(batch.rows, -1)
        mask = None if not padded else torch.tensor(
            [[1] * (11 + len(more)), [0] * 5 + [1] * (6 + len(more))])
        pos = None if not padded else torch.stack(
            [torch.arange(11, 11 + len(more)), torch.arange(6, 6 + len(more))])
        _forwards_agree(adapter, rows, mask, pos, batch, twin)


def test_models_it_does_not_reproduce_get_none(qwen2_tiny):
    sliding = Qwen2Config(vocab_size=300, hidden_size=64, intermediate_size=128,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          use_sliding_window=True, sliding_window=8, max_window_layers=0)
    assert "sliding_attention" in sliding.layer_types
    assert lean_step(Qwen2ForCausalLM(sliding)) is None  # a windowed layer
    from transformers import GPT2Config, GPT2LMHeadModel
    assert lean_step(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2))) is None
    lean = lean_step(qwen2_tiny)
    assert lean is not None and lean.fits(qwen2_tiny)
    handle = qwen2_tiny.model.layers[1].mlp.register_forward_hook(lambda *a: None)
    try:  # a hook the lean step would not call: none for a model hooked at load, and
        assert lean_step(qwen2_tiny) is None  # one made before the hook stands aside
        assert not lean.fits(qwen2_tiny)
    finally:
        handle.remove()
    assert lean.fits(qwen2_tiny) and not lean.fits(copy.copy(qwen2_tiny))


def test_the_memory_embedders_exit_hook_leaves_it_serving(demo_model_path):
    """The embedder's early exit stays registered on a layer once a memory was embedded, and
    transformers' output capturing once a forward asked for hidden states; both act only
    inside such a forward, so the lean step keeps serving (it used to stand aside for the
    life of the worker after the first embedding). Any other hook still sets it aside."""
    from injection.memory.embed import early_exit
    from injection.model.lean_step import serving

    adapter = load_adapter(str(demo_model_path), device="cpu", dtype="fp32")
    ids = torch.tensor([[5, 6, 7, 8]])
    hidden = early_exit(adapter.model, ids, 1)
    with torch.inference_mode():
        want = adapter.model(input_ids=ids, output_hidden_states=True).hidden_states[1]
    assert torch.equal(hidden, want)  # the hook still stops the embedder's forward there
    assert any(m._forward_hooks for m in adapter.model.modules())
    assert serving(adapter) is adapter.lean  # transformers' capturing hooks left in place too
    handle = adapter.model.model.layers[0].register_forward_hook(lambda *a: None)
    try:
        assert serving(adapter) is None
    finally:
        handle.remove()
    assert serving(adapter) is adapter.lean


def test_the_engines_replies_are_the_same_with_or_without_it(demo_model_path, chat_messages):
    """Through the executor (batch engine, 3 members at once, rows of different lengths):
    the same replies with the lean step as with the model's forward (``MODEL_LEAN_STEP=0``)."""
    replies = []
    for lean in (True, False):
        adapter = load_adapter(str(demo_model_path), device="cpu", dtype="fp32",
                               lean_step=lean)
        assert (adapter.lean is not None) is lean
        ex = build_executor(adapter, batch_max=4, metrics=Metrics())
        reqs = [ExecutionRequest("t", f"u{i}", chat_messages, f"I like the colour {c}.",
                                 max_new_tokens=12, **PARITY)
                for i, c in enumerate(("red", "green", "a deep midnight blue"))]
        try:
            with ThreadPoolExecutor(3) as pool:
                replies.append([r.text for r in pool.map(ex.execute, reqs)])
            assert ex.engine.stats()["batched_steps"] > 0
        finally:
            ex.close()
    assert replies[0] == replies[1]


@pytest.mark.slow
@pytest.mark.real_model
def test_smollm2s_logits_bit_for_bit(smollm):
    assert smollm.lean is not None
    _steps_agree(smollm.model, smollm.lean, [40, 23], steps=3)


@pytest.mark.slow
@pytest.mark.real_model
@pytest.mark.qwen
def test_qwens_logits_bit_for_bit(qwen):
    assert qwen.lean is not None
    _steps_agree(qwen.model, qwen.lean, [31, 18], steps=2)


def _padded_prefill_agrees(adapter, monkeypatch, prefixes: list[int], new: int) -> None:
    """Rows after prefixes of ``prefixes`` tokens each take ``new`` tokens in one padded
    forward (a group prefill's shape): the lean step's logits and K/V equal the model's bit
    for bit, and its attention read each K/V head by its query group (``_masked_gqa``)."""
    calls = []
    real = lean_mod._masked_gqa
    monkeypatch.setattr(lean_mod, "_masked_gqa", lambda *a: (calls.append(1), real(*a))[1])
    batch, twin = _batch(adapter.model, prefixes, 2), _batch(adapter.model, prefixes, 2)
    width = max(prefixes)
    ids = torch.randint(3, 1000, (len(prefixes), new), generator=torch.Generator().manual_seed(4))
    mask = torch.tensor([[0] * (width - p) + [1] * (p + new) for p in prefixes])
    pos = torch.stack([torch.arange(p, p + new) for p in prefixes])
    _forwards_agree(adapter, ids, mask, pos, batch, twin)
    assert len(calls) == adapter.num_layers


def test_a_padded_prefill_reads_kv_heads_by_group_bit_for_bit(adapter, monkeypatch):
    assert adapter.model.model.layers[0].self_attn.num_key_value_groups > 1
    _padded_prefill_agrees(adapter, monkeypatch, [37, 12, 25], 9)


@pytest.mark.real_model
def test_smollm2s_padded_prefill_bit_for_bit(smollm, monkeypatch):
    _padded_prefill_agrees(smollm, monkeypatch, [300, 180, 260, 299], 21)


@pytest.mark.real_model
@pytest.mark.qwen
def test_qwens_padded_prefill_bit_for_bit(qwen, monkeypatch):
    _padded_prefill_agrees(qwen, monkeypatch, [200, 150, 199], 17)
