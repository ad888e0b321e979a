"""The Triton WnA16 kernels (:mod:`.wna16` is their entry point): ``y = x @ dequantize(W)^T + bias`` with
fp16/bf16 activations and any IR weight, specialised by ``constexpr`` for the weight's format, scale dtype
and layout (:mod:`._weight_tile`).

- :func:`_wna16_kernel`: the tiled kernel (weight tiles dequantized in registers exactly as
  :func:`humming.dequantize` does, rounded once to the activations' dtype, ``tl.dot`` with fp32
  accumulation); with ``GROUPED`` the MoE grouped GEMM, with ``GATHER`` reading token rows through an index.
- :func:`_wna16_swap_kernel`: few tokens (M <= 16) on tensor cores with the operands swapped: the weight
  tile is the MMA's 64/128-row side and the tokens its 16-wide side, so no MMA row is idle.
- :func:`_wna16_gemv_kernel`: decode (M <= 4) without tensor cores, persistent and stream-K.

The tiled and swapped kernels split K when a config asks; all three add partial sums into a workspace with
fp32 atomics (:func:`~._tiles.add_partial_tile`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._dequant16 import dequantized_tile, times_global_scale
from ._tiles import add_partial_tile, route_tile, store_tile, tile_ids
from ._weight_tile import (
    WeightArgs,
    decode_scale,
    decode_weight,
    e2m1_fields,
    field_offsets,
    float_fields,
    int_fields,
    load_weight_tile,
    scale_tile,
    subgroup_tile,
    with_global_scale,
    zero_tile,
)
from .interpreter import dot

__all__ = ["_wna16_gemv_kernel", "_wna16_kernel", "_wna16_swap_kernel"]


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
    PACKED: tl.constexpr,  # the packed 16-bit decode's PTX, or "" (_dequant16.packed_decode)
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
        w = dequantized_tile(weight, WEIGHT, offs_n, k0, N, K, BK, EVEN_K, x.dtype, PACKED)
        acc = dot(x, tl.trans(w), acc)
    acc = times_global_scale(acc, weight, WEIGHT, PACKED)

    store_tile(acc, out_ptr, stride_om, bias_ptr, ws_ptr, offs_m, offs_n, M, N, HAS_BIAS, SPLIT_K)


@triton.jit
def _wna16_swap_kernel(
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
    PACKED: tl.constexpr,  # the packed 16-bit decode's PTX, or "" (_dequant16.packed_decode)
):
    """``out^T [BN, BM] = W_tile [BN, BK] @ x^T [BK, BM]`` for M <= BM (16): the dequantized weight tile (exactly
    :func:`humming.dequantize`, rounded once to the activations' dtype, as the tiled kernel) is the MMA's
    large side, read from registers, and the tokens its narrow side; split along K over the grid's second
    axis. The same numerics as :func:`_wna16_kernel`."""
    weight = WeightArgs(qw_ptr, s_ptr, z_ptr, gs_ptr, gidx_ptr, lut_ptr, stride_qn, stride_sn, stride_zn)
    offs_m = tl.arange(0, BM)
    offs_n = tl.program_id(0) * BN + tl.arange(0, BN)
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    m_ok = offs_m[:, None] < M
    k_tiles = tl.cdiv(K, BK)
    per_split = tl.cdiv(k_tiles, SPLIT_K)
    first = tl.program_id(1) * per_split
    last = tl.minimum(first + per_split, k_tiles)
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    for t in range(first, last):
        k0 = t * BK
        offs_k = k0 + tl.arange(0, BK)
        x = tl.load(x_rows + offs_k[None, :], mask=m_ok if EVEN_K else m_ok & (offs_k[None, :] < K), other=0.0)
        w = dequantized_tile(weight, WEIGHT, offs_n, k0, N, K, BK, EVEN_K, x.dtype, PACKED)
        acc = dot(w, tl.trans(x), acc)
    acc = times_global_scale(acc, weight, WEIGHT, PACKED)
    store_tile(tl.trans(acc), out_ptr, stride_om, bias_ptr, ws_ptr, offs_m, offs_n, M, N, HAS_BIAS, SPLIT_K)


#: How :func:`_word_values` reads a word's fields (the GEMV's ``FIELDS`` constexpr): decoded one by one, integer
#: fields in place (integer codes of 1, 2, 4 or 8 bits, integer zero points or none: :func:`~._weight_tile.int_fields`),
#: or e2m1 codes without zero points by byte table (:func:`~._weight_tile.e2m1_fields`). The GEMV works it out
#: in a constexpr assignment: triton 3.6 compiles the result of a jit function as a runtime value, even of
#: constexpr arguments, so an ``if`` on it would build both branches.
_FIELDS_INT, _FIELDS_E2M1 = tl.constexpr(1), tl.constexpr(2)  # 0: decoded one by one


@triton.jit
def _word_values(words, weight, spec, z, FIELDS: tl.constexpr):
    """The fields of a word tile ``[1, BN, W]`` -> fp32 ``[32 // bits, BN, W]``: ``decode(q) - zero`` (zero points
    ``z`` as stored, broadcastable to ``[1, BN, W]``; unused without them), read as ``FIELDS`` says. Integer
    fields come scaled by ``2^field_offsets`` (:func:`~._weight_tile.int_fields`), e2m1 ones by 2^12 in odd
    fields, the others as they are."""
    if FIELDS == _FIELDS_INT:
        zoff = z.to(tl.float32) if spec.HAS_ZP else 0.0
        v = int_fields(words, spec, zoff)
    elif FIELDS == _FIELDS_E2M1:
        v = e2m1_fields(words)
    else:
        if spec.W_KIND == 2 and spec.W_EBITS < 8:
            v = float_fields(words, spec)
        else:
            PER_WORD: tl.constexpr = 32 // spec.W_BITS
            shifts = (tl.arange(0, PER_WORD) * spec.W_BITS)[:, None, None]
            codes = (words >> shifts) & ((1 << spec.W_BITS) - 1)
            v = decode_weight(codes, weight, spec)
        if spec.HAS_ZP:
            v = v - z.to(tl.float32)
    return v


@triton.jit
def _field_scales(spec, FIELDS: tl.constexpr):
    """``[32 // bits]`` fp32: what the activation of each field of a word is multiplied by (``2^-o_j`` where
    :func:`_word_values` scales the field by ``2^o_j``, else 1)."""
    if FIELDS == _FIELDS_INT:
        out = ((127 - field_offsets(spec.W_BITS)) << 23).to(tl.float32, bitcast=True)
    elif FIELDS == _FIELDS_E2M1:
        out = ((126 - 8 * (tl.arange(0, 8) % 2)) << 23).to(tl.float32, bitcast=True)
    else:
        out = tl.full((32 // spec.W_BITS,), 1.0, tl.float32)
    return out


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
    HAS_BIAS: tl.constexpr,
    WEIGHT: tl.constexpr,  # the weight's WeightSpec (_weight_tile)
    EVEN_K: tl.constexpr,
    PREFETCH: tl.constexpr,  # load the next K tile's words and activations before decoding this one's
):
    """Decode (M <= BM <= 4): no tensor cores. Products accumulate in fp32 registers and are reduced along K
    once per output tile.

    Persistent and stream-K: the grid's programs deal the ``cdiv(N, BN) * cdiv(K, BK)`` K tiles of all output
    tiles evenly among themselves (tile-major), so every program streams the same number of weight bytes and
    the grid, sized to the multiprocessors, ends in one wave whatever the shape. A program whose share covers
    a whole output tile writes it; a share that starts or ends inside one adds its partial sums into the
    workspace (:func:`~._tiles.add_partial_tile`), and whichever part completes the tile writes it.
    """
    weight = WeightArgs(qw_ptr, s_ptr, z_ptr, gs_ptr, gidx_ptr, lut_ptr, stride_qn, stride_sn, stride_zn)
    offs_m = tl.arange(0, BM)
    k_tiles = tl.cdiv(K, BK)
    units = tl.cdiv(N, BN).to(tl.int64) * k_tiles
    pid = tl.program_id(0).to(tl.int64)
    unit = pid * units // tl.num_programs(0)
    end = (pid + 1) * units // tl.num_programs(0)
    while unit < end:
        tile = (unit // k_tiles).to(tl.int32)
        first = (unit - tile.to(tl.int64) * k_tiles).to(tl.int32)
        last = tl.minimum(first + (end - unit), k_tiles).to(tl.int32)
        offs_n = tile * BN + tl.arange(0, BN)
        y = _gemv_tile_sums(
            x_ptr, weight, WEIGHT, offs_m, offs_n, M, N, K, stride_xm, first, last, BM, BN, BK, EVEN_K, PREFETCH
        )
        if last - first == k_tiles:
            store_tile(y, out_ptr, stride_om, bias_ptr, ws_ptr, offs_m, offs_n, M, N, HAS_BIAS, 1)
        else:
            add_partial_tile(
                y, out_ptr, stride_om, bias_ptr, ws_ptr, offs_m, offs_n, M, N, HAS_BIAS, tile, last - first, k_tiles
            )
        unit += last - first


@triton.jit
def _gemv_tile_sums(
    x_ptr,
    weight,
    WEIGHT: tl.constexpr,
    offs_m,
    offs_n,
    M,
    N,
    K,
    stride_xm,
    first,
    last,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    EVEN_K: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    """fp32 ``[BM, BN]``: the products of rows ``offs_m`` of x and rows ``offs_n`` of the weight over K tiles
    ``first .. last - 1``.

    Whole-word fields in groups of whole words (every format but 3/5/6/7-bit codes and act-order): the word
    tile ``[BN, BK / f]`` (``f`` fields per word) is decoded in place into ``[BN, BK / f, f]``
    (:func:`_word_values`), multiplied by the activations read as ``[BK / f, f]`` (one vector load, reused by
    every row of the tile), and summed per word; the scale (one per row and group) multiplies those sums,
    not each weight: ``sum_k x_k (q_k - z) * s`` in fp32, the exact weights of :func:`humming.dequantize`
    with the scale applied once per group. Other formats: fp32 tiles of :func:`load_weight_tile`.

    Compute config, not tuning: the weights are never rounded to the activations' dtype (that rounding is
    what tensor cores need). Results are at least as accurate as the tensor-core path's; they differ from it
    by up to one bf16/fp16 rounding of each weight, inside the tolerances the tests state.
    """
    PER_WORD: tl.constexpr = 32 // WEIGHT.W_BITS
    PACKED: tl.constexpr = (
        BM == 1 and (32 % WEIGHT.W_BITS == 0) and (not WEIGHT.ACT_ORDER) and (WEIGHT.GK % PER_WORD == 0)
    )
    if PACKED:
        # Tiles are 3-D, [fields, rows, words], loaded that way: Triton lays a loaded tile out along its
        # contiguous dimension (the words, four to a thread for 16-byte loads) and keeps a dimension of size 1
        # (the fields) in each thread's registers, so the decode, the products and their sum over the fields
        # of a word move no data between threads; the activations [fields, 1, words] are the one exchange.
        BKW: tl.constexpr = BK // PER_WORD
        # Groups of at most four words lie in one thread (four words per 16-byte load): their sums add up there
        # and take their scale once per group, read once per group ([BN, BK / GK]).
        PER_GROUP: tl.constexpr = WEIGHT.GK // PER_WORD if WEIGHT.GK > 0 and BK % WEIGHT.GK == 0 else 0
        SCALE_PER_GROUP: tl.constexpr = WEIGHT.S_KIND != 0 and PER_GROUP > 0 and PER_GROUP <= 4 and PER_GROUP < BKW
        SUMS: tl.constexpr = BKW // PER_GROUP if SCALE_PER_GROUP else BKW
        acc = tl.zeros((1, BN, SUMS), dtype=tl.float32)
        n_words = (K * WEIGHT.W_BITS + 31) // 32
        q_rows = weight.qw + offs_n.to(tl.int64)[None, :, None] * weight.stride_qn
        n_ok = offs_n[None, :, None] < N
        INT_CODES: tl.constexpr = WEIGHT.W_KIND <= 1 and 16 % WEIGHT.W_BITS == 0
        INT_ZEROS: tl.constexpr = not WEIGHT.HAS_ZP or weight.z.dtype.element_ty.is_int()
        E2M1: tl.constexpr = WEIGHT.W_KIND == 2 and WEIGHT.W_EBITS == 2 and WEIGHT.W_MBITS == 1 and WEIGHT.W_BIAS == 1
        E2M1_TABLE: tl.constexpr = E2M1 and not WEIGHT.HAS_ZP
        FIELDS: tl.constexpr = _FIELDS_INT if INT_CODES and INT_ZEROS else (_FIELDS_E2M1 if E2M1_TABLE else 0)
        x_scale = _field_scales(WEIGHT, FIELDS)[:, None, None]
        # With PREFETCH the loop carries the next K tile's words and activations: their loads are in flight
        # while this tile decodes (one more word tile of registers per thread).
        if PREFETCH:
            words_next, x_next = _gemv_packed_loads(x_ptr, q_rows, n_ok, first, last, n_words, K, BK, BKW, EVEN_K, True)
        for t in range(first, last):
            offs_w = tl.multiple_of(t * BKW, BKW) + tl.arange(0, BKW)
            if PREFETCH:
                words, x = words_next, x_next
                words_next, x_next = _gemv_packed_loads(
                    x_ptr, q_rows, n_ok, t + 1, last, n_words, K, BK, BKW, EVEN_K, True
                )
            else:
                words, x = _gemv_packed_loads(x_ptr, q_rows, n_ok, t, last, n_words, K, BK, BKW, EVEN_K, False)
            first_k = offs_w * PER_WORD  # element index of each word's field 0; one group holds whole words
            k0 = t * BK
            z = zero_tile(weight, WEIGHT, offs_n, first_k, k0, N, K, BK, EVEN_K)[None, :, :] if WEIGHT.HAS_ZP else 0
            v = _word_values(words, weight, WEIGHT, z, FIELDS)  # [PER_WORD, BN, BKW]
            x = tl.trans(tl.reshape(x.to(tl.float32), (BKW, PER_WORD)))[:, None, :]  # [PER_WORD, 1, BKW]
            part = tl.sum(v * (x * x_scale), axis=0, keep_dims=True)
            if SCALE_PER_GROUP:
                part = tl.sum(tl.reshape(part, (1, BN, SUMS, PER_GROUP)), axis=3)
                s = subgroup_tile(weight.s, weight.stride_sn, offs_n, k0, N, K, BK, WEIGHT.GN, WEIGHT.GK, EVEN_K)
                part = part * with_global_scale(decode_scale(s, WEIGHT.S_KIND), weight, WEIGHT)[None, :, :]
            elif WEIGHT.S_KIND != 0:
                sc = with_global_scale(
                    scale_tile(weight, WEIGHT, offs_n, first_k, k0, N, K, BK, EVEN_K), weight, WEIGHT
                )
                part = part * sc[None, :, :]
            acc += part
        y = tl.sum(tl.sum(acc, axis=2), axis=0)[None, :]
    else:
        x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
        m_ok = offs_m[:, None] < M
        acc = tl.zeros((BM, BN, BK), dtype=tl.float32)
        for t in range(first, last):
            k0 = t * BK
            offs_k = k0 + tl.arange(0, BK)
            x = tl.load(x_rows + offs_k[None, :], mask=m_ok if EVEN_K else m_ok & (offs_k[None, :] < K), other=0.0)
            w = load_weight_tile(weight, WEIGHT, offs_n, k0, N, K, BK, EVEN_K)
            acc += x.to(tl.float32)[:, None, :] * w[None, :, :]
        y = tl.sum(acc, axis=2)
    return y


@triton.jit
def _gemv_packed_loads(
    x_ptr,
    q_rows,
    n_ok,
    t,
    last,
    n_words,
    K,
    BK: tl.constexpr,
    BKW: tl.constexpr,
    EVEN_K: tl.constexpr,
    AHEAD: tl.constexpr,
):
    """K tile ``t``'s word tile ``[1, BN, BKW]`` and activations ``[BK]`` for the packed GEMV. ``AHEAD``: ``t`` may
    be the tile after the share's last (``last``), which reads nothing (zeros): ``t < last`` is tested as each
    offset below the share's end, elementwise like the other bounds."""
    offs_w = tl.multiple_of(t * BKW, BKW) + tl.arange(0, BKW)
    offs_k = t * BK + tl.arange(0, BK)
    w_ok = n_ok if EVEN_K else n_ok & (offs_w[None, None, :] < n_words)
    if AHEAD:
        words = tl.load(q_rows + offs_w[None, None, :], mask=w_ok & (offs_w[None, None, :] < last * BKW), other=0)
        x = tl.load(x_ptr + offs_k, mask=(offs_k < K) & (offs_k < last * BK), other=0.0)
    else:
        words = tl.load(q_rows + offs_w[None, None, :], mask=w_ok, other=0)
        x = tl.load(x_ptr + offs_k) if EVEN_K else tl.load(x_ptr + offs_k, mask=offs_k < K, other=0.0)
    return words, x
