"""One multi-threaded torch thread per process on a CPU (``injection/model/cpu_threads.py``).

Speed itself is a benchmark's (docs/BENCHMARKS.md "CPU threads"); these tests check which
thread computes on how many threads, through the real engine and loader."""

from __future__ import annotations

import threading

import pytest
import torch

from injection.engine.batch import BatchEngine
from injection.model import cpu_threads
from injection.model.loading import load_adapter


def _count_on_new_thread() -> int:
    out: list[int] = []
    thread = threading.Thread(target=lambda: out.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    return out[0]


@pytest.fixture
def cores(monkeypatch):
    """A core count no default has (so a thread holding it was given it), restored after:
    threads started later take the default the process had."""
    before = cpu_threads._default
    monkeypatch.setattr(cpu_threads, "CORES", 3)
    yield 3
    cpu_threads._set_default(before)


def test_run_alone_computes_on_a_thread_of_its_own_and_hands_back_its_result(cores):
    def work() -> tuple[str, int]:
        return threading.current_thread().name, torch.get_num_threads()

    name, count = cpu_threads.run_alone(work)
    assert name == "torch-load" and name != threading.current_thread().name
    assert count == cores
    assert all(t.name != "torch-load" for t in threading.enumerate())  # it has ended
    with pytest.raises(ValueError, match="bad load"):
        cpu_threads.run_alone(lambda: (_ for _ in ()).throw(ValueError("bad load")))


def test_load_adapter_loads_on_a_thread_that_ends(demo_model_path, cores, monkeypatch):
    seen: list[str] = []
    real = cpu_threads.run_alone

    def spy(fn):
        return real(lambda: (seen.append(threading.current_thread().name), fn())[1])

    monkeypatch.setattr(cpu_threads, "run_alone", spy)
    adapter = load_adapter(demo_model_path, device="cpu")
    assert seen == ["torch-load"] and adapter.device.type == "cpu"
    assert adapter.cpu_threads == "engine"


def test_engine_thread_takes_the_cores_and_later_threads_take_one(adapter, cores):
    engine = BatchEngine(adapter, max_batch=2)
    try:
        assert _count_on_new_thread() == 1  # built: request threads compute on one
        on_engine = engine.forward("embed", lambda: (threading.current_thread().name,
                                                      torch.get_num_threads()))
        assert on_engine == ("batch-engine", cores)
        assert _count_on_new_thread() == 1  # the engine's count is its own
        out = engine.generate("Hello", None, 1.0, 4)  # and it still decodes
        assert len(out.token_ids) >= 1
    finally:
        engine.close()


def test_claim_elsewhere_than_a_cpu_or_shared_changes_nothing(adapter, cores, monkeypatch):
    cpu_threads._set_default(cores)  # whatever earlier engines left
    before = _count_on_new_thread()
    assert before == cores
    for attr, value in (("device", torch.device("meta")), ("cpu_threads", "shared")):
        elsewhere = type("Adapter", (), {"device": adapter.device, "cpu_threads": "engine",
                                         attr: value})()
        cpu_threads.reserve(elsewhere)
        cpu_threads.claim(elsewhere)
        assert _count_on_new_thread() == before
    cpu_threads.reserve(adapter)
    assert _count_on_new_thread() == 1


def test_load_adapter_shared_loads_on_the_callers_thread(demo_model_path, monkeypatch):
    monkeypatch.setattr(cpu_threads, "run_alone", lambda fn: pytest.fail("not shared"))
    adapter = load_adapter(demo_model_path, device="cpu", cpu_threads="shared")
    assert adapter.cpu_threads == "shared"
    with pytest.raises(ValueError, match="cpu threads mode"):
        load_adapter(demo_model_path, device="cpu", cpu_threads="all")
