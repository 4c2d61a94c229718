"""Memory recall on the served model: accuracy on the recall cases and what it costs.

For each case set (tests/injection/recall_cases.py: 10 memories, 12 messages), every
memory but a pinned one is a recall candidate; prints top-1 and top-3 (cosine >= the
default minimum) hits, then the cost of embedding one memory (cold cache) and of one
recall step (memories cached: the message's embedding + the similarities), each as a
ratio to the baseline measured in the same run: one prefill of the same message as a
chat prompt (what the request pays anyway).

    .venv/bin/python bench/bench_recall.py [--model PATH] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from injection import load_adapter  # noqa: E402
from injection.base import ExecutionRequest, MemoryItem  # noqa: E402
from injection.memory import MemoryPlanner, RecallOptions  # noqa: E402
from tests.injection.recall_cases import SETS  # noqa: E402


def sync(adapter) -> None:
    if torch.device(adapter.device).type == "cuda":
        torch.cuda.synchronize()


def timed(adapter, fn, reps: int) -> float:
    out = []
    for _ in range(reps):
        sync(adapter)
        t0 = time.perf_counter()
        fn()
        sync(adapter)
        out.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(ROOT / "var/models/smollm2-135m-instruct"))
    ap.add_argument("--device", default=None)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    adapter = load_adapter(args.model, device=args.device)
    print(f"model {Path(args.model).name} on {adapter.device} ({adapter.dtype})")
    for name, (memories, queries) in SETS.items():
        mems = (MemoryItem("p", "My name is Sam.", pinned=True),
                *(MemoryItem(str(i), t) for i, t in enumerate(memories)))
        row = []
        for k, floor in ((1, -1.0), (3, RecallOptions().min_similarity)):
            planner = MemoryPlanner(adapter, RecallOptions(segment_tokens=0, top_k=k,
                                                           min_similarity=floor))
            hits = 0
            for q, good in queries:
                plan = planner.plan(ExecutionRequest(
                    "t", "u", [{"role": "user", "content": q}], memories=mems))
                hits += bool({int(m.id) for m in plan.recalled} & good)
            row.append(f"top-{k}{'' if k == 1 else f' (cos >= {floor})'} {hits}/{len(queries)}")
        print(f"set {name}: " + ", ".join(row))
    memories, queries = SETS["B (held out)"]
    mems = (MemoryItem("p", "My name is Sam.", pinned=True),
            *(MemoryItem(str(i), t) for i, t in enumerate(memories)))
    msgs = [{"role": "user", "content": queries[0][0]}]
    prompt_ids = torch.tensor([adapter.renderer.encode(adapter.render_chat(msgs), first=True)],
                              device=adapter.device)

    def prefill() -> None:
        with torch.inference_mode():
            adapter.model(input_ids=prompt_ids, use_cache=True, logits_to_keep=1)

    planner = MemoryPlanner(adapter, RecallOptions(segment_tokens=0))
    planner.embedder.embed("warm", ["warm up the reference statistics"])
    base = timed(adapter, prefill, args.reps)
    n = [0]

    def embed_cold() -> None:
        n[0] += 1
        planner.embedder.embed("t", [f"{memories[n[0] % 10]} ({n[0]})"])

    cold = timed(adapter, embed_cold, args.reps)
    req = ExecutionRequest("t", "u", msgs, memories=mems)
    planner.plan(req)  # memories embedded once
    qn = [0]

    def recall_step() -> None:
        qn[0] += 1  # a new message each time (its embedding is not cached)
        planner.recall("t", list(mems[1:]), f"{msgs[0]['content']} #{qn[0]}")

    step = timed(adapter, recall_step, args.reps)
    print(f"baseline prefill of the message's chat prompt ({prompt_ids.shape[1]} tokens): "
          f"{base:.1f} ms")
    print(f"embed one memory (cold): {cold:.1f} ms = {cold / base:.2f}x baseline")
    print(f"recall step (10 candidates cached, new message): {step:.1f} ms = "
          f"{step / base:.2f}x baseline")


if __name__ == "__main__":
    main()
