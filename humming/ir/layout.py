"""Group layouts: map per-group tensors (scales, zeros) to elements and reduce elements to groups.

A group layout is ``group_shape = (bn, bk)`` (``-1`` = the whole dimension) or, with act-order, a
``g_idx`` giving the group of each input column. These two functions are the only place that knows how.
"""

from __future__ import annotations

import torch

from .weight import cdiv

__all__ = ["expand_groups", "group_reduce", "parse_group_size"]


def parse_group_size(group_size) -> tuple[int, int]:
    """``128`` -> ``(1, 128)``; ``-1`` -> per-channel ``(1, -1)``; ``"tensor"`` -> ``(-1, -1)``;
    a pair ``(bn, bk)`` is a 2-D block."""
    if group_size == "tensor":
        return (-1, -1)
    if group_size == "channel":
        return (1, -1)
    if isinstance(group_size, int) and not isinstance(group_size, bool):
        if group_size == -1 or group_size > 0:
            return (1, group_size)
    elif isinstance(group_size, (tuple, list)) and len(group_size) == 2:
        pair = tuple(group_size)
        if all(isinstance(v, int) and not isinstance(v, bool) and (v == -1 or v > 0) for v in pair):
            return pair
    raise ValueError(
        f"group_size: expected a positive int (group along K), -1 (per-channel), 'tensor', or a pair "
        f"(bn, bk) for 2-D blocks, got {group_size!r}"
    )


def _block(n: int, k: int, group_shape: tuple[int, int]) -> tuple[int, int]:
    bn, bk = group_shape
    return (n if bn == -1 else bn, k if bk == -1 else bk)


def _expand_g_idx(g_idx: torch.Tensor, lead: tuple[int, ...], n: int) -> torch.Tensor:
    """g_idx ``[K]`` or ``[*lead, K]`` -> int64 ``[*lead, N, K]`` gather index."""
    idx = g_idx.to(torch.int64)
    if idx.dim() == 1:
        idx = idx.expand(*lead, idx.shape[0])
    return idx.unsqueeze(-2).expand(*lead, n, idx.shape[-1])


def expand_groups(t: torch.Tensor, n: int, k: int, group_shape, g_idx: torch.Tensor | None = None) -> torch.Tensor:
    """Per-group tensor ``[*lead, gN, gK]`` -> per-element ``[*lead, N, K]``."""
    lead = tuple(t.shape[:-2])
    if g_idx is not None:
        return torch.gather(t, -1, _expand_g_idx(g_idx, lead, n))
    bn, bk = _block(n, k, group_shape)
    out = t.repeat_interleave(bn, dim=-2) if bn > 1 else t
    out = out.repeat_interleave(bk, dim=-1) if bk > 1 else out
    return out[..., :n, :k]


def group_reduce(
    x: torch.Tensor, group_shape, op: str, g_idx: torch.Tensor | None = None, n_groups: int | None = None
) -> torch.Tensor:
    """Reduce ``[*lead, N, K]`` over each group with ``op`` in {"amax", "amin"} -> ``[*lead, gN, gK]``."""
    lead, n, k = tuple(x.shape[:-2]), x.shape[-2], x.shape[-1]
    if g_idx is not None:
        if n_groups is None:
            n_groups = int(g_idx.max()) + 1
        out = torch.zeros(*lead, n, n_groups, dtype=x.dtype, device=x.device)  # empty groups: 0
        return out.scatter_reduce(-1, _expand_g_idx(g_idx, lead, n), x, reduce=op, include_self=False)
    bn, bk = _block(n, k, group_shape)
    gn, gk = cdiv(n, bn), cdiv(k, bk)
    fill = float("-inf") if op == "amax" else float("inf")
    padded = torch.nn.functional.pad(x, (0, gk * bk - k, 0, gn * bn - n), value=fill)
    blocks = padded.reshape(*lead, gn, bn, gk, bk)
    reduce = torch.amax if op == "amax" else torch.amin
    return reduce(blocks, dim=(-3, -1))
