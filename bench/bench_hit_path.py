"""Hit path: time from request to first generated token, by where the preference K/V comes from.

For preference lengths of 32/128/512 tokens, through ``InjectionExecutor.execute``
with ``max_new_tokens=1``:

* ``in-prompt`` (baseline): no injection, the preference text in the system message;
* ``L1 hit``: K/V from this process's TenantLRU;
* ``L2 hit``: L1 cleared, K/V from Redis (HMAC-verified, decoded, promoted to L1);
* ``miss``: both tiers cleared, K/V recomputed (and written back).

Ratios are against the in-prompt baseline measured in the same run (median of
``REPEATS`` rounds; the modes are interleaved in every round). A second table compares K/V acquisition alone (lookup +
host-to-device cache build vs ``compute_kv``): the "L1 hit vs recompute" ratio.

Run: ``.venv/bin/python bench/bench_hit_path.py [--write-docs]`` (``MODEL_PATH`` =
any local HF model dir; default: the demo model under var/models/demo; ``REPEATS`` = 20).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
import torch  # noqa: E402
from mdsection import machine, table, write_section  # noqa: E402  (bench/ is sys.path[0])

from config import embedded  # noqa: E402
from injection import build_executor, load_adapter  # noqa: E402
from injection.base import ExecutionRequest, Tier  # noqa: E402
from injection.metrics import Metrics  # noqa: E402
from injection.model.demo_model import CORPUS_PATH, build_demo_model  # noqa: E402

LENGTHS = (32, 128, 512)
REPEATS = int(os.environ.get("REPEATS", "20"))
WARMUP = 3
TENANT = "bench-hit-path"
QUESTION = "What should I cook tonight?"
SECRET = "bench-only-secret-not-for-production"


def model_path() -> Path:
    if os.environ.get("MODEL_PATH"):
        return Path(os.environ["MODEL_PATH"])
    return build_demo_model(embedded.VAR_DIR / "models" / "demo")


def preference_of(adapter, n_tokens: int) -> str:
    """Corpus prose whose tokenization (with BOS) is as close to ``n_tokens`` as possible."""
    ids: list[int] = []
    for line in CORPUS_PATH.read_text().splitlines():
        ids += adapter.tokenizer(line + " ", add_special_tokens=False)["input_ids"]
        if len(ids) > n_tokens + 64:
            break
    k = min(len(ids), n_tokens + 64)  # re-tokenizing decoded text merges across lines
    while k > 1:
        pref = adapter.tokenizer.decode(ids[:k]).strip()
        if len(adapter.tokenizer(pref)["input_ids"]) <= n_tokens:
            return pref
        k -= 1
    raise RuntimeError("cannot build a preference text")


def once(fn) -> tuple[float, object]:
    """Wall ms of one ``fn()`` call (synchronised on CUDA) and its result."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    result = fn()
    return (time.perf_counter() - t0) * 1000.0, result


def measure(executor, adapter, pref: str) -> dict[str, tuple[float, list]]:
    """Modes interleaved per round, so load changes hit every mode alike; median per mode."""
    question = [{"role": "user", "content": QUESTION}]
    injected = ExecutionRequest(TENANT, "u1", question, pref, max_new_tokens=1)
    # the same system turn, in the prompt: nothing injected
    baseline = ExecutionRequest(TENANT, "u1", question, pref, injection_enabled=False,
                                instructions=pref, max_new_tokens=1)
    l1, l2 = executor.l1, executor.l2
    prepare = {  # untimed: put the tiers in the state the mode needs
        "in-prompt": lambda: None,
        "L1 hit": lambda: executor.warm(TENANT, "u1", pref),
        "L2 hit": lambda: (l2.flush(30), l1.clear(TENANT)),
        "miss": lambda: (l2.flush(30), l1.clear(TENANT), l2.evict(TENANT)),
    }
    samples: dict[str, list] = {m: [] for m in prepare}
    for i in range(WARMUP + REPEATS):
        for mode, prep in prepare.items():
            prep()
            sample = once(lambda r=(baseline if mode == "in-prompt" else injected): executor.execute(r))
            if i >= WARMUP:
                samples[mode].append(sample)
    l2.flush(30)
    l1.clear(TENANT)
    l2.evict(TENANT)
    out = {m: (statistics.median(ms for ms, _ in s), [r for _, r in s]) for m, s in samples.items()}
    for name, want in (("L1 hit", Tier.L1), ("L2 hit", Tier.L2), ("miss", Tier.COMPUTE)):
        assert {r.tier for r in out[name][1]} == {want}, name
    return out


def acquisition(results: dict[str, tuple[float, list]]) -> tuple[float, ...]:
    """Medians as the executor reports them: L1/L2 lookup, cache build (H2D + DynamicCache), compute."""
    hits, l2_hits, misses = (results[k][1] for k in ("L1 hit", "L2 hit", "miss"))
    lookup = statistics.median(r.kv_fetch_latency_ms for r in hits)
    l2_lookup = statistics.median(r.kv_fetch_latency_ms for r in l2_hits)
    build = statistics.median(r.kv_transfer_latency_ms for r in hits + misses)
    compute = statistics.median(r.kv_fetch_latency_ms for r in misses)
    return lookup, l2_lookup, build, compute


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write-docs", action="store_true", help="update docs/BENCHMARKS.md")
    args = ap.parse_args()
    path = model_path()
    adapter = load_adapter(path)
    client = redis.Redis.from_url(embedded.redis_url())
    executor = build_executor(adapter, redis_client=client, signing_secret=SECRET, metrics=Metrics())
    cfg = adapter.model.config
    header = "  \n".join([
        f"Command: `.venv/bin/python bench/bench_hit_path.py --write-docs` (REPEATS={REPEATS} "
        f"interleaved rounds after {WARMUP} warm-up rounds, medians; max_new_tokens=1)",
        f"Machine: {machine()}, torch threads {torch.get_num_threads()}",
        f"Model: {'MODEL_PATH=' + str(path) if os.environ.get('MODEL_PATH') else 'demo model'} "
        f"({cfg.model_type}, L={adapter.num_layers}, H_kv={adapter.num_kv_heads}, "
        f"device {adapter.device}, {str(adapter.dtype)[6:]}); L2 = embedded Redis on localhost",
    ])
    print("measuring ...", flush=True)
    rows, acq = [], []
    for n in LENGTHS:
        res = measure(executor, adapter, preference_of(adapter, n))
        tokens = res["L1 hit"][1][0].kv_tokens
        rows.append((tokens, {k: v[0] for k, v in res.items()}))
        acq.append((tokens, *acquisition(res)))
    executor.l2.flush(30)
    executor.l2.evict(TENANT)
    executor.close()
    body = render(rows, acq, header)
    print(body)
    if args.write_docs:
        write_section("hit_path", body)


def render(rows, acq, header: str) -> str:
    modes = ("in-prompt", "L1 hit", "L2 hit", "miss")
    out = ["## Hit path: request to first token, by where the preference K/V comes from", "",
           header, "", "Time to first token, ms (x of the in-prompt baseline; < 1x is faster):", ""]
    out.append(table(["pref tokens", *modes], [
        [tokens, *(f"{ms[m]:.2f} ({ms[m] / ms['in-prompt']:.2f}x)" for m in modes)]
        for tokens, ms in rows
    ]))
    out += ["", "K/V acquisition, ms (the executor's own figures; the cache build, host-to-device "
            "+ DynamicCache, is the same on every injected path):", ""]
    out.append(table(
        ["pref tokens", "L1 lookup", "L2 lookup", "cache build", "recompute",
         "recompute / (L1 lookup + build)", "recompute / L1 lookup"],
        [[t, f"{lk:.3f}", f"{l2:.3f}", f"{b:.3f}", f"{c:.2f}", f"{c / (lk + b):.0f}x", f"{c / lk:.0f}x"]
         for t, lk, l2, b, c in acq],
    ))
    tokens, lookup, _, build, compute = acq[-1]
    ratio = compute / (lookup + build)
    verdict = "meets" if ratio >= 100 else "misses"
    out += ["", f"L1 hit path (lookup + cache build) vs recompute at {tokens} tokens: "
            f"**{ratio:.0f}x cheaper** ({verdict} the >= 100x target); lookup alone: "
            f"{compute / lookup:.0f}x.", "",
            "Reading: TTFT includes tokenizing, the request's own forward pass and one decode "
            "step; an injected request skips the preference tokens' forward pass, a miss pays it "
            "once (plus packing and the asynchronous L2 write). The cache build copies the K/V "
            "into a fresh DynamicCache (values scaled), so it is paid on hits and misses alike. "
            "The demo model is tiny (4 layers x 256 hidden): recompute grows with model size, "
            "lookup and cache build only with K/V bytes."]
    return "\n".join(out)


if __name__ == "__main__":
    main()
