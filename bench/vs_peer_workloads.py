"""The workloads bench/bench_vs_peer.py runs against one server (the platform or the peer):
the same members, questions and order on both, so the figures compare.

A member is an API key on the platform (its preference injected by the server) and a system
message on the peer (the same text, ``compose_context``). Every question is new to the
server ("Question k: ..."; k from the phase, the same on both), so a prefix cache holds the
system turn and history at most, never a whole prompt.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from v1stream import stream

QUESTIONS = ["What should I cook tonight?", "Suggest a plan for a rainy Sunday.",
             "How do I keep basil fresh?", "What is a good breakfast before a long walk?",
             "Give me three ideas for a picnic.", "How should I store leftover rice?",
             "What can I bring to a dinner party?", "Plan a simple lunch for tomorrow."]
PREFS = ["I am vegetarian and I cook for two.", "I live in Oslo and I cycle everywhere.",
         "I cook for two small kids who hate spicy food.", "I am allergic to nuts.",
         "I love Italian food and I bake on Sundays.", "I have little time on weekdays.",
         "I grow tomatoes and herbs on my balcony.", "I am training for a marathon."]
NAMES = ["Ana", "Bo", "Chen", "Dara", "Eli", "Femi", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea",
         "Mo", "Nia", "Oskar", "Pia", "Quinn", "Rui", "Sol", "Tove"]
INSTRUCTION_LINES = [
    "You are the assistant of Green Basket, a chain of neighbourhood grocery shops.",
    "Answer questions about cooking, recipes, ingredients, storage and our shops.",
    "Be brief, friendly and practical; prefer seasonal vegetables and simple methods.",
    "Never recommend products we do not sell and never give medical advice.",
    "Say so politely when a question is outside cooking or shopping.",
    "Our shops open at eight and close at nine, on Sundays at six.",
    "Mention the weekly offer on root vegetables where it fits the question."]
# ~3,900 characters of tenant instructions (issue 59): whole lines, in turn
INSTRUCTIONS = " ".join((INSTRUCTION_LINES * 8)[:54])  # 3,913
WARM_TOKENS, TURN_TOKENS = 8, 24
# before the paused timed turn: a person reads the reply before asking again, far longer in
# practice; the platform prepares the next turn's opening (injection/engine/turns.py,
# OPENING_DELAY_S 0.5 s after a reply), the peer has nothing to do with the time
PAUSE_S = 2.0
OFF = {"contrast": 0.0, "constraints": False, "reminder": False,
       "loop_guard": False}  # the mechanisms off


class Member(NamedTuple):
    key: str  # the platform's API key ('' on the peer)
    system: str  # the peer's system message ('' on the platform)


class Side(NamedTuple):
    name: str
    base: str
    model: str
    platform: bool


class Plan(NamedTuple):
    """Counts of one run (``make``: the defaults, or ``--quick``'s tiny ones)."""

    reps: int  # batch-1 streams per figure
    tokens: int  # new tokens of a timed reply
    bursts: tuple[int, ...]  # members at once (and one after another)
    soak_clients: int
    soak_seconds: float
    soak_streams: int  # per client, at most
    turns: int  # the conversation's measured turn
    conversations: int
    pause: float  # seconds a member reads the last reply before the paused timed turn
    compare: int  # members whose replies are compared
    tenant_members: int
    groups: dict  # tenant -> (instructions, member preferences)

    @classmethod
    def make(cls, quick: bool, reps: int | None, tenant_members: int | None,
             turns: int | None) -> Plan:
        reps = reps or (2 if quick else 5)
        bursts = (2, 3) if quick else (8, 16)
        tenant_members = tenant_members or (4 if quick else 200)
        warm = max(bursts)
        simple = [f"{PREFS[i % len(PREFS)]} My name is {NAMES[i % len(NAMES)]}{i}."
                  for i in range(warm + reps)]  # the last ``reps``: new members
        tenant = [f"{PREFS[i % len(PREFS)]} Call me {NAMES[i % len(NAMES)]}{i}."
                  for i in range(tenant_members + reps)]
        return cls(reps, 16 if quick else 64, bursts, 3 if quick else 16,
                   10.0 if quick else 120.0, 2 if quick else 40, turns or (3 if quick else 20),
                   1 if quick else 2, PAUSE_S, 2 if quick else 8, tenant_members,
                   {"simple": ("", tuple(simple)), "tenant": (INSTRUCTIONS, tuple(tenant))})


def question(k: int) -> str:
    return f"Question {k}: {QUESTIONS[k % len(QUESTIONS)]}"


def turn(side: Side, member: Member, messages: list[dict], tokens: int,
         extra: dict | None = None) -> dict:
    """One streamed greedy turn of ``member`` (``extra``: the platform's ``kvinject``)."""
    body = {"model": side.model, "max_tokens": tokens, "temperature": 0, "messages": messages}
    if side.platform:
        if extra:
            body["kvinject"] = extra
        return stream(side.base, body, {"Authorization": f"Bearer {member.key}"})
    body["messages"] = [{"role": "system", "content": member.system}, *messages]
    return stream(side.base, body)


def ask(side: Side, member: Member, k: int, tokens: int, extra: dict | None = None) -> dict:
    return turn(side, member, [{"role": "user", "content": question(k)}], tokens, extra)


def warm(side: Side, members: list[Member], k0: int, tries: int = 3) -> None:
    """One short turn per member (its context computed and cached), four at a time; a
    fresh server's first requests can fail on a loaded machine: sent again."""
    def one(i: int) -> None:
        for attempt in range(tries):
            try:
                ask(side, members[i], k0 + i, WARM_TOKENS)
                return
            except (SystemExit, OSError) as exc:
                print(f"{side.name}: warm-up failed ({exc}); attempt {attempt + 1}/{tries}")
        raise SystemExit(f"{side.name}: the warm-up failed")

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, range(len(members))))


def burst(side: Side, members: list[Member], k0: int, tokens: int, together: bool) -> dict:
    """Each member one new question, all at once or one after another: wall, replies."""
    jobs = [(m, k0 + i) for i, m in enumerate(members)]
    t0 = time.perf_counter()
    if together:
        with ThreadPoolExecutor(len(jobs)) as pool:
            done = list(pool.map(lambda j: ask(side, j[0], j[1], tokens), jobs))
    else:
        done = [ask(side, m, k, tokens) for m, k in jobs]
    wall = time.perf_counter() - t0
    return {"wall": wall, "tokens": sum(r["tokens"] for r in done),
            "ttft": [r["ttft"] for r in done]}


def soak(side: Side, members: list[Member], plan: Plan) -> dict:
    """``soak_clients`` members streaming back to back, each until ``soak_seconds`` or
    ``soak_streams`` streams: whole-stream seconds, tokens, failures."""
    lock, ok, failed = threading.Lock(), [], []
    t0 = time.perf_counter()
    until = time.monotonic() + plan.soak_seconds

    def client(c: int) -> None:
        for n in range(plan.soak_streams):
            if time.monotonic() >= until:
                return
            try:
                r = ask(side, members[c], 10000 + 1000 * c + n, plan.tokens)
                with lock:
                    ok.append((r["total"], r["tokens"]))
            except (SystemExit, OSError, ValueError) as exc:
                with lock:
                    failed.append(str(exc)[:160])

    threads = [threading.Thread(target=client, args=(c,)) for c in range(plan.soak_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"seconds": time.perf_counter() - t0, "latency": [s for s, _ in ok],
            "tokens": sum(n for _, n in ok), "failed": failed}


def conversation(side: Side, member: Member, plan: Plan, k0: int, pause: float = 0.0) -> dict:
    """Turns 1 .. ``turns`` of one conversation (the replies the server gives), the last one
    timed, sent back to back or ``pause`` seconds after the reply before it; the platform
    continues its conversation by id (``kvinject.conversation``)."""
    messages: list[dict] = []
    extra: dict = {}
    for t in range(1, plan.turns + 1):
        if t == plan.turns and pause:
            time.sleep(pause)
        messages.append({"role": "user", "content": question(k0 + t)})
        r = turn(side, member, messages, plan.tokens if t == plan.turns else TURN_TOKENS, extra)
        messages.append({"role": "assistant", "content": r["text"]})
        if side.platform and r["conversation"]:
            extra = {"conversation": r["conversation"]}
    return {k: r[k] for k in ("ttft", "rate", "prompt", "cached", "tokens")}


def run_all(side: Side, groups: dict[str, list[Member]], plan: Plan,
            memory: Callable[[], dict], restart: Callable[[], Side]) -> dict:
    """Every workload on ``side``, in the order both sides share; last, ``restart`` (the
    platform: its worker; the peer: its server, whose prefix cache is in-process) and the
    first token of tenant members seen before it."""
    simple, tenant = groups["simple"], groups["tenant"]
    warm_n = max(plan.bursts)
    t_start = time.monotonic()

    def done(phase: str) -> None:
        print(f"{side.name}: {phase} done after {time.monotonic() - t_start:.0f} s", flush=True)

    out: dict = {"memory_start": memory()}
    warm(side, simple[:warm_n], 0)
    done("warm-up")
    b1 = [ask(side, simple[0], 100 + r, plan.tokens) for r in range(plan.reps)]
    out["warm"] = [{k: r[k] for k in ("ttft", "rate", "tokens")} for r in b1]
    out["new_ttft"] = [ask(side, m, 200 + r, plan.tokens)["ttft"]
                       for r, m in enumerate(simple[warm_n:])]
    done("batch 1")
    for n in plan.bursts:
        out[f"burst{n}"] = {
            mode: burst(side, simple[:n], 1000 + 100 * n + 50 * together, plan.tokens, together)
            for mode, together in (("at_once", True), ("one_after", False))}
    done("bursts")
    out["soak"] = soak(side, simple, plan)
    done("soak")
    out["turn"] = [conversation(side, simple[c], plan, 3000 + 100 * c)
                   for c in range(plan.conversations)]
    out["turn_paused"] = [conversation(side, simple[c], plan, 3500 + 100 * c, plan.pause)
                          for c in range(plan.conversations)]
    done(f"turn {plan.turns}")
    out["replies"] = [ask(side, m, i, plan.tokens, OFF)["text"]
                      for i, m in enumerate(simple[:plan.compare])]
    out["tenant_memory_before"] = memory()
    t0 = time.perf_counter()
    warm(side, tenant[:plan.tenant_members], 20000)
    out["tenant_warm_s"] = time.perf_counter() - t0
    done(f"{plan.tenant_members} members of the tenant")
    out["tenant_memory_after"] = memory()
    out["tenant_new_ttft"] = [ask(side, m, 5000 + r, plan.tokens)["ttft"]
                              for r, m in enumerate(tenant[plan.tenant_members:])]
    n = min(max(plan.bursts), plan.tenant_members)  # members of the tenant seen before, at once
    out["tenant_burst"] = burst(side, tenant[:n], 6000, plan.tokens, True)
    t0 = time.perf_counter()
    side = restart()
    out["restart_s"] = time.perf_counter() - t0
    out["restart_ttft"] = [ask(side, m, 7000 + r, plan.tokens)["ttft"]
                           for r, m in enumerate(tenant[:plan.reps])]
    done("restart")
    return out
