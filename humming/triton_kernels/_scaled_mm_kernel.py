"""The ``@triton.jit`` kernel of the Triton scaled GEMM (:mod:`.scaled_mm`), private: one kernel specialised by
``constexpr`` for the compute plan (:mod:`._scaled_mm_plan`), the activation's format and the weight's layout,
dense or grouped (MoE). :mod:`._scaled_mm_launch` fills its arguments.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._decode_e4m3 import load_weight_tile_e4m3
from ._tiles import route_tile, store_tile, tile_ids
from ._weight_tile import (
    WeightArgs,
    decode_codes,
    decode_scale,
    decode_weight,
    group_tile,
    scale_tile,
    unpack_tile,
    with_global_scale,
    zero_tile,
)
from .interpreter import cast, dot, fp8_dot

__all__ = ["_scaled_mm_kernel"]


@triton.jit
def _scale_vec(ptr, stride, offs, ok, col, PER_ROW: tl.constexpr, GROUP: tl.constexpr, S_KIND: tl.constexpr):
    """fp32 scales [B] of rows ``offs`` (those where ``ok``; the others 0) at scale column ``col``: row groups
    of ``GROUP`` (0 = one for all)."""
    if PER_ROW:
        g = offs // GROUP if GROUP > 1 else offs
        s = tl.load(ptr + g.to(tl.int64) * stride + col, mask=ok, other=0)
    else:
        s = tl.load(ptr + col + offs * 0)
    return decode_scale(s, S_KIND)


@triton.jit
def _pow2(e):
    """fp32 ``2^e`` of int32 exponents ``e`` in [-126, 127] (normal numbers), exactly."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _row_fold(weight, spec, offs_n, offs_k, k0, N, K, tops, BK: tl.constexpr, EVEN_K: tl.constexpr):
    """``2^(e - t + 6)`` broadcastable to ``[BN, BK]``: the power of two that a group of e8m0 scale code ``e``
    folds into the e4m3 operand in a row of top code ``t`` (``tops``, [BN]; :func:`._scaled_mm_plan.row_tops`),
    at most ``2^6``; a group of zeros may lie below the fold's range (clamped: its values stay 0)."""
    s = weight.s
    e = group_tile(s, weight.stride_sn, offs_n, offs_k, k0, N, K, weight.gidx, BK, spec.GN, spec.GK, False, EVEN_K)
    return _pow2(tl.maximum(tl.minimum(e.to(tl.int32) - tops[:, None] + 6, 6), -126))


@triton.jit
def _row_scale(tops):
    """fp32 ``2^(t - 127 - 6)`` of e8m0 codes ``t`` (the rows' scales of a row fold), subnormals included: the
    product of two normal powers of two."""
    e = tops - 133
    high = tl.maximum(e, -126)
    return _pow2(high) * _pow2(e - high)


@triton.jit
def _mma(a, b, acc, MMA: tl.constexpr, BK: tl.constexpr):
    """``acc + a @ b`` (int32 for int8 operands, else fp32). fp8 products are promoted to the fp32
    accumulator every ``BK`` (fp8 tensor cores accumulate with reduced precision)."""
    if MMA == "int8":
        return tl.dot(a, b, acc, out_dtype=tl.int32)
    elif MMA == "e4m3":
        return fp8_dot(a, b, acc, BK)
    elif MMA == "fp32":
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return dot(a, b, acc)


@triton.jit
def _weight_operand(
    weight,
    spec,
    offs_n,
    offs_k,
    k0,
    N,
    K,
    BK: tl.constexpr,
    EVEN_K: tl.constexpr,
    MMA: tl.constexpr,
    MMA_DTYPE: tl.constexpr,
    W_SCALE: tl.constexpr,
    PACKED: tl.constexpr,
    tops,
):
    """The weight operand ``[BK, BN]`` of one K step: ``decode(q) - zero`` (times a folded scale, or with
    ``"rowfold"`` the power of two of :func:`_row_fold` for the rows' top scale codes ``tops``), exact in the
    MMA type; for int8 MMAs the integer ``q - zero`` itself; with ``PACKED`` (:mod:`._decode_e4m3`) the same
    e4m3 operand by packed conversion."""
    if len(PACKED) > 0:
        w_op = load_weight_tile_e4m3(weight, spec, offs_n, k0, N, K, BK, EVEN_K, PACKED)
    elif MMA == "int8":
        codes = unpack_tile(weight, spec, offs_n, k0, N, K, BK)
        W_BITS: tl.constexpr = spec.W_BITS
        w_int = (codes << (32 - W_BITS)) >> (32 - W_BITS) if spec.W_KIND == 0 else codes
        if spec.HAS_ZP:
            w_int = w_int - zero_tile(weight, spec, offs_n, offs_k, k0, N, K, BK).to(tl.int32)
        w_op = w_int.to(tl.int8)
    else:
        w_val = decode_weight(unpack_tile(weight, spec, offs_n, k0, N, K, BK), weight, spec)
        if spec.HAS_ZP:
            w_val = w_val - zero_tile(weight, spec, offs_n, offs_k, k0, N, K, BK).to(tl.float32)
        if W_SCALE == "fold":
            w_val = w_val * scale_tile(weight, spec, offs_n, offs_k, k0, N, K, BK)
        elif W_SCALE == "rowfold":
            w_val = w_val * _row_fold(weight, spec, offs_n, offs_k, k0, N, K, tops, BK, EVEN_K)
        w_op = w_val.to(tl.float8e4nv) if MMA == "e4m3" else cast(w_val, MMA_DTYPE)
    return tl.trans(w_op)


@triton.jit
def _scaled_mm_kernel(
    a_ptr,
    as_ptr,
    ags_ptr,
    qw_ptr,
    qb_ptr,
    s_ptr,
    z_ptr,
    gs_ptr,
    lut_ptr,
    rt_ptr,  # int32 [*E, N]: the rows' top scale codes of a "rowfold" plan (_scaled_mm_plan.row_tops)
    bias_ptr,
    out_ptr,
    ws_ptr,
    expert_ptr,
    rows_ptr,
    M,
    N,
    K,
    stride_am,
    stride_asm,
    stride_qn,
    stride_qb,
    stride_sn,
    stride_zn,
    stride_om,
    stride_qe,  # the stride_*e: per-expert offsets of the grouped (MoE) kernel
    stride_se,
    stride_ze,
    stride_gse,
    stride_rte,
    stride_be,
    route_bm,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SPLIT_K: tl.constexpr,  # > 1: program_id(1) takes a slice of K, summed in the workspace ws_ptr (store_tile)
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,  # K % BK == 0: no masks along K
    HAS_BIAS: tl.constexpr,
    MMA: tl.constexpr,  # "int8", "e4m3", "fp16", "bf16", "fp32" or "scaled" (tl.dot_scaled, sm_100+)
    MMA_DTYPE: tl.constexpr,
    A_SCALE: tl.constexpr,  # "end", "promote", "fold" or "native" (inside tl.dot_scaled)
    W_SCALE: tl.constexpr,  # "none", "end", "promote", "fold", "rowfold" or "native"
    A_KIND: tl.constexpr,
    A_BITS: tl.constexpr,
    A_EBITS: tl.constexpr,
    A_MBITS: tl.constexpr,
    A_BIAS: tl.constexpr,
    A_S_KIND: tl.constexpr,
    A_PER_ROW: tl.constexpr,  # scales per token (else one for the tensor)
    A_GK: tl.constexpr,  # activation scale group along K; 0 = the whole K
    A_HAS_GS: tl.constexpr,
    WEIGHT: tl.constexpr,  # the weight's WeightSpec (_weight_tile), without act-order
    GROUPED: tl.constexpr,  # MoE: rows use expert expert_ptr[row // route_bm] (as wna16's grouped kernel)
    GATHER: tl.constexpr,  # MoE: output row r reads activation row rows_ptr[r] (codes and scales; -1: zeros)
    PACKED: tl.constexpr = "",  # the packed e4m3 decode's PTX (_decode_e4m3.packed_e4m3), or "" (fp32 decode)
):
    pid_m, pid_n = tile_ids(M, N, BM, BN, GROUP_M)
    expert, offs_m, src, src_ok = route_tile(expert_ptr, rows_ptr, pid_m, M, route_bm, BM, GROUPED, GATHER)
    if GROUPED:
        if expert < 0:
            return
        qw_ptr += expert * stride_qe
        qb_ptr += expert * stride_qe * 4
        s_ptr += expert * stride_se
        z_ptr += expert * stride_ze
        gs_ptr += expert * stride_gse
        rt_ptr += expert * stride_rte
        bias_ptr += expert * stride_be
    # No act-order here (unsupported() refuses g_idx): the gidx slot is a dummy that WEIGHT never reads.
    weight = WeightArgs(qw_ptr, s_ptr, z_ptr, gs_ptr, z_ptr, lut_ptr, stride_qn, stride_sn, stride_zn)

    offs_n = pid_n * BN + tl.arange(0, BN)
    m_ok = src_ok[:, None]  # activation rows to read (codes and per-row scales): src, in x's row order
    a_rows = a_ptr + src[:, None] * stride_am
    W_PER_ROW: tl.constexpr = WEIGHT.GN > 0
    W_GN: tl.constexpr = WEIGHT.GN if WEIGHT.GN > 0 else 1
    PROMOTE: tl.constexpr = A_SCALE == "promote" or W_SCALE == "promote"
    ACC_DTYPE: tl.constexpr = tl.int32 if MMA == "int8" else tl.float32
    # 8-bit weights that are the MMA operand bit for bit are loaded as the operand type, [BN, BK] (K contiguous,
    # as the tensor cores read both 8-bit operands), and fed to the dot transposed: Triton then copies the
    # tiles asynchronously into the MMA's shared-memory layout and both operands go from there to the MMA
    # (a byte load bitcast to fp8, or an [BK, BN] tile, is re-laid out through registers every K step).
    W_BYTES: tl.constexpr = (WEIGHT.W_BITS == 8 and not WEIGHT.HAS_ZP and W_SCALE != "fold") and (
        (MMA == "int8" and WEIGHT.W_KIND == 0)
        or (MMA == "e4m3" and WEIGHT.W_KIND == 2 and WEIGHT.W_EBITS == 4 and WEIGHT.W_MBITS == 3)
    )
    A_DIRECT: tl.constexpr = A_BITS == 8 and (MMA == "int8" or MMA == "e4m3")  # 8-bit codes: the operand as is
    n_ok = offs_n[None, :] < N
    b_cols = qb_ptr + offs_n.to(tl.int64)[None, :] * stride_qb
    w_rows = qb_ptr.to(tl.pointer_type(MMA_DTYPE)) + offs_n.to(tl.int64)[:, None] * stride_qb
    w_rows_ok = offs_n[:, None] < N
    a_op_rows = a_ptr.to(tl.pointer_type(MMA_DTYPE)) + src[:, None] * stride_am
    tops = tl.load(rt_ptr + offs_n, mask=offs_n < N, other=127) if W_SCALE == "rowfold" else offs_n

    acc = tl.zeros((BM, BN), dtype=tl.float32 if PROMOTE else ACC_DTYPE)
    k_tiles = tl.cdiv(K, BK)
    per_split = tl.cdiv(k_tiles, SPLIT_K)
    first = tl.program_id(1) * per_split
    for t in range(first, tl.minimum(first + per_split, k_tiles)):
        k0 = t * BK
        offs_k = k0 + tl.arange(0, BK)
        a_mask = m_ok if EVEN_K else m_ok & (offs_k[None, :] < K)
        if A_DIRECT:
            a_raw = tl.load(a_op_rows + offs_k[None, :], mask=a_mask, other=0.0)
        else:
            a_raw = tl.load(a_rows + offs_k[None, :], mask=a_mask, other=0)

        if MMA == "scaled":
            # Blackwell block-scaled MMA: MX activations (e2m1 / e4m3, e8m0 per 32) x MXFP4 weights, packed
            # two e2m1 per byte along K, low nibble first (the IR's canonical packing of the weight as is).
            if A_BITS == 4:
                lo, hi = tl.split(tl.reshape(a_raw, (BM, BK // 2, 2)))
                a_op = lo | (hi << 4)
            else:
                a_op = a_raw
            offs_kb = k0 // 2 + tl.arange(0, BK // 2)
            b_op = tl.load(b_cols + offs_kb[:, None], mask=n_ok & (offs_kb[:, None] < (K + 1) // 2), other=0)
            offs_ks = k0 // 32 + tl.arange(0, BK // 32)
            ks_ok = offs_ks[None, :] < tl.cdiv(K, 32)
            a_sc_rows = as_ptr + src[:, None] * stride_asm
            a_sc = tl.load(a_sc_rows + offs_ks[None, :], mask=m_ok & ks_ok, other=127)
            w_sc_rows = s_ptr + offs_n.to(tl.int64)[:, None] * stride_sn
            w_sc = tl.load(w_sc_rows + offs_ks[None, :], mask=(offs_n[:, None] < N) & ks_ok, other=127)
            acc = tl.dot_scaled(a_op, a_sc, "e2m1" if A_BITS == 4 else "e4m3", b_op, w_sc, "e2m1", acc)
        else:
            # Activation operand. Codes beyond K are 0 and decode to 0, so the weight's padding adds nothing.
            if A_DIRECT:
                a_op = a_raw
            elif MMA == "int8":
                a_op = ((a_raw.to(tl.int32) << (32 - A_BITS)) >> (32 - A_BITS)).to(tl.int8)
            else:
                a_val = decode_codes(a_raw.to(tl.int32), lut_ptr, A_KIND, A_BITS, A_EBITS, A_MBITS, A_BIAS, 0)
                if A_SCALE == "fold":
                    a_s = tl.load(
                        as_ptr + src[:, None] * stride_asm + (offs_k // A_GK)[None, :],
                        mask=m_ok & (offs_k[None, :] < K),
                        other=0,
                    )
                    a_val = a_val * decode_scale(a_s, A_S_KIND)
                a_op = cast(a_val, MMA_DTYPE)

            # Weight operand [BK, BN]: bytes that are the MMA operand as they are, else decoded codes.
            if W_BYTES:
                b_mask = w_rows_ok if EVEN_K else w_rows_ok & (offs_k[None, :] < K)
                b_raw = tl.load(w_rows + offs_k[None, :], mask=b_mask, other=0.0)
                b_op = tl.trans(b_raw)
            else:
                b_op = _weight_operand(
                    weight, WEIGHT, offs_n, offs_k, k0, N, K, BK, EVEN_K, MMA, MMA_DTYPE, W_SCALE, PACKED, tops
                )

            if PROMOTE:
                # Each K step's partial product joins the fp32 accumulator with its scales.
                part = _mma(a_op, b_op, tl.zeros((BM, BN), dtype=ACC_DTYPE), MMA, BK).to(tl.float32)
                if A_SCALE == "promote":
                    a_s = _scale_vec(as_ptr, stride_asm, src, src_ok, k0 // A_GK, A_PER_ROW, 1, A_S_KIND)
                    part = part * a_s[:, None]
                if W_SCALE == "promote":
                    # fp32(scale) * global before the accumulator (here and in the epilogue), as dequantize
                    # rounds it: a scale near 2^127 times the accumulator could overflow where the product of
                    # the two scales does not.
                    w_s = _scale_vec(
                        s_ptr, stride_sn, offs_n, offs_n < N, k0 // WEIGHT.GK, W_PER_ROW, W_GN, WEIGHT.S_KIND
                    )
                    part = part * with_global_scale(w_s, weight, WEIGHT)[None, :]
                acc += part
            else:
                acc = _mma(a_op, b_op, acc, MMA, BK)

    acc = acc.to(tl.float32)
    if A_SCALE == "end":
        acc = acc * _scale_vec(as_ptr, stride_asm, src, src_ok, 0, A_PER_ROW, 1, A_S_KIND)[:, None]
    if W_SCALE == "end":
        w_s = _scale_vec(s_ptr, stride_sn, offs_n, offs_n < N, 0, W_PER_ROW, W_GN, WEIGHT.S_KIND)
        acc = acc * with_global_scale(w_s, weight, WEIGHT)[None, :]
    elif W_SCALE == "rowfold":  # the plan has no global scale here
        acc = acc * _row_scale(tops)[None, :]
    if A_HAS_GS:
        acc = acc * tl.load(ags_ptr)
    if WEIGHT.HAS_GS and W_SCALE != "end" and W_SCALE != "promote":
        acc = acc * tl.load(gs_ptr)  # after folded scales: e4m3 only (see _scaled_mm_plan), too small to overflow
    store_tile(acc, out_ptr, stride_om, bias_ptr, ws_ptr, offs_m, offs_n, M, N, HAS_BIAS, SPLIT_K)
