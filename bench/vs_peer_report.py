"""bench/bench_vs_peer.py's report: the figures of both sides, their ratios, and the replies
compared token for token."""

from __future__ import annotations

import os
from pathlib import Path

from mdsection import machine, table
from v1stream import first_difference, median, percentile


def compare_replies(results: dict, model: Path) -> dict | None:
    """The platform's replies with its mechanisms off against the peer's, re-encoded with the
    model's tokenizer: how many are equal, and where the others first differ."""
    if "peer" not in results:
        return None
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    return diff_replies(results["platform"]["replies"], results["peer"]["replies"],
                        lambda s: tok.encode(s, add_special_tokens=False))


def diff_replies(ours: list[str], theirs: list[str], encode) -> dict:
    """``{"equal", "of", "mismatches": [{member, position, ours, theirs}]}``: ``position``
    is the first differing token (of ``encode``), the texts shown from 20 characters
    before they part."""
    out: dict = {"equal": 0, "of": len(ours), "mismatches": []}
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        ta, tb = encode(a), encode(b)
        pos = first_difference(ta, tb)
        if pos is None:
            out["equal"] += 1
            continue
        cut = max(0, len(os.path.commonprefix([a, b])) - 20)
        out["mismatches"].append({"member": i, "position": pos, "ours": a[cut:cut + 80],
                                  "theirs": b[cut:cut + 80]})
    return out


def side_figures(r: dict, plan) -> dict:
    """One side's headline figures (seconds as ms, rates as tok/s)."""
    f = {"warm_ttft": median(x["ttft"] for x in r["warm"]) * 1000,
         "decode": median(x["rate"] for x in r["warm"]),
         "new_ttft": median(r["new_ttft"]) * 1000,
         "turn_ttft": median(x["ttft"] for x in r["turn"]) * 1000,
         "turn_cached": median(x["cached"] for x in r["turn"]),
         "turn_prompt": median(x["prompt"] for x in r["turn"]),
         "turn_paused_ttft": median(x["ttft"] for x in r.get("turn_paused") or [{"ttft": 0.0}])
         * 1000,
         "tenant_ttft": median(r["tenant_new_ttft"]) * 1000,
         "restart_ttft": median(r.get("restart_ttft") or [0.0]) * 1000}
    if tb := r.get("tenant_burst"):
        f["tenant_rate"] = tb["tokens"] / tb["wall"]
        f["tenant_max_ttft"] = max(tb["ttft"]) * 1000
    for n in plan.bursts:
        b = r[f"burst{n}"]
        f[f"one_after{n}"] = b["one_after"]["wall"]
        f[f"at_once{n}"] = b["at_once"]["wall"]
        f[f"rate{n}"] = b["at_once"]["tokens"] / b["at_once"]["wall"]
        f[f"max_ttft{n}"] = max(b["at_once"]["ttft"]) * 1000
    s = r["soak"]
    f.update(soak_streams=len(s["latency"]), soak_failed=len(s["failed"]),
             soak_p50=percentile(s["latency"], 50), soak_p99=percentile(s["latency"], 99),
             soak_rate=s["tokens"] / s["seconds"] if s["seconds"] else 0.0)
    mib = 2 ** 20
    before, after = r["tenant_memory_before"], r["tenant_memory_after"]
    f["rss"] = after["processes"] / mib
    f["rss_growth"] = (after["processes"] - before["processes"]) / mib
    f["redis"] = after.get("redis", 0) / mib
    return f


# (label, key, format, better: "low" = a time, "high" = a rate, "" = no ratio)
ROWS = [("warm member, batch-1 first token (ms)", "warm_ttft", "{:.0f}", "low"),
        ("new member, batch-1 first token (ms)", "new_ttft", "{:.0f}", "low"),
        ("batch-1 streamed decode (tok/s)", "decode", "{:.1f}", "high")]


def burst_rows(plan) -> list[tuple]:
    rows = []
    for n in plan.bursts:
        rows += [(f"{n} members one after another (s)", f"one_after{n}", "{:.1f}", "low"),
                 (f"{n} members at once (s)", f"at_once{n}", "{:.1f}", "low"),
                 (f"{n} members at once (tok/s)", f"rate{n}", "{:.1f}", "high"),
                 (f"{n} at once, slowest first token (ms)", f"max_ttft{n}", "{:.0f}", "low")]
    return rows


def render(results: dict, plan, args, model_name: str, seconds: float) -> str:
    ours = side_figures(results["platform"], plan)
    theirs = side_figures(results["peer"], plan) if "peer" in results else None
    rows = [*ROWS, *burst_rows(plan),
            (f"{plan.soak_clients}-client soak: streams (failed)", "soak_streams", "{:.0f}", ""),
            ("soak: whole stream p50 / p99 (s)", "soak_p50", "{:.2f}", "low"),
            ("soak: tok/s", "soak_rate", "{:.1f}", "high"),
            (f"turn {plan.turns} of a conversation, first token (ms)", "turn_ttft", "{:.0f}",
             "low"),
            (f"turn {plan.turns}: prompt tokens / from a cache", "turn_prompt", "{:.0f}", ""),
            (f"turn {plan.turns}, sent {plan.pause:g} s after the reply: first token (ms)",
             "turn_paused_ttft", "{:.0f}", "low"),
            (f"{plan.tenant_members} members, 3,900-char instructions: new member's first "
             "token (ms)", "tenant_ttft", "{:.0f}", "low"),
            (f"{min(max(plan.bursts), plan.tenant_members)} of them at once (tok/s)",
             "tenant_rate", "{:.1f}", "high"),
            ("those at once, slowest first token (ms)", "tenant_max_ttft", "{:.0f}", "low"),
            ("after a restart, a member seen before: first token (ms)", "restart_ttft",
             "{:.0f}", "low"),
            ("memory held after them: server RSS (MiB)", "rss", "{:.0f}", "low"),
            ("growth of that RSS over the tenant's warm-up (MiB)", "rss_growth", "{:.0f}", ""),
            ("the platform's Redis: used memory (MiB)", "redis", "{:.0f}", "")]
    extra = {"soak_streams": "soak_failed", "soak_p50": "soak_p99", "turn_prompt": "turn_cached"}
    body = []
    for label, key, fmt, better in rows:
        cells = [_cell(f, key, fmt, extra.get(key)) if f else "–" for f in (ours, theirs)]
        body.append([label, *cells, _ratio(ours, theirs, key, better)])
    peer = results["peer"] if "peer" in results else None
    head = ["figure", "platform (defaults, injected)",
            f"{peer['name']} (prefix caching, system message)" if peer else "peer (not run)",
            "platform / peer"]
    lines = [f"`.venv/bin/python bench/bench_vs_peer.py --peer {args.peer}"
             f"{' --quick' if args.quick else ''}` — {machine()}; model {model_name}; "
             "the platform: one `celery worker --pool threads` (WORKER_BATCH_MAX "
             f"{results['platform'].get('batch_max')}), the web under uvicorn"
             f"{', then the peer, one after the other' if 'peer' in results else ''}; "
             f"{plan.tokens} new tokens per timed reply, greedy, streamed "
             "`/v1`; "
             f"medians of {plan.reps}; {seconds / 60:.1f} min.", "", table(head, body)]
    rep = results.get("replies")
    if rep:
        lines.append(f"\nreplies, platform with contrast 0, constraints, reminder and loop guard off vs "
                     f"the peer (float32, greedy): {rep['equal']}/{rep['of']} equal token "
                     "for token" + "".join(
                         f"\n- member {m['member']}: first differs at token {m['position']}: "
                         f"{m['ours']!r} vs {m['theirs']!r}" for m in rep["mismatches"]))
    if peer:
        if peer.get("from"):
            lines.append(f"\npeer figures from an earlier run on this machine: {peer['from']}")
        lines.append(f"\npeer: {peer['name']}, float32, `--enable-prefix-caching`, "
                     "`VLLM_CPU_KVCACHE_SPACE=4` (its RSS holds that preallocated KV cache); "
                     "as it set itself up: " + "; ".join(dict.fromkeys(peer["notes"])))
    fails = [*results["platform"]["soak"]["failed"], *(peer["soak"]["failed"] if peer else [])]
    lines += [f"soak failure: {f}" for f in fails[:5]]
    return "\n".join(lines)


def _cell(f: dict, key: str, fmt: str, second: str | None) -> str:
    if f.get(key) is None:  # a figure an older run did not measure
        return "–"
    text = fmt.format(f[key])
    return f"{text} / {fmt.format(f[second])}" if second else text


def _ratio(ours: dict, theirs: dict | None, key: str, better: str) -> str:
    """platform / peer; '(behind)' where the platform is slower or smaller."""
    if not theirs or not better or not theirs.get(key) or not ours.get(key):
        return "–"
    r = ours[key] / theirs[key]
    behind = r > 1 if better == "low" else r < 1
    return f"{r:.2f}x{' (behind)' if behind else ''}"
