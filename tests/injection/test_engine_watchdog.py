"""The engine watchdog on the real batch engine (demo model): a scheduler thread stuck in a
forward pass, or dead, is found from its heartbeat; every in-flight and waiting request
fails at once with the retryable EngineUnavailable. The clock is injected: nothing here
depends on how fast the machine is."""

from __future__ import annotations

import threading

import pytest

from injection.engine.batch import BatchEngine
from injection.engine.watchdog import EngineWatchdog
from injection.errors import EngineUnavailable
from tests.injection.test_batch import PREFS, _row
from tests.injection.test_batch_faults import QUESTION, _Faulty, _until, _with_model


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class _Stuck:
    """A ``before`` hook: the ``at``-th forward blocks until released (a hung kernel)."""

    def __init__(self, at: int) -> None:
        self.at, self.entered, self.release = at, threading.Event(), threading.Event()

    def __call__(self, call, _kw):
        if call == self.at:
            self.entered.set()
            assert self.release.wait(60)


def _caller(eng, prompt, kv, box, key, **opts):
    def run():
        try:
            box[key] = eng.generate(prompt, kv, 1.0, 12, **opts)
        except BaseException as exc:  # noqa: BLE001 - checked by the test
            box[key] = exc

    t = threading.Thread(target=run)
    t.start()
    return t


@pytest.fixture
def stuck_engine(adapter):
    clock, stuck = FakeClock(), _Stuck(at=3)  # the second decoding step hangs
    eng = BatchEngine(_with_model(adapter, _Faulty(adapter.model, stuck)), max_batch=1,
                      clock=clock)
    yield eng, clock, stuck
    stuck.release.set()
    eng.close()


def test_a_stuck_scheduler_is_detected_and_its_requests_fail_fast(adapter, stuck_engine):
    eng, clock, stuck = stuck_engine
    prompt, kv = _row(adapter, PREFS[0], QUESTION)
    trips: list[str] = []
    dog = EngineWatchdog(eng, stall_after=30, on_trip=trips.append)
    clock.t += 3600
    assert dog.check() is None  # idle for an hour: not stuck
    box: dict = {}
    pieces: list[str] = []
    running = _caller(eng, prompt, kv, box, "running", on_text=pieces.append)
    assert stuck.entered.wait(60)
    waiting = _caller(eng, prompt, kv, box, "waiting")  # max_batch 1: it queues
    _until(lambda: eng.stats()["waiting"] == 1, "the second request queued")
    clock.t += 29
    assert dog.check() is None and not trips  # a slow step is not a stuck one
    clock.t += 2
    assert dog.check() == "stuck"
    running.join(60)
    waiting.join(60)
    assert isinstance(box["running"], EngineUnavailable)
    assert isinstance(box["waiting"], EngineUnavailable)
    assert trips == ["stuck"] and eng.counters["watchdog_trips"] == 1
    with pytest.raises(EngineUnavailable):  # refused at once until the worker restarts
        eng.generate(prompt, kv, 1.0, 4)
    clock.t += 3600
    assert dog.check() is None  # trips once
    sent = list(pieces)
    stuck.release.set()  # the hung forward returns after all
    eng._thread.join(60)
    assert not eng._thread.is_alive() and pieces == sent  # nothing more for a failed row


def test_the_watchdog_thread_trips_on_its_own(adapter, stuck_engine):
    eng, clock, stuck = stuck_engine
    prompt, kv = _row(adapter, PREFS[0], QUESTION)
    tripped = threading.Event()
    dog = EngineWatchdog(eng, stall_after=30, interval=0.01,
                         on_trip=lambda _reason: tripped.set()).start()
    try:
        box: dict = {}
        running = _caller(eng, prompt, kv, box, "running")
        assert stuck.entered.wait(60)
        clock.t += 31
        assert tripped.wait(60)
        running.join(60)
    finally:
        dog.stop()
    assert isinstance(box["running"], EngineUnavailable) and dog.tripped == "stuck"


class _Die(BaseException):
    """Not an Exception: no step catches it, so it ends the scheduler thread."""


def test_a_dead_scheduler_thread_is_detected(adapter, monkeypatch):
    monkeypatch.setattr(threading, "excepthook", lambda _args: None)  # expected death

    def die(call, _kw):
        if call == 2:
            raise _Die()

    clock = FakeClock()
    eng = BatchEngine(_with_model(adapter, _Faulty(adapter.model, die)), clock=clock)
    dog = EngineWatchdog(eng, stall_after=30)
    prompt, kv = _row(adapter, PREFS[0], QUESTION)
    box: dict = {}
    try:
        running = _caller(eng, prompt, kv, box, "running")
        _until(lambda: eng._thread is not None and not eng._thread.is_alive(), "thread died")
        assert "running" not in box  # nothing else would ever answer it
        assert dog.check() == "dead"  # no clock advance needed
        running.join(60)
    finally:
        eng.close()
    assert isinstance(box["running"], EngineUnavailable)


def test_a_scheduler_stuck_in_a_prefill_fails_the_row_being_admitted(adapter):
    clock, stuck = FakeClock(), _Stuck(at=1)  # the very first forward: the row's prefill
    eng = BatchEngine(_with_model(adapter, _Faulty(adapter.model, stuck)), clock=clock)
    dog = EngineWatchdog(eng, stall_after=30)
    prompt, kv = _row(adapter, PREFS[0], QUESTION)
    box: dict = {}
    try:
        running = _caller(eng, prompt, kv, box, "running")
        assert stuck.entered.wait(60)
        assert eng.stats()["active"] == 0 and eng.stats()["waiting"] == 0  # in neither list
        clock.t += 31
        assert dog.check() == "stuck"
        running.join(60)
    finally:
        stuck.release.set()
        eng.close()
    assert isinstance(box["running"], EngineUnavailable)
