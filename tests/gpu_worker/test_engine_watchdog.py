"""The worker's engine watchdog on a real batch engine (demo model) whose scheduler hangs in
a forward pass: the task waiting on it fails with the retryable EngineUnavailable, the
trip is counted in the worker's metrics, and only then does the process exit (an injected
exit hook here). The web answers that error with a 503. Events and an injected clock:
nothing depends on the machine's speed."""

from __future__ import annotations

import copy
import functools
import threading
import time

import pytest
from prometheus_client import REGISTRY

from gpu_worker.client.dispatch import _remote_error
from gpu_worker.serving import enginewatch
from gpu_worker.serving.limits import Watchdog
from injection import errors as engine_errors
from injection.engine.batch import BatchEngine
from injection.model.loading import load_adapter
from tenants import errors as web_errors


class _Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


class _HangingModel:
    """The model; its ``hang_at``-th forward blocks until released (a wedged kernel)."""

    def __init__(self, model, hang_at: int):
        self.model, self.hang_at, self.calls = model, hang_at, 0
        self.config, self.generation_config = model.config, model.generation_config
        self.entered, self.release = threading.Event(), threading.Event()

    def __call__(self, **kw):
        self.calls += 1
        if self.calls == self.hang_at:
            self.entered.set()
            self.release.wait(60)
        return self.model(**kw)


@pytest.fixture
def hanging_engine(demo_model_path):
    adapter = load_adapter(str(demo_model_path), device="cpu", dtype="fp32")
    adapter.model = _HangingModel(adapter.model, hang_at=2)
    clock = _Clock()
    eng = BatchEngine(adapter, max_batch=2, clock=clock)
    yield adapter, eng, clock
    adapter.model.release.set()
    enginewatch.stop()
    eng.close()


def _trips(reason: str) -> float:
    return REGISTRY.get_sample_value("kvi_engine_watchdog_trips_total", {"reason": reason}) or 0


def test_a_stuck_engine_fails_its_task_counts_the_trip_then_exits(hanging_engine):
    adapter, eng, clock = hanging_engine
    limits = Watchdog(on_hard=lambda _entry: None)  # the worker's per-task registry
    events: list[str] = []
    exited = threading.Event()
    box: dict = {}

    def task():
        with limits.guard("task-1", None, None):
            try:
                eng.generate(adapter.render_chat([{"role": "user", "content": "Hi"}]), None,
                             1.0, 8)
            except engine_errors.EngineUnavailable as exc:
                box["error"] = exc
                events.append("task failed")

    def exit_process(code: int) -> None:
        events.append(f"exit {code}")
        exited.set()

    before = _trips("stuck")
    on_trip = functools.partial(enginewatch.restart, exit_process=exit_process, grace=60,
                                settle=0, running=lambda: len(limits.running()))
    dog = enginewatch.start(eng, stall_after=30, interval=0.01, on_trip=on_trip)
    worker = threading.Thread(target=task)
    worker.start()
    assert adapter.model.entered.wait(60)  # the scheduler is inside the hung forward
    clock.t += 31
    assert exited.wait(60)
    worker.join(60)
    assert dog.tripped == "stuck"
    assert events == ["task failed", f"exit {enginewatch.EXIT_CODE}"]  # failed, then exit
    assert _trips("stuck") == before + 1
    assert eng.stats()["watchdog_trips"] == 1


def test_an_engine_making_progress_is_left_alone(hanging_engine):
    adapter, eng, clock = hanging_engine
    tripped: list[str] = []
    dog = enginewatch.start(eng, stall_after=30, interval=0.01, on_trip=tripped.append)
    adapter.model.hang_at = 0  # no hang
    out = eng.generate(adapter.render_chat([{"role": "user", "content": "Hi"}]), None, 1.0, 6)
    deadline = time.monotonic() + 60
    while eng.progress()[0] and time.monotonic() < deadline:  # the scheduler goes idle
        time.sleep(0.002)
    clock.t += 3600  # idle afterwards, for an hour
    assert dog.check() is None and not tripped
    assert len(out.token_ids) >= 1


def test_the_watchdog_is_off_without_an_engine_or_a_stall_time():
    assert enginewatch.start(None, stall_after=30) is None
    assert enginewatch.start(object(), stall_after=0) is None


def test_the_web_answers_an_engine_failure_with_a_retryable_503():
    err = _remote_error(engine_errors.EngineUnavailable("the scheduler is stuck; retry"))
    assert isinstance(err, web_errors.EngineUnavailable)
    assert isinstance(err, web_errors.WorkerUnavailable)  # retry_after + idempotency key
    assert err.status == 503 and err.code == "engine_unavailable"


def test_contained_engine_faults_are_exported(demo_model_path, monkeypatch):
    from prometheus_client import CollectorRegistry, generate_latest

    from gpu_worker.ops import metrics
    from gpu_worker.serving import host
    from injection import ExecutionRequest, build_executor

    adapter = load_adapter(str(demo_model_path), device="cpu", dtype="fp32")
    real, calls = adapter.model, []

    def failing_first_prefill(**kw):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected prefill fault")
        return real(**kw)

    ex = build_executor(adapter, batch_max=2)
    ex.engine.adapter = copy.copy(adapter)
    ex.engine.adapter.model = failing_first_prefill
    failing_first_prefill.config = real.config
    monkeypatch.setattr(host, "_executor", ex)
    req = ExecutionRequest("t-1", "", [{"role": "user", "content": "hello"}], "", max_new_tokens=2)
    try:
        with pytest.raises(RuntimeError, match="injected"):
            ex.execute(req)
        ex.execute(req)  # the engine goes on serving
    finally:
        ex.close()
    registry = CollectorRegistry()
    registry.register(metrics.EngineCollector())
    text = generate_latest(registry).decode()
    assert 'kvi_engine_faults_total{kind="row_failures"} 1.0' in text
    assert 'kvi_engine_faults_total{kind="watchdog_trips"} 0.0' in text


def test_the_worker_watches_the_engine_of_the_executor_it_builds(monkeypatch, settings,
                                                                  demo_model_path):
    from gpu_worker.serving import host, runtime

    settings.MODEL_PATH, settings.KV_L2_ENABLED = str(demo_model_path), False
    settings.WORKER_BATCH_MAX, settings.ENGINE_WATCHDOG_SECONDS = 2, 45
    monkeypatch.setattr(host, "_executor", None)
    monkeypatch.setattr(host, "_on_built", [])
    host.on_executor_built(runtime._watch_engine)  # what start_serving_process registers
    ex = host.get_executor()
    try:
        dog = enginewatch._current
        assert dog is not None and dog.engine is ex.engine and dog.stall_after == 45
        assert dog._thread is not None and dog._thread.is_alive()
    finally:
        runtime.close_serving_process()  # stops the watchdog, closes the executor
    assert enginewatch._current is None and host.current_executor() is None
