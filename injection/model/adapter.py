"""ModelAdapter: preference K/V computation and injected generation on a HF causal LM.

Traps handled here (each covered by tests/injection/test_adapter.py):

* transformers 5 has no legacy tuple caches: the injected cache is a fresh
  ``DynamicCache`` filled with ``update(k, v, layer_idx)``;
* ``generate`` derives ``cache_position`` from ``input_ids``: we pass the
  prefix ids followed by the prompt ids and a full-length attention mask;
* on CPU a PackedKV's "device copy" is the same storage, and the cache grows:
  the cache is built from fresh tensors (scaled values, cloned keys), so a
  request never mutates the cached PackedKV. Keys are never scaled.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import torch
from transformers import DynamicCache, StoppingCriteriaList
from transformers.cache_utils import DynamicLayer

from injection.base import GenerationOutput, PreferenceModel, SegmentSplit
from injection.devices import KVTimer, to_host
from injection.engine.stopping import GenerationWatch, admitted
from injection.errors import ContextLengthExceeded, InvalidRequest, ModelLoadError
from injection.hostmem import KV_COPIES
from injection.kvcache.packed import PackedKV
from injection.kvcache.pieces import KVPieces
from injection.model.dtypes import resolve_dtype
from injection.model.fingerprint import model_fingerprint
from injection.model.lean_step import serving
from injection.prompting.template import ChatRenderer, PromptParts

__all__ = ["ModelAdapter", "resolve_dtype"]


class ModelAdapter(PreferenceModel):
    """A causal LM + tokenizer behind the engine's :class:`PreferenceModel` interface.

    Args:
        model: a transformers causal LM (any attention layout: MHA/GQA/MQA).
        tokenizer: its tokenizer (BOS handling and chat template come from it).
        device: where the model runs; K/V caches stay on CPU.
        dtype: the model's dtype (PackedKV from ``compute_kv`` keeps it).
    """

    def __init__(self, model: Any, tokenizer: Any, *, device: torch.device | str, dtype: torch.dtype) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.dtype = dtype
        text_cfg = model.config.get_text_config(decoder=True)
        self.num_layers: int = text_cfg.num_hidden_layers
        self.num_kv_heads: int = getattr(text_cfg, "num_key_value_heads", None) or text_cfg.num_attention_heads
        self.max_positions: int | None = getattr(text_cfg, "max_position_embeddings", None)
        self.fingerprint = model_fingerprint(model, tokenizer, dtype)
        self.renderer = ChatRenderer(tokenizer)
        # Sliding-window layers (Mistral, Gemma's hybrids) get plain layers too: they keep
        # every token and the model's mask applies the window (exact, shown by the tests;
        # it costs full-attention memory). A config makes DynamicCache pick the layers of
        # other kinds (chunked, linear/recurrent state), which hold no plain per-token K/V.
        self._cache_config = model.config if _layer_kinds(text_cfg) - PLAIN_LAYERS else None
        # the batch engine pads, merges and slices plain per-token layers only
        self.supports_batching = self._cache_config is None
        self.matmul: Any = None  # ``cpu_matmul.MatmulChoice`` where load_adapter measured one
        self.cpu_threads = "engine"  # who computes on a CPU's cores (``cpu_threads.MODES``)
        # the engine's forwards without transformers' plumbing where they reproduce the
        # model's bit for bit (``lean_step.py``); None: the model's own forward
        self.lean: Any = None
        self.fused = 0  # projection groups stacked into one product each (``fused.py``)

    # -- PreferenceModel -----------------------------------------------------------
    def compute_kv(self, text: str) -> PackedKV:
        """One forward pass over ``text`` as the start of a sequence (BOS unless the text
        renders one); K/V on CPU, pinned with CUDA."""
        ids = self.renderer.encode(text, first=True)
        self._check_length(len(ids))
        input_ids = torch.tensor([ids], device=self.device)
        with torch.inference_mode():
            cache = self._prefill(input_ids, DynamicCache(config=self.model.config))
            layers = [(layer.keys[0], layer.values[0]) for layer in cache.layers]
            del cache
        if len(layers) != self.num_layers:
            raise ModelLoadError(f"cache has {len(layers)} layers, model {self.num_layers}")
        # stacked outside inference mode: the cached tensors are ordinary tensors
        with torch.no_grad():
            keys = to_host(torch.stack([k for k, _ in layers]))
            values = to_host(torch.stack([v for _, v in layers]))
        return PackedKV(keys, values, ids)

    def compute_kv_ids(self, ids: list[int] | tuple[int, ...],
                       parent: PackedKV | None = None) -> PackedKV:
        """K/V of ``ids`` as the continuation of ``parent`` (unscaled), holding only the
        tokens of ``ids``: a chained segment. ``parent`` None: ``ids`` start the sequence."""
        ids = list(ids)
        start = parent.num_tokens if parent is not None else 0
        self._check_length(start + len(ids))
        with torch.inference_mode():
            cache = (self.build_cache(parent, 1.0) if parent is not None
                     else DynamicCache(config=self._cache_config))
            cache = self._prefill(torch.tensor([ids], device=self.device), cache)
            layers = [(layer.keys[0, :, start:], layer.values[0, :, start:])
                      for layer in cache.layers]
            del cache
        with torch.no_grad():
            keys = to_host(torch.stack([k for k, _ in layers]))
            values = to_host(torch.stack([v for _, v in layers]))
        return PackedKV(keys, values, ids)

    def _prefill(self, input_ids: torch.Tensor, cache: Any) -> Any:
        """``input_ids`` through the model after ``cache``; returns the extended cache (by
        the lean forward where it stands for the model: ``lean_step.py``)."""
        if (lean := serving(self)) is not None:
            lean(input_ids, None, None, cache)
            return cache
        return self.model(input_ids=input_ids, past_key_values=cache, use_cache=True,
                          logits_to_keep=1).past_key_values

    def split_segment(self, segment: str, context: str, instructions: str) -> SegmentSplit | None:
        """Tenant + member parts of the injected turn (None: one segment). Layers other than
        full or sliding attention keep no plain per-token K/V to chain: one segment there."""
        if not self.supports_batching:
            return None
        return self.renderer.tenant_split(segment, context, instructions)

    def generate(
        self, prompt: str, injected: PackedKV | None, alpha: float, max_new_tokens: int,
        **sampling: Any,
    ) -> GenerationOutput:
        """Generate after ``prompt`` with ``injected`` as past K/V, values scaled by ``alpha``.

        ``sampling``: ``temperature`` (0 = greedy), ``top_p``, ``seed``; ``stop`` (strings
        the reply ends before), ``on_text`` and ``cancelled`` (see injection.engine.stopping);
        ``admit`` (asked with the prompt's token count: ``stopping.admitted``).
        """
        started = time.perf_counter()
        watch_opts = {k: sampling.pop(k) for k in ("stop", "on_text", "cancelled")
                      if k in sampling}
        on_failure = sampling.pop("on_failure", None)
        prompt_ids = self.renderer.encode(prompt, first=injected is None)
        prefix = list(injected.token_ids) if injected is not None else []
        if not prompt_ids:
            raise InvalidRequest("prompt is empty")
        input_ids = prefix + prompt_ids
        max_new_tokens = admitted(sampling, len(input_ids), max_new_tokens)
        self._check_length(len(input_ids) + max_new_tokens)
        with torch.inference_mode():
            with KVTimer(self.device) as timer:
                cache = self.build_cache(injected, alpha) if injected is not None else None
            watch = GenerationWatch(self.tokenizer, len(input_ids), **watch_opts)
            try:
                ids = self._run_generate(input_ids, cache, max_new_tokens, sampling, watch)
            except BaseException:  # billing: the tokens it generated (``ExecutionRequest``)
                if on_failure is not None:
                    on_failure(watch.steps)
                raise
            del cache
        gen = ids[len(input_ids):]
        reason = watch.finish(gen, max_new_tokens, self._eos_ids())
        first = watch.first_token_at
        return GenerationOutput(
            watch.text, gen, prompt_ids, kv_transfer_ms=timer.elapsed_ms(),
            kv_bytes_gpu=timer.peak_bytes, finish_reason=reason,
            first_token_ms=(first - started) * 1000.0 if first is not None else 0.0,
        )

    def _eos_ids(self) -> set[int]:
        eos = self.model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos]
        return {int(e) for e in [*eos, self.tokenizer.eos_token_id] if e is not None}

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """The tokenizer's chat template with a generation prompt, as text."""
        return self.renderer.render(messages)

    def split_prompt(self, context: str, messages: list[dict[str, str]]) -> PromptParts:
        """``context`` as the template's system turn (the injected segment) + the rest."""
        return self.renderer.split(context, messages)

    def plain_prompt(self, context: str, messages: list[dict[str, str]]) -> str:
        """The whole conversation with ``context`` rendered in the prompt (no injection)."""
        return self.renderer.plain(context, messages)

    def prompt_tokens(self, context: str, messages: list[dict[str, str]]) -> int:
        """Tokens the model sees for this conversation (injected segment included)."""
        return self.renderer.count(context, messages)

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    # -- injection ---------------------------------------------------------------------
    def build_cache(self, injected: PackedKV | KVPieces, alpha: float, *, room: int = 0,
                    layer: Callable[..., Any] | None = None) -> DynamicCache:
        """A fresh DynamicCache holding ``injected`` on this device, values scaled by alpha.

        Each cached piece is copied once, straight into one buffer on this device with
        ``room`` spare columns (``KVPieces.fill``: a non-blocking transfer, never the
        caller's storage); keys unscaled, values scaled in place when ``alpha != 1``.
        ``layer(k, v, n)`` makes a layer over one layer's ``[1, H, T + room, D]`` buffers
        holding ``n`` tokens (the engine's in-place ``SlabLayer``; default a plain layer).
        """
        self._check_compatible(injected)
        pieces = KVPieces.of(injected)
        n = pieces.num_tokens
        keys, values = pieces.empty(self.device, room)
        pieces.fill(keys, values)
        if alpha != 1.0:
            values[:, :, :n].mul_(alpha)
        cache = DynamicCache(config=self._cache_config)
        if self._cache_config is None:  # plain layers: over the buffers, no copy
            make = layer or _plain_layer
            cache.layers = [make(keys[i].unsqueeze(0), values[i].unsqueeze(0), n)
                            for i in range(self.num_layers)]
            return cache
        for i in range(self.num_layers):  # layers of their own kinds copy what they keep
            cache.update(keys[i, None, :, :n], values[i, None, :, :n], i)
            KV_COPIES.add("cache_update", pieces.nbytes // self.num_layers)
        return cache

    def _run_generate(
        self, input_ids: list[int], cache: DynamicCache | None, max_new_tokens: int,
        sampling: dict[str, Any], watch: GenerationWatch,
    ) -> list[int]:
        ids = torch.tensor([input_ids], device=self.device)
        kwargs: dict[str, Any] = {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),  # prefix + prompt, full length
            "generation_config": self._generation_config(max_new_tokens, sampling),
            "stopping_criteria": StoppingCriteriaList([watch]),
        }
        if cache is not None:
            kwargs["past_key_values"] = cache
        seed = sampling.get("seed")
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices, enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(int(seed))
            out = self.model.generate(**kwargs)
        return out[0].tolist()

    def _generation_config(self, max_new_tokens: int, sampling: dict[str, Any]) -> Any:
        gc = copy.deepcopy(self.model.generation_config)
        temperature = float(sampling.get("temperature") or 0.0)
        gc.max_new_tokens = int(max_new_tokens)
        gc.max_length = None
        gc.min_new_tokens = None
        gc.num_beams = 1
        if temperature > 0.0:
            gc.do_sample, gc.temperature = True, temperature
            gc.top_p = float(sampling.get("top_p", 1.0))  # top_k: the model's (engine too)
        else:
            gc.do_sample, gc.temperature, gc.top_p, gc.top_k = False, None, None, None
        if gc.pad_token_id is None:
            gc.pad_token_id = self.tokenizer.pad_token_id or self.tokenizer.eos_token_id
        return gc

    def _check_compatible(self, kv: PackedKV) -> None:
        if kv.num_layers != self.num_layers or kv.num_heads != self.num_kv_heads:
            raise InvalidRequest(
                f"injected K/V has L={kv.num_layers}, H={kv.num_heads}; model expects "
                f"L={self.num_layers}, H={self.num_kv_heads}"
            )
        if kv.dtype != self.dtype:
            raise InvalidRequest(f"injected K/V dtype {kv.dtype} != model dtype {self.dtype}")

    def _check_length(self, n: int) -> None:
        if self.max_positions and n > self.max_positions:
            raise ContextLengthExceeded(
                f"{n} tokens exceed the model's {self.max_positions} positions"
            )


PLAIN_LAYERS = frozenset({"full_attention", "sliding_attention"})


def _layer_kinds(cfg: Any) -> set[str]:
    """The attention kinds of the model's layers (``layer_types``, else by the config)."""
    types = getattr(cfg, "layer_types", None)
    if types:
        return set(types)
    return {"sliding_attention" if getattr(cfg, "sliding_window", None) else "full_attention"}


def _plain_layer(keys: torch.Tensor, values: torch.Tensor, n: int) -> DynamicLayer:
    """A plain layer holding the first ``n`` tokens of ``keys``/``values`` (views)."""
    layer = DynamicLayer()
    layer.lazy_initialization(keys, values)
    layer.keys, layer.values = keys[:, :, :n], values[:, :, :n]
    return layer
