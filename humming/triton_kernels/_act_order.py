"""Act-order weights on the dense scaled GEMM, private: each weight sorted by group once
(:func:`humming.ir.act_order.sort_act_order`, cached per weight object) with the column permutation that
:func:`.act_quant.quantize_activation` gathers the activations by."""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from ..ir.act_order import sort_act_order
from ..ir.weight import QuantizedWeight

__all__ = ["ActOrderLayout", "act_order_layout"]


@dataclass(frozen=True)
class ActOrderLayout:
    """``weight``: the act-order weight with K sorted by group (no ``g_idx``); ``perm``: int32 ``[K]``, the
    weight's column ``j`` is the original column ``perm[j]``."""

    weight: QuantizedWeight
    perm: torch.Tensor


_layouts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # act-order weight -> layout or reason


def act_order_layout(qw: QuantizedWeight) -> ActOrderLayout | str:
    """The sorted layout of 2-D act-order weight ``qw`` (made on first use, then cached), or the reason its
    groups cannot be sorted into a plain per-group layout."""
    layout = _layouts.get(qw)
    if layout is None:
        sorted_qw = sort_act_order(qw)
        layout = sorted_qw if isinstance(sorted_qw, str) else ActOrderLayout(sorted_qw[0], sorted_qw[1].int())
        _layouts[qw] = layout
    return layout
