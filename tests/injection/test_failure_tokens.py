"""A generation that fails after generating tells its request's ``on_failure`` how many
tokens it generated (billing: docs/API.md, "what a failed attempt bills"), once: a step that
fails in the engine, the caller's own time limit raised into its waiting thread, and the
engine-less path. Faults are injected into the real engine on the demo model; the count is
checked against the row's own stopping criterion (polled once per generated token)."""

from __future__ import annotations

import ctypes
import threading

import pytest

from injection.engine.batch import BatchEngine
from tests.injection.test_batch import PREFS, _row
from tests.injection.test_batch_faults import QUESTION, _Faulty, _until, _with_model


class TimeLimit(Exception):
    """Stands for Celery's SoftTimeLimitExceeded, raised into the waiting thread."""


def _counted():
    """A ``cancelled`` callback that counts the tokens it was polled for (never cancels)."""
    polls = [0]

    def cancelled() -> bool:
        polls[0] += 1
        return False

    return polls, cancelled


def test_a_row_failing_in_a_decoding_step_reports_what_it_generated(adapter):
    prompt, kv = _row(adapter, PREFS[0], QUESTION)

    def before(call, _kw):
        if call == 7:  # the prefill, then five decoding steps went through
            raise RuntimeError("injected step fault")

    eng = BatchEngine(_with_model(adapter, _Faulty(adapter.model, before)), max_batch=2)
    polls, cancelled = _counted()
    reported: list[int] = []
    try:
        with pytest.raises(RuntimeError, match="injected step fault"):
            eng.generate(prompt, kv, 1.0, 64, cancelled=cancelled, on_failure=reported.append)
    finally:
        eng.close()
    assert reported == [polls[0]] and polls[0] >= 5


def test_a_caller_stopped_by_its_time_limit_reports_what_was_generated(adapter):
    prompt, kv = _row(adapter, PREFS[1], QUESTION)
    eng = BatchEngine(adapter, max_batch=2)
    polls, cancelled = _counted()
    reported: list[int] = []
    box: dict = {}

    def chat():
        try:
            eng.generate(prompt, kv, 1.0, 400, cancelled=cancelled,
                         on_failure=reported.append)
        except TimeLimit as exc:
            box["error"] = exc

    thread = threading.Thread(target=chat)
    try:
        thread.start()
        _until(lambda: polls[0] >= 3, "three tokens generated")
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident),
                                                   ctypes.py_object(TimeLimit))
        thread.join(60)
        _until(lambda: eng.stats()["active"] == 0, "the abandoned row dropped")
    finally:
        eng.close()
    assert isinstance(box.get("error"), TimeLimit)
    # what it had when its caller stopped; the step in flight may add one, never more
    assert len(reported) == 1 and 3 <= reported[0] <= polls[0] <= reported[0] + 1


def test_without_the_engine_a_failing_generation_reports_too(adapter):
    prompt, kv = _row(adapter, PREFS[0], QUESTION)
    polls = [0]

    def fails_at_the_fourth_token() -> bool:
        polls[0] += 1
        if polls[0] == 4:
            raise RuntimeError("injected callback fault")
        return False

    reported: list[int] = []
    with pytest.raises(RuntimeError, match="injected callback fault"):
        adapter.generate(prompt, kv, 1.0, 64, cancelled=fails_at_the_fourth_token,
                         on_failure=reported.append)
    assert reported == [4]
