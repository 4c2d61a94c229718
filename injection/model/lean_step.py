"""The engine's forwards without transformers' per-call plumbing (llama-family models).

A decoding step feeds one token per row through every layer. Through the model's own
``forward`` each step (and each prefill) also passes through transformers' decorators, keyword plumbing,
output records and ``nn.Module.__call__`` for some 400 modules; on a CPU at batch 1 that
Python is a sizeable share of a step (docs/benchmarks/vs-peer.md, "where batch-1 decode
goes"). ``lean_step`` runs the same computation from the model's own parts: the same
modules' ``forward`` (the linear layers' CPU kernels included), the model's own
rotary-embedding, mask and attention functions, the same operations in the same order,
so the logits are the model's bit for bit (tests/injection/test_lean_step.py checks
``torch.equal`` on the test model and on both shipped models).

It serves models whose decoder layer is the llama layout (pre-norm attention, then a
gated MLP): ``model_type`` in ``FAMILIES``, every layer full attention, no module hooks.
Any other model gets None, and the engine calls the model's ``forward`` as before.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from transformers.masking_utils import create_causal_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from injection.model import shared_attention
from injection.model.fused import Stacked, stacked_of

__all__ = ["FAMILIES", "LeanStep", "lean_step", "serving"]

FAMILIES = ("llama", "qwen2")  # model types whose decoder layer this module reproduces
RMS_NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm")  # norms whose formula ``_norm`` repeats
ATTENTION = ("sdpa", "eager")  # attention implementations it calls as the model would


class _Layer(NamedTuple):
    """One decoder layer's parts, bound once (their ``forward``, not ``__call__``)."""

    norm1: Callable[..., torch.Tensor]
    attn: Any
    q: Callable[..., torch.Tensor]
    k: Callable[..., torch.Tensor]
    v: Callable[..., torch.Tensor]
    o: Callable[..., torch.Tensor]
    norm2: Callable[..., torch.Tensor]
    gate: Callable[..., torch.Tensor]
    up: Callable[..., torch.Tensor]
    down: Callable[..., torch.Tensor]
    act: Callable[..., torch.Tensor]
    qkv: Stacked | None  # q, k and v from one product (``fused.py``); None: three
    gate_up: Stacked | None


def _bound(layer: Any) -> _Layer:
    attn, mlp = layer.self_attn, layer.mlp
    return _Layer(_norm(layer.input_layernorm), attn, attn.q_proj.forward,
                  attn.k_proj.forward, attn.v_proj.forward, attn.o_proj.forward,
                  _norm(layer.post_attention_layernorm), mlp.gate_proj.forward,
                  mlp.up_proj.forward, mlp.down_proj.forward, mlp.act_fn.forward,
                  stacked_of(attn), stacked_of(mlp))


def _norm(module: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """The RMS norm's ``forward``; for a float32 llama-family norm the same operations
    with the intermediate ones in place (its casts are no-ops at float32)."""
    weight = getattr(module, "weight", None)
    if type(module).__name__ not in RMS_NORMS or weight is None or weight.dtype != torch.float32:
        return module.forward
    eps = module.variance_epsilon

    def norm(h: torch.Tensor) -> torch.Tensor:
        if h.dtype != torch.float32:
            return module.forward(h)
        variance = h.pow(2).mean(-1, keepdim=True)
        return weight * (h * variance.add_(eps).rsqrt_())
    return norm


def _rope_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and ``sin`` shaped for ``[B, heads, 1, D]``, ``sin``'s first half negated:
    ``roll(x) * sin`` is then ``rotate_half(x) * sin`` exactly (a sign moved, no rounding)."""
    half = sin.shape[-1] // 2
    signed = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
    return cos.unsqueeze(1), signed.unsqueeze(1)


def _rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """The model's ``x * cos + rotate_half(x) * sin`` in the same order, with fewer calls."""
    return (x * cos) + (x.roll(x.shape[-1] // 2, -1) * signed_sin)


class LeanStep:
    """``step(ids, mask, positions, cache)``: the last position's logits ``[B, V]`` of a
    decoding step or a prefill (``ids [B, n]``), appending each layer's K/V to ``cache``
    as the model's forward would; ``fits(model)`` says whether it stands for that model."""

    def __init__(self, model: Any) -> None:
        inner, cfg = model.model, model.config
        family = sys.modules[type(inner.layers[0].self_attn).__module__]
        self._attend = ALL_ATTENTION_FUNCTIONS.get_interface(
            cfg._attn_implementation, family.eager_attention_forward)
        self.model, self._modules = model, list(model.modules())
        self._config, self._inner, self._head = cfg, inner, model.lm_head.forward
        self._layers = [_bound(x) for x in inner.layers[: cfg.num_hidden_layers]]
        self._head_dim = inner.layers[0].self_attn.head_dim
        grouped = getattr(inner.layers[0].self_attn, "num_key_value_groups", 1) > 1
        self._sdpa_gqa = cfg._attn_implementation == "sdpa" and grouped

    def fits(self, model: Any) -> bool:
        """Whether it computes ``model``'s forward now: the model it was built from, with no
        hook registered since (a hook it would not call; checked per step, ~300 modules)."""
        return model is self.model and not _hooked(self._modules)

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor | None,
                 positions: torch.Tensor | None, cache: Any,
                 last: torch.Tensor | None = None) -> torch.Tensor:
        """The last position's logits ``[B, V]`` for ``ids [B, n]`` after ``cache`` (which
        it extends); ``mask`` and ``positions`` as the model takes them (None: derived
        as the model derives them, from the cache's length); ``last [B]``: each row's
        position whose logits to give instead (rows padded after their tokens)."""
        inner = self._inner
        h = inner.embed_tokens.forward(ids)
        rows, n = ids.shape
        if positions is None:
            positions = (torch.arange(n, device=h.device) + cache.get_seq_length()).unsqueeze(0)
        mask = create_causal_mask(config=self._config, inputs_embeds=h, attention_mask=mask,
                             cache=cache, position_ids=positions)
        cos, sin = _rope_tables(*inner.rotary_emb.forward(h, positions))
        for i, part in enumerate(self._layers):
            h = self._layer(part, i, cache, h, mask, cos, sin, (rows, n))
        h = inner.norm.forward(h)
        h = h[:, -1:] if last is None else h[torch.arange(rows, device=h.device), last, None]
        return self._head(h)[:, -1]

    def _layer(self, p: _Layer, i: int, cache: Any, h: torch.Tensor, mask: Any, cos: torch.Tensor,
               sin: torch.Tensor, lead: tuple[int, int]) -> torch.Tensor:
        """Decoder layer ``i`` on ``h [B, n, hidden]`` (``lead``: ``(B, n)``), as the
        model's layer computes it."""
        x = p.norm1(h)
        shape = (*lead, -1, self._head_dim)
        q, k, v = p.qkv(x) if p.qkv is not None else (p.q(x), p.k(x), p.v(x))
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        k, v = cache.update(k, v, i)
        groups = getattr(cache, "head_groups", None) if lead[1] == 1 else None
        if groups:  # rows sharing a head (``shared_attention.py``)
            out = shared_attention.attend(q, k, v, mask, p.attn.scaling, groups, lambda *a: (
                self._attend(p.attn, *a, dropout=0.0, scaling=p.attn.scaling)[0]))
        elif self._sdpa_gqa and lead[1] > 1 and mask is not None and q.device.type == "cpu":
            out = _masked_gqa(q, k, v, mask, p.attn.scaling)
        else:
            out, _ = self._attend(p.attn, q, k, v, mask, dropout=0.0, scaling=p.attn.scaling)
        h = h + p.o(out.reshape(*lead, -1).contiguous())
        x = p.norm2(h)
        gate, up = p.gate_up(x) if p.gate_up is not None else (p.gate(x), p.up(x))
        return h + p.down(p.act(gate) * up)


def _masked_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                scaling: float) -> torch.Tensor:
    """The model's sdpa attention for several queries under a mask (a prefill of padded
    rows), with each K/V head read by its group of query heads (``enable_gqa``) where
    transformers copies it once per query head first (``repeat_kv``: it leaves that copy
    out only without a mask, for CUDA's kernels). On the CPU the same flash kernel then
    computes the same sums: equal bit for bit, without copying the rows' K/V three times
    (SmolLM2, 14 rows of about 800 columns: 0.6 s of a 2 s prefill)."""
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=0.0, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous()


def serving(adapter: Any) -> LeanStep | None:
    """``adapter.lean`` where it stands for ``adapter.model`` now (``LeanStep.fits``); None:
    the model's own forward (no lean step, or a model swapped or hooked since)."""
    lean = getattr(adapter, "lean", None)
    return lean if lean is not None and lean.fits(adapter.model) else None


INERT = "lean_step_inert"  # a hook with this attribute true does nothing on a lean forward
# transformers' hook for ``output_hidden_states``: it stays once installed and acts only
# while a forward that asked for those outputs collects them
_CAPTURING = ("transformers.utils.output_capturing", "output_capturing_hook")


def _hooked(modules: list[Any]) -> bool:
    """Whether a hook the lean step would not call is registered. Hooks that act only
    inside a forward of their own are not counted (the memory embedder's early exit,
    marked ``INERT``, and transformers' output capturing): they stay registered, and
    would otherwise set the lean step aside for the life of the process."""
    from torch.nn.modules import module as nn_module

    if nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks:
        return True
    return any(not _inert(h) for m in modules if m._forward_hooks or m._forward_pre_hooks
               for hooks in (m._forward_hooks, m._forward_pre_hooks) for h in hooks.values())


def _inert(hook: Any) -> bool:
    if getattr(hook, INERT, False):
        return True
    name = getattr(hook, "__qualname__", "")
    return getattr(hook, "__module__", None) == _CAPTURING[0] and name.endswith(_CAPTURING[1])


def lean_step(model: Any) -> LeanStep | None:
    """The lean step for ``model`` where it reproduces the model's forward (module doc);
    None otherwise."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in FAMILIES:
        return None
    if getattr(cfg, "_attn_implementation", None) not in ATTENTION or model.training:
        return None
    if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or ()):
        return None
    if _hooked(list(model.modules())):
        return None
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not layers or not hasattr(model, "lm_head"):
        return None
    try:
        return LeanStep(model)
    except (AttributeError, ImportError):  # a layout this module does not know
        return None
