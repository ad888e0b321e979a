"""Routing into the contiguous grouped layout (the module doc of :mod:`humming.moe`): :func:`moe_align`
groups the routed slots by expert, padded to ``block_m`` rows, with no host sync: the checked call, the choice
between the torch definition (:mod:`humming.reference.align`) and the Triton kernels
(:mod:`humming.triton_kernels.align`), and its custom op."""

from __future__ import annotations

import functools
import importlib
import math
from dataclasses import dataclass

import torch

from .. import ops
from .._env import pass_backend
from ..dispatch.kernels import backend_unavailable
from ..reference import align as reference
from ..reference.align import padded_rows
from ._checks import MAX_EXPERTS, check_block_m, check_range, check_topk_ids
from .routing import BACKENDS

__all__ = [
    "MoeRouting",
    "align",
    "default_block_m",
    "moe_align",
    "padded_rows",
    "prepare_align",
    "triton_unsupported",
]


@dataclass(frozen=True)
class MoeRouting:
    """Routed slots grouped by expert (see :mod:`humming.moe`); every tensor is on ``topk_ids``' device.

    ``src_slots``: int32 ``[M_pad]``, the slot ``t * topk + j`` of each grouped row, -1 for padding rows.
    ``expert_ids``: int32 ``[M_pad // block_m]``, each block's expert, -1 past the last used block.
    ``num_rows``: int32 0-d, the grouped rows in use (padding included).
    ``slot_rows``: int32 ``[T * topk]``, the grouped row of each slot (the inverse of ``src_slots``), -1 for
    dropped slots: combining gathers each token's rows through it, with no atomics and no padding rows.
    ``rows``: :meth:`token_rows` for ``rows_topk`` slots per token, where the alignment wrote them (the Triton
    kernels do, in the same pass), else ``None``.
    """

    src_slots: torch.Tensor
    expert_ids: torch.Tensor
    block_m: int
    num_rows: torch.Tensor
    slot_rows: torch.Tensor
    rows: torch.Tensor | None = None
    rows_topk: int = 0

    @property
    def m_pad(self) -> int:
        return self.src_slots.shape[0]

    def token_rows(self, topk: int) -> torch.Tensor:
        """int32 ``[M_pad]``: the token of each grouped row (``src_slots // topk``), -1 for padding rows:
        :func:`humming.moe.grouped_linear`'s ``rows``, which reads the ``[T, K]`` tokens in place."""
        if self.rows is not None and topk == self.rows_topk:
            return self.rows
        return torch.where(self.src_slots >= 0, self.src_slots // topk, -1)


#: Routing blocks a layer whose grouped GEMMs take any multiple of 16 chooses among (the sm_90a GEMM's token
#: tiles, :data:`humming.cuda_kernels._gemm_sm90.GROUPED_BMS`).
FITTED_BLOCK_MS = tuple(range(16, 257, 16))
#: The grouped sm_90a GEMM's cost per routing segment, in token rows: each segment's tiles dequantize their
#: weight blocks whatever the segment holds, which costs about as much as 100 rows of wgmma (fitted on the
#: H100 sweeps of routing blocks 48-256, bench/results/h100/fine_tiles_2026-12-06/).
SEGMENT_COST_ROWS = 100


def default_block_m(num_slots: int, num_experts: int, blocks_of_8: bool = False, fitted: bool = False) -> int:
    """``block_m`` for ``num_slots`` routed slots over ``num_experts``: 16 while experts average <= 16 rows
    (decode: little padding), 64 up to 96 rows, else 128 (larger tiles for prefill). ``blocks_of_8``: the
    grouped GEMMs take blocks of 8 (:func:`humming.moe.grouped.takes_blocks_of_8`), then 8 while experts
    average <= 4 rows (half the token tile's work and padding; bench/results/h200/grouped_decode.json).
    ``fitted``: they take any multiple of 16 (:func:`humming.moe.grouped.takes_fitted_blocks`); above 16 rows
    the block of :data:`FITTED_BLOCK_MS` with the least expected cost, segments x (block_m +
    :data:`SEGMENT_COST_ROWS`), for uniformly routed slots (experts of 256 +- 16 rows: 144, two segments each)."""
    rows = num_slots / num_experts
    if blocks_of_8 and rows <= 4:
        return 8
    if rows <= 16:
        return 16
    if fitted:
        return _fitted_block_m(num_slots, num_experts)
    return 64 if rows <= 96 else 128


@functools.lru_cache(maxsize=4096)
def _fitted_block_m(num_slots: int, num_experts: int) -> int:
    cost = lambda b: expected_segments(num_slots, num_experts, b) * (b + SEGMENT_COST_ROWS)
    return min(FITTED_BLOCK_MS, key=cost)


def expected_segments(num_slots: int, num_experts: int, block_m: int) -> float:
    """The expected routing segments, sum over experts of ceil(rows / block_m), when each slot picks an expert
    uniformly: rows ~ Binomial(num_slots, 1 / num_experts), E[ceil(r / b)] = sum over j >= 0 of P(r > j b), the
    tails past 0 from the normal approximation (continuity-corrected)."""
    if num_experts == 1:  # every slot on the one expert
        return float(-(-num_slots // block_m))
    p = 1.0 / num_experts
    mean, sd = num_slots * p, math.sqrt(num_slots * p * (1.0 - p))
    per_expert = 1.0 - (1.0 - p) ** num_slots  # P(r > 0)
    bound = block_m
    while bound <= num_slots:
        tail = 0.5 * math.erfc((bound + 0.5 - mean) / (sd * math.sqrt(2.0)))
        if bound > mean and tail < 1e-9:
            break
        per_expert += tail
        bound += block_m
    return num_experts * per_expert


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int, *, backend: str = "auto") -> MoeRouting:
    """Group the routed slots of ``topk_ids`` (integer ``[T, topk]``) by expert, padded to ``block_m``.

    Within an expert, slots keep their order (stable). No host sync on any backend: CUDA-graph capturable.
    Ids outside ``[0, num_experts)`` raise ``ValueError`` on CPU tensors; on a GPU they are not checked
    (that would read them back to the host): such slots are dropped (no row, so they add nothing).
    ``backend``: ``"auto"`` (the Triton kernels of :mod:`humming.triton_kernels.align` on CUDA tensors, the
    torch definition of :mod:`humming.reference.align` elsewhere), ``"reference"`` or ``"triton"``; the
    results are the same bit for bit.
    """
    block_m = _check_arguments(topk_ids, num_experts, block_m, backend)
    if not ops.eager(topk_ids):
        tensors = torch.ops.humming.moe_align(topk_ids, num_experts, block_m, backend)
        return MoeRouting(tensors[0], tensors[1], block_m, tensors[2], tensors[3])
    check_range("topk_ids", topk_ids, 0, num_experts)
    return align(topk_ids, num_experts, block_m, backend)


def _check_arguments(topk_ids: torch.Tensor, num_experts: int, block_m: int, backend: str) -> int:
    """:func:`moe_align`'s argument checks but the ids' range (which reads them); returns ``block_m``."""
    check_topk_ids(topk_ids)
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or not 0 < num_experts <= MAX_EXPERTS:
        raise ValueError(f"num_experts: expected a positive int up to {MAX_EXPERTS}, got {num_experts!r}")
    block_m = check_block_m(block_m)
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    return block_m


def triton_unsupported(topk_ids: torch.Tensor, num_experts: int, backend: str) -> str | None:
    """``None`` when :func:`align` runs on the Triton kernels (``backend="triton"``, or ``"auto"`` on CUDA
    tensors, within the kernels' limits), else why not."""
    if backend == "reference" or (backend == "auto" and topk_ids.device.type != "cuda"):
        return f"backend {backend!r} on {topk_ids.device} aligns with the reference"
    reason = backend_unavailable("triton")
    if reason is None:
        reason = importlib.import_module("humming.triton_kernels.align").unsupported(topk_ids, num_experts)
    return reason


def align(
    topk_ids: torch.Tensor, num_experts: int, block_m: int, backend: str = "auto", separate: bool = False
) -> MoeRouting:
    """:func:`moe_align` once its arguments are checked; slots with ids out of range get no row. ``backend``
    as :func:`moe_align`'s (``HUMMING_BACKEND`` may set ``"auto"``); ``separate`` as :func:`prepare_align`'s."""
    prepared = prepare_align(topk_ids, num_experts, block_m, backend, separate)
    src_slots, expert_ids, num_rows, slot_rows, rows = prepared(topk_ids)
    rows_topk = 0 if rows is None else topk_ids.shape[1]
    return MoeRouting(src_slots, expert_ids, block_m, num_rows, slot_rows, rows, rows_topk)


def prepare_align(
    topk_ids: torch.Tensor, num_experts: int, block_m: int, backend: str = "auto", separate: bool = False
):
    """:func:`align` made ready for every call of ids with ``topk_ids``' shape, dtype and device (checked):
    a callable ``ids -> (src_slots, expert_ids, num_rows, slot_rows, rows)`` (the fields of
    :class:`MoeRouting`; ``rows`` ``None`` where the alignment does not write them). The Triton outputs
    share one allocation unless ``separate``."""
    backend = pass_backend(backend)
    reason = triton_unsupported(topk_ids, num_experts, backend)
    if reason is None:
        kernel = importlib.import_module("humming.triton_kernels.align")
        return kernel.PreparedAlign(topk_ids.shape, num_experts, block_m, topk_ids.device, separate=separate)
    if backend == "triton":
        raise ValueError(f"backend: 'triton' cannot run this moe_align call: {reason}")
    return lambda ids: (*reference.align(ids, num_experts, block_m), None)


def _moe_align_op(topk_ids, num_experts, block_m, backend="auto"):
    block_m = _check_arguments(topk_ids, num_experts, block_m, backend)
    check_range("topk_ids", topk_ids, 0, num_experts)
    r = align(topk_ids, num_experts, block_m, backend, separate=True)  # a custom op's outputs may not alias
    return r.src_slots, r.expert_ids, r.num_rows, r.slot_rows


def _moe_align_fake(topk_ids, num_experts, block_m, backend="auto"):
    m_pad = padded_rows(topk_ids.numel(), num_experts, block_m)
    new = lambda *shape: topk_ids.new_empty(shape, dtype=torch.int32)
    return new(m_pad), new(m_pad // block_m), new(), new(topk_ids.numel())


ops.register("moe_align", _moe_align_op, _moe_align_fake)
