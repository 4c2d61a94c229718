"""Typed environment reads: an on/off/auto switch refuses what it does not understand."""

from __future__ import annotations

import pytest

from config.envvars import env_auto_bool


@pytest.mark.parametrize(("raw", "want"), [(None, None), ("auto", None), (" AUTO ", None),
                                           ("on", True), ("1", True), ("off", False),
                                           ("false", False)])
def test_an_auto_switch_reads_auto_on_and_off(monkeypatch, raw, want):
    if raw is None:
        monkeypatch.delenv("KVI_TEST_SWITCH", raising=False)
    else:
        monkeypatch.setenv("KVI_TEST_SWITCH", raw)
    assert env_auto_bool("KVI_TEST_SWITCH") is want


def test_an_auto_switch_refuses_anything_else(monkeypatch):
    monkeypatch.setenv("KVI_TEST_SWITCH", "sometimes")
    with pytest.raises(ValueError, match="KVI_TEST_SWITCH"):
        env_auto_bool("KVI_TEST_SWITCH")


def test_a_list_is_comma_separated_and_stripped(monkeypatch):
    from config.envvars import env_list

    monkeypatch.setenv("KVI_TEST_LIST", " https://a.example , ,https://b.example:8443,")
    assert env_list("KVI_TEST_LIST") == ["https://a.example", "https://b.example:8443"]
    monkeypatch.delenv("KVI_TEST_LIST")
    assert env_list("KVI_TEST_LIST") == []
