"""Residual retrieve_fact tool calls are stripped in all three formats and counted."""

from __future__ import annotations

import pytest

from injection.prompting.output_filter import strip_retrieve_fact_calls as strip

DS_CALL = (
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>retrieve_fact\n"
    '```json\n{"trace_id": "t-1", "query": "diet"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
)


def test_text_without_calls_is_unchanged():
    text = "Try  the risotto.\n\n\nIt is  mild."
    assert strip(text) == (text, 0)


@pytest.mark.parametrize(
    "text, clean",
    [
        ('Try the risotto. retrieve_fact(trace_id="t-1", query="diet") Enjoy!',
         "Try the risotto. Enjoy!"),
        ('A retrieve_fact(q="has ) and ( inside", n=(1, 2)) B', "A B"),
        ("A retrieve_fact(q='it\\'s') B", "A B"),
        ("retrieve_fact()", ""),
    ],
)
def test_generic_calls(text, clean):
    assert strip(text) == (clean, 1)


def test_deepseek_call_and_empty_wrapper_removed():
    assert strip(f"Here you go. {DS_CALL} Enjoy.") == ("Here you go. Enjoy.", 1)


def test_deepseek_other_tools_are_kept():
    other = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n{}<｜tool▁call▁end｜>"
    text = f"{other} and <｜tool▁call▁begin｜>retrieve_fact\n{{}}<｜tool▁call▁end｜>"
    assert strip(text) == (f"{other} and", 1)


def test_glm_call_with_nested_json():
    text = 'Sure.<|tool_call|>retrieve_fact\n{"trace_id": "t}", "args": {"k": [1, {"x": 2}]}} Done.'
    assert strip(text) == ("Sure. Done.", 1)


def test_truncated_calls_strip_to_end():
    assert strip('Okay retrieve_fact(trace_id="abc') == ("Okay", 1)
    assert strip('Okay <|tool_call|>retrieve_fact\n{"a": 1') == ("Okay", 1)
    assert strip("Okay <｜tool▁call▁begin｜>retrieve_fact\n{") == ("Okay", 1)


def test_mixed_formats_are_all_counted():
    text = (
        f'Start retrieve_fact(x=1) middle {DS_CALL} then <|tool_call|>retrieve_fact\n{{"a": 1}} '
        "and retrieve_fact(y=2) end"
    )
    clean, n = strip(text)
    assert n == 4
    assert clean == "Start middle then and end"
    assert "retrieve_fact" not in clean


def test_word_containing_the_name_is_not_a_call():
    assert strip("my_retrieve_fact_helper is a function name") == (
        "my_retrieve_fact_helper is a function name", 0,
    )


def test_control_characters_no_client_can_display_are_removed():
    from injection.prompting.output_filter import strip_control_chars

    text = "Bon\x00jour\x1b[31m!\x07 caf\u00e9 \U0001f600\u200d\U0001f467\ttab\r\nline\x85\x9f end\ud800"
    clean, n = strip_control_chars(text)
    assert clean == "Bonjour[31m! caf\u00e9 \U0001f600\u200d\U0001f467\ttab\r\nline end"
    assert n == 6
    assert strip_control_chars("plain text\n") == ("plain text\n", 0)
