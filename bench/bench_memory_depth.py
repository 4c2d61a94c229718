"""Memory depth: is the member's memory still followed deep into a conversation?

Each case of bench/memory_cases.py (a memory, a question, an objective check; a tuning set
and a held-out set) is asked after 0, 4, 8 or 16 unrelated exchanges (fixed, pre-written
assistant replies: depth costs no generation), greedily, through the real engine
(``InjectionExecutor`` with an in-process L1 and the worker's batch engine), under every
condition, in one run:

* ``no memory``: the conversation alone;
* ``system message``: the memory as the client's system message at the start (baseline);
* ``platform``: the memory stored and injected (the member segment), each mechanism off;
* ``+ reminder``: memories re-stated before each user turn past a depth
  (injection/prompting/reminder.py);
* ``+ contrast S``: contrastive guidance (``ExecutionRequest.contrast``: the reply's
  distribution against the same conversation without the memories; on turns without a
  reminder; listed with ``--contrast``);
* ``20 memories``: the case's memory among 19 unrelated ones (``ExecutionRequest.memories``).

Adherence = replies passing their check *and* not reciting the memory
(``memory_cases.recites``: a reply that restates the memory and adds next to nothing; a
``fact`` case, whose question asks for the fact, is exempt) and not a non-answer
(``memory_cases.evades``: declining or apologising for a mistake nobody made, "as an AI
..."). "recites" / "evades": the share of replies failed for each. Fluency: empty replies and replies repeating a 4-gram of
words. Time to first token (one ``max_new_tokens=1`` request, segments already
in L1, median over cases, interleaved): 20 vs 1 memory, reminder on vs off, contrast on
vs off, at the deepest depth measured.

Run: ``.venv/bin/python bench/bench_memory_depth.py [--write-docs]``; subsets with
``--cases N --depths 0,8 --sets tuning --only ...``. ``--partial FILE`` keeps the replies
so far and resumes from them (the scoring is recomputed from the stored replies, so a
finished file re-scores without generating).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
from mdsection import machine, table, write_section  # noqa: E402
from memory_cases import (  # noqa: E402
    HELD_OUT,
    TUNING,
    adheres,
    conversation,
    evades,
    memory_list,
    recitation,
)

from injection import InjectionExecutor, TenantLRU, load_adapter  # noqa: E402
from injection.base import ExecutionRequest, MemoryItem  # noqa: E402
from injection.engine.batch import BatchEngine  # noqa: E402
from injection.metrics import Metrics  # noqa: E402

MAX_NEW_TOKENS = int(os.environ.get("MAX_NEW_TOKENS", "40"))
TENANT = "bench-memory-depth"
FIELDS = {f.name for f in dataclasses.fields(ExecutionRequest)}


def model_path() -> Path:
    if os.environ.get("MODEL_PATH"):
        return Path(os.environ["MODEL_PATH"])
    from injection.model.gguf_import import prepare_model

    return prepare_model(ROOT / "var" / "models" / "smollm2-135m-instruct")


def conditions(reminder: bool, many: str, contrasts: tuple[float, ...] = ()) -> dict[str, dict]:
    """Name -> options. ``many``: the mechanisms of the "20 memories" condition."""
    out: dict[str, dict] = {
        "no memory": {"mode": "none"},
        "system message": {"mode": "system"},
        "platform": {"mode": "platform", "reminder": False, "contrast": 0.0},
    }
    if reminder:
        out["platform + reminder"] = {"mode": "platform", "reminder": True, "contrast": 0.0}
    for c in contrasts:
        out[f"platform + contrast {c:g}"] = {"mode": "platform", "reminder": False,
                                             "contrast": c}
        if reminder:
            out[f"platform + reminder + contrast {c:g}"] = {
                "mode": "platform", "reminder": True, "contrast": c}
    if many:
        rem = "reminder" in many
        con = next((float(p.split("=")[1]) for p in many.split(",") if p.startswith("c=")), 0.0)
        label = "platform, 20 memories" + (" + reminder" if rem else "") + (
            f" + contrast {con:g}" if con else "")
        out[label] = {"mode": "platform", "n": 20, "reminder": rem, "contrast": con}
    return out


class Runner:
    def __init__(self, adapter, batch: int, segment_tokens: int = 0) -> None:
        self.adapter = adapter
        from injection.memory.recall import RecallOptions

        memory = RecallOptions(segment_tokens=segment_tokens) if segment_tokens else None
        self.ex = InjectionExecutor(adapter, l1=TenantLRU(max_bytes=2 * 1024**3), l2=None,
                                    alpha_cap=1.0, min_alpha=0.0, metrics=Metrics(),
                                    engine=BatchEngine(adapter, max_batch=batch),
                                    conversation_max_bytes=512 * 1024**2, memory=memory)

    def request(self, set_name: str, i: int, case, depth: int, cond: dict,
                n_tokens: int, **kw) -> ExecutionRequest:
        msgs = kw.pop("messages", None) or conversation(case, depth)
        kw = {"max_new_tokens": n_tokens, "reuse_conversation": False, **kw}
        mode = cond["mode"]
        if mode == "system":
            kw.update(instructions=case.memory, injection_enabled=False)
        elif mode == "platform":
            texts = memory_list(case, i, cond.get("n", 1))
            kw["preference_text"] = "\n".join(texts)
            if len(texts) > 1:  # one memory: preference_text, exactly as today
                kw["memories"] = tuple(MemoryItem(f"m{j}", t) for j, t in enumerate(texts))
            for name in ("reminder", "contrast"):
                if name in FIELDS:
                    kw[name] = cond.get(name)
                elif cond.get(name):
                    raise SystemExit(f"ExecutionRequest has no {name!r} field yet")
        # one member per case and set; the segment key includes its text and model
        return ExecutionRequest(TENANT, f"{set_name}-{i}", msgs, **kw)

    def run(self, req: ExecutionRequest) -> str:
        return self.ex.execute(req).text


def repeats(reply: str, n: int = 4) -> bool:
    """The reply repeats a word n-gram (degenerate loops)."""
    words = reply.lower().split()
    grams = [tuple(words[k:k + n]) for k in range(len(words) - n + 1)]
    return len(grams) != len(set(grams))


def score(s: str, i: int, case, d: int, name: str, reply: str) -> tuple:
    """(set, case index, depth, condition, pass, reply, recited, check alone)."""
    return (s, i, d, name, adheres(case, reply), reply, recitation(case, reply),
            bool(case.check(reply)))


def evaluate(runner: Runner, sets, depths, conds, workers: int,
             partial: str = "") -> list[tuple]:
    """Every (set, case, depth, condition) reply, generated ``workers`` at a time; the
    replies already in ``partial`` (same set, case, depth and condition) are reused."""
    # depth-major: an interrupted run (see --partial) has whole depths
    jobs = [(s, i, c, d, name) for d in depths for s, cases in sets
            for i, c in enumerate(cases) for name in conds]
    done: dict[tuple, str] = {}
    if partial and Path(partial).exists():
        done = {(r[0], r[1], r[2], r[3]): r[5] for r in json.loads(Path(partial).read_text())}
    todo = [j for j in jobs if (j[0], j[1], j[3], j[4]) not in done]
    print(f"  {len(jobs) - len(todo)} replies from {partial}, {len(todo)} to generate"
          if done else f"  {len(todo)} to generate", flush=True)
    t0 = time.perf_counter()

    def one(job):
        s, i, c, d, name = job
        return (s, i, d, name), runner.run(runner.request(s, i, c, d, conds[name],
                                                          MAX_NEW_TOKENS))

    def save():
        if partial:
            Path(partial).write_text(json.dumps(
                [[*k, None, v] for k, v in done.items()]))  # [set, i, depth, cond, -, reply]

    with ThreadPoolExecutor(max_workers=workers) as pool:
        for k, (key, reply) in enumerate(pool.map(one, todo), 1):
            done[key] = reply
            if k % 25 == 0 or k == len(todo):
                print(f"  {k}/{len(todo)} replies, {time.perf_counter() - t0:.0f} s", flush=True)
                save()
    return [score(s, i, c, d, name, done[(s, i, d, name)]) for s, i, c, d, name in jobs]


def forget(runner: Runner, text: str) -> None:
    """Drop the new message's embedding (its turn computes it once in a live chat; the
    warm-up request above must not make it free)."""
    emb = runner.ex.memories._embedder
    if emb is None:
        return
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    with emb._lock:
        for key in [k for k in emb._cache if k[2] == digest]:
            del emb._cache[key]


def ttft(runner: Runner, cases, depth: int, pairs: list[tuple[str, dict]], reps: int) -> dict:
    """Median TTFT per condition and mode: max_new_tokens=1, segments in L1, interleaved.

    ``cold``: one request with the whole history (prefilled); ``warm``: the conversation's
    link is cached up to the previous user turn (the previous turn ran, its reply is the
    pre-written one): the last assistant reply, the new turn (and its reminder) are
    prefilled; ``live``: the previous turn generated its reply (``LIVE_REPLY_TOKENS``),
    which the client sends back, as in a live chat: only the new turn (and its reminder)
    is prefilled."""
    times: dict[tuple[str, str], list[float]] = {}
    for i, case in enumerate(cases):
        conv = conversation(case, depth)
        for _name, cond in pairs:
            settled(runner, runner.request("ttft", i, case, depth, cond, 1))  # segments into L1
        for rep in range(reps):
            for name, cond in pairs:
                req = runner.request("ttft", i, case, depth, cond, 1)
                forget(runner, conv[-1]["content"])
                times.setdefault((name, "cold"), []).append(settled(runner, req).ttft_ms)
                if depth < 2:  # a first turn (one-shot) is not kept: nothing to continue
                    continue
                cid = f"c{i}-{rep}-{name}"
                settled(runner, runner.request("ttft", i, case, depth, cond, 1,
                                               messages=conv[:-2], reuse_conversation=True,
                                               conversation_id=cid))
                req = runner.request("ttft", i, case, depth, cond, 1, reuse_conversation=True,
                                     conversation_id=cid)
                forget(runner, conv[-1]["content"])
                res = settled(runner, req)
                assert res.reused_tokens > 0, "the warm turn did not continue its conversation"
                times.setdefault((name, "warm"), []).append(res.ttft_ms)
                times.setdefault((name, "live"), []).append(live(runner, i, case, depth, cond,
                                                                 f"{cid}-live", conv))
    return {k: statistics.median(v) for k, v in times.items()}


LIVE_REPLY_TOKENS = 24


def settled(runner: Runner, req: ExecutionRequest):
    """``execute``, then wait for its background work (the next turn's opening,
    engine/turns.py): the member reads the reply, and no timed request runs beside it."""
    res = runner.ex.execute(req)
    runner.ex.turns.drain()
    return res


def live(runner: Runner, i: int, case, depth: int, cond: dict, cid: str, conv) -> float:
    """TTFT of the last turn after a previous turn that generated the reply it is sent."""
    prev = settled(runner, runner.request("ttft", i, case, depth, cond, LIVE_REPLY_TOKENS,
                                          messages=conv[:-2], reuse_conversation=True,
                                          conversation_id=cid))
    msgs = [*conv[:-2], {"role": "assistant", "content": prev.text}, conv[-1]]
    req = runner.request("ttft", i, case, depth, cond, 1, messages=msgs,
                         reuse_conversation=True, conversation_id=cid)
    forget(runner, conv[-1]["content"])
    res = settled(runner, req)
    assert res.reused_tokens > prev.prompt_tokens - prev.kv_tokens, "the reply was not reused"
    return res.ttft_ms


def adherence_table(results, sets, depths, conds) -> str:
    header = ["condition"] + [f"{s} d={d}" for s, _ in sets for d in depths] + [
        "empty", "repeats", "recites", "evades"]
    rows = []
    for name in conds:
        cells = []
        for s, cases in sets:
            for d in depths:
                ok = sum(r[4] for r in results if r[0] == s and r[2] == d and r[3] == name)
                cells.append(f"{ok}/{len(cases)} ({100 * ok / len(cases):.0f} %)")
        mine = [r for r in results if r[3] == name]
        empty = sum(not r[5].strip() for r in mine)
        rep = sum(repeats(r[5]) for r in mine)
        recited, evaded = sum(r[6] for r in mine), sum(evades(r[5]) for r in mine)
        rows.append([name, *cells, f"{empty}/{len(mine)}", f"{100 * rep / len(mine):.0f} %",
                     f"{100 * recited / len(mine):.0f} %", f"{100 * evaded / len(mine):.0f} %"])
    return table(header, rows)


def check_only_table(results, sets, depths, conds) -> str:
    """The same replies scored by the case's check alone (recitation and non-answers
    pass), for comparison with tables measured before those were failed."""
    header = ["condition (check alone)"] + [f"{s} d={d}" for s, _ in sets for d in depths]
    rows = []
    for name in conds:
        cells = []
        for s, cases in sets:
            for d in depths:
                ok = sum(r[7] for r in results if r[0] == s and r[2] == d and r[3] == name)
                cells.append(f"{ok}/{len(cases)}")
        rows.append([name, *cells])
    return table(header, rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write-docs", action="store_true", help="update docs/BENCHMARKS.md")
    ap.add_argument("--show", action="store_true", help="print every reply")
    ap.add_argument("--cases", type=int, default=0, help="first N cases of each set (0: all)")
    ap.add_argument("--sets", default="tuning,held-out")
    ap.add_argument("--depths", default="0,4,8,16")
    ap.add_argument("--contrast", default="", help="contrast strengths to run, e.g. 0.5,1")
    ap.add_argument("--no-reminder", action="store_true", help="leave the reminder out")
    ap.add_argument("--many", default="reminder",
                    help="mechanisms of the 20-memories condition: '', 'reminder', "
                         "'reminder,c=1', ... ('none': leave the condition out)")
    ap.add_argument("--only", default="", help="condition names to run, separated by ;")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--partial", default="", help="JSON file of the replies so far")
    ap.add_argument("--segment-tokens", type=int, default=0,
                    help="the member segment's token budget (0: the engine's default)")
    ap.add_argument("--ttft-reps", type=int, default=3)
    ap.add_argument("--ttft-cases", type=int, default=8)
    ap.add_argument("--ttft-depth", type=int, default=None, help="(default: the deepest)")
    ap.add_argument("--reminder-role", default="", help="override: system | user")
    ap.add_argument("--reminder-prefix", default=None, help="override the reminder's prefix")
    ap.add_argument("--many-guided-before", type=int, default=None,
                    help="override guidance.plan.MANY_GUIDED_BEFORE (several memories: turns "
                         "with fewer exchanges before them are guided; 0: never)")
    ap.add_argument("--reminder-after", type=int, default=None, help="override: exchanges")
    ap.add_argument("--reminder-many-after", type=int, default=None,
                    help="override reminder.MANY_AFTER (members with several memories)")
    ap.add_argument("--reminder-top", type=int, default=None,
                    help="override reminder.RELEVANT_TOP (0: the first memories, not the "
                         "ones relevant to the message)")
    ap.add_argument("--embed-layer", type=int, default=None,
                    help="override: the decoder layer whose output the recall and reminder "
                         "embedding pools (memory/embed.py)")
    ap.add_argument("--opening", choices=("auto", "on", "off"), default="auto",
                    help="prefill the next turn's opening after a reply (engine/turns.py; "
                         "auto: where the model runs on a CPU)")
    args = ap.parse_args()
    torch.manual_seed(0)
    from injection.prompting import reminder

    reminder.ROLE = args.reminder_role or reminder.ROLE
    reminder.PREFIX = reminder.PREFIX if args.reminder_prefix is None else args.reminder_prefix
    if args.many_guided_before is not None:
        from injection.engine.guidance import plan as guide_plan

        guide_plan.MANY_GUIDED_BEFORE = args.many_guided_before
    if args.reminder_after is not None:
        reminder.DEFAULT_AFTER = args.reminder_after
    if args.reminder_top is not None:
        reminder.RELEVANT_TOP = args.reminder_top
    if args.reminder_many_after is not None:
        reminder.MANY_AFTER = args.reminder_many_after
    path = model_path()
    adapter = load_adapter(path, device=os.environ.get("MODEL_DEVICE") or None)
    conds = conditions(not args.no_reminder, "" if args.many == "none" else
                       (args.many or "plain"),
                       tuple(float(x) for x in args.contrast.split(",") if x))
    if args.only:
        keep = [x.strip() for x in args.only.split(";")]
        conds = {k: v for k, v in conds.items() if k in keep}
    all_sets = {"tuning": TUNING, "held-out": HELD_OUT}
    sets = [(s, all_sets[s][: args.cases or None]) for s in args.sets.split(",")]
    depths = [int(d) for d in args.depths.split(",")]
    runner = Runner(adapter, args.workers, args.segment_tokens)
    if args.opening != "auto":
        runner.ex.turns.prefill_opening = args.opening == "on"
    if args.embed_layer is not None:
        runner.ex.memories.embedder.layer = args.embed_layer
    n = sum(len(c) for _, c in sets) * len(depths) * len(conds)
    print(f"{n} replies ({len(conds)} conditions x depths {depths}), greedy, "
          f"{MAX_NEW_TOKENS} tokens", flush=True)
    t0 = time.perf_counter()
    results = evaluate(runner, sets, depths, conds, args.workers, args.partial)
    gen_s = time.perf_counter() - t0
    if args.show:
        for s, i, d, name, ok, reply, recited, _ in results:
            verdict = "PASS" if ok else "RECITES" if recited else "fail"
            print(f"[{s} {i} d={d}] {name:36s} {verdict} {reply!r}")
    body = [adherence_table(results, sets, depths, conds), "",
            check_only_table(results, sets, depths, conds)]
    body += ttft_section(runner, conds, sets, depths, args)
    header = "  \n".join([
        f"Command: `.venv/bin/python bench/bench_memory_depth.py {' '.join(sys.argv[1:])}` "
        f"(bench/memory_cases.py: {len(TUNING)} tuning + {len(HELD_OUT)} held-out cases, "
        f"greedy, max_new_tokens={MAX_NEW_TOKENS}, {len(results)} replies in {gen_s:.0f} s)",
        f"Machine: {machine()}, torch threads {torch.get_num_threads()}; "
        "loaded by other work at the same time (speed figures are ratios within this run)",
        f"Model: {path.name} ({adapter.model.config.model_type}, {adapter.device}, "
        f"{str(adapter.dtype)[6:]})",
    ])
    text = "\n".join(["## Memory depth: adherence per condition and depth", "", header, "",
                      *body])
    print(text)
    if args.write_docs:
        write_section("memory-depth", text)


def ttft_section(runner: Runner, conds, sets, depths, args) -> list[str]:
    """TTFT ratios of the mechanisms against the plain platform, same run."""
    if "platform" not in conds or args.ttft_reps <= 0:
        return []
    deep = max(depths) if args.ttft_depth is None else args.ttft_depth
    base = {"mode": "platform", "reminder": False, "contrast": 0.0}
    pairs = [("platform", base)]
    if "reminder" in FIELDS:
        pairs.append(("+ reminder", {**base, "reminder": True}))
    if any("contrast" in k for k in conds):
        strengths = [v["contrast"] for k, v in conds.items() if "contrast" in k and v["contrast"]]
        c = 1.0 if 1.0 in strengths else strengths[0]  # the cost does not depend on it
        pairs.append((f"+ contrast {c:g}", {**base, "contrast": c}))
        pairs.append((f"+ reminder + contrast {c:g}", {**base, "reminder": True, "contrast": c}))
        pairs.append((f"20 memories + reminder + contrast {c:g}",
                      {**base, "n": 20, "reminder": True, "contrast": c}))
    pairs.append(("20 memories", {**base, "n": 20}))
    if "reminder" in FIELDS:  # its reminders pick the memories relevant to each message
        pairs.append(("20 memories + reminder", {**base, "n": 20, "reminder": True}))
    cases = TUNING[: args.ttft_cases]
    med = ttft(runner, cases, deep, pairs, args.ttft_reps)
    rows = []
    for name, _ in pairs:
        row = [name]
        for mode in ("live", "warm", "cold"):
            ms = med.get((name, mode))
            row += ([f"{ms:.1f}", f"{ms / med[('platform', mode)]:.2f}x"] if ms is not None
                    else ["-", "-"])
        rows.append(row)
    return ["", f"Time to first token at depth {deep}, segments in L1 (median of {len(cases)} "
            f"cases x {args.ttft_reps}, one max_new_tokens=1 request, interleaved). Live: "
            f"the previous turn generated its reply ({LIVE_REPLY_TOKENS} tokens at most), "
            "which comes back with the new message, so only the new turn is prefilled; "
            "warm: the conversation's K/V is cached up to the previous user turn and the "
            "pre-written reply is prefilled with the new turn; cold: the whole history "
            "arrives in one request and is prefilled:",
            "", table(["condition", "live ms", "live vs platform", "warm ms",
                       "warm vs platform", "cold ms", "cold vs platform"], rows)]


if __name__ == "__main__":
    main()
