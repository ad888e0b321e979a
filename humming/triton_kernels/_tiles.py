"""Output tiles of the Triton GEMM kernels (:mod:`.wna16`, :mod:`.scaled_mm`), private: which tile a program
computes, and how the tile's fp32 accumulator reaches the output.

Every GEMM kernel computes ``out[M, N]`` in ``BM x BN`` tiles, on a grid of
``(cdiv(M, BM) * cdiv(N, BN), SPLIT_K)`` programs; the host side of the same contract is
:func:`.configs.finish_split_k`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .interpreter import cast

__all__ = ["store_tile", "tile_ids"]


@triton.jit
def tile_ids(M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """(row tile, column tile) of this program, in grouped order: ``GROUP_M`` row tiles share each weight
    column tile while it is in L2."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    return pid_m, pid_n


@triton.jit
def store_tile(
    acc,
    out_ptr,
    stride_om,
    bias_ptr,
    offs_m,
    offs_n,
    M,
    N,
    HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    GROUPED: tl.constexpr,
):
    """Writes the fp32 tile ``acc`` (rows ``offs_m``, columns ``offs_n``) to ``out_ptr``: plus the bias,
    rounded once to the output's dtype; split along K (``SPLIT_K > 1``), added with atomics into the fp32
    workspace that ``out_ptr`` then is, the host adding a dense call's bias after the last slice."""
    out = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(out, cast(acc, out_ptr.dtype.element_ty), mask=mask)
    else:
        # the bias differs per expert: the first K slice adds it (a compile-time test, then a run-time one)
        if GROUPED and HAS_BIAS:  # noqa: SIM102
            if tl.program_id(1) == 0:
                acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.atomic_add(out, acc, mask=mask, sem="relaxed")
