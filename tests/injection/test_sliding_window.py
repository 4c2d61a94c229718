"""Sliding-window models through the batch engine: tiny random Mistral (every layer
windowed) and Qwen2 (hybrid: one full, one sliding layer) with the demo tokenizer and a
24-token window. Plain cache layers keep every token and the model's mask applies the
window, so injected, batched, chunked replies equal the model's own generate() with its
native sliding cache, also for prompts and injected prefixes longer than the window."""

from __future__ import annotations

import threading

import pytest
import torch
from transformers import AutoTokenizer, GenerationConfig

from injection import build_executor
from injection.base import ExecutionRequest
from injection.engine.batch import BatchEngine
from injection.metrics import Metrics
from injection.model.loading import load_adapter
from injection.prompting.output_filter import strip_control_chars

WINDOW = 24
LONG_PREF = ("I am a vegetarian who lives in a small flat in Oslo with two cats, I cycle to "
             "work every day and I like quiet places, old films and long walks by the sea.")
QUESTIONS = ["What should I cook tonight?", "Tell me a story about a dog and a cat.",
             "Hello there, how are you doing today, my dear old friend from school?"]


def _build(kind: str, demo_model_path, out):
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    tok = AutoTokenizer.from_pretrained(demo_model_path)
    tok.save_pretrained(out)
    common = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=1024, initializer_range=0.05,
                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                  pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    if kind == "mistral":
        cfg, cls = MistralConfig(sliding_window=WINDOW, **common), MistralForCausalLM
    else:
        cfg, cls = Qwen2Config(use_sliding_window=True, sliding_window=WINDOW,
                               max_window_layers=1, **common), Qwen2ForCausalLM
    torch.manual_seed(3)
    model = cls(cfg).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id,
        pad_token_id=cfg.pad_token_id, do_sample=False)
    model.save_pretrained(out)
    return load_adapter(str(out), device="cpu", dtype="fp32")


@pytest.fixture(scope="module", params=["mistral", "qwen2-hybrid"])
def windowed(request, demo_model_path, tmp_path_factory):
    return _build(request.param, demo_model_path, tmp_path_factory.mktemp(request.param))


def native(adapter, context: str, question: str, n: int, window: bool = True) -> list[int]:
    """The model's own generate() with its own (sliding) cache: the reference."""
    msgs = ([{"role": "system", "content": context}] if context else []) + [
        {"role": "user", "content": question}]
    ids = adapter.renderer.encode(adapter.render_chat(msgs), first=True)
    cfg, saved = adapter.model.config, adapter.model.config.sliding_window
    cfg.sliding_window = saved if window else 100_000  # wider than any sequence here
    try:
        out = adapter.model.generate(input_ids=torch.tensor([ids]), max_new_tokens=n,
                                     do_sample=False)
    finally:
        cfg.sliding_window = saved
    return out[0, len(ids):].tolist()


def test_the_window_is_real_and_the_model_batches(windowed):
    assert windowed.model.config.sliding_window == WINDOW and windowed.supports_batching
    # prompts past the window answer differently with and without it: the tests below
    # would see a window that is not applied
    assert any(native(windowed, LONG_PREF, q, 16) != native(windowed, LONG_PREF, q, 16, False)
               for q in QUESTIONS)


def test_batched_rows_past_the_window_equal_the_native_sliding_cache(windowed):
    eng = BatchEngine(windowed, max_batch=4)
    prompts = [windowed.render_chat([{"role": "user", "content": q}]) for q in QUESTIONS]
    got: list = [None] * len(prompts)

    def run(i):
        got[i] = eng.generate(prompts[i], None, 1.0, 30).token_ids

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        eng.close()
    assert got == [native(windowed, "", q, 30) for q in QUESTIONS]
    assert eng.counters["peak_batch"] >= 2


def test_injected_segments_longer_than_the_window_reproduce_the_system_message(windowed):
    ex = build_executor(windowed, batch_max=4, metrics=Metrics(), batch_prefill_chunk=16)
    instr = "You are the assistant of a small bakery in Bergen. Answer briefly."
    assert windowed.count_tokens(LONG_PREF) > WINDOW
    try:
        for user, q in zip(("a", "b", "a"), QUESTIONS, strict=True):
            res = ex.execute(ExecutionRequest("t", user, [{"role": "user", "content": q}],
                                              LONG_PREF, instructions=instr, max_new_tokens=20,
                                              reminder=False))
            assert res.kv_tokens > WINDOW and "tenant" in res.extra["segments"]
            want = native(windowed, instr + "\n\n" + LONG_PREF, q, 20)
            assert res.completion_tokens == len(want)
            text = windowed.tokenizer.decode(want, skip_special_tokens=True)
            assert res.text == strip_control_chars(text)[0]
        assert ex.metrics.get("computes_one_pass") == 2  # members a and b
    finally:
        ex.close()
