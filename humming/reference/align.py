"""The alignment of routed slots into the contiguous grouped layout (:func:`humming.moe.moe_align`), defined in
torch ops with no host sync: the definition the Triton kernels (:mod:`humming.triton_kernels.align`) match bit
for bit."""

from __future__ import annotations

import torch

__all__ = ["align", "max_slots", "padded_rows"]


def padded_rows(num_slots: int, num_experts: int, block_m: int) -> int:
    """``M_pad``: the grouped rows of the worst case, the segment of every expert in use padded by
    ``block_m - 1``; at most ``min(E, num_slots)`` experts are in use (a decode step's few slots then get
    few rows, not a padded segment per expert of the model)."""
    worst = num_slots + torch.sym_min(num_experts, num_slots) * (block_m - 1)
    return (worst + block_m - 1) // block_m * block_m  # not -(-a // b): the size may be symbolic


def max_slots(m_pad: int, num_experts: int, block_m: int) -> int:
    """The most routed slots a routing of ``m_pad`` grouped rows can hold: the largest ``S`` whose
    :func:`padded_rows` is at most ``m_pad`` (``S * block_m`` rows while ``S <= E``, then ``S + E * (block_m - 1)``
    rounded up). An upper bound too for layouts padded for every expert (``S + E * (block_m - 1)``)."""
    if m_pad <= num_experts * block_m:
        return m_pad // block_m
    return m_pad - num_experts * (block_m - 1)


def align(topk_ids: torch.Tensor, num_experts: int, block_m: int):
    """``(src_slots [M_pad], expert_ids [M_pad // block_m], num_rows [], slot_rows [T * topk])``, int32 (as
    :class:`humming.moe.MoeRouting` describes them) of checked arguments; slots with ids outside
    ``[0, num_experts)`` get no row."""
    device = topk_ids.device
    ids = topk_ids.reshape(-1).long()
    m_pad = padded_rows(ids.numel(), num_experts, block_m)
    # Expert num_experts is a bucket for dropped (out of range) slots: it gets no rows.
    key = torch.where((ids >= 0) & (ids < num_experts), ids, num_experts)
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=device).scatter_add_(0, key, torch.ones_like(key))
    padded = (counts + block_m - 1) // block_m * block_m
    padded[num_experts:].zero_()  # an in-place fill: capturable (item assignment copies from the host)
    seg_start = torch.cumsum(padded, 0) - padded  # first grouped row of each expert
    first_sorted = torch.cumsum(counts, 0) - counts  # first position of each expert in sorted order
    order = torch.argsort(key, stable=True)
    sorted_key = key[order]
    rank = torch.arange(ids.numel(), device=device) - first_sorted[sorted_key]
    dest = torch.where(sorted_key < num_experts, seg_start[sorted_key] + rank, m_pad)  # m_pad: dropped
    src_slots = torch.full((m_pad + 1,), -1, dtype=torch.int32, device=device)
    src_slots.scatter_(0, dest, order.to(torch.int32))
    block_ends = torch.cumsum(padded[:num_experts] // block_m, 0)
    blocks = torch.arange(m_pad // block_m, device=device)
    expert_ids = torch.searchsorted(block_ends, blocks, right=True).to(torch.int32)
    expert_ids = torch.where(expert_ids < num_experts, expert_ids, -1)
    num_rows = padded.sum().to(torch.int32)
    slot_rows = torch.empty(ids.numel(), dtype=torch.int32, device=device)
    slot_rows.scatter_(0, order, torch.where(dest < m_pad, dest, -1).to(torch.int32))
    return src_slots[:m_pad], expert_ids, num_rows, slot_rows
