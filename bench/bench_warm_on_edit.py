"""What warming a member after an edit saves their next chat, and what a bulk edit's warms
cost the chats running beside them, through the API, on the platform's defaults.

    .venv/bin/python bench/bench_warm_on_edit.py [--members N] [--bulk N] [--write-docs]

``KV_WARM_ON_EDIT`` (``tenants.actions.warm_on_commit``): an edit's commit queues a
background ``warm_member`` behind every chat, which computes the new segment and, where first
turns lean, the member's lean (8 probes, ``guidance/probe.py``). On a stack of its own
(embedded PostgreSQL + Redis under var/bench-warm-on-edit, one ``celery worker --pool
threads`` as deployed, the web under uvicorn, the real default model, rate limits off):

1. **The next chat after an edit.** Members who chatted before (their K/V and lean cached)
   edit their memory (``actions.do_set_preference``, what the API's edit calls; the switch is
   this process's setting, so both conditions share one stack, interleaved member by member),
   then, after ``--think`` seconds (a member going from the settings page back to the
   chat), send one streamed ``/v1`` turn: time to the first content chunk and the guide
   tokens it ran (296: it measured the lean itself). Two kinds: a French member (first
   turns lean) and a vegetarian one (a segment only). Warm on vs off.
2. **A bulk edit beside live chats.** ``--bulk`` members' memories edited in one
   transaction (an import) while 8 members stream one turn each, one after another, warm on
   vs off: those chats' first tokens, and how long the backlog took to drain.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ["VAR_DIR"] = str(ROOT / "var" / "bench-warm-on-edit")
for var in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND"):
    os.environ.pop(var, None)
os.environ.setdefault("MODEL_PATH", str(ROOT / "var" / "models" / "smollm2-135m-instruct"))
os.environ.update(DJANGO_SETTINGS_MODULE="config.settings", CHAT_RATE_PER_MEMBER="",
                  CHAT_RATE_PER_TENANT="", API_RATE_PER_MEMBER="", API_RATE_PER_TENANT="")
sys.path.insert(0, str(ROOT))

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import transaction  # noqa: E402
from mdsection import machine, table, write_section  # noqa: E402
from servers import stop, worker_and_web  # noqa: E402

from config.celery import app  # noqa: E402
from gpu_worker.ops.metrics import warm_backlog  # noqa: E402
from gpu_worker.routing import registry  # noqa: E402
from tenants import actions  # noqa: E402

KINDS = {"French (leans)": "Always answer in French.",
         "vegetarian (segment only)": "I am vegetarian and I cook for two."}
EDITS = [" My name is {}.", " I live in {}."]
QUESTION, TOKENS = "What should I cook tonight?", 64
NAMES = ["Ana", "Bo", "Chen", "Dara", "Eli", "Femi", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea"]


def stream(base: str, key: str) -> dict:
    """One greedy streamed ``/v1`` first turn: time to its first content chunk, guide tokens."""
    body = {"model": "kvinject", "max_tokens": TOKENS, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": QUESTION}]}
    req = urllib.request.Request(f"{base}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {key}",
                                          "Content-Type": "application/json"})
    t0, first, usage = time.perf_counter(), None, {}
    with urllib.request.urlopen(req, timeout=600) as resp:
        for line in resp:
            data = line.decode().removeprefix("data: ").strip()
            if not data or data == "[DONE]":
                continue
            chunk = json.loads(data)
            if "error" in chunk:
                raise SystemExit(f"/v1 stream failed: {data[:400]}")
            if first is None and any((c.get("delta") or {}).get("content")
                                     for c in chunk.get("choices") or []):
                first = time.perf_counter() - t0
            usage = chunk.get("usage") or usage
    return {"ttft": first if first is not None else time.perf_counter() - t0,
            "guide": int(usage.get("kvinject_guide_tokens") or 0)}


def first_chat(base: str, key: str, tries: int = 3) -> dict:
    """A member's first turn (K/V and lean into the cache); a fresh worker's first requests
    can run past the task's time limit on a loaded machine: a failed one is sent again."""
    for attempt in range(tries):
        try:
            return stream(base, key)
        except (SystemExit, OSError) as exc:
            print(f"first chat failed ({exc}); {'again' if attempt + 1 < tries else 'no more'}")
    raise SystemExit("a first chat failed; see the servers' log")


def warms(port: int) -> dict[str, int]:
    """The worker's ``kvi_warms_total`` by outcome (its metrics endpoint)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for outcome in ("asked", "ran", "held"):
        m = re.search(r'^kvi_warms_total\{outcome="' + outcome + r'"\} ([0-9.e+]+)$', text, re.M)
        out[outcome] = int(float(m.group(1))) if m else 0
    return out


def backlog() -> int:
    """Warms waiting (after edits) plus every message on the shared queue."""
    client = registry.redis_client()
    return int(client.llen(warm_backlog())) + int(client.llen(registry.SHARED_QUEUE))


def drain(limit: float = 900.0) -> float:
    """Seconds until no warm waits, none is held for later (a busy worker's) and no worker
    runs a task (polled)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if backlog() == 0:
            look = app.control.inspect(timeout=1.0)
            held = [look.active() or {}, look.scheduled() or {}, look.reserved() or {}]
            if not any(v for d in held for v in d.values()):
                return time.monotonic() - t0
        time.sleep(0.5)
    raise SystemExit("the warms did not drain")


def next_chat(base: str, members: list, think: float, rounds: int) -> dict:
    """Per kind and condition: the streamed turn after an edit (``think`` s later)."""
    out: dict = {}
    for r in range(rounds):
        for i, (kind, member, key) in enumerate(members):
            for on in ((True, False) if (r + i) % 2 == 0 else (False, True)):
                settings.KV_WARM_ON_EDIT = on
                text = KINDS[kind] + EDITS[r % len(EDITS)].format(NAMES[(i + r + on) % len(NAMES)])
                actions.do_set_preference(member, text=text)
                time.sleep(think)
                out.setdefault((kind, on), []).append(stream(base, key))
                drain()
    return out


def bulk(base: str, members: list, keys: list[str], on: bool, tag: str, port: int) -> dict:
    """``members`` edited in one transaction, then 8 streamed turns one after another; and
    the warms the worker ran or dropped meanwhile."""
    settings.KV_WARM_ON_EDIT = on
    before = warms(port)
    t0 = time.monotonic()
    with transaction.atomic():
        for j, m in enumerate(members):
            actions.do_set_preference(m, text=f"{KINDS['French (leans)']} I am number {j}{tag}.")
    chats = [stream(base, k) for k in keys]
    drained = drain() + time.monotonic() - t0
    after = warms(port)
    return {"ttft": [c["ttft"] for c in chats], "drained": drained,
            **{k: after[k] - before[k] for k in ("ran", "held")}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--members", type=int, default=4, help="members per kind")
    parser.add_argument("--rounds", type=int, default=2, help="edits per member and condition")
    parser.add_argument("--think", type=float, default=3.0)
    parser.add_argument("--bulk", type=int, default=200)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    call_command("migrate", interactive=False, verbosity=0)
    tenant = actions.do_create_tenant(f"bench-warm-{int(time.time())}")
    settings.KV_WARM_ON_EDIT = False  # the set-up's own edits warm nothing
    members = [(kind, m, actions.do_create_api_token(m)) for kind, memory in KINDS.items()
               for m in (actions.do_add_member(tenant, f"{tenant.slug}-{kind[:3]}{i}",
                                               preference=memory)
                         for i in range(args.members))]
    bulked = [actions.do_add_member(tenant, f"{tenant.slug}-bulk{j}",
                                    preference=KINDS["French (leans)"]) for j in range(args.bulk)]
    live = [actions.do_create_api_token(actions.do_add_member(
        tenant, f"{tenant.slug}-live{i}", preference=KINDS["vegetarian (segment only)"]))
        for i in range(8)]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", WORKER_METRICS_PORT=str(port),
               WORKER_METRICS_ADDR="127.0.0.1")
    logpath = Path(os.environ["VAR_DIR"]) / "servers.log"
    t_start = time.monotonic()
    procs, base = worker_and_web("e1", env, logpath, pool="threads", wait_s=300)
    try:
        with ThreadPoolExecutor(4) as pool:  # every member chatted before: K/V, lean cached
            list(pool.map(lambda k: first_chat(base, k), [k for *_, k in members] + live))
        before = warms(port)
        after = next_chat(base, members, args.think, args.rounds)
        ran = warms(port)
        after["warms"] = {k: ran[k] - before[k] for k in ("ran", "held")}
        drain()
        bulks = {on: bulk(base, bulked, live, on, f"-{on}", port) for on in (False, True)}
    finally:
        stop(procs)
    report(after, bulks, args, time.monotonic() - t_start)


def report(after: dict, bulks: dict, args, seconds: float) -> None:
    med = statistics.median
    rows = []
    for kind in KINDS:  # (``after["warms"]``: counts, below)
        on, off = after[(kind, True)], after[(kind, False)]
        rows.append([kind, len(on), f"{med(r['ttft'] for r in off) * 1000:.0f}",
                     f"{med(r['ttft'] for r in on) * 1000:.0f}",
                     f"**{med(r['ttft'] for r in on) / med(r['ttft'] for r in off):.2f}x**",
                     f"{med(r['guide'] for r in off):.0f} / {med(r['guide'] for r in on):.0f}"])
    first = table(["memory", "edits per condition", "next chat's first token, off (ms)",
                   "on (ms)", "on / off", "guide tokens in that chat, off / on"], rows)
    b_rows = [[("on" if on else "off"), f"{med(b['ttft']) * 1000:.0f}",
               f"{max(b['ttft']) * 1000:.0f}", f"{b['drained']:.0f}",
               f"{b['ran']} / {b['held']}"]
              for on, b in bulks.items()]
    second = table([f"warm on edit, {args.bulk} members edited at once", "8 live chats' first "
                    "token, median (ms)", "slowest (ms)", "until the backlog drained (s)",
                    "warms run / held (until the worker was idle)"], b_rows)
    ratio = med(bulks[True]["ttft"]) / med(bulks[False]["ttft"])
    body = "\n".join([
        f"`.venv/bin/python bench/bench_warm_on_edit.py --members {args.members} --rounds "
        f"{args.rounds} --think {args.think:g} --bulk {args.bulk}` — {machine()}; one `celery "
        "worker --pool threads`, the web under uvicorn, platform defaults, SmolLM2, greedy, "
        f"64 tokens, streamed `/v1`; {seconds:.0f} s.", "", first, "", second, "",
        f"- the edits of the first table: {after['warms']['ran']} warms ran of "
        f"{after['warms']['held']} held (until the worker was idle).",
        f"- the live chats beside a bulk edit's warms: first token **{ratio:.2f}x** the same "
        "chats beside the same edit without warms (medians)."])
    print(body)
    if args.write_docs:
        write_section("warm-on-edit", "## Warm on edit: the next chat after an edit, and a "
                      "bulk edit's warms\n\n" + body)


if __name__ == "__main__":
    main()
