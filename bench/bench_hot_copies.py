"""Copies of cached K/V on the hot path: per request, before and after (issue 32, section 4).

Three requests through ``InjectionExecutor.execute`` (batch engine, embedded Redis, the demo
model on the CPU, a tenant with instructions, so the injected turn is a tenant segment and
a member segment):

* ``first turn``: a new member's first turn, the tenant segment cached (L1);
* ``continuing``: a conversation's third turn: tenant + member segments and the link (L1);
* ``L2 hit``: after ``clear_l1`` (a restart): a member's turn from Redis.

Measured, not counted by hand: a tracer wraps torch's copying calls (``cat``, ``stack``,
``copy_``, ``__setitem__``, ``clone``, ``contiguous``, ``to``, ``mul``, ``index_select``,
``pin_memory``), seeds it with the cached entries (L1's tensors, and what the L2 codec
decodes) and follows the bytes: a copy whose source is cached K/V, or a copy of it, counts
its source's bytes and makes its output tracked too. Whatever the code is, the tracer is the
same, so ``--baseline REV`` runs it on that revision (``git archive``) and on the working
tree, and prints after/before ratios. Copies are split into the **read** path (cache tiers to
the row's own cache on the model's device: what issue 32 asks to cut), the **join** (the
prefilled row into the batch cache: the engine's, the same before and after; it counts the
whole row, its prompt's K/V included) and the **store** path (the sequence handed back to
L1 for the next turn, the one-pass segment captured). ``max_new_tokens=1``: no decoding
steps, whose batch-cache growth is the engine's, not the request's. The working tree also
reports its own counter, ``injection.hostmem.KV_COPIES`` (a piece's keys + values = 1).

Run: ``OMP_NUM_THREADS=1 .venv/bin/python bench/bench_hot_copies.py --baseline 23e4aea``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import threading
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TENANT = "bench-hot-copies"
INSTRUCTIONS = ("You are the assistant of a cooking school. Answer briefly, in plain words, "
                "and recommend our evening classes where they fit.")
PREFERENCE = "I am a vegetarian and I do not like spicy food. I prefer quiet restaurants."
SECRET = "bench-only-secret-not-for-production"
STORE_SITES = ("row_kv", "_capture_segment", "_keep", "_sequence_kv", "_open")


class Tracer:
    """Bytes of cached K/V copied, by site (see the module doc). Process-wide patches."""

    def __init__(self) -> None:
        self.lock, self.on = threading.RLock(), False
        self.keep: dict[int, object] = {}  # storage -> a tensor holding it (no reuse)
        self.sites: dict[str, list[int]] = {}

    def seed(self, t) -> None:
        import torch
        if isinstance(t, torch.Tensor) and t.numel():
            self.keep[t.untyped_storage().data_ptr()] = t

    def tracked(self, t) -> bool:
        import torch
        return (isinstance(t, torch.Tensor) and t.numel() > 0
                and t.untyped_storage().data_ptr() in self.keep)

    def count(self, srcs, out) -> None:
        srcs = [s for s in srcs if self.tracked(s)]
        if not srcs or not self.on:
            return
        nbytes = sum(s.numel() * s.element_size() for s in srcs)
        site = _site()
        with self.lock:
            row = self.sites.setdefault(site, [0, 0])
            row[0] += 1
            row[1] += nbytes
            for o in out if isinstance(out, (list, tuple)) else (out,):
                self.seed(o)

    def install(self) -> None:
        import torch
        tr = self

        def wrap_fn(owner, name, sources, into=None):
            orig = getattr(owner, name)

            def patched(*a, **k):
                out = orig(*a, **k)
                if tr.on:
                    srcs, dst = sources(a, k), into(a) if into else k.get("out", out)
                    if not any(_same(s, dst) for s in srcs):  # a no-op (contiguous, to)
                        tr.count(srcs, dst)
                return out
            setattr(owner, name, patched)

        seq = lambda a, k: list(a[0]) if a else list(k.get("tensors", ()))  # noqa: E731
        for name in ("cat", "stack"):
            wrap_fn(torch, name, seq)
        wrap_fn(torch, "mul", lambda a, k: [x for x in a[:1]])
        wrap_fn(torch.Tensor, "copy_", lambda a, k: [a[1]], lambda a: a[0])
        wrap_fn(torch.Tensor, "__setitem__", lambda a, k: [a[2]], lambda a: a[0])
        for name in ("clone", "contiguous", "to", "mul", "index_select", "pin_memory"):
            wrap_fn(torch.Tensor, name, lambda a, k: [a[0]])


def _same(src, out) -> bool:
    import torch
    return (isinstance(src, torch.Tensor) and isinstance(out, torch.Tensor) and out.numel()
            and src.untyped_storage().data_ptr() == out.untyped_storage().data_ptr())


def _site() -> str:
    """``path:site``: the innermost frame of this project's code (or transformers') that
    asked for the copy; the path is ``store`` when a store-path function is on the stack."""
    f, site, path = sys._getframe(3), "?", "read"
    while f is not None:
        name = f.f_code.co_filename
        if ("/injection/" in name or "/transformers/" in name) and "bench_hot" not in name:
            site = f"{Path(name).stem}.{f.f_code.co_name}" if site == "?" else site
            path = "store" if f.f_code.co_name in STORE_SITES else path
        f = f.f_back
    if path == "read" and site.startswith("batchcache."):
        path = "join"  # the row's cache into the batch: the engine's, unchanged
    return f"{path}:{site}"


def measure() -> dict:
    """The three requests' copies, read and store path, on the tree this runs in."""
    import redis

    from config import embedded
    from injection import build_executor, load_adapter
    from injection.base import ExecutionRequest
    from injection.kvcache import codec
    from injection.metrics import Metrics
    from injection.model.demo_model import build_demo_model

    tracer = Tracer()
    tracer.install()
    decode = codec.decode_named

    def decode_seeded(*a, **k):
        kv = decode(*a, **k)
        tracer.seed(kv.keys), tracer.seed(kv.values)
        return kv
    codec.decode_named = decode_seeded
    try:
        from injection.hostmem import KV_COPIES
    except ImportError:  # the code before the counter
        KV_COPIES = None
    adapter = load_adapter(str(build_demo_model(embedded.VAR_DIR / "models" / "demo")),
                           device="cpu", dtype="fp32")
    client = redis.Redis.from_url(embedded.redis_url())
    ex = build_executor(adapter, redis_client=client, signing_secret=SECRET,
                        metrics=Metrics(), batch_max=4, conversation_prefill_opening=False)
    ex.invalidate(TENANT)

    def req(user, messages, conv=None, max_new=1):
        return ExecutionRequest(TENANT, user, messages, PREFERENCE, INSTRUCTIONS,
                                max_new_tokens=max_new, conversation_id=conv)

    def run(user, messages, conv=None) -> dict:
        for store in {id(s): s for s in (ex.l1, ex.conv_l1)}.values():
            for t in store._tenants.values():
                for e in t.entries.values():
                    tracer.seed(e.kv.keys), tracer.seed(e.kv.values)
        tracer.sites, tracer.on = {}, True
        before = KV_COPIES.snapshot() if KV_COPIES else {}
        reply = ex.execute(req(user, messages, conv))
        tracer.on = False
        ex.turns.drain()
        sites = {k: tuple(v) for k, v in tracer.sites.items()}
        return {"sites": sites, "counter": KV_COPIES.since(before) if KV_COPIES else {},
                "segments": reply.extra.get("segments"), "reused": reply.reused_tokens}

    hello = [{"role": "user", "content": "Hello, what is for dinner?"}]
    ex.execute(req("warm", hello, max_new=8))  # the tenant segment, cached
    out = {"first turn": run("new-member", hello)}
    msgs = list(hello)
    for q in ("And for lunch?", "Something with beans?"):  # the second turn stores a link
        r = ex.execute(req("m2", msgs, "c1", max_new=8))
        msgs = [*msgs, {"role": "assistant", "content": r.text or "Soup."},
                {"role": "user", "content": q}]
    out["continuing"] = run("m2", msgs, "c1")
    ex.l2.flush(30)
    ex.clear_l1()
    out["L2 hit"] = run("new-member", hello)
    ex.close()
    return out


PATHS = ("read", "join", "store")


def split(sites: dict) -> dict[str, tuple[int, int]]:
    """Copies and bytes per path: read (tiers to the row's cache), join (the row's cache
    into the batch cache) and store (what goes back to L1 for the next turn)."""
    out = {p: [0, 0] for p in PATHS}
    for site, (n, b) in sites.items():
        out[site.split(":")[0]][0] += n
        out[site.split(":")[0]][1] += b
    return {k: tuple(v) for k, v in out.items()}


def run_tree(root: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    script = root / "bench" / "bench_hot_copies.py"
    if script.resolve() != Path(__file__).resolve():
        script.write_text(Path(__file__).read_text())
    out = subprocess.run([sys.executable, str(script), "--measure"], cwd=root, env=env,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def report(before: dict | None, after: dict) -> None:
    def ratio(a: int, b: int) -> str:
        return f"{a / b:.2f}x" if b else "-"
    print("| request | path | copies before | copies after | bytes before | bytes after "
          "| bytes after/before |")
    print("|---|---|---|---|---|---|---|")
    for name, row in after.items():
        a = split(row["sites"])
        b = split(before[name]["sites"]) if before else {}
        for path in PATHS:
            nb, bb = b.get(path, ("-", 0))
            na, ba = a[path]
            print(f"| {name} | {path} | {nb} | {na} | {bb} | {ba} | {ratio(ba, bb)} |")
    for name, row in after.items():
        print(f"\n{name}: segments {row['segments']}, link tokens reused {row['reused']}")
        if before:
            print("  before:", dict(sorted(before[name]["sites"].items())))
        print("  after: ", dict(sorted(row["sites"].items())))
        print("  KV_COPIES (piece copies, bytes):", row["counter"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", help="a git revision to measure first (before)")
    ap.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure()))
        return
    before = None
    if args.baseline:
        with tempfile.TemporaryDirectory() as tmp:
            tar = subprocess.run(["git", "archive", args.baseline], cwd=ROOT, check=True,
                                 capture_output=True).stdout
            tarfile.open(fileobj=BytesIO(tar)).extractall(tmp, filter="data")
            before = run_tree(Path(tmp))
    report(before, run_tree(ROOT))


if __name__ == "__main__":
    main()
