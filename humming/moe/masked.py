"""``humming.moe.grouped_linear_masked``: the grouped GEMM on the masked layout of DeepEP's low-latency
dispatch, ``[E, max_m, K]`` with ``masked_m[e]`` valid rows per expert, run as :func:`~.grouped.run_grouped`
on routing blocks made on the device."""

from __future__ import annotations

import torch

from .. import ops
from ..dispatch.support import combination_error
from ..ir.activation import ActScheme, get_act_scheme
from ..ir.weight import QuantizedWeight
from ._checks import check_experts, check_out_dtype, check_range, check_x, expert_bias
from .align import default_block_m
from .grouped import run_grouped

__all__ = ["grouped_linear_masked", "masked_block_m", "masked_expert_ids", "run_grouped_masked"]


#: Rows per routing block of :func:`grouped_linear_masked`, largest first: multiples of 16 (the Triton
#: grouped GEMMs' minimum), so that every backend runs the same blocks.
_MASKED_BLOCK_MS = (128, 64, 32, 16)


def grouped_linear_masked(
    x: torch.Tensor,
    qweight: QuantizedWeight,
    masked_m: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    act=None,
    out_dtype: torch.dtype | None = None,
    expected_m: int | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Grouped GEMM on the masked layout (DeepEP's low-latency dispatch, DeepGEMM's masked GEMM): the first
    ``masked_m[e]`` rows of ``x[e]`` times expert ``e`` of ``qweight``.

    Runs :func:`humming.moe.grouped_linear` on ``x`` viewed as ``[E * max_m, K]`` (no copy) with routing blocks of
    ``block_m`` rows that divide ``max_m`` (so no block spans two experts); the blocks' expert ids are made
    on the device from ``masked_m`` (no host sync: CUDA-graph capturable), blocks past ``masked_m[e]`` get
    id -1 and are skipped.

    Args:
        x: ``[E, max_m, K]`` float16 / bfloat16 (float32 on the reference backend), viewable as
            ``[E * max_m, K]`` (experts ``max_m`` rows apart, last dimension contiguous). When ``max_m`` is
            not a multiple of 16 it is copied into a buffer padded to one (every kernel's routing blocks are
            multiples of 16 rows, and a block may not span two experts).
        qweight: expert-stacked ``[E, N, K]``.
        masked_m: int32 ``[E]`` on ``x``'s device, the valid rows of each expert; values past ``max_m``
            count as ``max_m``, negative ones as 0 (checked to lie in ``[0, max_m]`` on CPU only).
        bias: ``[E, N]``; defaults to ``qweight.bias``.
        act, out_dtype, backend: as :func:`humming.moe.grouped_linear`; ``act`` per token or per group only (a
            per-tensor or global activation scale would be taken over the rows past ``masked_m`` too, which
            hold whatever the dispatch left there).
        expected_m: the rows an expert is expected to hold (DeepGEMM's hint), which picks ``block_m``:
            16 up to 16 rows, 64 up to 96, else 128, each the largest that divides ``max_m``.
            ``None``: ``max_m``.
    Returns:
        ``[E, max_m, N]`` in ``out_dtype`` (default ``x``'s dtype). Rows ``>= masked_m[e]`` of expert ``e``
        are unspecified (the kernels skip their blocks; garbage there never reaches a valid row).
    """
    qweight = check_experts("qweight", qweight)
    bias = qweight.bias if bias is None else bias
    act, bias, out_dtype = _checked(x, qweight, masked_m, bias, act, out_dtype, expected_m)
    if ops.eager(x):
        return run_grouped_masked(x, qweight, masked_m, bias, act, out_dtype, expected_m or 0, backend)
    return torch.ops.humming.grouped_linear_masked(
        x, masked_m, expected_m or 0, *ops.weight_args(qweight), bias, ops.act_name(act), out_dtype, backend
    )


def _checked(x, qweight: QuantizedWeight, masked_m, bias, act, out_dtype, expected_m):
    """``(act, bias, out_dtype)`` of a grouped_linear_masked call, every argument checked (the entry point's
    and the custom op's)."""
    e, _, k = qweight.shape
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 3 or x.shape[0] != e or x.shape[2] != k:
        raise ValueError(f"x: expected shape [E={e}, max_m, K={k}] (E, K of the weight), got {tuple(x.shape)}")
    check_x("x", x[0], k, qweight.device)  # dtype, contiguous last dimension, device
    if x.shape[1] > 1 and x.stride(0) != x.shape[1] * x.stride(1):
        raise ValueError(
            f"x: experts must be max_m rows apart (x viewed as [E * max_m, K] without a copy), got strides "
            f"{tuple(x.stride())}"
        )
    if not isinstance(masked_m, torch.Tensor) or masked_m.dtype != torch.int32 or tuple(masked_m.shape) != (e,):
        got = f"{masked_m.dtype} {tuple(masked_m.shape)}" if isinstance(masked_m, torch.Tensor) else masked_m
        raise ValueError(f"masked_m: expected an int32 tensor of shape ({e},) (E), got {got!r}")
    if masked_m.device != x.device:
        raise ValueError(f"masked_m is on {masked_m.device} but x is on {x.device}")
    bias = expert_bias(bias, qweight)
    out_dtype = check_out_dtype(out_dtype, x.dtype)
    if expected_m is not None and (isinstance(expected_m, bool) or not isinstance(expected_m, int) or expected_m < 1):
        raise ValueError(f"expected_m: expected None or a positive int, got {expected_m!r}")
    act = None if act is None else get_act_scheme(act)
    if act is not None and (act.group_shape[0] != 1 or act.global_scale):
        raise ValueError(
            f"act: {act.name} takes one activation scale over every row, which in the masked layout would include "
            "the rows past masked_m (whatever the dispatch left there); use a per-token or per-group scheme "
            "(fp8, fp8_g128, int8, mxfp4...)"
        )
    reason = combination_error(qweight.format, act)
    if reason:
        raise ValueError(reason)
    return act, bias, out_dtype


def masked_block_m(max_m: int, expected_m: int) -> int:
    """The routing block of :func:`grouped_linear_masked` for ``max_m`` rows per expert (a multiple of 16)
    and ``expected_m`` expected rows: :func:`~.align.default_block_m`'s choice for that many rows, lowered to the
    largest of 128, 64, 32, 16 that divides ``max_m``."""
    target = default_block_m(expected_m, 1)
    return next(bm for bm in _MASKED_BLOCK_MS if bm <= target and max_m % bm == 0)


def masked_expert_ids(masked_m: torch.Tensor, max_m: int, block_m: int) -> torch.Tensor:
    """int32 ``[E * max_m // block_m]``: block ``b`` of expert ``e`` gets ``e`` if ``b * block_m <
    masked_m[e]``, else -1. Torch ops on ``masked_m``'s device, no host sync."""
    e = masked_m.shape[0]
    starts = torch.arange(0, max_m, block_m, dtype=torch.int32, device=masked_m.device)
    experts = torch.arange(e, dtype=torch.int32, device=masked_m.device)[:, None]
    return torch.where(starts[None, :] < masked_m[:, None], experts, -1).reshape(-1)


def run_grouped_masked(x, qweight, masked_m, bias, act: ActScheme | None, out_dtype, expected_m: int, backend: str):
    """What :func:`grouped_linear_masked` runs once its arguments are checked (its op too): the block size,
    the expert ids, the grouped GEMM. ``expected_m`` 0: ``max_m``."""
    e, max_m, k = x.shape
    check_range("masked_m", masked_m, 0, max_m + 1)
    rows = -(-max_m // 16) * 16
    if rows != max_m:  # no block size divides max_m: pad each expert to a multiple of 16 rows (a copy)
        padded = x.new_zeros(e, rows, k)
        padded[:, :max_m] = x
        x = padded
    block_m = masked_block_m(rows, expected_m or max_m)
    expert_ids = masked_expert_ids(masked_m, rows, block_m)
    out = run_grouped(x.reshape(e * rows, k), qweight, expert_ids, block_m, bias, act, out_dtype, backend)
    out = out.view(e, rows, -1)
    return out if rows == max_m else out[:, :max_m].contiguous()


def _grouped_masked_op(x, masked_m, expected_m, *args):
    *weight, bias, act, out_dtype, backend = args
    qweight = check_experts("qweight", ops.weight_from_args(*weight))
    act, bias, out_dtype = _checked(x, qweight, masked_m, bias, act, out_dtype, expected_m or None)
    return run_grouped_masked(x, qweight, masked_m, bias, act, out_dtype, expected_m, backend)


def _grouped_masked_fake(x, masked_m, expected_m, qweight, *args):
    return x.new_empty((x.shape[0], x.shape[1], qweight.shape[-2]), dtype=args[-2])


ops.register("grouped_linear_masked", _grouped_masked_op, _grouped_masked_fake)
