"""Stop sequences, finish reasons and incremental text on the real demo model."""

from __future__ import annotations

from injection.engine.stopping import GenerationWatch, find_stop


class ByteTokenizer:
    """Each id is one UTF-8 byte: decoding a prefix can end inside a character."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")


def test_find_stop_takes_the_earliest_of_several():
    assert find_stop("abc END xyz STOP", ["STOP", "END"]) == 4
    assert find_stop("abc", ["x", ""]) == -1


def test_incremental_text_never_splits_a_multibyte_character():
    data = "héllo → wörld".encode()
    pieces: list[str] = []
    watch = GenerationWatch(ByteTokenizer(), 0, on_text=pieces.append)
    for n in range(1, len(data) + 1):
        watch._update(list(data[:n]))
    assert "\ufffd" not in "".join(pieces)
    assert "".join(pieces) == "héllo → wörld"


def test_text_that_may_begin_a_stop_string_is_held_back_until_decided():
    pieces: list[str] = []
    watch = GenerationWatch(ByteTokenizer(), 0, stop=["END"], on_text=pieces.append)
    data = b"one EN two E"
    for n in range(1, len(data) + 1):
        watch._update(list(data[:n]))
    assert "".join(pieces) == "one EN two "  # the last "E" may start "END"
    watch._update(list(b"one EN two END three"))
    assert watch.finish_reason == "stop" and "".join(pieces) == watch.text == "one EN two "


def test_stop_sequence_cuts_the_reply_and_ends_generation(adapter, chat_prompt):
    full = adapter.generate(chat_prompt, None, 1.0, 24)
    assert full.finish_reason == "length" and len(full.token_ids) == 24
    stop = full.text[len(full.text) // 2:][:3]
    cut = adapter.generate(chat_prompt, None, 1.0, 24, stop=[stop])
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[:full.text.find(stop)]
    assert len(cut.token_ids) < 24  # generation ended there, not at max_new_tokens


def test_streamed_pieces_concatenate_to_the_reply(adapter, chat_prompt):
    pieces: list[str] = []
    out = adapter.generate(chat_prompt, None, 1.0, 20, on_text=pieces.append)
    assert len(pieces) > 1 and "".join(pieces) == out.text


def test_cancel_flag_stops_generation_within_a_token(adapter, chat_prompt):
    calls = []

    def cancelled() -> bool:
        calls.append(1)
        return len(calls) >= 3

    out = adapter.generate(chat_prompt, None, 1.0, 40, cancelled=cancelled)
    assert out.finish_reason == "cancelled" and len(out.token_ids) == 3
