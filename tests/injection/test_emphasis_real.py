"""Attention emphasis on the prepared default model (SmolLM2-135M-Instruct): exact when
off, the member's own tokens only, batched == alone with emphasis on."""

from __future__ import annotations

import math
import threading

import pytest

from injection import build_executor, load_adapter
from injection.base import ExecutionRequest
from injection.metrics import Metrics
from injection.prompting.emphasis_spans import text_spans

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

CASES = [
    ("I am vegetarian.", "What should I cook for dinner tonight?"),
    ("Always answer in French.", "How are you today?"),
    ("My favourite sport is tennis.", "What is my favourite sport?"),
]


@pytest.fixture(scope="module")
def smollm(real_model_path):
    return load_adapter(real_model_path, device="cpu")


@pytest.fixture(scope="module")
def ex(smollm):
    out = build_executor(smollm, batch_max=4, metrics=Metrics())
    yield out
    out.close()


def test_spans_cover_exactly_the_preference_tokens(smollm):
    instructions, pref = "You are a helpful assistant of Acme.", "I am vegetarian."
    context = f"{instructions}\n\n{pref}"
    segment = smollm.split_prompt(context, [{"role": "user", "content": "Hi"}]).segment
    split = smollm.split_segment(segment, context, instructions)
    assert split is not None
    spans = text_spans(smollm.renderer, segment, split, instructions, [pref])
    ids = smollm.renderer.encode(segment, first=True)
    assert len(spans) == 1
    (s, e), = spans
    assert smollm.tokenizer.decode(ids[s:e]) == pref  # not "\n\n", not <|im_end|>
    assert s > len(split.tenant_ids)  # the separator stays out


@pytest.mark.parametrize("pref, question", CASES)
def test_emphasis_zero_is_the_system_message_reply_token_for_token(smollm, ex, pref, question):
    msgs = [{"role": "user", "content": question}]
    prompted = smollm.generate(smollm.plain_prompt(pref, msgs), None, 1.0, 32)
    got = ex.execute(ExecutionRequest("t", "u", msgs, pref, max_new_tokens=32, emphasis=0.0,
                                      contrast=0.0))
    assert got.text == prompted.text and got.emphasis_effective == 0.0


def test_emphasis_batched_equals_alone_and_changes_only_marked_rows(smollm, ex):
    reqs = [ExecutionRequest("t", f"u{i}", [{"role": "user", "content": q}], p,
                             max_new_tokens=32, emphasis=e, reuse_conversation=False,
                             contrast=0.0)
            for i, ((p, q), e) in enumerate(zip(CASES, [math.log(5), 0.0, 2.0], strict=True))]
    alone = [ex.execute(r).text for r in reqs]
    out: list = [None] * len(reqs)

    def run(i):
        out[i] = ex.execute(reqs[i]).text

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert ex.engine.counters["batched_steps"] > 0
    assert out == alone
    prompted = smollm.generate(smollm.plain_prompt(CASES[1][0], list(reqs[1].messages)),
                               None, 1.0, 32)
    assert alone[1] == prompted.text  # the unmarked row is today's reply
