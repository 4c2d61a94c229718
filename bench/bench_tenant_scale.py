"""One tenant at scale: shared instructions, chained segments, conversations in Redis.

A tenant with ~900-token instructions and MEMBERS members with short preferences; each
member holds a TURNS-turn conversation of ~100-token messages, interleaved across members
and alternating between two workers (two executors in this process: their own L1s and
batch engines, one embedded Redis), with a history budget small enough that every
conversation passes it. Real model (the prepared SmolLM2-135M-Instruct, or MODEL_PATH).
Reported as ratios measured in the same run:

* bytes in Redis (and each worker's L1) per kind against
  ``(I + sum of member tokens + sum of conversation tokens) x bytes/token``;
* a new member's first-reply TTFT with the tenant segment warm, against the same prompt
  with instructions + preference as the system message (full prefill);
* turns (after turn 1) served with >= 50 % of their prompt from cache, including turns
  past the budget and turns that land on the other worker;
* a turn after a worker restart (empty L1, chain from Redis) against a full prefill;
* after an instructions edit: the time to serve every member again, against a warm
  round before the edit and a cold round (nothing cached: the cost of the old design).

Scaled for a 2-core CPU: MEMBERS=16, TURNS=8 by default (the issue asks 64 x 12).
Run: ``.venv/bin/python bench/bench_tenant_scale.py [--write-docs]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlparse, urlunparse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from mdsection import machine, table, write_section  # noqa: E402

from injection import build_executor, load_adapter  # noqa: E402
from injection.base import ExecutionRequest, MemoryItem  # noqa: E402
from injection.engine.planning.planner import fit_messages  # noqa: E402
from injection.engine.steps import bytes_per_token  # noqa: E402
from injection.kvcache.conversation import link_digest  # noqa: E402
from injection.metrics import Metrics  # noqa: E402
from injection.prompting.template import compose_context  # noqa: E402

MEMBERS = int(os.environ.get("MEMBERS", "16"))
TURNS = int(os.environ.get("TURNS", "8"))
BUDGET = int(os.environ.get("HISTORY_BUDGET", "600"))
NEW_TOKENS = 8
TENANT, SECRET = "bench-tenant", "bench-tenant-scale-secret-0123456789"
REDIS_DB = int(os.environ.get("BENCH_REDIS_DB", "13"))  # flushed before and after
INSTRUCTIONS = " ".join([
    "You are the assistant of Green Basket, a chain of neighbourhood grocery shops.",
    "Answer questions about cooking, recipes, ingredients, storage and our shops.",
    "Be brief, friendly and practical; prefer seasonal vegetables and simple methods.",
    "Never recommend products we do not sell, never give medical advice, and say so",
    "politely when a question is outside cooking or shopping.",
] * 9)
PREFS = ["I am vegetarian.", "I live in Oslo.", "I cook for two kids.", "No spicy food.",
         "I love Italian food.", "I am allergic to nuts.", "I have little time.",
         "I bake on Sundays."]
TOPICS = ["a quick dinner with rice and beans", "storing fresh herbs for a week",
          "a soup for a cold evening", "using up leftover bread", "a picnic for a sunny day",
          "a birthday cake without an oven", "cooking lentils so they stay firm",
          "planning meals for a busy week", "a salad that keeps until lunch"]


SIXTY_WORDS = (
    "I am a vegetarian who cooks for my partner and our two young children most evenings. "
    "We live in a small flat in Oslo with a tiny kitchen, two hobs and an old oven. I prefer "
    "quick recipes under thirty minutes, seasonal vegetables, little waste, and no spicy "
    "food because the kids will not eat it at all.")
# memories as people write them (issue 32): one short, one 60-word text, one 4,000-character
# text, twenty short memories (past the member segment's 256 tokens: some are recalled)
SHAPES = {
    "one short memory": ["I am vegetarian."],
    "one 60-word memory": [SIXTY_WORDS],
    "one 4,000-character memory": [" ".join(
        f"Note {i}: I keep my pantry stocked with rice, lentils, oats and canned tomatoes, "
        f"and I shop at the market on Saturday mornings." for i in range(32))],
    "20 memories": [f"I like {x}, and I would rather hear about it than about most things." for x
                    in ("green tea in the afternoon", "long walks by the river", "old jazz records",
                        "Italian food from the north", "baking sourdough bread", "my vegetable garden",
                        "cycling to work", "board games with friends", "science fiction novels",
                        "film photography", "swimming in the sea", "playing chess online",
                        "hiking in the mountains", "throwing pottery", "morning yoga",
                        "history podcasts", "knitting scarves", "sushi on Fridays",
                        "small museums", "running on Sundays")],
}
SHAPE_TURNS, SHAPE_REPLY, SHAPE_BUDGET = int(os.environ.get("SHAPE_TURNS", "30")), 24, 1024


def model_path() -> Path:
    if os.environ.get("MODEL_PATH"):
        return Path(os.environ["MODEL_PATH"])
    from injection.model.gguf_import import prepare_model

    return prepare_model(ROOT / "var" / "models" / "smollm2-135m-instruct")


def message(member: int, turn: int) -> str:
    """~100 tokens: a question with some context."""
    topic = TOPICS[(member + turn) % len(TOPICS)]
    return (f"Turn {turn}. I would like some help with {topic}. I usually shop on Saturday "
            "mornings, I have a small kitchen with two hobs and an old oven, and I try to "
            "waste as little food as I can. What would you suggest I buy, how should I "
            "prepare it, and how long will it take? Please also tell me how to store what is "
            "left over, and whether any of it can be frozen for later in the week.")


class Tenant:
    def __init__(self, adapter, client, *, opening: bool | None = None,
                 contrast: float | None = None, link_budget: int = 0) -> None:
        self.adapter, self.client = adapter, client
        self.opening, self.contrast = opening, contrast  # --opening (None: auto), --contrast
        self.link_budget = link_budget  # --link-budget-mib: the tenant's links in Redis
        self.workers = [self.worker(), self.worker()]
        # a serving worker announces each link it replaces on the control channel and the
        # others drop their copies (gpu_worker.channels.linkcast); in process, directly
        for ex, other in (self.workers, self.workers[::-1]):
            ex.conversations.on_replaced = (
                lambda old, new, kv, o=other: o.conversations.drop_stale(
                    old, new, kv.num_tokens, link_digest(kv.token_ids)))
        self.history: dict[int, list[dict[str, str]]] = {}
        self.last: dict[int, object] = {}
        self.instructions = INSTRUCTIONS

    def worker(self):
        ex = build_executor(self.adapter, batch_max=2, redis_client=self.client,
                            signing_secret=SECRET, metrics=Metrics(),
                            conversation_prefill_opening=self.opening,
                            l2_link_tenant_bytes=self.link_budget)
        if ex.l2 is not None:
            ex.l2.async_writes = False  # the next turn may land on the other worker at once
        return ex

    def request(self, member: int, text: str, **kw) -> ExecutionRequest:
        msgs = [*self.history.get(member, []), {"role": "user", "content": text}]
        return ExecutionRequest(TENANT, f"m{member}", msgs, PREFS[member % len(PREFS)],
                                instructions=self.instructions, max_new_tokens=NEW_TOKENS,
                                history_token_budget=BUDGET, contrast=self.contrast, **kw)

    def turn(self, ex, member: int, text: str):
        req = self.request(member, text)
        res = ex.execute(req)
        self.history[member] = [*req.messages, {"role": "assistant", "content": res.text}]
        self.last[member] = res
        return res

    def full_prefill_ttft(self, member: int, text: str) -> float:
        """The same turn with instructions + preference in the prompt: nothing cached."""
        ex = self.workers[0]
        req = self.request(member, text)
        context = compose_context(req.instructions, req.preference_text)
        msgs = fit_messages(ex.adapter, req, context)
        out = self.adapter.generate(self.adapter.plain_prompt(context, msgs), None, 1.0, 1)
        return out.first_token_ms


def conversations(t: Tenant) -> dict:
    rows, switched = [], 0
    for turn in range(TURNS):
        for m in range(MEMBERS):
            w = (m + turn) % 2  # every turn lands on the other worker
            res = t.turn(t.workers[w], m, message(m, turn))
            rows.append((turn, res.cached_tokens / res.prompt_tokens, res.history_messages))
            switched += turn > 0
    later = [r for r in rows if r[0] > 0]
    past_budget = [r for r in later if r[2] < 2 * r[0]]
    return {"turns": len(rows), "later": len(later), "switched": switched,
            "served": sum(1 for r in later if r[1] >= 0.5) / len(later),
            "past_budget": len(past_budget),
            "served_past_budget": (sum(1 for r in past_budget if r[1] >= 0.5)
                                   / max(1, len(past_budget))),
            "mean_cached": statistics.mean(r[1] for r in later)}


def storage(t: Tenant) -> dict:
    a = t.adapter
    bpt = bytes_per_token(a)
    context0 = compose_context(t.instructions, PREFS[0])
    seg = a.split_prompt(context0, [{"role": "user", "content": "Hi"}]).segment
    split = a.split_segment(seg, context0, t.instructions)
    tenant_tokens, member_tokens = len(split.tenant_ids), 0
    for m in range(MEMBERS):
        ctx = compose_context(t.instructions, PREFS[m % len(PREFS)])
        seg = a.split_prompt(ctx, [{"role": "user", "content": "Hi"}]).segment
        member_tokens += len(a.split_segment(seg, ctx, t.instructions).member_ids)
    needed = (tenant_tokens + member_tokens) * bpt
    l2 = t.workers[0].l2.stats(scan=True, tenants=[TENANT])["per_tenant"][TENANT]
    counts = [ex.l2.stats() for ex in t.workers]
    budget = t.link_budget
    kinds = [ex.stats()["kinds"] for ex in t.workers]
    # each conversation's newest link: its last turn after the injected turn, with the
    # reply (its last token was never fed back, so it has no K/V)
    conv_tokens = sum(r.prompt_tokens - r.kv_tokens + r.completion_tokens - 1
                      for r in (t.last[m] for m in range(MEMBERS)))
    ideal = needed + conv_tokens * bpt
    old = (MEMBERS * tenant_tokens + member_tokens) * bpt  # one private I + P per member
    return {"bpt": bpt, "I": tenant_tokens, "P": member_tokens, "C": conv_tokens,
            "redis_bytes": l2["bytes"], "redis_entries": l2["entries"], "ideal": ideal,
            "link_bytes": l2["link_bytes"], "link_entries": l2["link_entries"],
            "refused": sum(c["refused_writes"] for c in counts),
            "link_evictions": sum(c["link_evictions"] for c in counts), "budget": budget,
            "old_segments": old, "kinds": kinds}


def settle(t: Tenant) -> None:
    """Wait for the workers' background openings: in-process workers share this CPU, where
    real ones each have their own device."""
    for ex in t.workers:
        ex.turns.drain()


def new_member_ttft(t: Tenant) -> tuple[float, float]:
    warm, full = [], []
    for i in range(3):
        settle(t)
        m = MEMBERS + i
        res = t.turn(t.workers[0], m, message(m, 0))
        warm.append(res.ttft_ms)
        full.append(t.full_prefill_ttft(m + 100, message(m, 0)))
    return statistics.median(warm), statistics.median(full)


def restart_ttft(t: Tenant) -> tuple[float, float, int]:
    fresh = t.worker()  # a restarted worker: empty L1, the same Redis
    t.workers.append(fresh)
    m = 1
    text = message(m, TURNS)
    settle(t)
    full = t.full_prefill_ttft(m, text)
    res = t.turn(fresh, m, text)
    return res.ttft_ms, full, res.cached_tokens * 100 // res.prompt_tokens


def memory_shapes(t: Tenant) -> dict[str, tuple[float, float]]:
    """Per memory shape, one member's SHAPE_TURNS-turn conversation alternating workers,
    24-token replies, the platform's default history budget: (share of turns 2.. with
    >= 50 % of the prompt cached, mean cached share)."""
    out = {}
    for n, (name, texts) in enumerate(SHAPES.items()):
        items = tuple(MemoryItem(str(i), x) for i, x in enumerate(texts))
        history, shares = [], []
        for turn in range(SHAPE_TURNS):
            msgs = [*history, {"role": "user", "content": f"Turn {turn}: what could I cook "
                               f"with {TOPICS[turn % len(TOPICS)]}?"}]
            req = ExecutionRequest(TENANT, f"shape{n}", msgs, texts[0], memories=items,
                                   instructions=t.instructions, max_new_tokens=SHAPE_REPLY,
                                   history_token_budget=SHAPE_BUDGET, contrast=t.contrast)
            settle(t)
            res = t.workers[turn % 2].execute(req)
            shares.append(res.cached_tokens / res.prompt_tokens)
            history = [*msgs, {"role": "assistant", "content": res.text}]
        later = shares[1:]
        out[name] = (sum(x >= 0.5 for x in later) / len(later), statistics.mean(later))
    return out


def one_round(t: Tenant, turn: int) -> float:
    t0 = time.perf_counter()
    for m in range(MEMBERS):
        t.turn(t.workers[(m + turn) % 2], m, message(m, turn))
    return time.perf_counter() - t0


def plain_round(t: Tenant, turn: int) -> float:
    """The same round with instructions + preference + history in the prompt, nothing
    cached: what every member pays when nothing is shared (the old design after an edit)."""
    ex, spent = t.workers[0], 0.0
    for m in range(MEMBERS):
        req = t.request(m, message(m, turn))
        context = compose_context(req.instructions, req.preference_text)
        prompt = t.adapter.plain_prompt(context, fit_messages(ex.adapter, req, context))
        t0 = time.perf_counter()
        t.adapter.generate(prompt, None, 1.0, NEW_TOKENS)
        spent += time.perf_counter() - t0
    return spent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write-docs", action="store_true", help="update docs/BENCHMARKS.md")
    ap.add_argument("--opening", choices=("auto", "on", "off"), default="auto",
                    help="the next turn's opening after a reply (engine/turns.py)")
    ap.add_argument("--contrast", type=float, default=None,
                    help="contrastive guidance strength per request (default: the model's)")
    ap.add_argument("--shapes-only", action="store_true",
                    help="only the memory shapes' conversations (their table)")
    ap.add_argument("--link-budget-mib", type=int, default=512,
                    help="the tenant's conversation links in Redis (KV_L2_LINK_TENANT_BYTES)")
    args = ap.parse_args()
    from config import embedded

    url = urlparse(embedded.cache_redis_url())  # the K/V cache's own Redis
    client = redis.Redis.from_url(urlunparse(url._replace(path=f"/{REDIS_DB}")),
                                  socket_timeout=30)
    client.flushdb()
    adapter = load_adapter(str(model_path()), device=os.environ.get("DEVICE") or None)
    t = Tenant(adapter, client, contrast=args.contrast,
               opening=None if args.opening == "auto" else args.opening == "on",
               link_budget=args.link_budget_mib * 1024**2)
    started = time.perf_counter()
    if args.shapes_only:
        print(shapes_table(memory_shapes(t)))
        return
    conv = conversations(t)
    store = storage(t)
    ttft_new, ttft_full = new_member_ttft(t)
    ttft_restart, ttft_restart_full, restart_pct = restart_ttft(t)
    shapes = memory_shapes(t)
    warm_round = one_round(t, TURNS + 1)
    t.instructions = INSTRUCTIONS + " Mention our weekly offers when it helps."
    edit_round = one_round(t, TURNS + 2)
    cold_round = plain_round(t, TURNS + 2)
    total = time.perf_counter() - started
    body = render(conv, store, ttft_new, ttft_full, ttft_restart, ttft_restart_full,
                  restart_pct, warm_round, edit_round, cold_round, total, shapes)
    print(body)
    if args.write_docs:
        write_section("tenant-scale", body)
    for ex in t.workers:
        ex.close()
    client.flushdb()


def render(conv, st, ttft_new, ttft_full, ttft_r, ttft_rf, restart_pct, warm, edit, cold,
           total, shapes) -> str:
    mib = 1024 ** 2
    rows = [
        ["Redis bytes / (I + ΣP + ΣC) x bytes/token (goal <= 1.1)",
         f"{st['redis_bytes'] / st['ideal']:.2f}x",
         f"{st['redis_bytes'] / mib:.1f} MiB in {st['redis_entries']} entries; I={st['I']}, "
         f"ΣP={st['P']}, ΣC={st['C']} tokens, {st['bpt']} B/token"],
        ["  its conversation links (the tenant's link ledger) / ΣC x bytes/token",
         f"{st['link_bytes'] / max(1, st['C'] * st['bpt']):.2f}x",
         f"{st['link_bytes'] / mib:.1f} MiB in {st['link_entries']} links; budget "
         f"{st['budget'] / mib:.0f} MiB; {st['link_evictions']} evicted for room, "
         f"{st['refused']} writes refused"],
        ["segment bytes: old design (a private I + P per member) / now (I once + ΣP)",
         f"{st['old_segments'] / ((st['I'] + st['P']) * st['bpt']):.1f}x",
         f"{st['old_segments'] / mib:.1f} MiB vs {(st['I'] + st['P']) * st['bpt'] / mib:.1f} MiB"],
        ["new member first-reply TTFT, tenant segment warm / full prefill (goal <= 0.3)",
         f"{ttft_new / ttft_full:.2f}x", f"{ttft_new:.0f} ms vs {ttft_full:.0f} ms (median of 3)"],
        ["turns after turn 1 with >= 50 % of the prompt cached (goal >= 90 %)",
         f"{conv['served']:.0%}", f"{conv['later']} turns, every one on the other worker; "
         f"mean cached share {conv['mean_cached']:.0%}"],
        ["  of them past the history budget", f"{conv['served_past_budget']:.0%}",
         f"{conv['past_budget']} turns"],
        ["turn after a worker restart (chain from Redis) TTFT / full prefill (goal <= 0.4)",
         f"{ttft_r / ttft_rf:.2f}x", f"{ttft_r:.0f} ms vs {ttft_rf:.0f} ms; "
         f"{restart_pct} % of its prompt from cache"],
        ["serve every member after an instructions edit / a warm round",
         f"{edit / warm:.2f}x", f"{edit:.1f} s vs {warm:.1f} s"],
        ["serve every member after an instructions edit / a cold round (old design)",
         f"{edit / cold:.2f}x", f"{edit:.1f} s vs {cold:.1f} s"],
    ]
    kinds = st["kinds"]
    l1 = [[f"worker {i}", k, row["entries"], f"{row['bytes'] / mib:.1f}"]
          for i, ks in enumerate(kinds) for k, row in ks.items()]
    return "\n".join([
        "## Tenant scale: shared instructions, chained segments, conversations in Redis",
        "",
        f"`.venv/bin/python bench/bench_tenant_scale.py --write-docs` ({machine()}; "
        f"SmolLM2-135M-Instruct fp32; {MEMBERS} members x {TURNS} turns, ~100-token messages, "
        f"history budget {BUDGET} tokens, two workers sharing the embedded cache Redis; "
        f"scaled down from the issue's 64 x 12 to fit a 2-core CPU; {total:.0f} s).",
        "",
        table(["measure", "ratio", "detail"], rows),
        "",
        "L1 per kind after the conversations (each worker holds its own copy of the tenant "
        "segment; conversation links have their own L1). A link replaced on one worker "
        "is dropped from the other's L1 too (the control channel's conv_link; here wired "
        "directly between the two in-process workers):",
        "",
        table(["worker", "kind", "entries", "MiB"], l1),
        "",
        shapes_table(shapes),
    ])


def shapes_table(shapes: dict[str, tuple[float, float]]) -> str:
    return "\n".join([
        f"Memories as people write them: one member per shape, a {SHAPE_TURNS}-turn "
        f"conversation alternating the two workers, {SHAPE_REPLY}-token replies, the "
        f"platform's {SHAPE_BUDGET}-token history budget (goal: >= 80 % of turns 2-"
        f"{SHAPE_TURNS} with >= 50 % of the prompt cached; the 20 memories, ~18 tokens each, "
        "pass the member segment's 256 tokens, so the rest are recalled per message):",
        "",
        table(["memory shape", f"turns 2-{SHAPE_TURNS} >= 50 % cached", "mean cached share"],
              [[name, f"{a:.0%}", f"{b:.0%}"] for name, (a, b) in shapes.items()]),
    ])


if __name__ == "__main__":
    main()
