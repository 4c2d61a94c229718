"""What contrastive guidance costs a member, through the API, on the platform's defaults.

    .venv/bin/python bench/bench_guide_cost.py [--quick] [--write-docs] [--reps N] [--kinds K,..]

Issue 31, "What they cost" and section 3: a guided request carries a second "guide" row
in the batch engine (``injection/engine/guidance/``). This measures what a client sees,
with the real default model (SmolLM2-135M-Instruct, ``var/models/smollm2-135m-instruct``
unless ``MODEL_PATH`` names another), on a stack of its own: embedded PostgreSQL + Redis
under var/bench-guide-cost, one ``celery worker --pool threads`` as deployed (the demo's
and the Procfile's pool: WORKER_BATCH_MAX task threads feed one batch engine) and the web
under uvicorn; rate limits off, every other setting the platform's default.

Members of one tenant, five kinds by their one memory: a standing instruction the decoding
constraints keep ("Always answer in lowercase letters only.": not guided by default), one
they do not ("Always answer in French.": guided), a preference/fact ("I am vegetarian
and I cook for two."), a required word the decoder keeps ("Work the word 'harbour' into
every answer.") and placeholders it keeps ("Put at least two placeholders in square
brackets, like [date], in every reply."), 8 of each, and French members asked after 8
unrelated exchanges (sent through ``/v1`` with that history: a reminded turn, which runs no guide row but is
anchored: ``guidance/anchor.py``), and a mixed tenant: the four first-turn memories,
two members each, in one burst (what defaults cost where a quarter of the members is
guided). Conditions: ``defaults`` (nothing sent: the platform
decides), ``contrast 0`` (guidance off, the baseline) and, for the lowercase instruction,
``constraints off`` (its constraint off, so it is guided again: what keeping it by the
decoder saves) and, for the required word and placeholders, ``neither`` (no constraint, no
guide: what keeping it costs by itself). Each member's memory is warmed by one earlier request. All replies greedy
(temperature 0), ``TOKENS`` new tokens, each request the first turn of a new conversation.
Per rep the kind x condition cells run interleaved (their order rotates and reverses;
the streams in rounds over the cells, then the bursts), so load from elsewhere hits every
condition alike; the first request of each member (the warm-up, on the defaults) measures
its lean where its first turns are guided (``guidance/probe.py``), reported apart. ``--quick``: one rep (2 streams per cell), about 15 minutes on a loaded
2-core CPU; else 3 reps:

1. ``/v1`` streamed at batch 1 (the kind's first member): time to the first content chunk,
   decode tokens/s after it ((completion_tokens - 1) / time after the first chunk, from the
   usage chunk of ``stream_options.include_usage``) and ``usage.kvinject_guide_tokens``;
2. 8 first-turn ``/api/chat`` requests (the kind's 8 members, 8 different questions) sent
   at once, and the same 8 one after another: wall time of each, their ratio, the longest
   worker-side time to first token in the burst (``cache.ttft_ms``: a request waiting for
   a batch slot shows here), and the guide's tokens (``usage.guide_prefill_tokens`` +
   ``guide_decode_tokens``) and ``cache.contrast_effective``;
3. the replies: greedy, so the same request gives the same reply in every rep and whether
   sent alone or in the burst (counted); and whether defaults and ``contrast 0`` differ.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ["VAR_DIR"] = str(ROOT / "var" / "bench-guide-cost")
for var in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND"):
    os.environ.pop(var, None)
# the real default model (not the random demo model); VAR_DIR above moves the default path
os.environ.setdefault("MODEL_PATH", str(ROOT / "var" / "models" / "smollm2-135m-instruct"))
os.environ.update(DJANGO_SETTINGS_MODULE="config.settings", CHAT_RATE_PER_MEMBER="",
                  CHAT_RATE_PER_TENANT="", API_RATE_PER_MEMBER="", API_RATE_PER_TENANT="")
sys.path.insert(0, str(ROOT))

import django  # noqa: E402

django.setup()

import v1stream  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from mdsection import machine, table, write_section  # noqa: E402
from servers import stop, worker_and_web  # noqa: E402

from tenants import actions  # noqa: E402

TOKENS = 64
BURST = 8
KINDS = {"instruction": "Always answer in lowercase letters only.",
         "guided instruction": "Always answer in French.",
         "preference": "I am vegetarian and I cook for two.",
         "required word": "Work the word 'harbour' into every answer.",
         "placeholders": "Put at least two placeholders in square brackets, like [date], in "
                         "every reply.",
         "deep guided instruction": "Always answer in French.",
         # a tenant's members as they come: the four first-turn memories above, two members
         # each (the first French: its stream is guided), on the same defaults
         "mixed tenant": ("Always answer in French.", "Always answer in lowercase letters only.",
                          "I am vegetarian and I cook for two.",
                          "Work the word 'harbour' into every answer.")}
# kinds whose requests come after this many exchanges (bench/memory_cases.py's distractors,
# sent through ``/v1``, which takes the history: a reminded turn, anchored by default)
KIND_DEPTH = {"deep guided instruction": 8}
# what each condition sends beside the message ({}: nothing, the platform decides)
CONDITIONS = {"defaults": {}, "contrast 0": {"contrast": 0.0},
              "constraints off": {"constraints": False},
              "neither": {"constraints": False, "contrast": 0.0}}
# the conditions each kind runs. The lowercase instruction is kept by its decoding
# constraint and so not guided by default (``contrast.resolve``): ``contrast 0`` would send
# its defaults' work again; with ``constraints off`` it is guided. French is guided. The
# required word is kept by the decoder too (forced where the reply would end, no repeated
# run after it): ``neither`` (no constraint, no guide) is what keeping it costs by itself.
KIND_CONDITIONS = {"instruction": ["defaults", "constraints off"],
                   "guided instruction": ["defaults", "contrast 0"],
                   "preference": ["defaults", "contrast 0"],
                   "required word": ["defaults", "constraints off", "neither"],
                   "placeholders": ["defaults", "constraints off", "neither"],
                   "deep guided instruction": ["defaults", "contrast 0"],
                   "mixed tenant": ["defaults", "contrast 0"]}
# what a kind the decoder keeps asks of a reply (counted in the `/api/chat` replies)
KIND_KEPT = {"required word": ("the word", lambda t: "harbour" in t.lower()),
             "placeholders": ("two placeholders", lambda t: len(re.findall(r"\[.*?\]", t)) >= 2)}
STREAM_QUESTION = "What should I cook tonight?"
WARM_QUESTION = "Hello! Who are you?"
QUESTIONS = ["What should I cook tonight?", "Suggest a plan for a rainy Sunday.",
             "How do I keep basil fresh?", "What is a good breakfast before a long walk?",
             "Give me three ideas for a picnic.", "How should I store leftover rice?",
             "What can I bring to a dinner party?", "Plan a simple lunch for tomorrow."]
assert len(QUESTIONS) == BURST


def member_memory(memory: str | tuple[str, ...], i: int) -> str:
    """Member ``i``'s memory: the kind's one, or its ``i``-th in turn (a mixed kind)."""
    return memory if isinstance(memory, str) else memory[i % len(memory)]


def start(model: Path) -> tuple[list[subprocess.Popen], str, Path]:
    env = dict(os.environ, MODEL_PATH=str(model), TOKENIZERS_PARALLELISM="false")
    logpath = Path(os.environ["VAR_DIR"]) / "servers.log"
    return (*worker_and_web("g1", env, logpath, pool="threads", wait_s=300), logpath)


def _post(url: str, key: str, body: dict, timeout: float = 600):
    return v1stream.post(url, body, {"Authorization": f"Bearer {key}"}, timeout)


def history(depth: int) -> list[dict]:
    """``depth`` unrelated exchanges (bench/memory_cases.py's distractors)."""
    from memory_cases import DISTRACTORS

    return [{"role": r, "content": t} for q, a in DISTRACTORS[:depth]
            for r, t in (("user", q), ("assistant", a))]


def v1_body(question: str, extra: dict, depth: int, **more) -> dict:
    """A greedy ``/v1`` request of ``question`` after ``depth`` exchanges, ``extra`` as its
    ``kvinject`` object (none when empty)."""
    body = {"model": "kvinject", "max_tokens": TOKENS, "temperature": 0, **more,
            "messages": [*history(depth), {"role": "user", "content": question}]}
    return {**body, "kvinject": dict(extra)} if extra else body


def stream(base: str, key: str, extra: dict, depth: int = 0) -> dict:
    """One streamed ``/v1`` turn (after ``depth`` exchanges): first content chunk, decode
    rate, guide tokens."""
    body = v1_body(STREAM_QUESTION, extra, depth)
    out = v1stream.stream(base, body, {"Authorization": f"Bearer {key}"})
    return {**{k: out[k] for k in ("ttft", "rate", "tokens", "text")},
            "guide": int(out["usage"].get("kvinject_guide_tokens") or 0)}


def chat(base: str, key: str, question: str, extra: dict, depth: int = 0) -> dict:
    """One ``/api/chat`` first turn (a new conversation); after ``depth`` exchanges, one
    ``/v1`` request with that history."""
    if depth:
        return v1_chat(base, key, question, extra, depth)
    body = {"message": question, "max_new_tokens": TOKENS, "temperature": 0, **extra}
    t0 = time.perf_counter()
    with _post(f"{base}/api/chat", key, body) as resp:
        answer = json.loads(resp.read())
    usage, cache = answer.get("usage") or {}, answer.get("cache") or {}
    return {"seconds": time.perf_counter() - t0, "text": answer["reply"],
            "tokens": int(usage.get("completion_tokens") or 0),
            "guide": int(usage.get("guide_prefill_tokens") or 0)
            + int(usage.get("guide_decode_tokens") or 0),
            "contrast": float(cache.get("contrast_effective") or 0.0),
            "ttft_ms": float(cache.get("ttft_ms") or 0.0)}


def v1_chat(base: str, key: str, question: str, extra: dict, depth: int) -> dict:
    """``chat``'s figures of one ``/v1`` request after ``depth`` exchanges."""
    t0 = time.perf_counter()
    with _post(f"{base}/v1/chat/completions", key, v1_body(question, extra, depth)) as resp:
        answer = json.loads(resp.read())
    usage, cache = answer.get("usage") or {}, (answer.get("kvinject") or {}).get("cache") or {}
    return {"seconds": time.perf_counter() - t0,
            "text": answer["choices"][0]["message"]["content"],
            "tokens": int(usage.get("completion_tokens") or 0),
            "guide": int(usage.get("kvinject_guide_tokens") or 0),
            "contrast": float(cache.get("contrast_effective") or 0.0),
            "ttft_ms": float(cache.get("ttft_ms") or 0.0)}


def warm(base: str, key: str, tries: int = 3) -> dict:
    """One request on the defaults: the member's K/V in L1 and, where its first turns are
    guided, its lean measured (``guidance/probe.py``: its probes, once per member). A fresh
    worker's first requests can run past the task's time limit on a loaded machine: a failed
    one is sent again."""
    for attempt in range(tries):
        try:
            return chat(base, key, WARM_QUESTION, {})
        except SystemExit as exc:
            print(f"warm-up request failed ({exc}); {'again' if attempt + 1 < tries else 'giving up'}",
                  flush=True)
    raise SystemExit("the warm-up failed; see the servers' log")


def burst(base: str, keys: list[str], extra: dict, together: bool, depth: int = 0) -> dict:
    """The kind's 8 members, each its own question: at once, or one after another."""
    jobs = list(zip(keys, QUESTIONS, strict=True))
    t0 = time.perf_counter()
    if together:
        with ThreadPoolExecutor(len(jobs)) as pool:
            done = list(pool.map(lambda j: chat(base, j[0], j[1], extra, depth), jobs))
    else:
        done = [chat(base, k, q, extra, depth) for k, q in jobs]
    return {"wall": time.perf_counter() - t0, "replies": done}


def cell_order(rep: int) -> list[tuple[str, str]]:
    """The kind x condition cells, rotated by ``rep`` and reversed on odd reps."""
    cells = [(k, c) for k in KINDS for c in KIND_CONDITIONS[k]]
    shift = rep % len(cells)
    cells = cells[shift:] + cells[:shift]
    return cells[::-1] if rep % 2 else cells


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer reps (about 10 minutes)")
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--kinds", default="", help="only these kinds (comma-separated; "
                        "the report is then printed, not written)")
    parser.add_argument("--reps", type=int, default=None,
                        help="reps of the bursts (default 1 with --quick, else 3); each rep "
                             "also streams 2 (--quick) or 3 requests per cell")
    args = parser.parse_args()
    reps = args.reps or (1 if args.quick else 3)
    if args.kinds:
        chosen = [k.strip() for k in args.kinds.split(",")]
        if set(chosen) - set(KINDS):
            raise SystemExit(f"--kinds: unknown {sorted(set(chosen) - set(KINDS))}")
        for kind in [k for k in KINDS if k not in chosen]:
            del KINDS[kind]
        args.write_docs = False
    streams_per_rep = 2 if args.quick else 3
    call_command("migrate", interactive=False, verbosity=0)
    model = Path(settings.MODEL_PATH)
    if not (model / "config.json").exists():
        raise SystemExit(f"no model at {model}: `manage.py prepare_model` makes it")
    tenant = actions.do_create_tenant(f"bench-guide-{int(time.time())}")
    keys = {kind: [actions.do_create_api_token(actions.do_add_member(
        tenant, f"{tenant.slug}-{kind[:4]}{i}", preference=member_memory(memory, i)))
        for i in range(BURST)] for kind, memory in KINDS.items()}
    load = [os.getloadavg()[0]]
    t_start = time.monotonic()
    procs, base, logpath = start(model)
    streams: dict = {cell: [] for cell in cell_order(0)}
    warmups: dict = {}
    bursts: dict = {(cell, t): [] for cell in cell_order(0) for t in (True, False)}
    try:
        for kind, ks in keys.items():  # warm: the model, the guide's head, each member's K/V
            stream(base, ks[0], {"contrast": 0.0})  # and lean in L1 (the 8 members at once)
            with ThreadPoolExecutor(len(ks)) as pool:
                warmups[kind] = list(pool.map(lambda k: warm(base, k), ks))
        print(f"warm after {time.monotonic() - t_start:.0f} s", flush=True)
        for rep in range(reps):
            for r in range(streams_per_rep):  # rounds over the four cells
                for kind, cond in cell_order(rep * streams_per_rep + r):
                    streams[(kind, cond)].append(
                        stream(base, keys[kind][0], CONDITIONS[cond], KIND_DEPTH.get(kind, 0)))
            for cell in cell_order(rep):
                kind, cond = cell
                for together in ((True, False) if rep % 2 == 0 else (False, True)):
                    bursts[(cell, together)].append(burst(base, keys[kind], CONDITIONS[cond],
                                                          together, KIND_DEPTH.get(kind, 0)))
            load.append(os.getloadavg()[0])
            print(f"rep {rep + 1}/{reps} done after {time.monotonic() - t_start:.0f} s, "
                  f"load {load[-1]:.1f}", flush=True)
    finally:
        stop(procs)
    raw = Path(os.environ["VAR_DIR"]) / "last_run.json"  # kept should the report fail
    raw.write_text(json.dumps({"streams": [[list(k), v] for k, v in streams.items()],
                               "bursts": [[[list(c), t], v] for (c, t), v in bursts.items()]}))
    report(streams, bursts, reps, streams_per_rep, load, args, model.name,
           time.monotonic() - t_start, logpath, warmups)


def _median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else 0.0


def report(streams: dict, bursts: dict, reps: int, per_rep: int, load: list[float], args,
           model_name: str, seconds: float, logpath: Path, warmups: dict) -> None:
    rows, fig = [], {}
    for kind in KINDS:
        for cond in KIND_CONDITIONS[kind]:
            cell = (kind, cond)
            s = streams[cell]
            conc, seq = bursts[(cell, True)], bursts[(cell, False)]
            chats = [r for b in conc + seq for r in b["replies"]]
            f = fig[cell] = {
                "ttft": _median(x["ttft"] for x in s) * 1000,
                "rate": _median(x["rate"] for x in s),
                "guide_v1": _median(x["guide"] for x in s),
                "guide_chat": _median(r["guide"] for r in chats),
                # the mean: a mixed kind's share of guided requests (0 or 1 for the others)
                "contrast": statistics.fmean(r["contrast"] for r in chats) if chats else 0.0,
                "seq": _median(b["wall"] for b in seq),
                "conc": _median(b["wall"] for b in conc),
                "ratio": _median(a["wall"] / b["wall"] for a, b in zip(seq, conc, strict=True)),
                "max_ttft": _median(max(r["ttft_ms"] for r in b["replies"]) for b in conc),
                "tokens": _median(r["tokens"] for r in chats),
                "mean_tok": _median(statistics.fmean(r["tokens"] for r in b["replies"])
                                    for b in conc),
                "long_tok": _median(max(r["tokens"] for r in b["replies"]) for b in conc),
                "held": sum(KIND_KEPT[kind][1](r["text"]) for r in chats) if kind in KIND_KEPT
                else 0, "of": len(chats),
            }
            rows.append([kind, cond, f"{f['contrast']:g}", f"{f['guide_v1']:.0f} / "
                         f"{f['guide_chat']:.0f}", f"{f['ttft']:.0f}", f"{f['rate']:.1f}",
                         f"{f['seq']:.1f}", f"{f['conc']:.1f}", f"**{f['ratio']:.2f}x**",
                         f"{f['max_ttft']:.0f}"])
    lines = []
    for kind in KINDS:
        d, b = fig[(kind, "defaults")], fig.get((kind, "contrast 0"))
        if b is not None:
            lines.append(_versus(kind, "`contrast: 0`", d, b, " (goal >= 0.9x)") + " (goal >= 3.5x)" + (
                "; no guide by default, so both rows send the same work: they differ by this "
                "run's noise." if d["contrast"] == 0 else "."))
        if "constraints off" in KIND_CONDITIONS[kind]:
            lines.append(_versus(kind, "`constraints: false` (the decoding constraints off: "
                                 "guided again)", d, fig[(kind, "constraints off")]) + ".")
        if "neither" in KIND_CONDITIONS[kind]:
            c = fig[(kind, "neither")]
            lines.append(_versus(kind, "neither constraints nor guidance (what the decoder keeping "
                                 "it costs)", d, c)
                         + f"; {KIND_KEPT[kind][0]} in {d['held']}/{d['of']} "
                         f"`/api/chat` replies vs {c['held']}/{c['of']} (guided, constraints off: "
                         f"{fig[(kind, 'constraints off')]['held']}/{c['of']}).")
    guided = [k for k in KINDS if fig[(k, "defaults")]["contrast"] > 0
              and (k, "contrast 0") in fig]
    if guided:
        lines.append(
            "- slowest first token of the 8 at once, defaults vs `contrast: 0`: " + ", ".join(
                f"{k} {fig[(k, 'defaults')]['max_ttft']:.0f} vs "
                f"{fig[(k, 'contrast 0')]['max_ttft']:.0f} ms" for k in guided)
            + f": a guided first turn leans with its member's lean (one batch row) or runs a "
            f"guide row beside it (two), one of the {settings.WORKER_BATCH_MAX} request slots "
            "either way, so all 8 run at once.")
        lines.extend(_measured(k, warmups[k]) for k in guided if warmups.get(k))
        lines.extend(_bound(k, fig[(k, "defaults")], fig[(k, "contrast 0")]) for k in guided)
    lines.append("- replies (greedy): " + replies_line(streams, bursts))
    cmd = "`.venv/bin/python bench/bench_guide_cost.py" + (" --quick" if args.quick else "") + (
        f" --reps {args.reps}" if args.reps else "") + "`"
    body = "\n".join([
        "## Contrastive guidance: what the guide row costs a member (issue 31)",
        f"{cmd} — {machine()}, **loaded** by other jobs (1-min load {min(load):.1f}–"
        f"{max(load):.1f}); model {model_name}; one `celery worker --pool threads` "
        f"(WORKER_BATCH_MAX {settings.WORKER_BATCH_MAX}), the web under uvicorn, platform "
        f"defaults; first turns, memory warm, {TOKENS} new tokens, greedy. Medians of "
        f"{reps * per_rep} streams and {reps} burst rep{'s' if reps > 1 else ''} of 8 at once "
        f"and 8 one after another per row, conditions interleaved. Guide tokens: "
        "`/v1` `kvinject_guide_tokens` / `/api/chat` guide prefill + decode; burst max TTFT: "
        "the slowest worker-side first token of the 8 sent at once. Batch-1 figures "
        f"from {reps * per_rep} streams on a loaded machine are noisy; the bursts less so.",
        "",
        table(["memory", "condition", "contrast applied (mean)", "guide tokens /reply",
               "/v1 b1 first token ms", "/v1 b1 decode tok/s", "8 one after another s",
               "8 at once s", "ratio", "burst max TTFT ms"], rows),
        "",
        *lines,
    ])
    print(body)
    print(f"\n({seconds / 60:.1f} min; servers' log: {logpath})")
    if args.write_docs:
        write_section("guide-cost", body)


def _versus(kind: str, other: str, d: dict, c: dict, goal: str = "") -> str:
    """One line: the defaults' figures of ``kind`` as ratios of condition ``other``'s."""
    return (f"- {kind}: defaults against {other} — first token **{d['ttft'] / c['ttft']:.2f}x**, "
            f"batch-1 decode **{d['rate'] / c['rate']:.2f}x**{goal}, 8 one after another "
            f"**{d['seq'] / c['seq']:.2f}x** the time, 8 at once **{d['conc'] / c['conc']:.2f}x**; "
            f"at once / one after another {d['ratio']:.2f}x vs {c['ratio']:.2f}x")


def _measured(kind: str, warm: list[dict]) -> str:
    """What each member's first request (the warm-up, the 8 at once) paid to measure its lean."""
    guide = [r["guide"] for r in warm]
    return (f"- {kind}, each member's first request (the warm-up, the 8 at once; it measures "
            f"the member's lean where first turns lean): guide tokens {_median(guide):.0f} "
            f"(median), worker-side first token {_median(r['ttft_ms'] for r in warm):.0f} ms "
            f"(median) / {max(r['ttft_ms'] for r in warm):.0f} ms (slowest); later requests "
            "lean with it at no guide tokens.")


def _bound(kind: str, d: dict, c: dict) -> str:
    """What a guide at no cost would leave of the burst ratio: 8 at once take as long as
    their longest reply, one after another the sum of them."""
    bound = d["seq"] / c["conc"]
    return (f"- {kind}, 8 at once: reply tokens (mean / longest of the 8) {d['mean_tok']:.0f} / "
            f"{d['long_tok']:.0f} on defaults vs {c['mean_tok']:.0f} / {c['long_tok']:.0f} with "
            f"`contrast: 0`; a guide that cost nothing would leave 8 at once at about `contrast: "
            f"0`'s {c['conc']:.1f} s (where the longest replies are as long), so about "
            f"**{bound:.2f}x** ({d['seq']:.1f} s one after another / {c['conc']:.1f} s) where "
            f"the goal asks 3.5x.")


def replies_line(streams: dict, bursts: dict) -> str:
    """Whether replies repeat across reps and burst modes, and differ between conditions."""
    unstable, total = 0, 0
    by_cell: dict = {}
    for (cell, _together), runs in bursts.items():
        for run in runs:
            for q, r in zip(QUESTIONS, run["replies"], strict=True):
                by_cell.setdefault((cell, q), set()).add(r["text"])
    for cell, s in streams.items():
        by_cell[(cell, "stream")] = {x["text"] for x in s}
    odd = []
    for where, texts in by_cell.items():
        total += 1
        unstable += len(texts) > 1
        if len(texts) > 1:
            odd.append(f"{where[0][0]}/{where[0][1]}: {where[1]!r}")
    asks = [*QUESTIONS, "stream"]
    differ = {kind: sum(by_cell[((kind, "defaults"), q)] != by_cell[((kind, "contrast 0"), q)]
                        for q in asks) for kind in KINDS if "contrast 0" in KIND_CONDITIONS[kind]}
    kept = ("; defaults and `constraints: false` on " + str(sum(
        by_cell[(("instruction", "defaults"), q)] != by_cell[(("instruction", "constraints off"),
                                                              q)] for q in asks))
        + f"/{len(asks)} of the instruction member's") if "instruction" in KINDS else ""
    return (f"{total - unstable}/{total} requests gave one reply in every rep, alone "
            f"and at once; defaults and `contrast: 0` differ on " + ", ".join(
                f"{n}/{len(asks)} of the {kind} member's" for kind, n in differ.items())
            + " (guidance changes the reply where it runs)" + kept
            + (f"; more than one reply: {', '.join(odd)}." if odd else "."))


if __name__ == "__main__":
    main()
