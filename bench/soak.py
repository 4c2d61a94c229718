"""Soak probe against a running platform: N members streaming short replies back to back.

    .venv/bin/python bench/soak.py [--base http://127.0.0.1:8000] [--members 16]
                                   [--seconds 300] [--tokens 16] [--write-docs]

Run it beside `make demo` (same checkout: it reaches the demo's Postgres to create a
``soak`` tenant with ``--members`` members, each with a preference and a fresh API token).
For the figures in docs/BENCHMARKS.md start the demo with the request-rate limits off, so
that a 429 measures nothing but the limiter: ``CHAT_RATE_PER_MEMBER= CHAT_RATE_PER_TENANT= make demo``
(429s are counted separately, never as failures).

Each member's thread sends ``/v1/chat/completions`` with ``stream: true`` and waits for its
``[DONE]`` before the next request, until ``--seconds`` have passed. Reported:

* streams: answered, failed (HTTP error other than 429, an error event, a connection error)
  and truncated (no ``[DONE]`` or no ``finish_reason``);
* latency of a whole stream, p50 and p99 (goal: p99 <= 4x p50);
* resident memory (RSS, from /proc) of every platform process (web, worker, Redis,
  Postgres) at the end of minute 1 and at the end (goal: <= 15 % growth);
* Redis stream keys (``kvi:stream:*``) left once the platform is idle (goal: none).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

QUESTIONS = ["Suggest a quick dinner.", "What should I read next?", "Plan a short walk.",
             "Give me one tip for today.", "What can I cook with rice?"]
PROCESS_MARKS = {"web": "config.asgi", "worker": "celery", "redis": "redis-server",
                 "postgres": "postgres"}


MEMORY = "I like short answers. My favourite number is {i}."


def members(count: int, slug: str = "soak", memory: str = MEMORY) -> list[str]:
    """API keys of ``count`` members of the ``slug`` tenant (created when missing), member i
    with the preference ``memory`` (``{i}``: i) when created."""
    import django

    django.setup()
    from tenants import actions
    from tenants.models import Member, Tenant

    tenant = Tenant.objects.filter(slug=slug).first() or actions.do_create_tenant(
        slug, "Soak probe")
    keys = []
    for i in range(count):
        name = f"{slug}-m{i:02d}"  # user names are the whole platform's: the tenant's in it
        member = Member.objects.filter(tenant=tenant, user__username=name).first()
        if member is None:
            member = actions.do_add_member(
                tenant, name, preference=memory.format(i=i))
        keys.append(actions.do_create_api_token(member, name="soak"))
    return keys


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ok: list[float] = []
        self.failed: list[str] = []
        self.truncated = 0
        self.throttled = 0

    def add(self, outcome: str, seconds: float, detail: str = "") -> None:
        with self.lock:
            if outcome == "ok":
                self.ok.append(seconds)
            elif outcome == "throttled":
                self.throttled += 1
            elif outcome == "truncated":
                self.truncated += 1
            else:
                self.failed.append(detail[:120])


EXTRA: dict = {}  # more request fields (``--contrast``: ``{"kvinject": {"contrast": x}}``)


def one_stream(base: str, key: str, question: str, tokens: int) -> tuple[str, str]:
    body = {"model": "kvinject", "stream": True, "max_tokens": tokens, "temperature": 0,
            "messages": [{"role": "user", "content": question}], **EXTRA}
    req = urllib.request.Request(f"{base}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {key}",
                                          "Content-Type": "application/json"})
    done = finished = False
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    event = json.loads(line[6:])
                    if "error" in event:
                        return "failed", json.dumps(event["error"])
                    choice = (event.get("choices") or [{}])[0]
                    finished = finished or bool(choice.get("finish_reason"))
    except urllib.error.HTTPError as exc:
        return ("throttled" if exc.code == 429 else "failed"), f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        return "failed", f"{type(exc).__name__}: {exc}"
    return ("ok" if done and finished else "truncated"), ""


def member_loop(base: str, key: str, index: int, until: float, tokens: int, tally: Tally) -> None:
    n = 0
    while time.monotonic() < until:
        t0 = time.monotonic()
        outcome, detail = one_stream(base, key, QUESTIONS[(index + n) % len(QUESTIONS)], tokens)
        tally.add(outcome, time.monotonic() - t0, detail)
        n += 1
        if outcome == "throttled":
            time.sleep(1.0)


def platform_rss() -> dict[str, int]:
    """RSS bytes per platform process kind, summed over its processes (from /proc)."""
    out = dict.fromkeys(PROCESS_MARKS, 0)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            if int(pid) == os.getpid() or str(ROOT) not in cmd and "postgres" not in cmd:
                continue
            kind = next((k for k, mark in PROCESS_MARKS.items() if mark in cmd), None)
            if kind is None:
                continue
            status = Path(f"/proc/{pid}/status").read_text()
            rss_kb = next(int(s.split()[1]) for s in status.splitlines() if s.startswith("VmRSS"))
            out[kind] += rss_kb * 1024
        except (OSError, StopIteration, ValueError):
            continue
    return out


def stream_keys_left(idle_wait: float = 30.0) -> int:
    """``kvi:stream:*`` keys in the platform's Redis once idle (waits up to ``idle_wait`` s)."""
    import redis
    from django.conf import settings

    client = redis.Redis.from_url(settings.REDIS_URL)
    deadline = time.monotonic() + idle_wait
    while True:
        left = sum(1 for _ in client.scan_iter(match="kvi:stream:*", count=500))
        if left == 0 or time.monotonic() > deadline:
            return left
        time.sleep(1.0)


def run(args) -> dict:
    keys = members(args.members, args.tenant, args.memory)
    tally = Tally()
    until = time.monotonic() + args.seconds
    threads = [threading.Thread(target=member_loop, daemon=True,
                                args=(args.base, k, i, until, args.tokens, tally))
               for i, k in enumerate(keys)]
    for t in threads:
        t.start()
    time.sleep(min(60.0, args.seconds / 2))
    rss_first = platform_rss()
    for t in threads:
        t.join()
    rss_end = platform_rss()
    return {"tally": tally, "rss_first": rss_first, "rss_end": rss_end,
            "stream_keys_left": stream_keys_left()}


def report(args, res: dict) -> list[str]:
    tally: Tally = res["tally"]
    lat = sorted(tally.ok)
    p50 = statistics.median(lat) if lat else 0.0
    p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else 0.0
    growth = {k: (res["rss_end"][k] / res["rss_first"][k] - 1.0) if res["rss_first"][k] else 0.0
              for k in PROCESS_MARKS}
    lines = [
        f"{args.members} members streaming {args.tokens}-token replies back to back for "
        f"{args.seconds} s against {args.base}",
        f"streams answered {len(lat)}, failed {len(tally.failed)}, truncated {tally.truncated}, "
        f"throttled (429) {tally.throttled}",
        f"whole-stream latency p50 {p50:.2f} s, p99 {p99:.2f} s: p99/p50 {p99 / p50 if p50 else 0:.2f}x "
        f"(goal <= 4x)",
    ]
    for kind in PROCESS_MARKS:
        lines.append(f"RSS {kind}: {res['rss_first'][kind] / 2**20:.0f} MiB after minute 1, "
                     f"{res['rss_end'][kind] / 2**20:.0f} MiB at the end ({growth[kind]:+.1%}; "
                     f"goal <= +15%)")
    lines.append(f"Redis stream keys left once idle: {res['stream_keys_left']} (goal 0)")
    lines += [f"failure: {f}" for f in tally.failed[:10]]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="http://127.0.0.1:8000")
    ap.add_argument("--members", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--contrast", type=float, default=None,
                    help="send kvinject.contrast (default: the platform decides)")
    ap.add_argument("--tenant", default="soak", help="the tenant's slug (created when missing)")
    ap.add_argument("--memory", default=MEMORY,
                    help="each new member's preference ({i}: its number); use a new --tenant")
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    if args.contrast is not None:
        EXTRA["kvinject"] = {"contrast": args.contrast}
    lines = report(args, run(args))
    print("\n".join(lines))
    if args.write_docs:
        from mdsection import write_section

        write_section("soak", "## Soak (`bench/soak.py` against `make demo`)\n\n"
                      f"`.venv/bin/python bench/soak.py --members {args.members} --seconds "
                      f"{args.seconds:g} --tokens {args.tokens}"
                      + ("" if args.contrast is None else f" --contrast {args.contrast:g}")
                      + ("" if args.tenant == "soak" else f" --tenant {args.tenant}")
                      + ("" if args.memory == MEMORY else f" --memory '{args.memory}'")
                      + "`\n\n```\n" + "\n".join(lines)
                      + "\n```\n")


if __name__ == "__main__":
    main()
