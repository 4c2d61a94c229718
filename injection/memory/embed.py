"""Text embeddings from the served model's own hidden states, cached per tenant.

What and why: recall needs a similarity between a memory and the user's message. No
model hub is reachable and the embedded Postgres's pgvector (0.6.2 ships with pgserver
and ``CREATE EXTENSION vector`` works) only stores and searches vectors: something still
has to make them. The served model is already loaded in the worker, so it embeds: a
forward pass over ``PREFIX + text`` that stops after the decoder layer a fifth of the
way up (``n // 5``: the 6th of SmolLM2's 30 layers; a forward hook raises once that
layer's output exists, so the rest of the model never runs). The hidden states of the text's
tokens (the prefix takes the first position, the attention sink whose huge norm would
dominate a mean) are mean-pooled, standardised per dimension against a fixed set of
neutral reference sentences (removes the large common direction of a decoder's states,
which otherwise makes every cosine ~1) and L2-normalised.

A message is embedded on every turn that recalls or picks reminders, so this forward is
paid before the first token. The recipe used to concatenate this layer with the last
one (a whole forward); on SmolLM2-135M (bench/bench_recall.py) the quarter-depth layer
alone has one pick fewer of 12 on set A's top-3 and on set B's top-1, the rest the same
(9-10/12), at 0.18x of the message's prefill instead of 0.79x on the CPU (docs/BENCHMARKS.md
"Memory recall"). Layer 6 then costs 0.7x of layer 8's forward, with the same 20-memory
reminder picks and adherence on the memory-depth cases and recall within a pick of it
(a sweep over layers 2-8, docs/BENCHMARKS.md; layer 5 lost two top-1 picks of 12 on the
held-out recall set). A model whose decoder layers are not found at
``model.get_decoder().layers`` runs whole and reads ``hidden_states`` (same vector).

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
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch

from injection.base import run_here
from injection.model.lean_step import INERT

__all__ = ["HiddenStateEmbedder", "REFERENCE_SENTENCES", "early_exit"]

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
    """``embed(tenant, texts)`` -> ``[n, d]`` unit vectors (float32, CPU). ``forward(kind,
    fn)`` runs a call's missing vectors, one ``fn`` ("embed"; ``BatchEngine.forward``: on
    the engine's scheduler thread; default: here)."""

    def __init__(self, adapter: Any, *, max_entries: int = 4096,
                 forward: Callable[[str, Callable[[], Any]], Any] = run_here) -> None:
        self.adapter, self.forward = adapter, forward
        self.max_entries = max(1, int(max_entries))
        n = int(getattr(adapter, "num_layers", 0) or adapter.model.config.num_hidden_layers)
        # index into hidden_states (0 = embeddings, k = decoder layer k's output)
        self.layer = max(1, n // 5)
        self._cache: OrderedDict[tuple[str, str, str], torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()
        self._ref: tuple[torch.Tensor, torch.Tensor] | None = None
        self.hits = self.misses = 0

    # -- public ----------------------------------------------------------------------
    def embed(self, tenant: str, texts: Sequence[str]) -> torch.Tensor:
        """The texts' vectors: cached ones, and the missing ones computed in one forward
        job (a text repeated in ``texts`` is computed once and counted a hit after)."""
        fp = self.adapter.fingerprint
        keys = [(tenant, fp, hashlib.sha256(text.encode("utf-8")).hexdigest())
                for text in texts]
        found: dict[tuple[str, str, str], torch.Tensor] = {}
        missing: dict[tuple[str, str, str], str] = {}
        with self._lock:
            for key, text in zip(keys, texts, strict=True):
                vec = self._cache.get(key)
                if vec is not None:
                    self._cache.move_to_end(key)
                    found[key] = vec
                if vec is not None or key in missing:
                    self.hits += 1
                else:
                    missing[key] = text
        if missing:
            vecs = self.forward("embed", lambda: [self._vector(t) for t in missing.values()])
            found.update(zip(missing, vecs, strict=True))
            with self._lock:
                self.misses += len(missing)
                for key in missing:
                    self._cache[key] = found[key]
                    while len(self._cache) > self.max_entries:
                        self._cache.popitem(last=False)
        return torch.stack([found[key] for key in keys]) if keys else torch.empty(0)

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
    def _pooled(self, text: str) -> torch.Tensor:
        tok = self.adapter.tokenizer
        head = tok(PREFIX, add_special_tokens=False)["input_ids"]
        body = tok(text, add_special_tokens=False)["input_ids"][-MAX_TEXT_TOKENS:] or head[-1:]
        ids = torch.tensor([head + body], device=self.adapter.device)
        hidden = early_exit(self.adapter.model, ids, self.layer)
        return hidden[0, len(head):].float().mean(0).cpu()

    def _reference(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._ref is None:
            m = torch.stack([self._pooled(s) for s in REFERENCE_SENTENCES])
            self._ref = (m.mean(0), m.std(0) + 1e-3)
        return self._ref

    def _vector(self, text: str) -> torch.Tensor:
        mu, sd = self._reference()
        return torch.nn.functional.normalize((self._pooled(text) - mu) / sd, dim=-1)


# -- a forward that stops early ------------------------------------------------------------
class _Exit(Exception):
    def __init__(self, hidden: torch.Tensor) -> None:
        self.hidden = hidden


# per decoder layer: the threads whose forward should stop there. The hook stays on the
# layer (the batch engine's forwards on other threads only read one attribute), so no
# hook is added or removed while another thread runs the model.
_EXITS: weakref.WeakKeyDictionary[torch.nn.Module, threading.local] = weakref.WeakKeyDictionary()
_EXITS_LOCK = threading.Lock()


def early_exit(model: Any, ids: torch.Tensor, index: int) -> torch.Tensor:
    """``hidden_states[index]`` of ``model(ids)`` (``[1, t, d]``), running the decoder
    layers up to ``index`` only; the whole forward where its layers are not found."""
    flag = _exit_flag(model, index)
    with torch.inference_mode():
        if flag is None:
            out = model(input_ids=ids, output_hidden_states=True, use_cache=False,
                        logits_to_keep=1)
            return out.hidden_states[index]
        flag.on = True
        try:
            model(input_ids=ids, use_cache=False, logits_to_keep=1)
        except _Exit as stop:
            return stop.hidden
        finally:
            flag.on = False
    raise RuntimeError("the forward passed its exit layer without stopping")


def _exit_flag(model: Any, index: int) -> threading.local | None:
    try:
        layers = model.get_decoder().layers
    except AttributeError:
        return None
    if not 1 <= index < len(layers):  # the last entry of hidden_states is after the norm
        return None
    layer = layers[index - 1]
    with _EXITS_LOCK:
        flag = _EXITS.get(layer)
        if flag is None:
            flag = _EXITS[layer] = threading.local()
            layer.register_forward_hook(_stopper(flag))
    return flag


def _stopper(flag: threading.local):
    def hook(_module, _args, output):
        if getattr(flag, "on", False):
            raise _Exit(output[0] if isinstance(output, tuple) else output)
    setattr(hook, INERT, True)  # off outside ``early_exit``: the lean step may stand in
    return hook
