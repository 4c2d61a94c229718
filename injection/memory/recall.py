"""The planner's memory step: budget the member's segment, recall the rest per message.

Runs before generation, in the executor's planning (one step, never a loop): the
member's memories are split by the segment's token budget (``plan.split_budget``); when
some are left over, each user message and the candidates are embedded (``embed.py``,
cached per tenant) and the ``top_k`` most similar with a cosine of at least
``min_similarity`` are recalled for that message, in the member's own order, and
re-stated before it (``prompting/reminder.py``). A pick depends on its message alone,
so an earlier turn renders the same in every later prompt and the conversation's cached
K/V stays its prefix.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

from injection.base import ExecutionRequest, MemoryItem, run_here
from injection.memory.embed import HiddenStateEmbedder
from injection.memory.plan import MemoryPlan, split_budget

__all__ = ["MemoryPlanner", "RecallOptions"]

MAX_CANDIDATES = 512  # a member's memories are bounded by the platform far below this
# The reminder's pick re-states a memory only when it stands out from the member's others:
# its similarity at least this many standard deviations above their mean (with at least
# Z_CANDIDATES of them). A message that relates to none ("What is your name?", "Hello!")
# then re-states none, instead of the two that happen to score highest, which next to the
# question can outweigh the tenant's instructions ("I am learning Spanish." turned a
# reply Spanish). On bench/memory_cases.py's 20-memory lists, every pick of the case's
# own memory had z >= 2.05, and 6 of 35 other top-2 picks were over 2 (22 over the
# cosine floor alone); chosen looking at both case sets, with layer 8's embedding (layer
# 6's, the default since, keeps the case's memory in the same 21 of 28 picks).
RELEVANT_MIN_Z = 2.0
Z_CANDIDATES = 5


class RecallOptions(NamedTuple):
    segment_tokens: int = 256  # the member's cached segment budget (tokens)
    top_k: int = 3  # memories recalled per request at most
    min_similarity: float = 0.1  # cosine below this is never recalled
    cache_entries: int = 4096  # embedding LRU size (entries, all tenants)


class MemoryPlanner:
    """``forward``: runs the embeddings' forwards (``HiddenStateEmbedder``)."""

    def __init__(self, adapter: Any, options: RecallOptions | None = None,
                 metrics: Any = None, forward: Callable[[str, Callable[[], Any]], Any] = run_here,
                 ) -> None:
        self.adapter, self.options = adapter, options or RecallOptions()
        self.metrics, self.forward = metrics, forward
        self._embedder: HiddenStateEmbedder | None = None

    @property
    def embedder(self) -> HiddenStateEmbedder:
        if self._embedder is None:
            self._embedder = HiddenStateEmbedder(self.adapter, forward=self.forward,
                                                 max_entries=self.options.cache_entries)
        return self._embedder

    def plan(self, req: ExecutionRequest, *, on: bool = True) -> MemoryPlan:
        """The request's member text (``on`` False: no recall, nothing is injected)."""
        memories = [m for m in req.memories if m.text.strip()]
        if not memories:
            return MemoryPlan(req.preference_text)
        segment, candidates = split_budget(memories, self.options.segment_tokens,
                                           self.adapter.count_tokens)
        if not (on and candidates and self.options.top_k >= 1):
            return MemoryPlan("", segment=segment, candidates=candidates)
        candidates = candidates[:MAX_CANDIDATES]
        recalled = self.recall(req.tenant, candidates,
                               str(list(req.messages)[-1].get("content", "")))
        texts = [m.text for m in candidates]

        def recall(message: str) -> list[str]:  # a user message's pick, its texts
            return [texts[i] for i in self._top(req.tenant, texts, message, self.options.top_k)]
        return MemoryPlan("", segment=segment, candidates=candidates, recalled=recalled,
                          recall=recall)

    def recall(self, tenant: str, candidates: list[MemoryItem], message: str
               ) -> list[MemoryItem]:
        """The candidates most relevant to ``message``, in their own order (counted)."""
        t0 = time.perf_counter()
        picked = self._top(tenant, [m.text for m in candidates], message, self.options.top_k)
        if self.metrics is not None:
            self.metrics.incr("memory_recalls")
            self.metrics.incr("memories_recalled", len(picked))
            self.metrics.observe_ms("memory_recall", (time.perf_counter() - t0) * 1000.0)
        return [candidates[i] for i in picked]

    def relevant(self, tenant: str, texts: list[str], message: str, top: int) -> list[str]:
        """The (at most ``top``) of ``texts`` most similar to ``message``, in their own
        order (the memory reminder's pick, ``prompting/reminder.py``)."""
        live = [t for t in texts if t.strip()][:MAX_CANDIDATES]
        return [live[i] for i in self._top(tenant, live, message, top, stand_out=True)
                ] if live else []

    def _top(self, tenant: str, texts: list[str], query: str, top: int,
             stand_out: bool = False) -> list[int]:
        """Indices of the ``top`` texts most similar to ``query`` with a cosine of at least
        ``min_similarity`` (``stand_out``: and ``RELEVANT_MIN_Z`` above the others),
        ascending."""
        if top < 1 or not texts:
            return []
        emb = self.embedder
        sims = emb.embed(tenant, texts) @ emb.embed(tenant, [query])[0]
        floor = self.options.min_similarity
        if stand_out and len(texts) >= Z_CANDIDATES:
            floor = max(floor, float(sims.mean() + RELEVANT_MIN_Z * sims.std(correction=0)))
        order = sims.argsort(descending=True).tolist()[:top]
        return sorted(i for i in order if float(sims[i]) >= floor)

    def evict(self, tenant: str) -> int:
        return self._embedder.evict(tenant) if self._embedder is not None else 0

    def stats(self) -> dict[str, Any]:
        return self._embedder.stats() if self._embedder is not None else {"entries": 0}
