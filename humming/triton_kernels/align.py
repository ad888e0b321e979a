"""The alignment of routed slots by expert (:func:`humming.moe.moe_align`) in Triton: the outputs of the
reference (:func:`humming.reference.align.align`) bit for bit, in one launch for up to
:data:`ONE_PROGRAM_SLOTS` slots and three for more, with no host sync (CUDA-graph capturable).

Each slot's key is its expert, or ``E`` for an id outside ``[0, E)`` (dropped: no row). Sorting the packed
``key * BLOCK + slot`` of a block of slots orders them by expert and, within an expert, by slot (stable). A
slot at sorted position ``p`` of a block then lands on row ``base[key] + p``, where ``base`` is the expert's
first grouped row plus its slots in earlier blocks, minus the block's slots of lower experts. The per-expert
counts are integer atomics (their order does not matter), so every output is exact. The scatter also writes
each row's token (``slot // topk``, -1 for padding): ``grouped_linear``'s ``rows``, with no pass of its own.

- One program (``T * topk <= ONE_PROGRAM_SLOTS``): counts, the prefix sums over experts, the blocks' expert
  ids and the scatter, phases separated by CTA barriers, with the counts and ``base`` in a workspace.
- Three launches for more slots, blocks of :data:`CHUNK` slots or more: each program of the first counts its
  block's experts and sorts it (and fills its share of the padding with -1); one program takes the prefix sums over
  blocks and experts into ``base [blocks, E]`` and writes the expert ids; each program of the third scatters
  its sorted block.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..reference.align import padded_rows
from . import registry
from ._launch import CompiledLaunches
from .interpreter import INTERPRET, sort_distinct

__all__ = [
    "CHUNK",
    "MAX_CHUNK",
    "MAX_CHUNKS",
    "ONE_PROGRAM_SLOTS",
    "Layout",
    "PreparedAlign",
    "align",
    "layout",
    "unsupported",
]

#: The most slots (``T * topk``) the one-program kernel aligns; more take the three-launch path. Each power of
#: two up to it is a compiled kernel (a sort network: seconds to compile), so it stays at decode sizes.
ONE_PROGRAM_SLOTS = 1024
#: The slots per program of the three-launch path (its smallest block; larger calls take larger blocks).
CHUNK = 1024
#: The most blocks of the three-launch path: its middle program holds a ``[blocks, E-chunk]`` tile.
MAX_CHUNKS = 1024
#: The largest block of the three-launch path; calls of more than ``MAX_CHUNKS * MAX_CHUNK`` slots run on the
#: reference.
MAX_CHUNK = 4096
#: The id dtypes the kernels read.
ID_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)

_FILL = tl.constexpr(1024)  # elements per store of the -1 fill and of the expert-id search


@triton.jit
def _sort_keys(ids_ptr, start, num_slots, NUM_EXPERTS: tl.constexpr, BLOCK: tl.constexpr):
    """``(keys, sorted packed keys)`` of the slots ``[start, start + BLOCK)``: each key is the slot's expert,
    ``NUM_EXPERTS`` for an id out of range and ``NUM_EXPERTS + 1`` past the last slot; packed with the slot's
    place in the block, ``key * BLOCK + place``, so that the sort is stable."""
    place = tl.arange(0, BLOCK)
    inside = start + place < num_slots
    ids = tl.load(ids_ptr + start + place, mask=inside, other=0).to(tl.int64)  # compared before narrowing
    key = tl.where((ids >= 0) & (ids < NUM_EXPERTS), ids, NUM_EXPERTS).to(tl.int32)
    key = tl.where(inside, key, NUM_EXPERTS + 1)
    return key, sort_distinct(key * BLOCK + place, BLOCK)


@triton.jit
def _scatter(
    packed,
    base_ptr,
    start,
    src_slots_ptr,
    token_rows_ptr,
    slot_rows_ptr,
    NUM_EXPERTS: tl.constexpr,
    TOPK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Write the rows of a block's sorted ``packed`` keys: the slot at sorted position ``p`` goes to row
    ``base[key] + p`` (its token, ``slot // TOPK``, to that row of ``token_rows``); a dropped slot's
    ``slot_rows`` is -1."""
    key = packed // BLOCK
    slot = start + packed % BLOCK
    kept = key < NUM_EXPERTS
    row = tl.load(base_ptr + key, mask=kept, other=0) + tl.arange(0, BLOCK)
    tl.store(src_slots_ptr + row, slot, mask=kept)
    tl.store(token_rows_ptr + row, slot // TOPK, mask=kept)
    tl.store(slot_rows_ptr + slot, tl.where(kept, row, -1), mask=key <= NUM_EXPERTS)


@triton.jit
def _fill_padding(src_slots_ptr, token_rows_ptr, begin, end, step):
    """``src_slots[begin:end]`` and ``token_rows[begin:end]`` = -1 (the padding rows' value) in runs of
    ``_FILL``, every ``step``-th run from ``begin`` (a program's share)."""
    offs = tl.arange(0, _FILL)
    for first in range(begin, end, step):
        tl.store(src_slots_ptr + first + offs, -1, mask=first + offs < end)
        tl.store(token_rows_ptr + first + offs, -1, mask=first + offs < end)


@triton.jit
def _padded(counts, BLOCK_M: tl.constexpr):
    return (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M


@triton.jit
def _padded_rows(num_slots, NUM_EXPERTS: tl.constexpr, BLOCK_M: tl.constexpr):
    """``M_pad`` (:func:`humming.reference.align.padded_rows`)."""
    return _padded(num_slots + tl.minimum(num_slots, NUM_EXPERTS) * (BLOCK_M - 1), BLOCK_M)


@triton.jit
def _count_block(
    ids_ptr,
    src_slots_ptr,
    token_rows_ptr,
    counts_ptr,
    start,
    num_slots,
    fill_step,
    NUM_EXPERTS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_E: tl.constexpr,
):
    """The sorted packed keys of the slots ``[start, start + BLOCK)`` (:func:`_sort_keys`), with their counts per
    expert in ``counts [E]`` (zeroed first); sets this program's share of the padding on the way
    (:func:`_fill_padding`: the runs of ``_FILL`` from the ``start // BLOCK``-th, every ``fill_step``)."""
    expert = tl.arange(0, BLOCK_E)
    for first in range(0, NUM_EXPERTS, BLOCK_E):
        tl.store(counts_ptr + first + expert, 0, mask=first + expert < NUM_EXPERTS)
    m_pad = _padded_rows(num_slots, NUM_EXPERTS, BLOCK_M)
    _fill_padding(src_slots_ptr, token_rows_ptr, start // BLOCK * _FILL, m_pad, fill_step)
    tl.debug_barrier()
    key, packed = _sort_keys(ids_ptr, start, num_slots, NUM_EXPERTS, BLOCK)
    tl.atomic_add(counts_ptr + key, 1, mask=key < NUM_EXPERTS, sem="relaxed")
    return packed


@triton.jit
def _expert_ids(ends_ptr, expert_ids_ptr, num_blocks, NUM_EXPERTS: tl.constexpr, STEPS: tl.constexpr):
    """``expert_ids[b]``: the number of experts whose blocks end at or before block ``b`` (a binary search of
    the non-decreasing ``ends``, the reference's ``searchsorted(right=True)``), -1 past the last used block."""
    offs = tl.arange(0, _FILL)
    for first in range(0, num_blocks, _FILL):
        block = first + offs
        lo = tl.zeros([_FILL], dtype=tl.int32)
        hi = tl.full([_FILL], NUM_EXPERTS, dtype=tl.int32)
        for _ in tl.static_range(STEPS):
            active = lo < hi
            mid = (lo + hi) // 2
            end = tl.load(ends_ptr + mid, mask=active, other=0)
            right = active & (end <= block)
            lo = tl.where(right, mid + 1, lo)
            hi = tl.where(active & ~right, mid, hi)
        tl.store(expert_ids_ptr + block, tl.where(lo < NUM_EXPERTS, lo, -1), mask=block < num_blocks)


@triton.jit(do_not_specialize=["num_slots"])
def _align_one_kernel(
    ids_ptr,
    src_slots_ptr,
    token_rows_ptr,
    expert_ids_ptr,
    num_rows_ptr,
    slot_rows_ptr,
    work_ptr,
    num_slots,
    NUM_EXPERTS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    TOPK: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_E: tl.constexpr,
    STEPS: tl.constexpr,
):
    """Every output of ``num_slots <= BLOCK`` slots in one program; ``work``: int32 ``[3 * NUM_EXPERTS]``
    (counts, ``base`` and the experts' block ends). Grid: (1,)."""
    counts_ptr = work_ptr
    base_ptr = work_ptr + NUM_EXPERTS
    ends_ptr = work_ptr + 2 * NUM_EXPERTS
    packed = _count_block(
        ids_ptr, src_slots_ptr, token_rows_ptr, counts_ptr, 0, num_slots, _FILL, NUM_EXPERTS, BLOCK_M, BLOCK, BLOCK_E
    )
    tl.debug_barrier()
    expert = tl.arange(0, BLOCK_E)
    rows = tl.sum(tl.zeros([BLOCK_E], dtype=tl.int32), 0)  # running sums over the experts so far
    slots = rows
    for first in range(0, NUM_EXPERTS, BLOCK_E):
        inside = first + expert < NUM_EXPERTS
        counts = tl.load(counts_ptr + first + expert, mask=inside, other=0, cache_modifier=".cg")  # atomics: L2
        padded = _padded(counts, BLOCK_M)
        rows_end = tl.cumsum(padded, 0) + rows
        slots_end = tl.cumsum(counts, 0) + slots
        tl.store(base_ptr + first + expert, (rows_end - padded) - (slots_end - counts), mask=inside)
        tl.store(ends_ptr + first + expert, rows_end // BLOCK_M, mask=inside)
        rows += tl.sum(padded, 0)
        slots += tl.sum(counts, 0)
    tl.store(num_rows_ptr, rows)
    tl.debug_barrier()
    _expert_ids(ends_ptr, expert_ids_ptr, _padded_rows(num_slots, NUM_EXPERTS, BLOCK_M) // BLOCK_M, NUM_EXPERTS, STEPS)
    _scatter(packed, base_ptr, 0, src_slots_ptr, token_rows_ptr, slot_rows_ptr, NUM_EXPERTS, TOPK, BLOCK)


@triton.jit(do_not_specialize=["num_slots"])
def _align_count_kernel(
    ids_ptr,
    src_slots_ptr,
    token_rows_ptr,
    work_ptr,
    num_slots,
    NUM_EXPERTS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_E: tl.constexpr,
):
    """Block ``b = program_id(0)`` of ``BLOCK`` slots: its counts per expert into row ``b`` of the counts
    ``[blocks, E]`` in ``work`` (:func:`_work_elements`), its sorted packed keys into its run of the sorted keys; its
    share of ``src_slots`` set to -1. Grid: (blocks,)."""
    block = tl.program_id(0)
    num_blocks = tl.num_programs(0)
    counts_ptr = work_ptr + block * NUM_EXPERTS
    sorted_ptr = work_ptr + (2 * num_blocks + 1) * NUM_EXPERTS + block * BLOCK
    packed = _count_block(
        ids_ptr,
        src_slots_ptr,
        token_rows_ptr,
        counts_ptr,
        block * BLOCK,
        num_slots,
        num_blocks * _FILL,
        NUM_EXPERTS,
        BLOCK_M,
        BLOCK,
        BLOCK_E,
    )
    tl.store(sorted_ptr + tl.arange(0, BLOCK), packed)


@triton.jit(do_not_specialize=["num_slots", "num_blocks"])
def _align_offsets_kernel(
    work_ptr,
    expert_ids_ptr,
    num_rows_ptr,
    num_slots,
    num_blocks,
    NUM_EXPERTS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_E: tl.constexpr,
    STEPS: tl.constexpr,
):
    """From the counts ``[blocks, E]`` in ``work`` (:func:`_work_elements`): ``base [blocks, E]`` and the experts'
    block ends there, ``num_rows`` and ``expert_ids``. Grid: (1,)."""
    base_ptr = work_ptr + num_blocks * NUM_EXPERTS
    ends_ptr = base_ptr + num_blocks * NUM_EXPERTS
    block = tl.arange(0, BLOCK_B)[:, None]
    expert = tl.arange(0, BLOCK_E)[None, :]
    before = tl.zeros([BLOCK_B], dtype=tl.int32)  # each block's slots of the experts so far
    rows = tl.sum(before, 0)
    for first in range(0, NUM_EXPERTS, BLOCK_E):
        inside = (block < num_blocks) & (first + expert < NUM_EXPERTS)
        offs = block * NUM_EXPERTS + first + expert
        counts = tl.load(work_ptr + offs, mask=inside, other=0)
        padded = _padded(tl.sum(counts, 0), BLOCK_M)
        rows_end = tl.cumsum(padded, 0) + rows
        in_earlier_blocks = tl.cumsum(counts, 0) - counts
        in_lower_experts = tl.cumsum(counts, 1) - counts + before[:, None]
        base = (rows_end - padded)[None, :] + in_earlier_blocks - in_lower_experts
        tl.store(base_ptr + offs, base, mask=inside)
        column = first + tl.arange(0, BLOCK_E)
        tl.store(ends_ptr + column, rows_end // BLOCK_M, mask=column < NUM_EXPERTS)
        before += tl.sum(counts, 1)
        rows += tl.sum(padded, 0)
    tl.store(num_rows_ptr, rows)
    tl.debug_barrier()
    _expert_ids(ends_ptr, expert_ids_ptr, _padded_rows(num_slots, NUM_EXPERTS, BLOCK_M) // BLOCK_M, NUM_EXPERTS, STEPS)


@triton.jit
def _align_scatter_kernel(
    work_ptr,
    src_slots_ptr,
    token_rows_ptr,
    slot_rows_ptr,
    NUM_EXPERTS: tl.constexpr,
    TOPK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Block ``program_id(0)``'s rows from its sorted keys and its row of ``base``. Grid: (blocks,)."""
    block = tl.program_id(0)
    num_blocks = tl.num_programs(0)
    base_ptr = work_ptr + (num_blocks + block) * NUM_EXPERTS
    packed = tl.load(work_ptr + (2 * num_blocks + 1) * NUM_EXPERTS + block * BLOCK + tl.arange(0, BLOCK))
    _scatter(packed, base_ptr, block * BLOCK, src_slots_ptr, token_rows_ptr, slot_rows_ptr, NUM_EXPERTS, TOPK, BLOCK)


@dataclass(frozen=True)
class Layout:
    """How a call is split: ``blocks`` of ``block`` slots (a power of two); one block runs the one-program
    kernel. ``block_e``: experts per step of the loops over experts; ``block_b``: the blocks the middle
    program of the three-launch path holds at once (a power of two, at least ``blocks``)."""

    blocks: int
    block: int
    block_e: int
    block_b: int
    num_warps: int


@functools.lru_cache(maxsize=1024)
def layout(num_slots: int, num_experts: int, block: int | None = None) -> Layout:
    """The :class:`Layout` of ``num_slots`` slots over ``num_experts``: one program up to
    :data:`ONE_PROGRAM_SLOTS`, else blocks of ``block`` slots (``None``: :data:`CHUNK`, or more so that there are
    at most :data:`MAX_CHUNKS`)."""
    experts = triton.next_power_of_2(num_experts)
    if block is None and num_slots <= ONE_PROGRAM_SLOTS:
        one = max(16, triton.next_power_of_2(num_slots))
        return Layout(1, one, min(experts, 1024), 1, 4 if one <= 1024 else 8)
    if block is None:
        block = max(CHUNK, triton.next_power_of_2(triton.cdiv(num_slots, MAX_CHUNKS)))
    blocks = triton.cdiv(num_slots, block)
    block_b = triton.next_power_of_2(blocks)
    return Layout(blocks, block, min(experts, max(1, 4096 // block_b)), block_b, 4 if block <= 1024 else 8)


def _work_elements(lay: Layout, num_experts: int) -> int:
    """The int32 workspace of a call. One program: counts, ``base`` and block ends, ``E`` each. Three launches:
    counts ``[blocks, E]``, ``base [blocks, E]``, block ends ``[E]``, sorted keys ``[blocks, block]``."""
    if lay.blocks == 1:
        return 3 * num_experts
    return (2 * lay.blocks + 1) * num_experts + lay.blocks * lay.block


def unsupported(topk_ids: torch.Tensor, num_experts: int) -> str | None:
    """``None`` if :func:`align` runs this call, else the reason."""
    if topk_ids.device.type != "cuda" and not INTERPRET:
        return f"topk_ids is on {topk_ids.device}; the kernels run on CUDA tensors (or the interpreter)"
    if topk_ids.dtype not in ID_DTYPES:
        return f"topk_ids: the kernels read {', '.join(map(str, ID_DTYPES))}, got {topk_ids.dtype}"
    if topk_ids.numel() > MAX_CHUNKS * MAX_CHUNK:
        return f"{topk_ids.numel()} slots are above the kernels' {MAX_CHUNKS * MAX_CHUNK}"
    return None


def _steps(num_experts: int) -> int:
    """The halvings of a binary search over ``num_experts`` block ends."""
    return num_experts.bit_length()


_one = CompiledLaunches(_align_one_kernel)
_count = CompiledLaunches(_align_count_kernel)
_offsets = CompiledLaunches(_align_offsets_kernel)
_scatter_blocks = CompiledLaunches(_align_scatter_kernel)


def align(topk_ids: torch.Tensor, num_experts: int, block_m: int, block: int | None = None):
    """``(src_slots, expert_ids, num_rows, slot_rows, token_rows)``: the reference's outputs, and each grouped
    row's token (``src_slots // topk``, -1 for padding rows), for a call :func:`unsupported` accepts (checked
    arguments; ids out of range are dropped). ``block``: force the three-launch path with blocks of that many
    slots (a power of two, at least 16)."""
    return PreparedAlign(topk_ids.shape, num_experts, block_m, topk_ids.device, block)(topk_ids)


class PreparedAlign:
    """:func:`align` for every call of ``topk_ids`` shaped ``shape`` on ``device`` made ready: the sizes, the
    layout, the kernels' arguments but the tensors. One allocation per call holds every output and the
    workspace (each part 16-byte aligned, as the launch keys assume of the outputs); ``separate``: one per
    output instead, for callers whose outputs must not alias one another (a custom op's, under compile)."""

    def __init__(
        self,
        shape,
        num_experts: int,
        block_m: int,
        device: torch.device,
        block: int | None = None,
        separate: bool = False,
    ) -> None:
        num_slots, topk = shape[0] * shape[1], shape[1]
        self.num_slots, self.device, self.separate = num_slots, device, separate
        m_pad = padded_rows(num_slots, num_experts, block_m)
        self.layout = lay = layout(num_slots, num_experts, block) if num_slots else None
        work = -(-_work_elements(lay, num_experts) // 4) * 4 if num_slots else 0
        # src_slots, expert_ids, num_rows, slot_rows, token_rows, work, each at an offset of a multiple of 4 int32
        # (16 bytes), laid out as src_slots, token_rows, work, slot_rows, expert_ids, num_rows: the parts whose
        # sizes are multiples of 4 first, so that one split into views needs few gaps between them
        sizes = (m_pad, m_pad // block_m, 1, num_slots, m_pad, work)
        self.parts = [None] * len(sizes)
        self.split_sizes, picks, at = [], [], 0
        for i in (0, 4, 5, 3, 1, 2):
            self.parts[i] = (at, at + sizes[i])
            picks.append((i, len(self.split_sizes)))
            self.split_sizes.append(sizes[i])
            at += sizes[i]
            if at % 4 and i != 2:  # a gap to the next part's 16-byte boundary (none after the last part)
                self.split_sizes.append(4 - at % 4)
                at += 4 - at % 4
        self.elements = at
        # the split's views of src_slots, expert_ids, num_rows, slot_rows, token_rows, work, in that order
        self.pick = operator.itemgetter(*(view for _, view in sorted(picks)))
        self.key = (device.index, num_experts, block_m, topk, lay)
        self.constexprs = (num_experts, block_m, topk) + ((lay.block, lay.block_e, _steps(num_experts)) if lay else ())

    def __call__(self, topk_ids: torch.Tensor):
        """The outputs of :func:`align` for ``topk_ids`` (checked, shaped as this one was made for)."""
        if self.separate:
            empty = lambda size: torch.empty(size, dtype=torch.int32, device=self.device)
            src_slots, expert_ids, num_rows, slot_rows, token_rows, work = (empty(b - a) for a, b in self.parts)
        else:
            buffer = torch.empty(self.elements, dtype=torch.int32, device=self.device)
            parts = self.pick(buffer.split_with_sizes(self.split_sizes))
            src_slots, expert_ids, num_rows, slot_rows, token_rows, work = parts
        num_rows = num_rows[0]
        outputs = src_slots, expert_ids, num_rows, slot_rows, token_rows
        lay, num_slots, index = self.layout, self.num_slots, self.device.index
        if num_slots == 0:  # no slot: no row, and no launch
            for padding in (src_slots, expert_ids, token_rows):
                padding.fill_(-1)
            num_rows.zero_()
            return outputs
        ids = topk_ids if topk_ids.is_contiguous() else topk_ids.contiguous()
        # Launch keys: what Triton specializes on besides the constexprs (the sizes are not specialized): the ids'
        # dtype and 16-byte alignment (the other pointers are 16-byte aligned), and the device.
        key = (index, ids.dtype, ids.data_ptr() % 16, *self.key[1:])
        num_experts, block_m, topk = self.constexprs[:3]
        if lay.blocks == 1:
            args = (ids, src_slots, token_rows, expert_ids, num_rows, slot_rows, work, num_slots)
            _one.launch(key, (1, 1, 1), (*args, *self.constexprs), lay.num_warps, index)
            return outputs
        grid = (lay.blocks, 1, 1)
        count_args = (ids, src_slots, token_rows, work, num_slots, num_experts, block_m, lay.block, lay.block_e)
        _count.launch(key, grid, count_args, lay.num_warps, index)
        offsets_args = (work, expert_ids, num_rows, num_slots, lay.blocks, num_experts, block_m)
        _offsets.launch(key, (1, 1, 1), (*offsets_args, lay.block_b, lay.block_e, self.constexprs[-1]), 8, index)
        scatter_args = (work, src_slots, token_rows, slot_rows, num_experts, topk, lay.block)
        _scatter_blocks.launch(key, grid, scatter_args, lay.num_warps, index)
        return outputs


def _compile_specs() -> list[registry.CompileSpec]:
    """Decode with 128 experts (int64 ids), the three-launch path with 256, and the expert limit. One
    family: the kernels have no path that differs by architecture."""
    outputs = ("src_slots", "token_rows", "expert_ids", "num_rows", "slot_rows", "work")
    pointers = {"ids_ptr": "*i32"} | {f"{name}_ptr": "*i32" for name in outputs}
    specs = []
    for name, slots, topk, experts, block_m, ids in [
        ("e128-i64", 8, 8, 128, 16, "i64"),
        ("blocks-e256", 65536, 8, 256, 128, "i32"),
        ("emax", 16, 2, 1 << 16, 8, "i32"),  # humming.moe's MAX_EXPERTS (tests/moe/test_align.py checks)
    ]:
        lay = layout(slots, experts)
        typed = pointers | {"ids_ptr": f"*{ids}"}
        sizes = {"NUM_EXPERTS": experts, "BLOCK_M": block_m, "TOPK": topk, "BLOCK": lay.block}
        sizes |= {"BLOCK_B": lay.block_b, "BLOCK_E": lay.block_e, "STEPS": _steps(experts)}
        kernels = (
            [_align_one_kernel]
            if lay.blocks == 1
            else [_align_count_kernel, _align_offsets_kernel, _align_scatter_kernel]
        )
        for kernel in kernels:
            names = set(kernel.arg_names)
            constexprs = {arg: value for arg, value in sizes.items() if arg in names}
            specs.append(
                registry.CompileSpec(
                    name=f"align-{kernel.__name__.strip('_').removesuffix('_kernel').removeprefix('align_')}-{name}",
                    kernel=kernel,
                    pointers={arg: kind for arg, kind in typed.items() if arg in names},
                    constexprs=constexprs,
                    num_warps=8 if kernel is _align_offsets_kernel else lay.num_warps,
                )
            )
    return specs


registry.register("align", _compile_specs)
