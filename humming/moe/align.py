"""Routing into the contiguous grouped layout (the module doc of :mod:`humming.moe`): :func:`moe_align`
groups the routed slots by expert, padded to ``block_m`` rows, in torch ops with no host sync."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import ops
from ._checks import MAX_EXPERTS, check_block_m, check_range, check_topk_ids

__all__ = ["MoeRouting", "align", "default_block_m", "moe_align", "padded_rows"]


@dataclass(frozen=True)
class MoeRouting:
    """Routed slots grouped by expert (see :mod:`humming.moe`); every tensor is on ``topk_ids``' device.

    ``src_slots``: int32 ``[M_pad]``, the slot ``t * topk + j`` of each grouped row, -1 for padding rows.
    ``expert_ids``: int32 ``[M_pad // block_m]``, each block's expert, -1 past the last used block.
    ``num_rows``: int32 0-d, the grouped rows in use (padding included).
    ``slot_rows``: int32 ``[T * topk]``, the grouped row of each slot (the inverse of ``src_slots``), -1 for
    dropped slots: combining gathers each token's rows through it, with no atomics and no padding rows.
    """

    src_slots: torch.Tensor
    expert_ids: torch.Tensor
    block_m: int
    num_rows: torch.Tensor
    slot_rows: torch.Tensor

    @property
    def m_pad(self) -> int:
        return self.src_slots.shape[0]

    def token_rows(self, topk: int) -> torch.Tensor:
        """int32 ``[M_pad]``: the token of each grouped row (``src_slots // topk``), -1 for padding rows:
        :func:`humming.moe.grouped_linear`'s ``rows``, which reads the ``[T, K]`` tokens in place."""
        return torch.where(self.src_slots >= 0, self.src_slots // topk, -1)


def padded_rows(num_slots: int, num_experts: int, block_m: int) -> int:
    """``M_pad``: the grouped rows of the worst case, every expert's segment padded by ``block_m - 1``."""
    worst = num_slots + num_experts * (block_m - 1)
    return (worst + block_m - 1) // block_m * block_m  # not -(-a // b): the size may be symbolic


def default_block_m(num_slots: int, num_experts: int) -> int:
    """``block_m`` for ``num_slots`` routed slots over ``num_experts``: 16 while experts average <= 16 rows
    (decode: little padding), 64 up to 96 rows, else 128 (larger tiles for prefill)."""
    rows = num_slots / num_experts
    return 16 if rows <= 16 else 64 if rows <= 96 else 128


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> MoeRouting:
    """Group the routed slots of ``topk_ids`` (integer ``[T, topk]``) by expert, padded to ``block_m``.

    Within an expert, slots keep their order (stable). Torch ops only and no host sync: CUDA-graph
    capturable. Ids outside ``[0, num_experts)`` raise ``ValueError`` on CPU tensors; on a GPU they are not
    checked (that would read them back to the host): such slots are dropped (no row, so they add nothing).
    """
    check_topk_ids(topk_ids)
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or not 0 < num_experts <= MAX_EXPERTS:
        raise ValueError(f"num_experts: expected a positive int up to {MAX_EXPERTS}, got {num_experts!r}")
    block_m = check_block_m(block_m)
    if ops.eager(topk_ids):
        check_range("topk_ids", topk_ids, 0, num_experts)
        return align(topk_ids, num_experts, block_m)
    src_slots, expert_ids, num_rows, slot_rows = torch.ops.humming.moe_align(topk_ids, num_experts, block_m)
    return MoeRouting(src_slots, expert_ids, block_m, num_rows, slot_rows)


def align(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> MoeRouting:
    """:func:`moe_align` once its arguments are checked; slots with ids out of range get no row."""
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
    return MoeRouting(src_slots[:m_pad], expert_ids, block_m, num_rows, slot_rows)


def _moe_align_op(topk_ids, num_experts, block_m):
    r = moe_align(topk_ids, num_experts, block_m)  # eager here: every argument checked, then aligned
    return r.src_slots, r.expert_ids, r.num_rows, r.slot_rows


def _moe_align_fake(topk_ids, num_experts, block_m):
    m_pad = padded_rows(topk_ids.numel(), num_experts, block_m)
    new = lambda *shape: topk_ids.new_empty(shape, dtype=torch.int32)
    return new(m_pad), new(m_pad // block_m), new(), new(topk_ids.numel())


ops.register("moe_align", _moe_align_op, _moe_align_fake)
