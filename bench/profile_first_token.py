"""Where a batch-1 first token's time goes on the real stack (issue 59: the new member's and
turn 20's rows of bench_vs_peer, where the platform is behind vLLM).

    .venv/bin/python bench/profile_first_token.py [--reps 5] [--turns 20] [--no-trace]

The platform as bench_vs_peer runs it (embedded PostgreSQL + Redis under
var/profile-first-token, one ``celery worker --pool threads``, the web under uvicorn, the
default model, members of one tenant with one preference each, not warmed on creation),
each server process started through ``bench/ttft_trace.py`` so the functions it names
record their wall-clock spans (``--no-trace``: started as servers.py starts them). Timed,
alternating: a warm member's and a new member's first turn (streamed ``/v1``, greedy), then
``--turns`` turns of a conversation (the last ``--timed`` of them timed). Printed per kind:
the client's time to the first content chunk (median), and per traced function the median
of its start (ms after the request was sent) and its duration, within that first-token
window. Figures from a shared machine compare only within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import vs_peer_workloads as wl  # noqa: E402
from servers import setup_django, stop  # noqa: E402

VAR = ROOT / "var" / "profile-first-token"


def members(n: int) -> list[wl.Member]:
    from django.conf import settings

    from tenants import actions

    settings.KV_WARM_ON_EDIT = False
    tenant = actions.do_create_tenant(f"ttft-{int(time.time())}")
    return [wl.Member(actions.do_create_api_token(actions.do_add_member(
        tenant, f"{tenant.slug}-{i}",
        preference=f"{wl.PREFS[i % len(wl.PREFS)]} My name is {wl.NAMES[i % len(wl.NAMES)]}{i}."
    )), "") for i in range(n)]


def start(trace: Path | None, env: dict[str, str], log) -> tuple[list[subprocess.Popen], str]:
    from gpu_worker.routing import registry

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pre = [sys.executable, str(ROOT / "bench" / "ttft_trace.py")]
    celery = ["-A", "config", "worker", "-Q", "gpu", "--pool", "threads", "--hostname",
              "pft@bench", "--without-gossip", "--without-mingle", "-l", "WARNING"]
    web = ["config.asgi:application", "--host", "127.0.0.1", "--port", str(port),
           "--log-level", "warning"]
    if trace is not None:
        cmds = [pre + [str(trace.with_suffix(".worker.jsonl")), "celery", *celery],
                pre + [str(trace.with_suffix(".web.jsonl")), "uvicorn", *web]]
    else:
        cmds = [[sys.executable, "-m", "celery", *celery],
                [sys.executable, "-m", "uvicorn", *web]]
    procs = [subprocess.Popen(c, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
             for c in cmds]
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            break
        try:
            if "pft@bench" in registry.live_workers():
                urllib.request.urlopen(f"{base}/healthz", timeout=2).close()
                return procs, base
        except OSError:
            pass
        time.sleep(0.5)
    stop(procs)
    raise SystemExit(f"servers did not start; see {VAR / 'servers.log'}")


def timed(kind: str, fn, *args) -> dict:
    t0 = time.time()
    r = fn(*args)
    return {"kind": kind, "t0": t0, "first": t0 + r["ttft"], "end": t0 + r["total"],
            "ttft": r["ttft"] * 1000, "prompt": r["prompt"], "cached": r["cached"],
            "text": r["text"], "conversation": r["conversation"]}


def conversation(side: wl.Side, member: wl.Member, turns: int, timed_last: int, k0: int,
                 tokens: int) -> tuple[list[dict], list[str]]:
    messages: list[dict] = []
    extra: dict = {}
    out, replies = [], []
    for t in range(1, turns + 1):
        messages.append({"role": "user", "content": wl.question(k0 + t)})
        n = tokens if t == turns else wl.TURN_TOKENS
        rec = timed(f"turn{t}", wl.turn, side, member, list(messages), n, extra)
        if t > turns - timed_last:
            out.append(rec)
        replies.append(rec["text"])
        messages.append({"role": "assistant", "content": rec["text"]})
        extra = {"conversation": rec["conversation"] or extra.get("conversation")}
    return out, replies


def spans(trace: Path | None) -> list[dict]:
    if trace is None:
        return []
    out = []
    for suffix in (".worker.jsonl", ".web.jsonl"):
        path = trace.with_suffix(suffix)
        if path.exists():
            side = suffix.split(".")[1]
            out += [dict(json.loads(line), side=side) for line in path.read_text().splitlines()]
    return out


def breakdown(records: list[dict], events: list[dict]) -> None:
    kinds: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        kinds[r["kind"] if not r["kind"].startswith("turn") else "turn"].append(r)
    for kind, rs in kinds.items():
        ttfts = [r["ttft"] for r in rs]
        print(f"\n== {kind}: first token median {statistics.median(ttfts):.1f} ms "
              f"{[round(x, 1) for x in ttfts]}; prompt/cached {rs[-1]['prompt']}/{rs[-1]['cached']}")
        per: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
        for r in rs:
            seen: dict[str, tuple[float, float, str]] = {}
            for e in events:
                if r["t0"] <= e["t0"] <= r["first"]:
                    start, dur = (e["t0"] - r["t0"]) * 1000, (e["t1"] - e["t0"]) * 1000
                    key = f"{e['side']}:{e['fn']}"
                    if key in seen:  # summed over calls in the window, first start kept
                        s0, d0, th = seen[key]
                        seen[key] = (s0, d0 + dur, th)
                    else:
                        seen[key] = (start, dur, e["th"])
            for key, v in seen.items():
                per[key].append(v)
        rows = sorted(per.items(), key=lambda kv: statistics.median(v[0] for v in kv[1]))
        print(f"  {'function':62s} {'start':>7s} {'ms':>7s}  n")
        for key, vals in rows:
            print(f"  {key:62s} {statistics.median(v[0] for v in vals):7.1f} "
                  f"{statistics.median(v[1] for v in vals):7.1f}  {len(vals)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--timed", type=int, default=3, help="last turns of the conversation timed")
    ap.add_argument("--tokens", type=int, default=16, help="new tokens of a timed reply")
    ap.add_argument("--warm-members", type=int, default=4)
    ap.add_argument("--no-trace", action="store_true")
    ap.add_argument("--out", help="write the records (and replies) as JSON here")
    args = ap.parse_args()
    VAR.mkdir(parents=True, exist_ok=True)
    setup_django(VAR)
    stamp = time.strftime("%H%M%S")
    trace = None if args.no_trace else VAR / f"trace-{stamp}.jsonl"
    ms = members(args.warm_members + args.reps + 1)
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    log = open(VAR / "servers.log", "ab")
    procs, base = start(trace, env, log)
    side = wl.Side("platform", base, "kvinject", platform=True)
    try:
        wl.warm(side, ms[:args.warm_members], 0)
        conv_member = ms[-1]
        records, replies = [], {}
        for r in range(args.reps):  # alternating: warm, new
            warm_m = ms[r % args.warm_members]
            records.append(timed("warm", wl.ask, side, warm_m, 100 + r, args.tokens))
            new_m = ms[args.warm_members + r]
            rec = timed("new", wl.ask, side, new_m, 200 + r, args.tokens)
            records.append(rec)
            replies[f"new{r}"] = rec["text"]
        turns, conv_replies = conversation(side, conv_member, args.turns, args.timed, 3000,
                                           args.tokens)
        records += turns
        replies["conversation"] = conv_replies
    finally:
        stop(procs)
    breakdown(records, spans(trace))
    if args.out:
        Path(args.out).write_text(json.dumps({"records": records, "replies": replies}, indent=1))


if __name__ == "__main__":
    main()
