"""Personalisation: does the injected preference change what a real model says?

Each case (bench/personalisation_cases.py: facts, diets, constraints, language, style)
is answered greedily under every condition, in one run, through the real engine
(``InjectionExecutor`` with an in-process L1 and the worker's batch engine):

* ``no preference``: the conversation alone (the template's own default system turn);
* ``system message``: the preference as the system message, in the prompt (baseline);
* ``injected a=X``: the preference's system turn injected as K/V, values scaled by X,
  for X in ALPHAS (the platform's default is marked);
* ``injected a=X + contrast S``: with contrastive guidance (``--contrast``, and the
  model's default when it has one);
* ``raw text (old)``: the composition before this change, for the record: K/V of the
  raw preference text (with BOS), then the whole chat template, a=0.7.

Adherence = replies passing their case's objective check. Time to first token per
condition: median over cases of one ``max_new_tokens=1`` request, injected ones on an
L1 hit (K/V already cached), interleaved per case.

Run: ``.venv/bin/python bench/bench_personalisation.py [--write-docs]``
(``MODEL_PATH``: any local HF chat model dir; default: the prepared SmolLM2-135M-Instruct;
``MODEL_DTYPE``: e.g. bfloat16, default the model's own).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from mdsection import machine, table, write_section  # noqa: E402
from personalisation_cases import CASES  # noqa: E402

from injection import InjectionExecutor, TenantLRU, load_adapter  # noqa: E402
from injection.base import ExecutionRequest  # noqa: E402
from injection.engine.batch import BatchEngine  # noqa: E402
from injection.kvcache.packed import PackedKV  # noqa: E402
from injection.metrics import Metrics  # noqa: E402

ALPHAS = (0.3, 0.5, 0.7, 0.85, 1.0)
MAX_NEW_TOKENS = int(os.environ.get("MAX_NEW_TOKENS", "48"))
TENANT = "bench-personalisation"


def default_alpha() -> float:
    from injection.base import DEFAULT_ALPHA

    return DEFAULT_ALPHA


def model_path() -> Path:
    if os.environ.get("MODEL_PATH"):
        return Path(os.environ["MODEL_PATH"])
    from injection.model.gguf_import import prepare_model

    return prepare_model(ROOT / "var" / "models" / "smollm2-135m-instruct")


def conditions(alpha_default: float, contrast_default: float = 0.0,
               contrasts: tuple[float, ...] = ()) -> list[tuple[str, dict]]:
    """``injected a=X`` rows run without contrastive guidance; ``+ contrast S`` rows at the
    default alpha with it (the default's row marked: alpha and contrast as shipped)."""
    out = [("no preference", {"pref": False}), ("system message", {"system": True})]
    for a in ALPHAS:
        mark = " (default)" if a == alpha_default and not contrast_default else ""
        out.append((f"injected a={a}{mark}", {"alpha": a, "contrast": 0.0}))
    for c in sorted({*contrasts, *([contrast_default] if contrast_default else [])}):
        mark = " (default)" if c == contrast_default else ""
        out.append((f"injected a={alpha_default} + contrast {c:g}{mark}",
                     {"alpha": alpha_default, "contrast": c}))
    return out + [("raw text (old)", {"raw": True})]


class Runner:
    """Answers one case under one condition; ``n`` new tokens."""

    def __init__(self, adapter) -> None:
        self.adapter = adapter
        # the worker's path: generation as a row of the batch engine
        self.ex = InjectionExecutor(adapter, l1=TenantLRU(max_bytes=2 * 1024**3), l2=None,
                                    alpha_cap=1.0, min_alpha=0.0, metrics=Metrics(),
                                    engine=BatchEngine(adapter, max_batch=8))
        self.raw_kv: dict[str, PackedKV] = {}

    def run(self, i: int, case, cond: dict, n: int) -> str:
        msgs = [{"role": "user", "content": case.question}]
        if cond.get("raw"):
            return self._raw(case, msgs, n)
        req = ExecutionRequest(
            TENANT, f"u{i}", msgs, case.preference if cond.get("pref", True) else "",
            injection_enabled=not cond.get("system"), alpha=cond.get("alpha", 1.0),
            instructions=case.preference if cond.get("system") else "", max_new_tokens=n,
            contrast=cond.get("contrast"),
        )
        return self.ex.execute(req).text

    def _raw(self, case, msgs, n: int) -> str:
        kv = self.raw_kv.get(case.preference)
        if kv is None:  # the old composition: K/V of the raw text (BOS if the tokenizer adds one)
            kv = self.raw_kv[case.preference] = self.adapter.compute_kv(case.preference)
        return self.adapter.generate(self.adapter.render_chat(msgs), kv, 0.7, n).text


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000.0


def evaluate(runner: Runner, conds, cases) -> tuple[dict, dict, list]:
    passed = {name: 0 for name, _ in conds}
    ttft: dict[str, list[float]] = {name: [] for name, _ in conds}
    replies = []
    for i, case in enumerate(cases):
        for name, cond in conds:
            reply = runner.run(i, case, cond, MAX_NEW_TOKENS)  # also fills L1 for the timing
            ok = bool(case.check(reply))
            passed[name] += ok
            replies.append((i, name, ok, reply))
            ttft[name].append(timed(lambda i=i, k=case, c=cond: runner.run(i, k, c, 1)))
        print(f"  case {i + 1}/{len(cases)}: " + " ".join(
            "+" if ok else "." for j, n, ok, _ in replies if j == i), flush=True)
    return passed, {k: statistics.median(v) for k, v in ttft.items()}, replies


def by_kind(replies, conds, cases) -> list[list[object]]:
    kinds = sorted({c.kind for c in cases})
    rows = []
    for name, _ in conds:
        cells = []
        for k in kinds:
            idx = [i for i, c in enumerate(cases) if c.kind == k]
            ok = sum(1 for i, n, good, _ in replies if n == name and good and i in idx)
            cells.append(f"{ok}/{len(idx)}")
        rows.append([name, *cells])
    return [["condition", *kinds], *rows]


def render(passed, ttft, kinds, header: str, n: int) -> str:
    base = ttft["system message"]
    rows = [[name, f"{ok}/{n}", f"{ttft[name]:.1f}", f"{ttft[name] / base:.2f}x"]
            for name, ok in passed.items()]
    out = ["## Personalisation: adherence and time to first token per condition", "", header, "",
           table(["condition", "adherence", "TTFT ms (L1 hit)", "vs system message"], rows),
           "", "Adherence by kind of case:", "", table(kinds[0], kinds[1:])]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write-docs", action="store_true", help="update docs/BENCHMARKS.md")
    ap.add_argument("--show", action="store_true", help="print every reply")
    ap.add_argument("--contrast", default="", help="contrast strengths to add, e.g. 0.5,1")
    args = ap.parse_args()
    torch.manual_seed(0)
    path = model_path()
    adapter = load_adapter(path, device=os.environ.get("MODEL_DEVICE") or None,
                           dtype=os.environ.get("MODEL_DTYPE") or None)
    from injection.engine.guidance.contrast import resolve

    conds = conditions(default_alpha(), resolve(adapter, None),
                       tuple(float(x) for x in args.contrast.split(",") if x))
    print(f"{len(CASES)} cases x {len(conds)} conditions, greedy, {MAX_NEW_TOKENS} tokens",
          flush=True)
    passed, ttft, replies = evaluate(Runner(adapter), conds, CASES)
    if args.show:
        for i, name, ok, reply in replies:
            print(f"[{i}] {name:28s} {'PASS' if ok else 'fail'} {reply!r}")
    header = "  \n".join([
        f"Command: `.venv/bin/python bench/bench_personalisation.py {' '.join(sys.argv[1:])}` "
        f"({len(CASES)} cases of bench/personalisation_cases.py, greedy, "
        f"max_new_tokens={MAX_NEW_TOKENS}; TTFT = median of one max_new_tokens=1 request)",
        f"Machine: {machine()}, torch threads {torch.get_num_threads()}",
        f"Model: {path.name} ({adapter.model.config.model_type}, L={adapter.num_layers}, "
        f"H_kv={adapter.num_kv_heads}, {adapter.device}, {str(adapter.dtype)[6:]})",
    ])
    body = render(passed, ttft, by_kind(replies, conds, CASES), header, len(CASES))
    print(body)
    if args.write_docs:
        write_section("personalisation", body)


if __name__ == "__main__":
    main()
