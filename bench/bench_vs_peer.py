"""The platform against the peer a user would run instead (issue 59): vLLM's CPU build with
automatic prefix caching, the member's context as the system message, on the same model,
machine and workload, one after the other (never at once).

    .venv/bin/python bench/bench_vs_peer.py [--quick] [--peer vllm|llamacpp|none]
                                            [--reps N] [--tenant-members N] [--turns N]
                                            [--peer-results JSON]

The peer runs from a venv of its own (``make peer-vllm``, bench/peers.py); where it is not
installed this prints one line saying so and exits 0 (``make bench`` passes). ``--peer
none``: the platform's figures alone. The platform: embedded PostgreSQL + Redis under
var/bench-vs-peer, one ``celery worker --pool threads`` as deployed, the web under uvicorn,
its defaults (rate limits off; members made without a warm on creation), the real default
model (``MODEL_PATH`` for another); members of one tenant with one preference each,
injected. The peer gets, per member, the same text as the system message
(``compose_context``: the tenant's instructions, then the preference).
Every request is a streamed greedy ``/v1/chat/completions`` turn; each question is new to
both servers ("Question k: ..."), so neither serves a whole prompt from a cache. Measured
(bench/vs_peer_workloads.py): a warm member's and a new member's batch-1 time to the first
token, batch-1 streamed decode, 8 and 16 members at once against one after another, a
16-client soak (bounded in seconds and streams), turn ``--turns`` of a conversation (sent
back to back, and in other conversations 2 s after the reply before it, as a person reads), and
``--tenant-members`` members of a second tenant with ~3,900-character instructions (a new
member's first token; memory held: RSS of the server processes, and the platform's Redis),
and after a restart (the platform's worker; the peer's server, whose prefix cache is in its
process) the first token of members of that tenant seen before it.
``--peer-results``: the peer's side from an earlier run's JSON (same machine and counts; the
report names the file), so a change to the platform is measured without the peer again.
Replies: the platform with its mechanisms off (contrast 0, constraints, reminder and loop
guard off) against the peer, greedy, token for token (the first differing position where they differ).
Output: a table (ratios platform / peer of this run) and JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import peers  # noqa: E402
import vs_peer_report as report  # noqa: E402
import vs_peer_workloads as wl  # noqa: E402
from servers import setup_django  # noqa: E402

RESULTS = ROOT / "bench" / "results"
VAR = ROOT / "var" / "bench-vs-peer"


def platform_members(plan: wl.Plan) -> dict[str, list[wl.Member]]:
    """The plan's members as platform members (an API key each) of two new tenants; not
    warmed on creation (``KV_WARM_ON_EDIT`` off while they are made), so a new member is new
    on both sides and no background warm runs beside the timed requests."""
    from django.conf import settings

    from tenants import actions

    settings.KV_WARM_ON_EDIT = False

    stamp = int(time.time())
    out: dict[str, list[wl.Member]] = {}
    for group, (instructions, prefs) in plan.groups.items():
        tenant = actions.do_create_tenant(f"vs-peer-{group}-{stamp}")
        if instructions:
            tenant = actions.do_set_tenant_instructions(tenant, instructions)
        out[group] = [wl.Member(actions.do_create_api_token(actions.do_add_member(
            tenant, f"{tenant.slug}-{i}", preference=p)), "") for i, p in enumerate(prefs)]
    return out


def platform_memory(procs: list) -> dict[str, int]:
    """Resident bytes of the web and the worker (with children), and what both Redis hold."""
    import redis
    from django.conf import settings

    held = {"processes": peers.tree_rss([p.pid for p in procs])}
    urls = {settings.REDIS_URL, settings.KV_CACHE_REDIS_URL}
    held["redis"] = sum(int(redis.Redis.from_url(u).info("memory")["used_memory"]) for u in urls)
    return held


def run_platform(plan: wl.Plan) -> dict:
    from django.conf import settings
    from servers import stop, worker_and_web

    members = platform_members(plan)
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    VAR.mkdir(parents=True, exist_ok=True)
    procs, base = worker_and_web("vp1", env, VAR / "servers.log", pool="threads", wait_s=600)
    side = wl.Side("platform", base, "kvinject", platform=True)

    def restart() -> wl.Side:
        """The worker stopped and a new one started (the web stays): its memory is gone,
        the cached K/V in Redis is not."""
        stop(procs[:1])
        procs[0] = restarted_worker("vp2", env)
        return side

    try:
        return wl.run_all(side, members, plan, lambda: platform_memory(procs), restart) | {
            "batch_max": settings.WORKER_BATCH_MAX}
    finally:
        stop(procs)


def restarted_worker(name: str, env: dict[str, str], wait_s: float = 600):
    from servers import celery_worker, wait_registered

    proc = celery_worker(name, env, open(VAR / "servers.log", "ab"), pool="threads")
    if not wait_registered(name, [proc], wait_s):
        raise SystemExit(f"the restarted worker did not start; see {VAR / 'servers.log'}")
    return proc


def run_peer(kind: str, plan: wl.Plan, model: Path) -> dict:
    from injection.prompting.template import compose_context

    members = {g: [wl.Member("", compose_context(instructions, p)) for p in prefs]
               for g, (instructions, prefs) in plan.groups.items()}
    log = open(VAR / f"peer-{kind}.log", "ab")
    running = [peers.start_vllm(model, log)]
    peer = running[0]

    def restart() -> wl.Side:
        """The server stopped and started again: its prefix cache lives in the process."""
        peers.stop(running[0].proc)
        running[0] = peers.start_vllm(model, log)
        return wl.Side(peer.name, running[0].base, running[0].model, platform=False)

    side = wl.Side(peer.name, peer.base, peer.model, platform=False)
    try:
        return wl.run_all(side, members, plan,
                          lambda: {"processes": peers.tree_rss([running[0].proc.pid])},
                          restart) | {"name": peer.name, "notes": list(peer.notes)}
    finally:
        peers.stop(running[0].proc)
        log.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny counts: proves it runs")
    ap.add_argument("--peer", choices=["vllm", "llamacpp", "none"], default="vllm")
    ap.add_argument("--reps", type=int, help="batch-1 streams per figure (5; --quick 2)")
    ap.add_argument("--tenant-members", type=int, help="members of the big tenant (200)")
    ap.add_argument("--turns", type=int, help="the conversation's measured turn (20)")
    ap.add_argument("--peer-results", metavar="JSON", help="the peer's figures from an earlier "
                    "run's JSON on this machine (same counts) instead of running it again")
    args = ap.parse_args()
    if args.peer != "none" and not args.peer_results and (why := peers.missing(args.peer)):
        print(why)
        return
    plan = wl.Plan.make(args.quick, args.reps, args.tenant_members, args.turns)
    VAR.mkdir(parents=True, exist_ok=True)
    setup_django(VAR)
    from django.conf import settings

    model = Path(settings.MODEL_PATH)
    t0 = time.monotonic()
    results = {"platform": run_platform(plan)}
    if args.peer_results:
        earlier = json.loads(Path(args.peer_results).read_text())
        if earlier["plan"] != json.loads(json.dumps(plan._asdict())):
            raise SystemExit(f"{args.peer_results} was run with other counts")
        results["peer"] = earlier["peer"] | {"from": args.peer_results}
    elif args.peer != "none":
        results["peer"] = run_peer(args.peer, plan, model)
    results["replies"] = report.compare_replies(results, model)
    text = report.render(results, plan, args, model.name, time.monotonic() - t0)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"vs-peer-{args.peer}-{time.strftime('%Y-%m-%d-%H%M')}{'-quick' * args.quick}.json"
    out.write_text(json.dumps({"args": vars(args), "plan": plan._asdict(), **results}, indent=1))
    print(f"\nraw figures: {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
