"""Watchdog: the time limits Celery does not enforce under the solo/threads pools."""

from __future__ import annotations

import threading
import time

from celery.exceptions import SoftTimeLimitExceeded

from gpu_worker.serving.limits import Watchdog


def _run_ticking(wd: Watchdog, thread: threading.Thread, timeout: float = 10.0) -> None:
    thread.start()
    deadline = time.monotonic() + timeout
    while thread.is_alive() and time.monotonic() < deadline:
        wd.check()
        time.sleep(0.01)
    thread.join(timeout=1)
    assert not thread.is_alive(), "task thread still running"


def test_soft_limit_raises_inside_the_running_task():
    wd = Watchdog(on_hard=lambda e: None)
    seen = {}

    def task():
        try:
            with wd.guard("t-soft", soft=0.2, hard=None):
                while True:  # Python bytecode, like generate()'s per-token loop
                    sum(range(100))
        except SoftTimeLimitExceeded:
            seen["soft"] = time.monotonic()

    started = time.monotonic()
    _run_ticking(wd, threading.Thread(target=task))
    assert seen["soft"] - started >= 0.2
    assert wd.running() == []


def test_hard_limit_hands_the_wedged_task_to_on_hard():
    wedged = []
    wd = Watchdog(on_hard=wedged.append)
    release, entered = threading.Event(), threading.Event()

    def task():
        with wd.guard("t-hard", soft=None, hard=0.1):
            entered.set()
            release.wait(60)  # stuck in native code: no bytecode to interrupt

    th = threading.Thread(target=task)
    th.start()
    assert entered.wait(60)  # inside the guard, however slow the machine
    deadline = time.monotonic() + 60
    while not wedged and time.monotonic() < deadline:  # past the hard limit
        wd.check()
        time.sleep(0.01)
    release.set()
    th.join(10)
    assert [e.task_id for e in wedged] == ["t-hard"]


def test_a_task_that_finished_in_time_is_never_interrupted_later():
    wd = Watchdog(on_hard=lambda e: None)
    result = {}

    def task():
        with wd.guard("t-ok", soft=0.1, hard=0.2):
            pass
        wd.finish()  # task_postrun calls it again: idempotent
        t0 = time.monotonic()
        while time.monotonic() - t0 < 0.4:  # past both limits, outside the task
            sum(range(100))
        result["done"] = True

    _run_ticking(wd, threading.Thread(target=task))
    assert result == {"done": True}
