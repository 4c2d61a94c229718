"""`make demo`'s first-run experience, on a real demo (own embedded servers): one line per
step, the banner only once web and worker answer, and a short, clean stop on Ctrl-C."""

from __future__ import annotations

import shutil
import signal
import urllib.request

import pytest

from tests.gpu_worker.conftest import fresh_var_dir
from tests.gpu_worker.test_demo_supervisor import Demo, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def demo(stopped_demo_dirs, demo_model_path):
    """A first run: a fresh VAR_DIR. Stopped cleanly, the dir is handed on to a later demo
    test (test_demo_supervisor's), which then skips making and migrating its database."""
    var_dir = fresh_var_dir()
    d = Demo(var_dir, demo_model_path)
    yield d
    d.stop()
    if d.proc.returncode == 0:
        stopped_demo_dirs.append(var_dir)
    else:
        shutil.rmtree(var_dir, ignore_errors=True)


def test_steps_then_banner_when_ready_then_a_clean_stop(demo):
    wait_for(lambda: demo.proc.poll() is not None or demo.token(), 300, "the demo banner")
    assert demo.proc.poll() is None, demo.log()
    # the banner means ready: the web answers and a chat is served right away
    with urllib.request.urlopen(f"http://127.0.0.1:{demo.port}/healthz", timeout=5) as r:
        assert r.status == 200
    assert demo.chat()["reply"] is not None
    log = demo.log()
    steps = [log.index(f"[{n}/5]") for n in range(1, 6)]
    assert steps == sorted(steps) and steps[-1] < log.index("token alice")
    assert "[5/5] web server and worker are ready" in log
    demo.proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
    assert demo.proc.wait(timeout=90) == 0
    log = demo.log()
    assert log.rstrip().endswith("demo stopped.")
    assert "Traceback" not in log and "KeyboardInterrupt" not in log
