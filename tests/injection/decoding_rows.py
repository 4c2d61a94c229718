"""A decoding row without an engine, for stepping a reply's constraints token by token on
SmolLM2's tokenizer (tests/injection/test_constraint_*.py; ``smol_tok`` in conftest.py)."""

from __future__ import annotations

from typing import Any

from injection.engine.decoding import bans
from injection.engine.sampling import RowSampler


def row(tok: Any, constraints: tuple[str, ...], eos: list[int], max_new: int = 64) -> Any:
    """A row whose sampler keeps ``constraints``: ``sampler``, ``max_new_tokens``, ``gen``."""
    said = bans.prepare(tok, constraints, eos)[1]

    class Job:
        sampler = RowSampler(forced=said)
        max_new_tokens = max_new
        gen: list[int] = []

    Job.sampler.token_map = None
    return Job


def ids(tok: Any, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def eos_ids(tok: Any) -> list[int]:
    """The end-of-turn ids of SmolLM2's tokenizer."""
    return sorted({tok.eos_token_id, *ids(tok, "<|im_end|>")})


def engine_replies(adapter: Any, constraints: tuple[str, ...], max_new: int) -> tuple[Any, Any]:
    """The batch engine's greedy replies (``GenerationOutput``) to the planner tests' ASK
    with ``constraints`` and without, on ``adapter``."""
    from injection.engine.batch import BatchEngine
    from tests.injection.test_planner import ASK

    ask = adapter.renderer.encode(adapter.render_chat(ASK), first=True)
    eng = BatchEngine(adapter, max_batch=4)
    try:
        return tuple(eng.run(None, 1.0, ask, max_new, **kw)
                     for kw in ({"constraints": constraints}, {}))
    finally:
        eng.close()
