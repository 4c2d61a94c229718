"""retrieve_fact markup never reaches a client: the streamed pieces, however the reply is
cut, concatenate to the final filtered text, and no prefix ever streamed shows markup."""

from __future__ import annotations

import random

import pytest

from injection.base import ExecutionRequest
from injection.engine.request_checks import sampling_options
from injection.engine.stopping import GenerationWatch
from injection.prompting.markup import MarkupStream, strip_markup
from injection.prompting.output_filter import strip_control_chars, strip_retrieve_fact_calls

DS = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>retrieve_fact\n"
      '```json\n{"trace_id": "t-1"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>')
OTHER = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n{}<｜tool▁call▁end｜>"
TEXTS = [
    'Try the risotto. retrieve_fact(trace_id="t-1", query="diet") Enjoy!',
    'A retrieve_fact(q="has ) and ( inside", n=(1, 2)) B',
    "retrieve_fact() at the start, and retrieve_fact(x=1)",
    f"Here you go. {DS} Enjoy.",
    f"{OTHER} and <｜tool▁call▁begin｜>retrieve_fact\n{{}}<｜tool▁call▁end｜> then",
    'Sure.<|tool_call|>retrieve_fact\n{"trace_id": "t}", "args": {"k": [1, {"x": 2}]}} Done.',
    '<|tool_call|>retrieve_facts {"a": 1} is another tool, <|tool_call|>other too',
    'Okay retrieve_fact(trace_id="abc',
    "Okay <|tool_call|>retrieve_fact\n{\"a\": 1",
    "Lines\n\nretrieve_fact(a)\n\n\nnext paragraph\n",
    "my_retrieve_fact_helper is a function name; retrieve_fact is a word here",
    "ends with a head retrieve_fact",
    "ends with a partial <|tool_ca",
    "x retrieve_fact(a)retrieve_fact(b) y  retrieve_fact (c)  z",
    "plain reply with no markup at all, just words.  Two spaces.\n",
]


def stream(text: str, cuts: list[int]) -> tuple[str, list[str]]:
    got: list[str] = []
    s = MarkupStream(got.append)
    prev = 0
    for cut in [*cuts, len(text)]:
        s(text[prev:cut])
        prev = cut
        # what the client has at any moment is a prefix of the final text
        assert strip_markup(text)[0].startswith("".join(got))
    s.finish()
    return "".join(got), got


@pytest.mark.parametrize("text", TEXTS)
def test_every_chunking_streams_the_final_text(text):
    final, _ = strip_markup(text)
    assert stream(text, list(range(1, len(text))))[0] == final  # one character a piece
    for cut in range(len(text) + 1):  # every two-piece split
        assert stream(text, [cut])[0] == final
    rng = random.Random(len(text))
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 8))))
        assert stream(text, cuts)[0] == final


@pytest.mark.parametrize("text", [t for t in TEXTS if "is a word" not in t
                                  and "ends with a" not in t and "another tool" not in t])
def test_no_markup_is_ever_streamed(text):
    streamed, pieces = stream(text, list(range(1, len(text))))
    assert "retrieve_fact" not in streamed and "<|tool_call|>" not in streamed
    assert all("retrieve_fact(" not in p for p in pieces)


def test_final_filter_is_the_same_function():
    for text in TEXTS:
        assert strip_retrieve_fact_calls(text) == strip_markup(text)
    assert strip_markup("x retrieve_fact(a)retrieve_fact(b) y") == ("x y", 2)


def test_generation_watch_streams_filtered_pieces(adapter):
    """The engine's per-token watch with a request's stream: real tokenizer ids, decoded
    token by token, pieces through the request's stream filter, flushed at the end."""
    text = 'Sure, here. retrieve_fact(trace_id="t-9", q="x") The answer\x00 is 4.'
    ids = adapter.tokenizer(text, add_special_tokens=False)["input_ids"]
    got: list[str] = []
    req = ExecutionRequest("t", "u", [{"role": "user", "content": "hi"}], on_text=got.append)
    opts = sampling_options(req)
    watch = GenerationWatch(adapter.tokenizer, 0, on_text=opts["on_text"])
    for i in range(1, len(ids) + 1):
        watch.observe(ids[:i])
    watch.finish(ids, 1000, set())
    decoded = adapter.tokenizer.decode(ids, skip_special_tokens=True)
    final = strip_markup(strip_control_chars(decoded)[0])[0]
    assert "".join(got) == final and "retrieve_fact" not in final and "\x00" not in final
