"""The Triton WnA16 kernels (:mod:`.wna16` is their entry point): ``y = x @ dequantize(W)^T + bias`` with
fp16/bf16 activations and any IR weight, specialised by ``constexpr`` for the weight's format, scale dtype
and layout (:mod:`._weight_tile`).

- :func:`_wna16_kernel`: the tiled kernel (weight tiles dequantized in registers exactly as
  :func:`humming.dequantize` does, rounded once to the activations' dtype, ``tl.dot`` with fp32
  accumulation); with ``GROUPED`` the MoE grouped GEMM, with ``GATHER`` reading token rows through an index.
- :func:`_wna16_gemv_kernel`: decode (M <= 4) without tensor cores.

Both split K when a config asks (fp32 atomics into a workspace).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._tiles import route_tile, store_tile, tile_ids
from ._weight_tile import (
    WeightArgs,
    decode_weight,
    load_weight_tile,
    scale_tile,
    with_global_scale,
    zero_tile,
)
from .interpreter import cast, dot

__all__ = ["_wna16_gemv_kernel", "_wna16_kernel"]


@triton.jit
def _wna16_kernel(
    x_ptr,
    qw_ptr,
    s_ptr,
    z_ptr,
    gs_ptr,
    gidx_ptr,
    lut_ptr,
    bias_ptr,
    out_ptr,
    ws_ptr,
    expert_ptr,
    rows_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_qn,
    stride_sn,
    stride_zn,
    stride_om,
    stride_qe,
    stride_se,
    stride_ze,
    stride_gse,
    stride_gie,
    stride_be,
    route_bm,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SPLIT_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    WEIGHT: tl.constexpr,  # the weight's WeightSpec (_weight_tile)
    EVEN_K: tl.constexpr,
    GROUPED: tl.constexpr,
    GATHER: tl.constexpr,
):
    """The tiled kernel; with ``GROUPED`` the MoE grouped GEMM: row ``r`` of ``x`` uses expert
    ``expert_ptr[r // route_bm]`` (``BM`` divides ``route_bm``, so one tile has one expert), tiles of
    expert -1 return at once, and every per-expert tensor is offset by ``expert * stride_*e``. With
    ``GATHER`` output row ``r`` reads row ``rows_ptr[r]`` of ``x`` (-1: a padding row, read as zeros)."""
    pid_m, pid_n = tile_ids(M, N, BM, BN, GROUP_M)
    expert, offs_m, src, src_ok = route_tile(expert_ptr, rows_ptr, pid_m, M, route_bm, BM, GROUPED, GATHER)
    if GROUPED:
        if expert < 0:
            return
        qw_ptr += expert * stride_qe
        s_ptr += expert * stride_se
        z_ptr += expert * stride_ze
        gs_ptr += expert * stride_gse
        gidx_ptr += expert * stride_gie
        bias_ptr += expert * stride_be
    weight = WeightArgs(qw_ptr, s_ptr, z_ptr, gs_ptr, gidx_ptr, lut_ptr, stride_qn, stride_sn, stride_zn)

    offs_n = pid_n * BN + tl.arange(0, BN)
    x_rows = x_ptr + src[:, None] * stride_xm
    m_ok = src_ok[:, None]

    k_tiles = tl.cdiv(K, BK)
    per_split = tl.cdiv(k_tiles, SPLIT_K)
    first = tl.program_id(1) * per_split
    last = tl.minimum(first + per_split, k_tiles)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for t in range(first, last):
        k0 = t * BK
        offs_k = k0 + tl.arange(0, BK)
        x = tl.load(x_rows + offs_k[None, :], mask=m_ok if EVEN_K else m_ok & (offs_k[None, :] < K), other=0.0)
        w = load_weight_tile(weight, WEIGHT, offs_n, k0, N, K, BK, EVEN_K)
        acc = dot(x, tl.trans(cast(w, x.dtype)), acc)

    store_tile(acc, out_ptr, stride_om, bias_ptr, ws_ptr, offs_m, offs_n, M, N, HAS_BIAS, SPLIT_K)


@triton.jit
def _wna16_gemv_kernel(
    x_ptr,
    qw_ptr,
    s_ptr,
    z_ptr,
    gs_ptr,
    gidx_ptr,
    lut_ptr,
    bias_ptr,
    out_ptr,
    ws_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_qn,
    stride_sn,
    stride_zn,
    stride_om,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SPLIT_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    WEIGHT: tl.constexpr,  # the weight's WeightSpec (_weight_tile)
    EVEN_K: tl.constexpr,
):
    """Decode (M <= BM <= 4): no tensor cores, so no layout change of the weight tile; products accumulate
    elementwise in fp32 ``[BM, BN, BK]`` and are reduced along K once, after the loop.

    Compute config, not tuning: the fp32 weights are used as they are, without the rounding to the
    activations' dtype that tensor cores need (a conversion per weight would cost more than the bandwidth
    allows at decode). Results are at least as accurate; they differ from the tensor-core path by up to one
    bf16/fp16 rounding of each weight, inside the tolerances the tests state.
    """
    weight = WeightArgs(qw_ptr, s_ptr, z_ptr, gs_ptr, gidx_ptr, lut_ptr, stride_qn, stride_sn, stride_zn)
    offs_m = tl.arange(0, BM)
    offs_n = tl.program_id(0) * BN + tl.arange(0, BN)
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    m_ok = offs_m[:, None] < M
    k_tiles = tl.cdiv(K, BK)
    per_split = tl.cdiv(k_tiles, SPLIT_K)
    first = tl.program_id(1) * per_split
    last = tl.minimum(first + per_split, k_tiles)
    # Whole-word fields and groups of whole words: unpack field j of every word in place (the K order of a
    # dot product is free), so the word tile keeps its load layout; x is read at the matching positions.
    PER_WORD: tl.constexpr = 32 // WEIGHT.W_BITS
    PACKED: tl.constexpr = (32 % WEIGHT.W_BITS == 0) and (not WEIGHT.ACT_ORDER) and (WEIGHT.GK % PER_WORD == 0)
    if PACKED:
        BKW: tl.constexpr = BK // PER_WORD
        # One row (decode): a 2-D accumulator in the word tile's own layout (no layout conversions).
        acc = tl.zeros((BN, BKW) if BM == 1 else (BM, BN, BKW), dtype=tl.float32)
        n_words = (K * WEIGHT.W_BITS + 31) // 32
        q_rows = qw_ptr + offs_n.to(tl.int64)[:, None] * stride_qn
        n_ok = offs_n[:, None] < N
        for t in range(first, last):
            offs_w = tl.multiple_of(t * BKW, BKW) + tl.arange(0, BKW)
            w_ok = n_ok if EVEN_K else n_ok & (offs_w[None, :] < n_words)
            words = tl.load(q_rows + offs_w[None, :], mask=w_ok, other=0)
            first_k = offs_w * PER_WORD  # element index of each word's field 0; one group holds whole words
            k0 = t * BK
            if WEIGHT.HAS_ZP:
                z = zero_tile(weight, WEIGHT, offs_n, first_k, k0, N, K, BK, EVEN_K).to(tl.float32)
            if WEIGHT.S_KIND != 0:
                sc = with_global_scale(
                    scale_tile(weight, WEIGHT, offs_n, first_k, k0, N, K, BK, EVEN_K), weight, WEIGHT
                )
            for j in tl.static_range(PER_WORD):
                codes = (words >> (j * WEIGHT.W_BITS)) & ((1 << WEIGHT.W_BITS) - 1)
                w = decode_weight(codes, weight, WEIGHT)
                if WEIGHT.HAS_ZP:
                    w = w - z
                if WEIGHT.S_KIND != 0:
                    w = w * sc
                xk = first_k + j
                x = tl.load(x_rows + xk[None, :], mask=m_ok if EVEN_K else m_ok & (xk[None, :] < K), other=0.0)
                if BM == 1:
                    acc += x.to(tl.float32) * w
                else:
                    acc += x.to(tl.float32)[:, None, :] * w[None, :, :]
    else:
        acc = tl.zeros((BM, BN, BK), dtype=tl.float32)
        for t in range(first, last):
            k0 = t * BK
            offs_k = k0 + tl.arange(0, BK)
            x = tl.load(x_rows + offs_k[None, :], mask=m_ok if EVEN_K else m_ok & (offs_k[None, :] < K), other=0.0)
            w = load_weight_tile(weight, WEIGHT, offs_n, k0, N, K, BK, EVEN_K)
            acc += x.to(tl.float32)[:, None, :] * w[None, :, :]
    y = tl.sum(acc, axis=1)[None, :] if PACKED and BM == 1 else tl.sum(acc, axis=2)
    store_tile(y, out_ptr, stride_om, bias_ptr, ws_ptr, offs_m, offs_n, M, N, HAS_BIAS, SPLIT_K)
