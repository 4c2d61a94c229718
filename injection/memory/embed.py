"""Text embeddings from the served model's own hidden states, cached per tenant.

What and why: recall needs a similarity between a memory and the user's message. No
model hub is reachable and the embedded Postgres's pgvector (0.6.2 ships with pgserver
and ``CREATE EXTENSION vector`` works) only stores and searches vectors: something still
has to make them. The served model is already loaded in the worker, so it embeds: one
forward pass over ``PREFIX + text``; the hidden states of the text's tokens (the
prefix takes the first position, the attention sink whose huge norm would dominate a
mean) are mean-pooled at two depths (a quarter of the way up, and the last layer),
each standardised per dimension against a fixed set of neutral reference sentences
(removes the large common direction of a decoder's states, which otherwise makes every
cosine ~1), L2-normalised, concatenated and normalised again. Measured on SmolLM2-135M
(bench/bench_recall.py, docs/BENCHMARKS.md "Memory recall"): raw last-layer means pick
the right memory of 10 for 5/12 messages; this recipe 9/12 on the set it was chosen on
and 10/12 on a held-out set (top-3 with cosine >= 0.1: 10/12 on both).

The vectors live in this process, not in Postgres: a member has tens of memories, so a
recall is one small matrix product here (microseconds), while the vectors depend on the
served model (a fingerprint per model) and would need a round trip and a schema per
model in the database for no gain at this size.

Cache: a bounded LRU keyed by (tenant, model fingerprint, SHA-256 of the text), so a
memory is embedded once per process and two tenants never share an entry (identical
text of two tenants is embedded twice: nothing of one tenant's is served to another).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["HiddenStateEmbedder", "REFERENCE_SENTENCES"]

PREFIX = "Text: "
MAX_TEXT_TOKENS = 256  # longer texts are embedded from their last tokens
REFERENCE_SENTENCES = (
    "The meeting was moved to Thursday afternoon.", "Please send me the report by Friday.",
    "It rained all day yesterday.", "The museum opens at nine in the morning.",
    "She bought a new laptop last week.", "How do I change a flat tyre?",
    "What is the capital of Australia?", "Tell me a joke about cats.",
    "I enjoy reading history books.", "Explain how photosynthesis works.",
    "My favourite colour is green.", "Can you translate this into French?",
    "The train was late again.", "I need a recipe for pancakes.",
    "What time is it in New York?", "Write a short poem about the sea.",
)


class HiddenStateEmbedder:
    """``embed(tenant, texts)`` -> ``[n, d]`` unit vectors (float32, CPU)."""

    def __init__(self, adapter: Any, *, max_entries: int = 4096) -> None:
        self.adapter = adapter
        self.max_entries = max(1, int(max_entries))
        n = int(getattr(adapter, "num_layers", 0) or adapter.model.config.num_hidden_layers)
        self.layers = (n // 4 + 1, n)  # indices into hidden_states (0 = embeddings)
        self._cache: OrderedDict[tuple[str, str, str], torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()
        self._ref: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.hits = self.misses = 0

    # -- public ----------------------------------------------------------------------
    def embed(self, tenant: str, texts: Sequence[str]) -> torch.Tensor:
        fp = self.adapter.fingerprint
        rows: list[torch.Tensor] = []
        for text in texts:
            key = (tenant, fp, hashlib.sha256(text.encode("utf-8")).hexdigest())
            with self._lock:
                vec = self._cache.get(key)
                if vec is not None:
                    self._cache.move_to_end(key)
                    self.hits += 1
            if vec is None:
                vec = self._vector(text)
                with self._lock:
                    self.misses += 1
                    self._cache[key] = vec
                    while len(self._cache) > self.max_entries:
                        self._cache.popitem(last=False)
            rows.append(vec)
        return torch.stack(rows) if rows else torch.empty(0)

    def evict(self, tenant: str) -> int:
        """Drop ``tenant``'s entries (tenant deleted or invalidated); returns how many."""
        with self._lock:
            keys = [k for k in self._cache if k[0] == tenant]
            for k in keys:
                del self._cache[k]
        return len(keys)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            per: dict[str, int] = {}
            for tenant, _, _ in self._cache:
                per[tenant] = per.get(tenant, 0) + 1
            return {"entries": len(self._cache), "hits": self.hits, "misses": self.misses,
                    "per_tenant": per}

    # -- internals ---------------------------------------------------------------------
    def _pooled(self, text: str) -> list[torch.Tensor]:
        tok = self.adapter.tokenizer
        head = tok(PREFIX, add_special_tokens=False)["input_ids"]
        body = tok(text, add_special_tokens=False)["input_ids"][-MAX_TEXT_TOKENS:] or head[-1:]
        ids = torch.tensor([head + body], device=self.adapter.device)
        with torch.inference_mode():
            out = self.adapter.model(input_ids=ids, output_hidden_states=True, use_cache=False,
                                     logits_to_keep=1)
            return [out.hidden_states[i][0, len(head):].float().mean(0).cpu()
                    for i in self.layers]

    def _reference(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        if self._ref is None:
            pooled = [self._pooled(s) for s in REFERENCE_SENTENCES]
            ref = []
            for i in range(len(self.layers)):
                m = torch.stack([p[i] for p in pooled])
                ref.append((m.mean(0), m.std(0) + 1e-3))
            self._ref = ref
        return self._ref

    def _vector(self, text: str) -> torch.Tensor:
        ref = self._reference()
        parts = [torch.nn.functional.normalize((h - mu) / sd, dim=-1)
                 for h, (mu, sd) in zip(self._pooled(text), ref, strict=True)]
        return torch.nn.functional.normalize(torch.cat(parts), dim=-1)
