"""The demo supervisor with real child processes: restart with doubling backoff, stop all."""

from __future__ import annotations

import os
import sys
import time

from gpu_worker.ops.supervisor import Child, Supervisor


def run_until(sup: Supervisor, done, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "supervisor did not get there in time"
        sup.tick()
        time.sleep(0.02)


def test_a_crashing_child_is_restarted_with_doubling_capped_backoff():
    said: list[str] = []
    crasher = Child("crasher", [sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ))
    sup = Supervisor([crasher], say=said.append, backoff=(0.1, 0.4))
    sup.start()
    try:
        run_until(sup, lambda: crasher.restarts >= 4)
    finally:
        sup.stop()
    assert set(crasher.history) == {3}
    delays = [float(m.rsplit(" ", 1)[1].rstrip("s")) for m in said if "restarting it in" in m]
    assert delays[:4] == [0.1, 0.2, 0.4, 0.4]
    assert "crasher exited with code 3; restarting it in 0.1s" in said
    assert "restarting crasher (restart 1)" in said


def test_a_running_child_is_left_alone_and_stop_ends_every_child():
    sleeper = Child("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"],
                    dict(os.environ))
    crasher = Child("crasher", [sys.executable, "-c", "raise SystemExit(1)"], dict(os.environ))
    sup = Supervisor([sleeper, crasher], say=lambda m: None, backoff=(0.05, 0.05))
    sup.start()
    first = sleeper.proc.pid
    run_until(sup, lambda: crasher.restarts >= 2)  # another child crashing stops nothing
    assert sleeper.running() and sleeper.proc.pid == first and sleeper.restarts == 0
    sup.stop(grace=10)
    assert sleeper.proc.returncode is not None and not sleeper.running()
