"""Attention emphasis (issue 22 section 4) on the demo model: exact when off, applied to the
marked rows only, batched == alone, the same as a plain reference loop, keyed links."""

from __future__ import annotations

import math
import threading

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from injection import build_executor
from injection.base import ExecutionRequest, MemoryItem
from injection.engine import emphasis
from injection.engine.batch import BatchEngine
from injection.errors import InvalidRequest
from injection.kvcache.conversation import ConversationStore
from injection.kvcache.packed import PackedKV
from injection.metrics import Metrics
from injection.prompting.emphasis_spans import text_spans

PREF = "I am vegetarian and I never eat fish."
QUESTIONS = ["What should I cook tonight?", "And for dessert?", "Which drink goes with it?"]


@pytest.fixture
def engine(adapter):
    eng = BatchEngine(adapter, max_batch=8)
    yield eng
    eng.close()


@pytest.fixture
def ex(adapter):
    out = build_executor(adapter, batch_max=4, metrics=Metrics())
    yield out
    out.close()


def _case(adapter, pref: str, question: str):
    """(prefix K/V, prompt ids, the preference's absolute key span) of one row."""
    parts = adapter.split_prompt(pref, [{"role": "user", "content": question}])
    spans = text_spans(adapter.renderer, parts.segment, None, "", [pref])
    return (adapter.compute_kv(parts.segment), adapter.renderer.encode(parts.prompt, first=False),
            spans)


def _reference(adapter, prefix, ids, n, value, spans):
    """Greedy batch-1 loop on a plain DynamicCache: the bias built by hand each step, the
    prompt's at full strength, the generated tokens' at ``GENERATED_SCALE`` of it."""
    cache = adapter.build_cache(prefix, 1.0)
    dev = adapter.device
    out, step = [], torch.tensor([ids], device=dev)
    with torch.inference_mode():
        for i in range(n):
            kv = cache.get_seq_length() + step.shape[1]
            bias = torch.zeros(1, 1, 1, kv, device=dev)
            for s, e in spans:
                bias[..., s:e] = value if i == 0 else value * emphasis.GENERATED_SCALE
            logits = adapter.model(input_ids=step, past_key_values=cache, use_cache=True,
                                   position_bias=bias).logits[0, -1]
            out.append(int(logits.argmax()))
            step = torch.tensor([[out[-1]]], device=dev)
    return out


def _threads(calls):
    out = [None] * len(calls)

    def run(i, fn):
        out[i] = fn()

    ts = [threading.Thread(target=run, args=(i, f)) for i, f in enumerate(calls)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    return out


def test_the_bias_is_added_to_the_attention_logits_in_nats():
    """SDPA with ``position_bias`` == softmax(q k^T * scale + mask + bias) v, by hand."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 4, 7, 8), torch.randn(2, 4, 7, 8)
    bias = torch.zeros(2, 1, 1, 7)
    bias[0, ..., 1:3], bias[1, ..., 5:6] = math.log(5), 2.0
    mask = torch.ones(2, 1, 3, 7, dtype=torch.bool).tril(4)
    module = torch.nn.Module()
    got, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.5, position_bias=bias)
    logits = (q @ k.transpose(-1, -2)) * 0.5 + bias
    want = torch.softmax(logits.masked_fill(~mask, float("-inf")), -1) @ v
    torch.testing.assert_close(got, want.transpose(1, 2))


def test_prefill_bias_spares_the_models_own_tokens():
    """Queries at ``quiet`` positions (earlier replies) get GENERATED_SCALE of the bias."""
    assert emphasis.GENERATED_SCALE == 0.0  # the measured default: the model's own words
    plain = emphasis.prefill_bias(2.0, ((1, 3),), 8, "cpu", torch.float32, 4)
    assert plain.shape == (1, 1, 1, 8) and plain[0, 0, 0].tolist() == [0, 2, 2, 0, 0, 0, 0, 0]
    # queries are positions 4..7; 5..6 are a reply, 9..12 lies beyond this chunk
    bias = emphasis.prefill_bias(2.0, ((1, 3),), 8, "cpu", torch.float32, 4, ((5, 7), (9, 12)))
    assert bias.shape == (1, 1, 4, 8)
    assert [row[1] for row in bias[0, 0].tolist()] == [2, 0, 0, 2]
    assert emphasis.prefill_bias(2.0, ((1, 3),), 8, "cpu", torch.float32, 4, ((0, 4),)).shape \
        == (1, 1, 1, 8)  # quiet tokens already in the cache: nothing changes


def test_decode_bias_follows_each_rows_left_padding(monkeypatch):
    class Row:
        def __init__(self, e, spans):
            self.emphasis, self.emphasis_spans = e, spans

    rows = [Row(2.0, ((1, 3),)), Row(0.0, ((0, 5),)), Row(1.5, ((0, 1), (4, 6)))]
    assert emphasis.decode_bias(rows, [0, 2, 3], 6, "cpu", torch.float32) is None  # default
    monkeypatch.setattr(emphasis, "GENERATED_SCALE", 1.0)
    bias = emphasis.decode_bias(rows, [0, 2, 3], 6, "cpu", torch.float32)
    assert bias.shape == (3, 1, 1, 7)
    assert bias[0, 0, 0].tolist() == [0, 2, 2, 0, 0, 0, 0]
    assert bias[1].abs().sum() == 0  # emphasis 0: nothing, whatever its spans
    assert bias[2, 0, 0].tolist() == [0, 0, 0, 1.5, 0, 0, 0]  # (4, 6) clipped at column 7
    assert emphasis.decode_bias(rows[1:2], [0], 6, "cpu", torch.float32) is None
    assert emphasis.prefill_bias(0.0, ((0, 3),), 9, "cpu", torch.float32) is None


def test_a_row_with_emphasis_equals_the_plain_reference_loop(adapter, engine):
    prefix, ids, spans = _case(adapter, PREF, "What should I cook tonight?")
    assert spans
    got = engine.run(prefix, 1.0, ids, 16, emphasis=3.0, emphasis_spans=spans)
    assert got.token_ids == _reference(adapter, prefix, ids, len(got.token_ids), 3.0, spans)
    off = engine.run(prefix, 1.0, ids, 16)
    assert off.token_ids == _reference(adapter, prefix, ids, len(off.token_ids), 0.0, ())
    assert got.token_ids != off.token_ids  # the bias changes what the (random) model says


def test_mixed_batch_each_row_equals_itself_alone(adapter, engine):
    """Different prefix lengths (left pads), emphasised and plain rows in one batch."""
    cases = [(*_case(adapter, p, q), e) for p, q, e in [
        (PREF, "What should I cook tonight?", 4.0),
        ("I live in Oslo, I ski every weekend and I have two dogs.", "Plan my weekend.", 0.0),
        ("Answer like a pirate.", "Where is the treasure?", 1.5),
        ("I live in Oslo, I ski every weekend and I have two dogs.", "Plan my weekend.", 2.0),
    ]]
    alone = [engine.run(p, 1.0, ids, 20, emphasis=e, emphasis_spans=s)
             for p, ids, s, e in cases]
    together = _threads([lambda c=c: engine.run(c[0], 1.0, c[1], 20, emphasis=c[3],
                                                emphasis_spans=c[2]) for c in cases])
    assert engine.counters["batched_steps"] > 0
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    assert alone[1].token_ids != alone[3].token_ids  # same row, emphasis on vs off


def test_emphasis_zero_and_default_are_exactly_todays_reply(adapter, ex):
    msgs = [{"role": "user", "content": "What should I cook tonight?"}]
    prompted = adapter.generate(adapter.plain_prompt(PREF, msgs), None, 1.0, 24)
    zero = ex.execute(ExecutionRequest("t", "u", msgs, PREF, max_new_tokens=24, emphasis=0.0))
    assert zero.text == prompted.text and zero.emphasis_effective == 0.0
    default = ex.execute(ExecutionRequest("t", "u2", msgs, PREF, max_new_tokens=24))
    assert default.emphasis_effective == emphasis.resolve(adapter, None)
    if default.emphasis_effective == 0.0:
        assert default.text == prompted.text
    on = ex.execute(ExecutionRequest("t", "u", msgs, PREF, max_new_tokens=24, emphasis=4.0))
    assert on.emphasis_effective == 4.0 and on.cache_info()["emphasis_effective"] == 4.0
    assert on.text != prompted.text


@pytest.mark.parametrize("value", [-0.1, 8.5, float("nan"), float("inf")])
def test_emphasis_out_of_range_is_refused(ex, value):
    msgs = [{"role": "user", "content": "Hello"}]
    with pytest.raises(InvalidRequest, match="emphasis"):
        ex.execute(ExecutionRequest("t", "u", msgs, PREF, emphasis=value))


def test_emphasis_needs_a_member_text(adapter, ex):
    msgs = [{"role": "user", "content": "Hello"}]
    res = ex.execute(ExecutionRequest("t", "u", msgs, "", instructions="Be brief.",
                                      max_new_tokens=8, emphasis=3.0))
    assert res.emphasis_effective == 0.0  # tenant instructions are never emphasised


def test_spans_are_the_member_texts_only(adapter):
    instructions, texts = "Be brief and polite.", ["I am vegetarian.", "I live in Oslo."]
    context = "\n\n".join([instructions, "\n".join(texts)])
    segment = adapter.split_prompt(context, [{"role": "user", "content": "Hi"}]).segment
    split = adapter.split_segment(segment, context, instructions)
    assert split is not None
    spans = text_spans(adapter.renderer, segment, split, instructions, texts)
    ids = adapter.renderer.encode(segment, first=True)
    got = [adapter.tokenizer.decode(ids[s:e]).strip() for s, e in spans]
    assert "".join(got).replace("\n", "") == "".join(texts)
    assert all(s >= len(split.tenant_ids) for s, _ in spans)
    # no split: the same tokens, found after the instructions' text
    assert text_spans(adapter.renderer, segment, None, instructions, texts) == spans
    req = ExecutionRequest("t", "u", [], "ignored", memories=(MemoryItem("1", texts[0]),))
    assert ExecutionRequest.__dataclass_fields__["emphasis"].default is None
    assert req.emphasis is None


def test_conversation_links_are_keyed_by_emphasis(adapter, ex):
    store = ConversationStore(None, None, Metrics(), max_bytes=0)
    base = store.key("t", "u", "c", "h", 1.0, "fp")
    assert store.key("t", "u", "c", "h", 1.0, "fp", emphasis=0.0) == base  # off: as before
    assert store.key("t", "u", "c", "h", 1.0, "fp", emphasis=2.0) != base

    def talk(value, user):
        history, out = [], []
        for q in QUESTIONS:
            msgs = [*history, {"role": "user", "content": q}]
            res = ex.execute(ExecutionRequest("t", user, msgs, PREF, max_new_tokens=10,
                                              emphasis=value, conversation_id=f"c-{user}"))
            out.append(res)
            history += [{"role": "user", "content": q}, {"role": "assistant", "content": res.text}]
        return out

    first = talk(3.0, "u1")
    assert first[2].reused_tokens > 0  # the same emphasis continues its link
    # another emphasis never continues a link computed under 3.0
    msgs = [{"role": "user", "content": QUESTIONS[0]}]
    hist = [*msgs, {"role": "assistant", "content": first[0].text},
            {"role": "user", "content": QUESTIONS[1]}, {"role": "assistant",
                                                        "content": first[1].text},
            {"role": "user", "content": QUESTIONS[2]}]
    other = ex.execute(ExecutionRequest("t", "u1", hist, PREF, max_new_tokens=10,
                                        emphasis=2.0, conversation_id="c-u1"))
    assert other.reused_tokens == 0 and other.emphasis_effective == 2.0


def test_replies_prefilled_as_prompt_get_the_biases_they_had_while_decoding(adapter, engine):
    """A reply's K/V made while decoding (its tokens attend without emphasis) equals the
    same tokens prefilled later with ``quiet_spans`` covering them, not without."""
    prefix, ids, spans = _case(adapter, PREF, "What should I cook tonight?")
    decoded = engine.run(prefix, 1.0, ids, 12, emphasis=3.0, emphasis_spans=spans,
                         keep_kv=True)
    gen = decoded.token_ids
    start = prefix.num_tokens + len(ids)
    reply = (start, start + len(gen) - 1)  # the last token was chosen, never fed

    def prefilled(quiet):
        out = engine.run(prefix, 1.0, ids + gen[:-1], 1, emphasis=3.0, emphasis_spans=spans,
                         quiet_spans=quiet, keep_kv=True)
        return out, out.sequence_kv.keys[:, :, start:reply[1]]

    want = decoded.sequence_kv.keys[:, :, start:reply[1]]
    quiet, quiet_keys = prefilled((reply,))
    assert quiet.token_ids[0] == gen[-1]
    torch.testing.assert_close(quiet_keys, want, atol=1e-4, rtol=1e-4)
    _, loud_keys = prefilled(())
    assert (loud_keys - want).abs().max() > 1e-3  # without them the replies' K/V differ


def test_a_turns_quiet_spans_are_its_earlier_replies_tokens(adapter, ex):
    """The executor marks exactly the earlier replies' tokens (absolute positions), with or
    without a cached link in front of the prompt."""
    replies = ["I like cooking pasta with basil.", "A lemon sorbet, then."]
    msgs = [{"role": "user", "content": QUESTIONS[0]}, {"role": "assistant", "content": replies[0]},
            {"role": "user", "content": QUESTIONS[1]}, {"role": "assistant", "content": replies[1]},
            {"role": "user", "content": QUESTIONS[2]}]
    parts = adapter.split_prompt(PREF, msgs)
    req = ExecutionRequest("t", "u", msgs, PREF, emphasis=3.0)
    plan = ex.turns.plan(req, msgs, parts.prompt, "h", 1.0, injected=True, emphasis=3.0)
    head = adapter.compute_kv(parts.segment)
    ids = [*head.token_ids, *plan.prompt_ids]
    quiet = ex.turns._quiet(plan, head, 0, 0, ((0, 1),))
    assert [adapter.tokenizer.decode(ids[s:e]).strip() for s, e in quiet] == replies
    done = quiet[0][1] - head.num_tokens + 2  # a cached link covering the first reply
    linked = PackedKV(head.keys[:, :, :1].expand(-1, -1, head.num_tokens + done, -1),
                      head.values[:, :, :1].expand(-1, -1, head.num_tokens + done, -1),
                      ids[:head.num_tokens + done])
    assert ex.turns._quiet(plan, linked, done, 0, ((0, 1),)) == quiet[1:]
    assert ex.turns._quiet(plan, head, 0, 0, ()) == ()  # no emphasis: nothing to spare
