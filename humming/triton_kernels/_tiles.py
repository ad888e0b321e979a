"""Output tiles of the Triton GEMM kernels (:mod:`.wna16`, :mod:`.scaled_mm`), private: which tile a program
computes, and how the tile's fp32 accumulator reaches the output.

Every GEMM kernel computes ``out[M, N]`` in ``BM x BN`` tiles, on a grid of
``(cdiv(M, BM) * cdiv(N, BN), SPLIT_K)`` programs, ``program_id(0)`` naming the output tile. Split along K, the
programs of a tile add into a workspace that is zero between calls (:data:`humming.workspaces.WORKSPACES`), so
that a call needs no memset and no pass of its own after the GEMM.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .interpreter import cast

__all__ = ["add_partial_tile", "route_tile", "split_k_words", "store_tile", "tile_ids"]


def split_k_words(m: int, n: int, tiles: int) -> int:
    """The 32-bit words of a split-K workspace for ``out [m, n]`` on ``tiles`` output tiles: the fp32 sums
    ``[m, n]`` (row stride ``n``), then one int32 arrival count per tile."""
    return m * n + tiles


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
def route_tile(
    expert_ptr,
    rows_ptr,
    pid_m,
    M,
    route_bm,
    BM: tl.constexpr,
    GROUPED: tl.constexpr,
    GATHER: tl.constexpr,
):
    """What row tile ``pid_m`` reads: ``(expert, offs_m, src, src_ok)``.

    ``offs_m`` [BM]: the output rows. ``expert`` (int64): the MoE expert of the tile, ``expert_ptr[first row //
    route_bm]`` (``BM`` divides ``route_bm``, so one tile has one expert; -1: a skipped block), 0 for a dense
    GEMM. ``src`` [BM] (int64): the activation row of each output row, ``rows_ptr[offs_m]`` with ``GATHER``
    (the MoE gather: tokens are read in place, never copied into grouped order), else ``offs_m``; ``src_ok``
    [BM]: rows to load (in range, not padding: a gathered -1), the others read as zeros."""
    offs_m = pid_m * BM + tl.arange(0, BM)
    m_ok = offs_m < M
    if GROUPED:
        expert = tl.load(expert_ptr + (pid_m * BM) // route_bm).to(tl.int64)
    else:
        expert = 0
    if GATHER:
        src = tl.load(rows_ptr + offs_m, mask=m_ok, other=-1).to(tl.int64)
        src_ok = src >= 0
    else:
        src = offs_m.to(tl.int64)
        src_ok = m_ok
    return expert, offs_m, src, src_ok


@triton.jit
def store_tile(
    acc, out_ptr, stride_om, bias_ptr, ws_ptr, offs_m, offs_n, M, N, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr
):
    """Writes the fp32 tile ``acc`` (rows ``offs_m``, columns ``offs_n``) to ``out_ptr``: plus the bias,
    rounded once to the output's dtype. Split along K (``SPLIT_K > 1``), each program adds its slice through
    :func:`add_partial_tile`, as one of ``SPLIT_K`` parts of the tile of its ``program_id(0)``."""
    if SPLIT_K > 1:
        add_partial_tile(
            acc, out_ptr, stride_om, bias_ptr, ws_ptr, offs_m, offs_n, M, N, HAS_BIAS, tl.program_id(0), 1, SPLIT_K
        )
    else:
        _store_out(acc, out_ptr, stride_om, bias_ptr, offs_m, offs_n, M, N, HAS_BIAS)


@triton.jit
def add_partial_tile(
    acc, out_ptr, stride_om, bias_ptr, ws_ptr, offs_m, offs_n, M, N, HAS_BIAS: tl.constexpr, tile, parts, total
):
    """Adds the fp32 partial sums ``acc`` of output tile ``tile`` into the workspace ``ws_ptr`` (32-bit words,
    :func:`split_k_words`; zero between calls) and counts ``parts`` (of ``total``) into the tile's arrival
    count; the call that completes the count reads the totals back with atomic exchanges, which leave zeros,
    resets the count, and writes the output as :func:`store_tile` does. The order of the additions varies
    between calls (the last bits of fp32). The exchanges move the fp32 bits as int32 (what every Triton
    version, its interpreter too, exchanges)."""
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    words = offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    sums = ws_ptr.to(tl.pointer_type(tl.float32), bitcast=True)
    tl.atomic_add(sums + words, acc, mask=mask, sem="relaxed")
    tl.debug_barrier()  # every thread's additions before the tile's arrival
    count = ws_ptr + (M * N + tile)
    if tl.atomic_add(count, parts, sem="acq_rel") == total - parts:
        zeros = tl.zeros(acc.shape, dtype=tl.int32)
        acc = tl.atomic_xchg(ws_ptr + words, zeros, mask=mask, sem="relaxed").to(tl.float32, bitcast=True)
        tl.atomic_xchg(count, 0, sem="relaxed")
        _store_out(acc, out_ptr, stride_om, bias_ptr, offs_m, offs_n, M, N, HAS_BIAS)


@triton.jit
def _store_out(acc, out_ptr, stride_om, bias_ptr, offs_m, offs_n, M, N, HAS_BIAS: tl.constexpr):
    """``acc`` plus the bias, rounded once to the output's dtype, into ``out_ptr``."""
    out = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    tl.store(out, cast(acc, out_ptr.dtype.element_ty), mask=mask)
