"""The demo supervisor with real child processes: restart with doubling backoff, a
crash-loop limit with a clear final message, stop all.

The supervisor's clock is injected: backoffs elapse when the test advances it, so no
assertion depends on how fast this machine is. The children are real processes; the
tests wait (with a generous bound) only for them to start or exit.
"""

from __future__ import annotations

import os
import sys
import time

import pytest

from gpu_worker.ops.supervisor import STABLE_SECONDS, Child, CrashLoop, Supervisor
from tests.workers import wait_for

CRASHER = "print('booting', flush=True); print('fatal: bad config', flush=True); " \
          "raise SystemExit(3)"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def exited(child: Child) -> None:
    wait_for(lambda: not child.running(), 30, f"{child.name} to exit")


def test_a_crashing_child_is_restarted_with_doubling_capped_backoff():
    said, clock = [], Clock()
    crasher = Child("crasher", [sys.executable, "-c", CRASHER], dict(os.environ))
    sup = Supervisor([crasher], say=said.append, backoff=(1, 4), crash_limit=10,
                     clock=clock, echo=lambda raw: None)
    sup.start()
    delays = []
    try:
        for restart in range(1, 5):
            exited(crasher)
            sup.tick()  # notices the exit, schedules the restart
            delays.append(crasher.restart_at - clock())
            sup.tick()
            assert crasher.restarts == restart - 1, "restarted before its backoff"
            clock.advance(delays[-1])
            sup.tick()
            assert crasher.restarts == restart
    finally:
        sup.stop()
    assert delays == [1, 2, 4, 4]
    assert set(crasher.history) == {3}
    assert "crasher exited with code 3; restarting it in 1s" in said
    assert "restarting crasher (restart 1)" in said


def test_a_crash_loop_stops_with_the_process_name_and_its_last_lines():
    said, clock = [], Clock()
    crasher = Child("worker", [sys.executable, "-c", CRASHER], dict(os.environ))
    sup = Supervisor([crasher], say=said.append, backoff=(1, 1), crash_limit=3, clock=clock,
                     echo=lambda raw: None)
    sup.start()
    try:
        for _ in range(2):
            exited(crasher)
            sup.tick()
            clock.advance(1)
            sup.tick()  # restarted
        exited(crasher)
        with pytest.raises(CrashLoop) as err:
            sup.tick()
    finally:
        sup.stop()
    message = str(err.value)
    assert message.startswith("giving up: worker crashed 3 times in a row")
    assert "(last exit code 3)" in message
    assert message.endswith("  | booting\n  | fatal: bad config")
    assert crasher.restarts == 2


def test_a_child_that_ran_a_while_starts_its_crash_count_again(tmp_path):
    clock, flag = Clock(), tmp_path / "exit-now"
    script = (f"import os, time\nwhile not os.path.exists({str(flag)!r}): time.sleep(0.01)\n"
              "raise SystemExit(1)")
    child = Child("web", [sys.executable, "-c", script], dict(os.environ))
    sup = Supervisor([child], say=lambda m: None, backoff=(1, 8), crash_limit=2, clock=clock,
                     echo=lambda raw: None)
    sup.start()
    try:
        for _ in range(3):  # each run lasts "a minute": never a crash loop
            clock.advance(STABLE_SECONDS)
            flag.touch()
            exited(child)
            flag.unlink()
            sup.tick()
            assert child.quick_crashes == 1 and child.restart_at == clock() + 1
            clock.advance(1)
            sup.tick()
    finally:
        sup.stop()
    assert child.restarts == 3


def test_run_gives_up_on_a_crash_loop_and_stops_every_child():
    said, clock = [], Clock()

    def sleep(seconds: float) -> None:  # the supervisor's time passes at once
        clock.advance(seconds)
        time.sleep(0.01)

    sleeper = Child("web", [sys.executable, "-c", "import time; time.sleep(120)"],
                    dict(os.environ))
    crasher = Child("worker", [sys.executable, "-c", CRASHER], dict(os.environ))
    sup = Supervisor([sleeper, crasher], say=said.append, backoff=(1, 30), crash_limit=4,
                     clock=clock, sleep=sleep, echo=lambda raw: None)
    with pytest.raises(CrashLoop):
        sup.run()
    assert not sleeper.running() and sleeper.proc.returncode is not None
    assert sleeper.restarts == 0 and crasher.restarts == 3
    assert said[-1].startswith("giving up: worker crashed 4 times in a row")
    assert "fatal: bad config" in said[-1]


def test_children_output_is_passed_through():
    echoed: list[bytes] = []
    crasher = Child("crasher", [sys.executable, "-c", CRASHER], dict(os.environ))
    crasher.start(echo=echoed.append)
    exited(crasher)
    crasher.output_done()
    assert echoed == [b"booting\n", b"fatal: bad config\n"]
    assert list(crasher.tail) == ["booting", "fatal: bad config"]


def test_a_running_child_is_left_alone_and_stop_ends_every_child():
    clock = Clock()
    sleeper = Child("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"],
                    dict(os.environ))
    crasher = Child("crasher", [sys.executable, "-c", "raise SystemExit(1)"], dict(os.environ))
    sup = Supervisor([sleeper, crasher], say=lambda m: None, backoff=(1, 1), crash_limit=10,
                     clock=clock, echo=lambda raw: None)
    sup.start()
    first = sleeper.proc.pid
    for _ in range(2):  # another child crashing stops nothing
        exited(crasher)
        sup.tick()
        clock.advance(1)
        sup.tick()
    assert sleeper.running() and sleeper.proc.pid == first and sleeper.restarts == 0
    sup.stop(grace=10)
    assert sleeper.proc.returncode is not None and not sleeper.running()


RUN_IGNORING_SIGINT = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)  # what a shell does to a background job
from gpu_worker.ops.supervisor import Child, Supervisor
flag = sys.argv[1]
child = Child("web", [sys.executable, "-c",
                      f"open({flag!r}, 'w').close()\\nimport time\\ntime.sleep(120)"],
              dict(os.environ))
Supervisor([child], say=print, backoff=(1, 1), crash_limit=3).run()
print("exited; child returncode", child.proc.returncode, flush=True)
"""


def test_sigint_stops_a_supervisor_started_with_sigint_ignored(tmp_path):
    import signal
    import subprocess

    flag = tmp_path / "child-started"
    proc = subprocess.Popen([sys.executable, "-c", RUN_IGNORING_SIGINT, str(flag)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(flag.exists, 60, "the supervised child to start")
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "stopping" in out and "exited; child returncode" in out, out
    assert "child returncode None" not in out, out
