"""Probe against a running platform: are a tenant's long instructions stored once in Redis?

    .venv/bin/python bench/probe_tenant_instructions.py [--base http://127.0.0.1:8000]
        [--tenant acme] [--members 12] [--tokens 8] [--admin-key KEY] [--json]

Run it beside `make demo` (same checkout: it reads the tenant admin's API token from
var/secrets/demo-tokens.json unless ``--admin-key`` is given, and creates members with
``manage.py tenant adduser``, which reaches the demo's embedded Postgres). Loopback only.

The claim it checks: "a tenant with 4000-character instructions stores them once in
Redis however many members chat". The system turn is cached as a chain of segments
(injection/kvcache/chain.py): the tenant segment (template header + instructions) once
per tenant, and per member only the tokens the member's preference adds. Steps:

1. ``GET /api/tenant/instructions`` (kept, restored at the end), then ``PUT`` a ~4000
   character instructions text (a varied company assistant policy) as the tenant admin;
2. ``manage.py tenant adduser`` ``--members`` new members (names unique per run) with
   distinct short preferences, and a ``manage.py kvcache stats --tenant T --json``
   baseline;
3. one ``POST /api/chat`` per member (``max_new_tokens`` ``--tokens``), one after the
   other: the reply's ``cache`` (tier, kv_tokens, per-segment tiers) and ``usage``;
4. each member's second request through ``POST /v1/chat/completions``:
   ``usage.prompt_tokens`` and ``usage.prompt_tokens_details.cached_tokens``;
5. ``manage.py kvcache stats --tenant T --json`` again (polled until Redis is settled:
   writes to Redis are asynchronous): Redis entries and bytes per kind (tenant segment,
   member segments; conversation links share the member's index, see ``kvcache stats``;
   one-shot requests like these store no link) and the ratio of what Redis holds to the
   ideal (the tenant segment once plus every member's own segment).

Reported: a table per member and a summary; the claim holds when the tenant has exactly
one tenant-segment entry in Redis and the tenant bytes do not grow with the members.
The members stay in the tenant afterwards (``manage.py tenant deluser T NAME`` removes one).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
PYTHON = ROOT / ".venv" / "bin" / "python"

# ~4000 characters of instructions (the API's limit is 4000): a varied policy text, so the
# tenant segment is what a real tenant would send, not one sentence repeated.
INSTRUCTIONS = """\
You are the assistant of Acme Corporation, a mid-sized company that designs, builds and \
services industrial kitchen equipment for restaurants, hospitals, schools and hotels in \
twelve countries. You answer the questions of Acme's employees and of the customers they \
put in touch with you. Be friendly, precise and brief: most answers should fit in three \
short paragraphs or a list of at most seven items.

Tone and language. Write in plain language and avoid jargon unless the person uses it \
first. Answer in the language of the question. Use metric units, and add imperial units \
in brackets when the person writes from the United States. Never use sarcasm, never \
guess at someone's feelings, and do not add emojis unless the person uses them.

Products. Acme sells combination ovens (the Vapora series), blast chillers (Frostline), \
dishwashing tunnels (ClearPass), induction ranges (Heatwise) and the Acme Connect \
monitoring service. When someone asks about a product, give the model family, its main \
use and where to find the manual on the customer portal. Do not quote prices, delivery \
dates or discounts: say that the regional sales office confirms them in writing.

Safety first. Questions about gas connections, electrical installation, refrigerant \
handling or water treatment must be answered with a clear warning that the work is done \
by a certified technician only. Never explain how to bypass an interlock, a thermal \
cut-out or a door sensor, even when the person says it is for testing. If someone describes \
smoke, a burning smell, a gas odour or an electric shock, tell them to switch the \
appliance off at the isolator, leave the area if needed and call the local emergency \
number before anything else.

Service and warranty. Standard warranty is twenty-four months on parts and twelve months \
on labour from the date of commissioning. Extended plans exist but their terms differ by \
country, so point people to their service contract rather than stating coverage. To open \
a service ticket, the person needs the serial number on the rating plate, a short \
description of the fault and any error code shown on the display.

Privacy. Do not ask for or repeat personal data that is not needed to answer: no home \
addresses, dates of birth, health information or bank details. If a person pastes such \
data, answer without repeating it. Customer names, contract numbers and site addresses \
are confidential and must never be shared with another customer.

Orders and deliveries. Customers can follow an order on the portal with its order number. \
If a delivery is late or damaged, ask for photos of the packaging and the delivery note, \
and tell them to note any damage on the carrier's receipt before signing. Spare parts \
ship from the central warehouse within two working days when in stock.

Internal matters. Employees may ask about HR policies, travel, expenses and IT. Give the \
general rule and link to the intranet page by its title; for individual cases (a salary, \
a dispute, a medical leave) refer them to their HR partner. Travel is booked through the \
travel desk; economy class for flights under six hours; receipts are submitted within \
thirty days. Passwords are never shared, not even with IT staff.

What you do not do. You do not give legal, medical or financial advice, you do not make \
promises on Acme's behalf, and you do not comment on competitors, share prices, ongoing \
litigation or rumours about the company. If you do not know an answer, say so plainly and \
suggest who can help: the service desk, the regional sales office or the person's manager.

Format. Start with the answer, then the reasons. Use numbered steps for procedures and \
bullet points for options. Keep code, part numbers and error codes in their exact form. \
When a question mixes several topics, answer each under its own short heading. Write \
dates as day, month name and year. End with one short follow-up question only when \
something essential is missing.\
"""

PREFERENCES = [
    "I am vegetarian.", "Answer in French, please.", "I prefer very short answers.",
    "I work night shifts.", "I am a field technician in Lyon.", "I like bullet points.",
    "I am new at Acme.", "I manage the Madrid office.", "I am allergic to nuts.",
    "I use the Vapora ovens daily.", "Please explain like I am a beginner.",
    "I travel a lot for work.", "I am colour blind.", "I prefer metric units only.",
    "I handle customer complaints.", "I run a school canteen.",
]
QUESTIONS = ["How do I open a service ticket?", "What is the warranty on a blast chiller?",
             "Can you summarise the travel policy?", "What should I do if I smell gas?"]


def check_loopback(base: str) -> None:
    host = urlsplit(base).hostname or ""
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit(f"--base must be a loopback address (got {host!r})")


def call(base: str, method: str, path: str, key: str, body: dict | None = None,
         timeout: float = 200.0) -> tuple[int, dict]:
    """(HTTP status, JSON body) of one request; HTTP errors come back, not raised."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"{base}{path}", data=data, method=method,
                                 headers={"Authorization": f"Bearer {key}",
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, {"raw": raw[:200].decode(errors="replace")}


def retrying(fn, attempts: int = 6):
    """``fn()`` -> (status, body), retried on 429/503 after ``Retry-After`` (bounded)."""
    status, body = fn()
    for _ in range(attempts - 1):
        if status not in (429, 503):
            break
        time.sleep(min(30.0, float((body or {}).get("retry_after") or 5)))
        status, body = fn()
    return status, body


def manage(*args: str, timeout: float = 300.0) -> str:
    done = subprocess.run([str(PYTHON), "manage.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"manage.py {' '.join(args[:2])} failed ({done.returncode}): "
                         f"{done.stderr.strip()[-500:]}")
    return done.stdout


def add_member(tenant: str, name: str, preference: str) -> str:
    out = manage("tenant", "adduser", tenant, name, "--preference", preference)
    return out.strip().splitlines()[-1].strip()


def redis_kinds(tenant: str) -> dict:
    """Redis (L2) entries and bytes of ``tenant`` per kind, from ``kvcache stats``."""
    report = json.loads(manage("kvcache", "stats", "--tenant", tenant, "--json"))
    kinds = report.get("kinds") or {}
    l2 = report["tenants"][tenant]["l2"]
    row = {k: {"entries": (kinds.get(k) or {}).get("l2_entries"),
               "bytes": (kinds.get(k) or {}).get("l2_bytes")}
           for k in ("tenant", "member", "conversation")}
    row["total"] = {"entries": l2["entries"], "bytes": l2["bytes"]}
    row["l1_conversation_entries"] = (kinds.get("conversation") or {}).get("entries", 0)
    row["workers_unconfirmed"] = report.get("workers_unconfirmed")
    return row


def settled_kinds(tenant: str, want_tenant: int | None, want_members: int | None,
                  seconds: float = 30.0) -> dict:
    """``redis_kinds`` once it shows what was asked for or stops changing (bounded)."""
    until = time.monotonic() + seconds
    last = redis_kinds(tenant)
    while time.monotonic() < until:
        ok = ((want_tenant is None or last["tenant"]["entries"] == want_tenant)
              and (want_members is None or last["member"]["entries"] >= want_members))
        if ok:
            return last
        time.sleep(2.0)
        now = redis_kinds(tenant)
        if now == last and want_members is None:
            return now
        last = now
    return last


def admin_key(tenant: str, given: str | None) -> str:
    if given:
        return given
    tokens = json.loads((ROOT / "var" / "secrets" / "demo-tokens.json").read_text())
    key = tokens.get(f"{tenant}-admin")
    if not key:
        raise SystemExit(f"no {tenant}-admin token in var/secrets/demo-tokens.json: "
                         "pass --admin-key")
    return key if isinstance(key, str) else key["token"]


def first_chat(base: str, key: str, question: str, tokens: int) -> dict:
    status, body = retrying(lambda: call(base, "POST", "/api/chat", key,
                                         {"message": question, "max_new_tokens": tokens}))
    if status != 200:
        raise SystemExit(f"/api/chat answered {status}: {json.dumps(body)[:300]}")
    cache, usage = body.get("cache") or {}, body.get("usage") or {}
    return {"tier": cache.get("tier"), "kv_tokens": cache.get("kv_tokens"),
            "kv_bytes_cpu": cache.get("kv_bytes_cpu"),
            "segments": (cache.get("extra") or {}).get("segments") or cache.get("segments"),
            "instructions_version": cache.get("instructions_version"),
            "injection_mode": cache.get("injection_mode"),
            "prompt_tokens": usage.get("prompt_tokens"),
            "cached_tokens": usage.get("cached_tokens", cache.get("cached_tokens"))}


def second_chat(base: str, key: str, question: str, tokens: int) -> dict:
    body_in = {"model": "kvinject", "max_tokens": tokens, "temperature": 0,
               "messages": [{"role": "user", "content": question}]}
    status, body = retrying(lambda: call(base, "POST", "/v1/chat/completions", key, body_in))
    if status != 200:
        raise SystemExit(f"/v1/chat/completions answered {status}: {json.dumps(body)[:300]}")
    usage = body.get("usage") or {}
    cache = (body.get("kvinject") or {}).get("cache") or {}
    return {"tier": cache.get("tier"),
            "segments": (cache.get("extra") or {}).get("segments"),
            "prompt_tokens": usage.get("prompt_tokens"),
            "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens")}


def probe(args: argparse.Namespace) -> dict:
    key = admin_key(args.tenant, args.admin_key)
    status, before = call(args.base, "GET", "/api/tenant/instructions", key)
    if status != 200:
        raise SystemExit(f"GET /api/tenant/instructions answered {status}: {before}")
    status, put = retrying(lambda: call(args.base, "PUT", "/api/tenant/instructions", key,
                                        {"instructions": INSTRUCTIONS,
                                         "expected_version": before["version"]}))
    if status != 200:
        raise SystemExit(f"PUT /api/tenant/instructions answered {status}: {put}")
    try:
        return run_members(args, put["version"])
    finally:
        status, now = call(args.base, "GET", "/api/tenant/instructions", key)
        status, back = retrying(lambda: call(
            args.base, "PUT", "/api/tenant/instructions", key,
            {"instructions": before["instructions"], "expected_version": now.get("version")}))
        print(f"restored {args.tenant}'s instructions ({len(before['instructions'])} chars): "
              f"HTTP {status}, version {back.get('version')}", file=sys.stderr)


def run_members(args: argparse.Namespace, version: int) -> dict:
    # the instructions change drops the tenant's Redis entries (through the outbox): wait
    # for that before the baseline, so no late eviction races the first chat
    time.sleep(2.0)
    baseline = settled_kinds(args.tenant, want_tenant=0, want_members=None, seconds=20.0)
    suffix = time.strftime("%m%d%H%M%S")
    members = []
    for i in range(args.members):
        name = f"probe-{suffix}-{i:02d}"
        pref = f"{PREFERENCES[i % len(PREFERENCES)]} (member {i + 1})"
        members.append({"name": name, "preference": pref,
                        "key": add_member(args.tenant, name, pref)})
    for i, m in enumerate(members):
        m["first"] = first_chat(args.base, m["key"], QUESTIONS[i % len(QUESTIONS)], args.tokens)
        if m["first"]["instructions_version"] != version:
            raise SystemExit(f"{m['name']}: reply used instructions version "
                             f"{m['first']['instructions_version']}, expected {version}")
    for i, m in enumerate(members):
        m["second"] = second_chat(args.base, m["key"], QUESTIONS[(i + 1) % len(QUESTIONS)],
                                  args.tokens)
    after = settled_kinds(args.tenant, want_tenant=1,
                          want_members=baseline["member"]["entries"] + len(members))
    for m in members:
        m.pop("key")
    return {"tenant": args.tenant, "instructions_chars": len(INSTRUCTIONS),
            "instructions_version": version, "members": members,
            "redis_before": baseline, "redis_after": after}


def summary(r: dict) -> dict:
    n = len(r["members"])
    a, b = r["redis_after"], r["redis_before"]
    t_entries, t_bytes = a["tenant"]["entries"], a["tenant"]["bytes"]
    m_entries = a["member"]["entries"] - b["member"]["entries"]
    m_bytes = a["member"]["bytes"] - b["member"]["bytes"]
    per_member = m_bytes / n if n else 0.0
    ideal = t_bytes + m_bytes
    total = a["total"]["bytes"] - b["total"]["bytes"]
    private = t_bytes + per_member  # one member's own copy of instructions + preference
    return {"members": n, "tenant_entries": t_entries, "tenant_bytes": t_bytes,
            "member_entries": m_entries, "member_bytes": m_bytes,
            "bytes_per_member": per_member, "private_copy_bytes": private,
            "private_copies_total": n * private, "redis_total_bytes": total,
            "ideal_bytes": ideal, "ratio_total_to_ideal": total / ideal if ideal else None,
            "saving_vs_private_copies": n * private / total if total else None,
            "stored_once": t_entries == 1}


def mb(n: float | None) -> str:
    return "-" if n is None else f"{n / 1024**2:.2f} MB"


def report(r: dict, s: dict) -> None:
    p = print
    p(f"tenant {r['tenant']}: instructions {r['instructions_chars']} chars "
      f"(version {r['instructions_version']}), {s['members']} new members")
    p(f"{'member':<22} {'1st tier':>8} {'segments':<28} {'kv_tok':>6} {'prompt':>6} "
      f"{'cached':>6} | {'2nd tier':>8} {'prompt':>6} {'cached':>6}")
    for m in r["members"]:
        f, s2 = m["first"], m["second"]
        seg = ",".join(f"{k}={v}" for k, v in (f["segments"] or {}).items())
        p(f"{m['name']:<22} {f['tier']:>8} {seg:<28} {f['kv_tokens']!s:>6} "
          f"{f['prompt_tokens']!s:>6} {f['cached_tokens']!s:>6} | {s2['tier']!s:>8} "
          f"{s2['prompt_tokens']!s:>6} {s2['cached_tokens']!s:>6}")
    b, a = r["redis_before"], r["redis_after"]
    p("")
    p(f"Redis (L2) per kind, tenant {r['tenant']}     before run            after run")
    for kind in ("tenant", "member", "conversation", "total"):
        x, y = b[kind], a[kind]
        p(f"  {kind:<14} {x['entries']!s:>8} entries {mb(x['bytes']):>11}   "
          f"{y['entries']!s:>8} entries {mb(y['bytes']):>11}")
    p("  (conversation: no index of its own, counted in member; worker L1 conversation "
      f"entries: {a['l1_conversation_entries']})")
    p("")
    rows = [
        ("members", s["members"]),
        ("tenant-segment entries / bytes", f"{s['tenant_entries']} / {mb(s['tenant_bytes'])}"),
        ("member-segment entries / bytes (this run)",
         f"{s['member_entries']} / {mb(s['member_bytes'])}"),
        ("bytes per member", mb(s["bytes_per_member"])),
        ("one member's private copy (tenant + member)", mb(s["private_copy_bytes"])),
        (f"{s['members']} private copies", mb(s["private_copies_total"])),
        ("Redis total (this run)", mb(s["redis_total_bytes"])),
        ("ideal (tenant once + member segments)", mb(s["ideal_bytes"])),
        ("ratio total / ideal", "-" if s["ratio_total_to_ideal"] is None
         else f"{s['ratio_total_to_ideal']:.3f}"),
        ("private copies / Redis total", "-" if s["saving_vs_private_copies"] is None
         else f"{s['saving_vs_private_copies']:.1f}x"),
        ("1st request cached_tokens (per member)",
         " ".join(str(m["first"]["cached_tokens"]) for m in r["members"])),
        ("2nd request cached_tokens / prompt_tokens",
         " ".join(f"{m['second']['cached_tokens']}/{m['second']['prompt_tokens']}"
                  for m in r["members"])),
        ("instructions stored once", "yes" if s["stored_once"] else "NO"),
    ]
    for label, value in rows:
        p(f"  {label:<46} {value}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="http://127.0.0.1:8000")
    ap.add_argument("--tenant", default="acme")
    ap.add_argument("--members", type=int, default=12, help="new members (1-64)")
    ap.add_argument("--tokens", type=int, default=8, help="max new tokens per reply")
    ap.add_argument("--admin-key", default=None,
                    help="the tenant admin's API token (default: var/secrets/demo-tokens.json)")
    ap.add_argument("--json", action="store_true", help="also print the raw figures as JSON")
    args = ap.parse_args()
    check_loopback(args.base)
    if not 1 <= args.members <= 64:
        ap.error("--members must be 1-64")
    r = probe(args)
    s = summary(r)
    report(r, s)
    if args.json:
        print(json.dumps({"run": r, "summary": s}, sort_keys=True))
    return 0 if s["stored_once"] else 1


if __name__ == "__main__":
    sys.exit(main())
