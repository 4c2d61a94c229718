"""A caller waiting on another request's shared computation (a segment, a lean:
``injection.kvcache.singleflight``) is not failed by that request's time limit: the soft
limit the worker's watchdog (``gpu_worker.serving.limits``) raises into the leader's thread
ends the leader alone, and the waiting caller computes for itself. A computation's own error
still reaches every caller."""

from __future__ import annotations

import threading
import time

import pytest
from celery.exceptions import SoftTimeLimitExceeded

from gpu_worker.serving.limits import Watchdog
from injection.kvcache.singleflight import SingleFlight, leaders_own
from tests.injection.test_singleflight import wait_until


def _caller(sf: SingleFlight):
    """``(outcomes, call)``: ``call(name, fn)`` runs ``sf.do`` on one key and keeps what it
    returned or raised under ``name``."""
    outcomes: dict[str, tuple] = {}

    def call(name, fn):
        try:
            outcomes[name] = ("ok", *sf.do("segment", fn))
        except BaseException as exc:  # noqa: BLE001
            outcomes[name] = ("err", exc)

    return outcomes, call


def test_the_leaders_soft_time_limit_is_not_the_waiting_callers():
    sf: SingleFlight[str] = SingleFlight()
    watchdog, started, computed = Watchdog(on_hard=lambda e: None), threading.Event(), []
    outcomes, call = _caller(sf)

    def slow() -> str:  # the leader's computation: Python bytecodes, so the limit lands
        started.set()
        while True:
            time.sleep(0.001)

    def follower_compute() -> str:
        computed.append("follower")
        return "segment K/V"

    def leader_task():
        with watchdog.guard("task-1", soft=30.0, hard=None):
            call("leader", slow)

    leader = threading.Thread(target=leader_task)
    leader.start()
    assert started.wait(10)
    follower = threading.Thread(target=call, args=("follower", follower_compute))
    follower.start()
    wait_until(lambda: sf.waiters("segment") == 1)
    entry = watchdog.running()[0]
    watchdog.check(now=entry.started + 31.0)  # the leader's task passed its soft limit
    leader.join(10)
    follower.join(10)
    assert outcomes["leader"][0] == "err"
    assert isinstance(outcomes["leader"][1], SoftTimeLimitExceeded)
    # the follower led a computation of its own and got its result
    assert outcomes["follower"] == ("ok", "segment K/V", False) and computed == ["follower"]
    assert not sf._calls


def test_a_computations_own_error_still_reaches_the_waiting_caller():
    sf: SingleFlight[str] = SingleFlight()
    release, started = threading.Event(), threading.Event()
    outcomes, call = _caller(sf)

    def failing() -> str:
        started.set()
        release.wait(10)
        raise RuntimeError("out of memory")

    leader = threading.Thread(target=call, args=("leader", failing))
    leader.start()
    assert started.wait(10)
    follower = threading.Thread(target=call, args=("follower", lambda: "unused"))
    follower.start()
    wait_until(lambda: sf.waiters("segment") == 1)
    release.set()
    leader.join(10)
    follower.join(10)
    assert [outcomes[n][0] for n in ("leader", "follower")] == ["err", "err"]
    assert outcomes["follower"][1] is outcomes["leader"][1]


@pytest.mark.parametrize(("error", "own"), [(SoftTimeLimitExceeded(), True),
                                            (KeyboardInterrupt(), True),
                                            (RuntimeError("oom"), False),
                                            (ValueError("bad"), False)])
def test_which_errors_are_the_leaders_own(error, own):
    assert leaders_own(error) is own
