"""Fault probe against a running platform: a backing service hangs (SIGSTOP) during chats.

    .venv/bin/python bench/fault_probe.py redis|postgres [--base http://127.0.0.1:8000]
                                          [--hang 60] [--write-docs]

Run it beside `make demo` (same checkout: it finds the demo's embedded Redis or Postgres
processes under this checkout and uses the demo's tokens in var/secrets/demo-tokens.json).
It stops every process of the service with SIGSTOP for ``--hang`` seconds (a hung
dependency: connections are accepted by the kernel, nothing answers), and meanwhile:

* sends one chat every few seconds and records, per chat, the HTTP status, whether the
  body is the documented JSON error, and how long the answer took;
* runs ``manage.py kvcache stats`` and records its exit code and how long it took;

then sends SIGCONT and measures how long until a chat is answered 200 again (recovery
without a restart). The goals (issue 20): every chat during the hang answers a JSON
502/503 within its deadline, ``kvcache stats`` exits non-zero within 90 s, and the platform
recovers by itself after SIGCONT.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKS = {"redis": "redis-server", "postgres": "postgres"}


def service_pids(service: str) -> list[int]:
    """Every process of the embedded ``service`` started from this checkout, and their
    children (a Postgres backend per open connection)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            continue
        if MARKS[service] in cmd and (str(ROOT) in cmd or str(ROOT) in exe):
            pids.append(int(pid))
    return pids + descendants(pids)  # Postgres: its backends serve the open connections


def descendants(roots: list[int]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(pid))
    found, todo = [], list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in roots and child not in found:
                found.append(child)
                todo.append(child)
    return found


def demo_key() -> str:
    tokens = json.loads((ROOT / "var" / "secrets" / "demo-tokens.json").read_text())
    first = next(iter(tokens.values()))
    return first if isinstance(first, str) else first["token"]


def chat(base: str, key: str, timeout: float = 200.0) -> tuple[int, bool, float]:
    """(HTTP status, body is a JSON error/answer, seconds) for one short chat."""
    body = {"message": "Say hello.", "max_new_tokens": 8}
    req = urllib.request.Request(f"{base}/api/chat", data=json.dumps(body).encode(),
                                 headers={"Authorization": f"Token {key}",
                                          "Content-Type": "application/json"})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            payload, status = resp.read(), resp.status
    except urllib.error.HTTPError as exc:
        payload, status = exc.read(), exc.code
    except OSError:
        return 0, False, time.monotonic() - t0
    try:
        parsed = json.loads(payload)
        is_json = "reply" in parsed if status == 200 else "error" in parsed
    except ValueError:
        is_json = False
    return status, is_json, time.monotonic() - t0


def kvcache_stats(timeout: float = 300.0) -> tuple[int | None, float]:
    t0 = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "manage.py", "kvcache", "stats"], cwd=ROOT,
                              capture_output=True, timeout=timeout)
        return done.returncode, time.monotonic() - t0
    except subprocess.TimeoutExpired:
        return None, time.monotonic() - t0


def probe(service: str, base: str, hang: float, key: str) -> dict:
    pids = service_pids(service)
    if not pids:
        raise SystemExit(f"no {service} process of this checkout is running (start make demo)")
    status, ok, _ = chat(base, key)
    if status != 200:
        raise SystemExit(f"the platform does not answer before the fault (HTTP {status})")
    chats: list[tuple[int, bool, float]] = []
    stats: list[tuple[int | None, float]] = []
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        runner = threading.Thread(target=lambda: stats.append(kvcache_stats()), daemon=True)
        runner.start()
        while time.monotonic() - stopped_at < hang:
            threads = [threading.Thread(target=lambda: chats.append(chat(base, key)))
                       for _ in range(2)]
            for t in threads:
                t.start()
            time.sleep(max(1.0, hang / 8))
        for t in threads:
            t.join(timeout=5)
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    resumed = time.monotonic()
    recovered = None
    while time.monotonic() - resumed < 120:
        if chat(base, key, timeout=60)[0] == 200:
            recovered = time.monotonic() - resumed
            break
        time.sleep(1.0)
    runner.join(timeout=300)
    return {"service": service, "hang": hang, "chats": chats, "stats": stats,
            "recovered": recovered}


def report(res: dict) -> list[str]:
    chats = res["chats"]
    codes = sorted({c for c, _, _ in chats})
    worst = max((s for _, _, s in chats), default=0.0)
    answered = [c for c in chats if c[0] in (502, 503) and c[1]]
    stats = res["stats"][0] if res["stats"] else (None, 0.0)
    recovered = res["recovered"]
    return [
        f"{res['service']} stopped (SIGSTOP) for {res['hang']:g} s during chats:",
        f"  chats sent {len(chats)}: statuses {codes}; JSON 502/503 {len(answered)}/{len(chats)}; "
        f"slowest answer {worst:.1f} s",
        f"  kvcache stats: exit {stats[0]} after {stats[1]:.1f} s (goal: non-zero within 90 s)",
        "  after SIGCONT: " + (f"answered 200 again after {recovered:.1f} s" if recovered is not None
                               else "NOT recovered within 120 s"),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("service", choices=sorted(MARKS))
    ap.add_argument("--base", default="http://127.0.0.1:8000")
    ap.add_argument("--hang", type=float, default=60.0)
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    lines = report(probe(args.service, args.base, args.hang, demo_key()))
    print("\n".join(lines))
    if args.write_docs:
        from mdsection import write_section

        write_section(f"fault-{args.service}",
                      f"## Fault probe: {args.service} hung (`bench/fault_probe.py {args.service}`)"
                      "\n\n```\n" + "\n".join(lines) + "\n```\n")


if __name__ == "__main__":
    main()
