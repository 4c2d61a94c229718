"""BoundedWriter: in-flight quota, ordering, cancel, flush/close, survives failing jobs."""

from __future__ import annotations

import threading

import pytest

from injection.kvcache.l2.writer import BoundedWriter


class Sink:
    """A real job function that can be held closed with an Event."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()
        self.done: list[str] = []

    def __call__(self, key: str, value: int) -> None:
        self.started.set()
        self.gate.wait(10)
        if value < 0:
            raise RuntimeError("job failure")
        self.done.append(key)


def test_jobs_run_in_order_and_flush_waits():
    sink = Sink()
    w = BoundedWriter(sink, max_inflight=10, name="t")
    for i in range(5):
        assert w.submit(f"k{i}", i)
    assert w.flush(10) and w.inflight == 0
    assert sink.done == [f"k{i}" for i in range(5)]
    w.close()


def test_full_quota_refuses_without_blocking():
    sink = Sink()
    sink.gate.clear()
    w = BoundedWriter(sink, max_inflight=2, name="t")
    assert w.submit("a", 1) and sink.started.wait(10)
    assert w.submit("b", 1)
    assert w.submit("c", 1) is False and w.inflight == 2
    assert w.flush(0.05) is False
    sink.gate.set()
    assert w.flush(10) and sink.done == ["a", "b"]
    w.close()


def test_cancel_drops_matching_queued_jobs_and_waits_for_running_one():
    sink = Sink()
    sink.gate.clear()
    w = BoundedWriter(sink, max_inflight=10, name="t")
    for k in ("x1", "y1", "x2", "y2"):
        w.submit(k, 1)
    sink.started.wait(10)
    threading.Timer(0.1, sink.gate.set).start()
    assert w.cancel(lambda k: k.startswith("x")) == 1  # x2 dropped; x1 was running
    assert "x1" in sink.done  # cancel returned only after the running match finished
    assert w.flush(10) and sink.done == ["x1", "y1", "y2"]
    w.close()


def test_failing_job_does_not_kill_the_writer_and_close_refuses_more():
    sink = Sink()
    w = BoundedWriter(sink, max_inflight=4, name="t")
    w.submit("bad", -1)
    w.submit("good", 1)
    assert w.flush(10) and sink.done == ["good"]
    w.close()
    assert w.submit("late", 1) is False


def test_validation():
    with pytest.raises(ValueError):
        BoundedWriter(Sink(), max_inflight=0, name="t")
