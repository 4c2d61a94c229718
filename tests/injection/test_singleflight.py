"""Concurrent callers of one key share one computation; errors reach all; nothing leaks."""

from __future__ import annotations

import threading
import time

import pytest

from injection.kvcache.singleflight import SingleFlight

N = 8


def wait_until(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.001)


def run_concurrently(sf, key, fn, n=N):
    """Start n callers; returns (threads, outcomes) once all but the leader are waiting."""
    outcomes: list = [None] * n

    def call(i):
        try:
            outcomes[i] = ("ok", *sf.do(key, fn))
        except Exception as exc:  # noqa: BLE001
            outcomes[i] = ("err", exc)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return threads, outcomes


def test_same_key_computes_once_and_all_share_the_result():
    sf: SingleFlight[object] = SingleFlight()
    release, calls = threading.Event(), []

    def compute():
        calls.append(1)
        release.wait(10)
        return object()

    threads, outcomes = run_concurrently(sf, "k", compute)
    wait_until(lambda: sf.waiters("k") == N - 1)  # everyone is inside do() now
    release.set()
    for t in threads:
        t.join(10)
    assert len(calls) == 1
    results = {id(o[1]) for o in outcomes}
    assert len(results) == 1
    assert sorted(o[2] for o in outcomes) == [False] + [True] * (N - 1)
    assert not sf._calls


def test_errors_propagate_to_every_waiter_and_key_is_released():
    sf: SingleFlight[int] = SingleFlight()
    release = threading.Event()

    def boom():
        release.wait(10)
        raise RuntimeError("compute failed")

    threads, outcomes = run_concurrently(sf, "k", boom)
    wait_until(lambda: sf.waiters("k") == N - 1)
    release.set()
    for t in threads:
        t.join(10)
    assert all(o[0] == "err" and str(o[1]) == "compute failed" for o in outcomes)
    assert not sf._calls
    assert sf.do("k", lambda: 5) == (5, False)  # a later call computes afresh


def test_sequential_calls_recompute_and_keys_do_not_leak():
    sf: SingleFlight[int] = SingleFlight()
    counter = iter(range(100))
    assert [sf.do(f"k{i % 3}", lambda: next(counter))[0] for i in range(6)] == list(range(6))
    assert not sf._calls and sf.waiters("k0") == 0


def test_different_keys_run_concurrently():
    sf: SingleFlight[str] = SingleFlight()
    both = threading.Barrier(2, timeout=10)

    def compute(name):
        both.wait()  # deadlocks (BrokenBarrierError) if keys were serialised
        return name

    out = {}
    threads = [
        threading.Thread(target=lambda k=k: out.setdefault(k, sf.do(k, lambda: compute(k))))
        for k in ("a", "b")
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert out == {"a": ("a", False), "b": ("b", False)}


def test_leader_exception_is_raised_to_leader():
    sf: SingleFlight[int] = SingleFlight()
    with pytest.raises(ZeroDivisionError):
        sf.do("k", lambda: 1 // 0)
    assert not sf._calls
