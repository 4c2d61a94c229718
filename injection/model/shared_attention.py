"""A decoding step's attention where several rows begin with the same K/V (a tenant's
instructions), reading those columns once for all of them.

Every row of the batch holds its own copy of its injected K/V, so with 16 members of one
tenant at once a step's attention read the tenant's columns 16 times: 48.6 ms of a 104 ms
step at 16 rows of about 790 tokens (``bench/profile_tenant_step.py``). Here, for a group
of rows whose first ``P`` columns are equal (``BatchCache`` checks it when a row joins),
the scores against those columns come from one product over one row's copy, the scores
against each row's own later columns from a product over a short window, and one softmax
over both. Rows in no group attend as the model does.

The result equals the model's attention up to float rounding (a different order of the
same sums), not bit for bit: ``LeanStep`` uses it only where the engine hands it groups.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

__all__ = ["HeadGroup", "attend"]


class HeadGroup(NamedTuple):
    """Rows whose first ``tokens`` real columns are equal; ``source`` holds the copy read;
    ``starts[i]``: the column where row ``rows[i]``'s own part begins."""

    rows: tuple[int, ...]
    source: int
    first: int  # the source row's first real column
    tokens: int
    starts: tuple[int, ...]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
           scaling: float, groups: list[HeadGroup],
           model: Callable[..., torch.Tensor]) -> torch.Tensor:
    """Attention output ``[B, 1, Hq, D]`` for one query per row (``q [B, Hq, 1, D]``,
    ``k``/``v [B, Hkv, W, D]``): grouped rows as above, the others by ``model(q, k, v,
    mask)`` (the model's attention, same shapes)."""
    out = q.new_empty(q.shape[0], 1, q.shape[1], q.shape[3])
    done: set[int] = set()
    for g in groups:
        pick = _rows(g.rows, q.device)
        out[pick] = _grouped(q[pick], k, v, pick, g, scaling)
        done.update(g.rows)
    rest = [r for r in range(q.shape[0]) if r not in done]
    if rest:
        pick = _rows(tuple(rest), q.device)
        out[pick] = model(q[pick], k[pick], v[pick], None if mask is None else mask[pick])
    return out


def _rows(rows: tuple[int, ...], device: torch.device) -> slice | torch.Tensor:
    """A slice where the rows are consecutive (views, no copy), else an index."""
    if rows == tuple(range(rows[0], rows[0] + len(rows))):
        return slice(rows[0], rows[0] + len(rows))
    return torch.tensor(rows, device=device)


def _grouped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pick: slice | torch.Tensor,
             g: HeadGroup, scaling: float) -> torch.Tensor:
    """The group's rows: ``q`` theirs (in ``g.rows`` order), ``k``/``v`` the batch's,
    ``pick`` the group's rows in it."""
    rows, heads, _, dim = q.shape
    kv_heads, width = k.shape[1], k.shape[2]
    per = heads // kv_heads
    qs = (q * scaling).reshape(rows, kv_heads, per, dim)
    head_k = k[g.source, :, g.first:g.first + g.tokens]  # [Hkv, P, D]: one copy for all rows
    head_v = v[g.source, :, g.first:g.first + g.tokens]
    by_head = qs.transpose(0, 1).reshape(kv_heads, rows * per, dim)
    shared = torch.matmul(by_head, head_k.transpose(1, 2))  # [Hkv, R*G, P]
    w0 = min(g.starts)
    own = torch.matmul(qs, k[pick, :, w0:].transpose(-1, -2))  # [R, Hkv, G, S]: own columns
    cols = torch.arange(w0, width, device=q.device)
    hidden = cols.unsqueeze(0) < torch.tensor(g.starts, device=q.device).unsqueeze(1)
    own.masked_fill_(hidden[:, None, None, :], float("-inf"))
    top = torch.maximum(shared.amax(-1).reshape(kv_heads, rows, per).transpose(0, 1),
                        own.amax(-1))  # [R, Hkv, G]
    shared = shared.sub_(top.transpose(0, 1).reshape(kv_heads, rows * per, 1)).exp_()
    own = own.sub_(top.unsqueeze(-1)).exp_()
    total = shared.sum(-1).reshape(kv_heads, rows, per).transpose(0, 1) + own.sum(-1)
    out = torch.matmul(shared, head_v).reshape(kv_heads, rows, per, dim).transpose(0, 1)
    out = out + torch.matmul(own, v[pick, :, w0:])
    return (out / total.unsqueeze(-1)).reshape(rows, heads, dim).unsqueeze(1)
