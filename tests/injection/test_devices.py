"""Device discipline: CUDA timers read only after their end event is reached; the batched
path never empties the allocator's cache per request (only OOM recovery does)."""

from __future__ import annotations

import pytest
import torch

from injection import build_executor
from injection.base import ExecutionRequest
from injection.devices import KVTimer
from injection.model.loading import load_adapter


def test_kv_timer_on_cpu_reports_host_time_and_no_device_memory():
    with KVTimer(torch.device("cpu")) as timer:
        torch.ones(64, 64) @ torch.ones(64, 64)
    assert timer.elapsed_ms() >= 0.0 and timer.peak_bytes == 0


@pytest.mark.gpu
def test_kv_timer_on_cuda_is_readable_while_later_work_is_still_queued():
    dev = torch.device("cuda")
    big = torch.randn(4096, 4096, device=dev)
    with KVTimer(dev) as timer:
        built = big @ big  # the timed work (queued, not waited for)
    for _ in range(20):  # more work queued behind the end event
        big = big @ big
    assert timer.elapsed_ms() > 0.0  # raised "device not ready" before the sync
    assert timer.peak_bytes >= built.numel() * built.element_size()


@pytest.mark.gpu
@pytest.mark.parametrize("batch_max, want_empties", [(2, 0), (0, 1)])
def test_only_the_unbatched_path_empties_the_cache_per_request(
    demo_model_path, monkeypatch, batch_max, want_empties
):
    adapter = load_adapter(str(demo_model_path), device="cuda", dtype="fp32")
    ex = build_executor(adapter, batch_max=batch_max)
    calls: list[int] = []
    real = torch.cuda.empty_cache
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: (calls.append(1), real())[1])
    try:
        msgs = [{"role": "user", "content": "What should I cook tonight?"}]
        ex.execute(ExecutionRequest("t1", "u1", msgs, "I am vegetarian.", max_new_tokens=4))
    finally:
        ex.close()
    assert len(calls) == want_empties
