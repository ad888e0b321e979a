"""Act-order weights (GPTQ ``desc_act``: ``g_idx`` gives each input column's scale group) in K order sorted
by group, so that kernels which need contiguous groups along K can run them.

``act_order_perm(qw)`` is the column order (a stable sort of ``g_idx``); ``sort_act_order(qw)`` permutes the
weight's K by it: ``dequantize(sorted) == dequantize(qw)[:, perm]`` bit for bit, and where every group then
holds exactly ``group_size`` consecutive columns (what GPTQ writes) the result is a plain per-group weight
without ``g_idx``. ``x @ W^T == x[:, perm] @ W[:, perm]^T``: a kernel reads the sorted weight and the
activations' columns gathered by ``perm``.

Quantized activations of an act-order weight (``humming.linear(x, qw, act=...)``) are quantized in this
order: ``quantize_activation(x[:, perm], act)``. Per-token and per-tensor scales do not depend on the
order (the codes are x's codes, permuted); groups along K span consecutive columns of ``x[:, perm]``, the
columns that share the weight's scale groups.
"""

from __future__ import annotations

import torch

from .packing import pack_codes
from .quantize import unpacked_codes
from .weight import QuantizedWeight

__all__ = ["act_order_perm", "sort_act_order"]


def act_order_perm(qw: QuantizedWeight) -> torch.Tensor | None:
    """int64 ``[K]``: the input columns of a 2-D act-order weight sorted by group (stable: columns of one
    group keep their order); ``None`` without ``g_idx``."""
    if not isinstance(qw, QuantizedWeight):
        raise ValueError(f"qw: expected a QuantizedWeight, got {type(qw).__name__}")
    if qw.g_idx is None:
        return None
    if qw.num_experts is not None:
        raise ValueError(f"qw: act_order_perm takes a 2-D weight [N, K], got an expert-stacked {qw.shape}")
    return torch.sort(qw.g_idx, stable=True).indices


def sort_act_order(qw: QuantizedWeight) -> tuple[QuantizedWeight, torch.Tensor] | str:
    """``(sorted weight, perm)`` for a 2-D act-order weight: codes (and nothing else: scales and zero points
    are per group) permuted along K by :func:`act_order_perm`, ``g_idx`` dropped; or, where the sorted groups
    are not ``group_size`` consecutive columns each (a group of another size, an empty one: a row-parallel
    shard of a GPTQ weight), the reason it cannot be sorted into a plain per-group layout."""
    perm = act_order_perm(qw)
    if perm is None:
        raise ValueError("qw: sort_act_order needs an act-order weight (g_idx set)")
    k = qw.K
    g = k if qw.group_shape[1] == -1 else qw.group_shape[1]
    groups = -(-k // g)
    expected = torch.arange(k, device=perm.device) // g
    if not torch.equal(qw.g_idx[perm].to(expected.dtype), expected):
        return f"act-order groups are not {g} consecutive columns each once sorted (g_idx of another layout)"
    codes = unpacked_codes(qw)[:, perm]
    take = lambda t: None if t is None else t[:, :groups].contiguous()
    sorted_qw = qw.replace(
        qweight=pack_codes(codes, qw.bits), scales=take(qw.scales), zeros=take(qw.zeros), g_idx=None, bias=qw.bias
    )
    return sorted_qw, perm
