"""The Triton kernels of activation quantization (:mod:`.act_quant` is their entry point), bit-exact with
:func:`humming.quantize_activation`, and the element arithmetic the fused passes (:mod:`.norm_quant`,
:mod:`.moe_layer`) share: :func:`finite_absmax` (a span's absmax and whether it holds NaN / Inf),
:func:`span_scale` (the scale of a span from its absmax) and :func:`quantize_chunk` (codes of a tile for
its scales)."""

from __future__ import annotations

import triton
import triton.language as tl

from .interpreter import fma

__all__ = ["_absmax_kernel", "_act_quant_kernel", "finite_absmax", "quantize_chunk", "span_scale"]


@triton.jit
def _exp2i(n):
    """2.0**n as float32 for an int32 tensor n in [-126, 127] (exact; no libdevice call)."""
    return ((n + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _floor_log2(mag):
    """floor(log2(mag)) of non-negative normal float32 values (-127 for zero and subnormals)."""
    return ((mag.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127


@triton.jit
def _encode(q, up, INT: tl.constexpr, BITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr, MAXV: tl.constexpr):
    """float32 value ``q`` -> int32 code, rounding to nearest even and saturating like
    ``NumberFormat.encode``. ``up`` (float32: -1, 0 or +1) is the sign of ``exact - q``: where ``q`` sits
    exactly on a midpoint but the exact value does not, the midpoint is left in that direction."""
    if INT:
        qc = tl.minimum(tl.maximum(q, -MAXV - 2.0), MAXV + 2.0)
        fl = tl.floor(qc)
        frac = qc - fl
        odd = (fl.to(tl.int32) & 1) == 1
        rnd_up = (frac > 0.5) | ((frac == 0.5) & ((up > 0) | ((up == 0) & odd)))
        r = tl.where(rnd_up, fl + 1.0, fl)
        r = tl.minimum(tl.maximum(r, -MAXV - 1.0), MAXV)
        return r.to(tl.int32) & ((1 << BITS) - 1)
    else:
        sign = (q.to(tl.int32, bitcast=True) >> 31) & 1
        mag = tl.abs(q)
        up_mag = tl.where(sign == 1, -up, up)
        up_mag = tl.where(mag >= MAXV, 0.0, up_mag)
        mag = tl.minimum(mag, MAXV)
        e = tl.maximum(_floor_log2(mag), 1 - BIAS)
        t = mag * _exp2i(MBITS - e)  # the significand in units of the quantum (exact: power of two)
        fl = tl.floor(t)
        frac = t - fl
        odd = (fl.to(tl.int32) & 1) == 1
        rnd_up = (frac > 0.5) | ((frac == 0.5) & ((up_mag > 0) | ((up_mag == 0) & odd)))
        r = tl.where(rnd_up, fl + 1.0, fl).to(tl.int32)
        carry = r >= (2 << MBITS)  # rounding carried into the next binade
        e = tl.where(carry, e + 1, e)
        r = tl.where(carry, 1 << MBITS, r)
        normal = r >= (1 << MBITS)
        exp_field = tl.where(normal, e + BIAS, 0)
        mant = tl.where(normal, r - (1 << MBITS), r)
        return (sign << (BITS - 1)) | (exp_field << MBITS) | mant


@triton.jit
def _decode_e4m3(code):
    """uint8/int32 e4m3 code -> float32 (codes 0x7F / 0xFF: NaN)."""
    exp_field = (code >> 3) & 0xF
    mant = code & 0x7
    normal = ((exp_field - 7 + 127) << 23) | (mant << 20)
    mag = tl.where(exp_field == 0, mant.to(tl.float32) * 0.001953125, normal.to(tl.float32, bitcast=True))
    sign = ((code >> 7) & 1) << 31  # OR-ed in: negation (0 - mag) would turn code 0x80 into +0.0
    value = (mag.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)
    return tl.where((code & 0x7F) == 0x7F, float("nan"), value)


@triton.jit
def _encode_rne(q, INT: tl.constexpr, BITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr, MAXV: tl.constexpr):
    """Finite float32 ``q`` -> int32 code, rounded to nearest even and saturated like ``NumberFormat.encode``
    (:func:`_encode` with ``up`` zero) in a few integer and float additions: each addition's own rounding is
    the rounding asked for."""
    if INT:
        qc = tl.minimum(tl.maximum(q, -MAXV - 1.0), MAXV)
        # 1.5 * 2**23 has an ulp of 1: the sum is qc rounded to an integer, ties to even, in the low bits.
        return ((qc + 12582912.0).to(tl.int32, bitcast=True) - 0x4B400000) & ((1 << BITS) - 1)
    else:
        sign = (q.to(tl.int32, bitcast=True) >> 31) & 1
        mag = tl.minimum(tl.abs(q), MAXV)
        mag_bits = mag.to(tl.int32, bitcast=True)
        # Normal codes: the float32 bits lose 23 - MBITS mantissa bits, half to even; a carry moves into the
        # exponent, which is then rebased from float32's bias to the format's.
        lsb = (mag_bits >> (23 - MBITS)) & 1
        normal = ((mag_bits + ((1 << (22 - MBITS)) - 1) + lsb) >> (23 - MBITS)) - ((127 - BIAS) << MBITS)
        # Subnormal codes: 2**(23 + emin - MBITS) has the subnormal quantum as its ulp, so adding it rounds.
        magic = _exp2i(tl.zeros_like(mag_bits) + (24 - BIAS - MBITS))
        subnormal = (mag + magic).to(tl.int32, bitcast=True) - magic.to(tl.int32, bitcast=True)
        min_normal = _exp2i(tl.zeros_like(mag_bits) + (1 - BIAS))
        return (sign << (BITS - 1)) | tl.where(mag < min_normal, subnormal, normal)


@triton.jit
def _settled_quotient(
    x, s, INT: tl.constexpr, BITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr, MAXV: tl.constexpr
):
    """``x / s`` as a float32 that rounds on the element grid (:func:`_encode_rne`) as the exact quotient
    rounds, without a division or a float64 step per element.

    The span's ``x`` and ``s`` are first scaled by one power of two (exact) so that ``1 / s`` and every
    residual below are normal floats. ``q = x * (1 / s)`` (two roundings: under 2 float32 ulps from
    ``x / s``) rounds like ``x / s`` unless it lies within 3 ulps of a midpoint of the grid. The magnitude is
    moved to a binade whose ulp is a fixed fraction of the grid's quantum (integers and subnormals by
    adding a power of two, exactly or within half an ulp), where the bits below the quantum are the distance
    to the nearest midpoint ``mid``. Near one, the sign of ``|x| - mid * s``, one fma (exact in sign: the
    residual is a multiple of 2^-89 at least, far from underflow), settles the side: ``mid`` one ulp up or
    down, or ``mid`` itself for an exact tie (then rounded half to even, as the reference does)."""
    factor = tl.where(s < 1e-12, _exp2i(tl.zeros_like(s.to(tl.int32, bitcast=True)) + 100), 1.0)
    factor = tl.where(s > 1e12, _exp2i(tl.zeros_like(s.to(tl.int32, bitcast=True)) - 64), factor)
    s = s * factor
    x = x * factor
    inverse = tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), tl.where(s == 0, 1.0, s))
    q = x * inverse
    if INT:  # integers: the magnitude plus 2**BITS, in a binade whose ulp is 2**(BITS - 23)
        mag = tl.minimum(tl.abs(q), MAXV + 1.0)
        lift = _exp2i(tl.zeros_like(q.to(tl.int32, bitcast=True)) + BITS)
        frac_bits: tl.constexpr = 23 - BITS
    else:  # subnormals plus the smallest normal, in its binade, whose quantum is theirs
        mag = tl.minimum(tl.abs(q), MAXV)
        min_normal = _exp2i(tl.zeros_like(q.to(tl.int32, bitcast=True)) + (1 - BIAS))
        lift = tl.where(mag < min_normal, min_normal, 0.0)
        frac_bits: tl.constexpr = 23 - MBITS
    moved = (mag + lift).to(tl.int32, bitcast=True)
    half = 1 << (frac_bits - 1)
    below = moved & ((1 << frac_bits) - 1)
    near = tl.abs(below - half) <= 3
    mid = ((moved & ~((1 << frac_bits) - 1)) | half).to(tl.float32, bitcast=True) - lift  # exact (Sterbenz)
    side = fma(-mid, s + tl.zeros_like(x), tl.abs(x))
    mid_bits = mid.to(tl.int32, bitcast=True)
    settled = tl.where(side > 0, mid_bits + 1, tl.where(side < 0, mid_bits - 1, mid_bits))
    out_bits = tl.where(near, settled, mag.to(tl.int32, bitcast=True))
    return (out_bits | (q.to(tl.int32, bitcast=True) & (-0x7FFFFFFF - 1))).to(tl.float32, bitcast=True)


@triton.jit
def quantize_chunk(x, s, e8m0_exp, ELEMENT: tl.constexpr, SCALE: tl.constexpr):
    """Codes of float32 ``x`` [BM, BK] (any rank) in the element format ``ELEMENT`` (an ElementSpec) for scale
    ``s`` ([BM, 1], float64 for "e4m3g", else float32) or, for SCALE == "e8m0", the int32 exponent
    ``e8m0_exp`` [BM, 1].

    float32 scales: the codes of :func:`_settled_quotient`, which rounds like the reference's float64
    ``x / s``."""
    if SCALE == "e8m0":
        q = x * _exp2i(-e8m0_exp)  # exact: a power of two
        code = _encode_rne(q, ELEMENT.INT, ELEMENT.BITS, ELEMENT.MBITS, ELEMENT.BIAS, ELEMENT.MAXV)
        zero = tl.zeros_like(q) != 0
    elif SCALE == "e4m3g":
        q64 = x.to(tl.float64) / tl.where(s == 0, 1.0, s)
        q = q64.to(tl.float32)
        d = q64 - q.to(tl.float64)
        up = tl.where(d > 0, 1.0, tl.where(d < 0, -1.0, 0.0))
        code = _encode(q, up, ELEMENT.INT, ELEMENT.BITS, ELEMENT.MBITS, ELEMENT.BIAS, ELEMENT.MAXV)
        zero = (s == 0) & (x == x)
    else:
        q = _settled_quotient(x, s, ELEMENT.INT, ELEMENT.BITS, ELEMENT.MBITS, ELEMENT.BIAS, ELEMENT.MAXV)
        code = _encode_rne(q, ELEMENT.INT, ELEMENT.BITS, ELEMENT.MBITS, ELEMENT.BIAS, ELEMENT.MAXV)
        zero = (s == 0) & (x == x)
    # NaN / Inf elements: the format's NaN code (0x7F, all ones but the sign, in every 8-bit eXmY format), else
    # code 0, as humming.quantize_activation sets them (README, "Non-finite activations").
    if ELEMENT.INT or ELEMENT.BITS < 8:
        nan_code = 0
    else:
        nan_code = 0x7F
    return tl.where(tl.abs(x) < float("inf"), tl.where(zero, 0, code), nan_code)


@triton.jit
def finite_absmax(x, axis: tl.constexpr):
    """``(absmax, non_finite)`` of float32 ``x`` along ``axis``: the largest magnitude of the finite elements
    and whether any element is NaN / Inf. Reduced on the magnitudes' bits (non-negative floats order like
    them, NaN and Inf above every finite one), with the finite-only maximum taken again only where a tile
    holds a non-finite element."""
    bits = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    top = tl.max(bits, axis=axis)
    non_finite = top >= 0x7F800000
    if tl.max(non_finite.to(tl.int32), axis=None) != 0:
        top = tl.max(tl.where(bits < 0x7F800000, bits, 0), axis=axis)
    return top.to(tl.float32, bitcast=True), non_finite


@triton.jit
def span_scale(amax, ELEMENT: tl.constexpr, SCALE: tl.constexpr):
    """``(s, e8m0_exp)`` of spans whose absmax is ``amax`` (float32 [BM]) in the element format ``ELEMENT``:
    for SCALE == "fp32" the float32 scale ``s`` (``e8m0_exp`` zero), for SCALE == "e8m0" the int32 exponent
    of the e8m0 scale (``s`` zero)."""
    if SCALE == "fp32":
        # float32(float64(amax) / max) (no double rounding: the quotient of these operands is never within
        # 2^-53 of a float32 midpoint); integer grids round the scale up so that no code clips.
        s = tl.math.div_rn(amax, tl.full(amax.shape, ELEMENT.MAXV, tl.float32))
        if ELEMENT.INT:
            below = s.to(tl.float64) * ELEMENT.MAXV < amax.to(tl.float64)  # exact: 24 x 8 significant bits
            s = tl.where(below, (s.to(tl.int32, bitcast=True) + 1).to(tl.float32, bitcast=True), s)
        e8m0_exp = tl.zeros(amax.shape, dtype=tl.int32)
    else:
        # OCP MX: 2^(floor(log2(amax)) - emax(element)), at least 2^-127 (exact for every fp16/bf16/fp32 amax).
        e8m0_exp = tl.minimum(tl.maximum(_floor_log2(amax) - ELEMENT.EMAX_ELEM, -127), 127)
        s = tl.zeros(amax.shape, dtype=tl.float32)
    return s, e8m0_exp


@triton.jit
def _absmax_kernel(x_ptr, amax_ptr, M, K, stride_xm, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """amax_ptr[0] (int32 bits of a non-negative float32, zero-initialised) = max |x| over [M, K]."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    rows64 = rows.to(tl.int64)  # row offsets in int64: M * K may exceed 2^31 elements
    mask = (rows[:, None] < M) & (cols[None, :] < K)
    x = tl.load(x_ptr + rows64[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    # NaN / Inf are left out of the absmax (finite_absmax): a row holding one gets a NaN output row from
    # humming.linear, and the other rows keep the scale they have without it.
    row_amax, _ = finite_absmax(x, 1)
    amax = tl.max(row_amax, axis=0)
    tl.atomic_max(amax_ptr, amax.to(tl.int32, bitcast=True))  # non-negative floats order like their bits


@triton.jit
def _source_cols(perm_ptr, cols, k_hi, PERM: tl.constexpr):
    """The columns of x that columns ``cols`` of the codes quantize: ``perm_ptr[cols]`` with PERM, else
    ``cols`` (columns at or past ``k_hi`` are masked by the caller)."""
    if PERM:
        return tl.load(perm_ptr + cols, mask=cols < k_hi, other=0)
    return cols


@triton.jit
def _act_quant_kernel(
    x_ptr,
    codes_ptr,
    scales_ptr,
    amax_ptr,
    gscale_ptr,
    perm_ptr,
    M,
    K,
    stride_xm,
    stride_cm,
    stride_sm,
    stride_sk,
    ELEMENT: tl.constexpr,  # the element format's ElementSpec (_act_quant_pass)
    SCALE: tl.constexpr,  # "fp32", "e8m0" or "e4m3g" (e4m3 scales under an fp32 global scale)
    SOURCE: tl.constexpr,  # "local" (amax per row span), "tensor" (amax_ptr) or "static" (scales_ptr given)
    GROUP_K: tl.constexpr,  # span of one scale along K; 0 = the whole row
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    VALUES: tl.constexpr = False,  # store e4m3 values (16-bit floats) instead of codes
    PERM: tl.constexpr = False,  # column j of the codes quantizes column perm_ptr[j] of x (act order)
):
    """Quantize x [M, K] -> codes uint8 [M, K] and scales (span j of row r at r * stride_sm + j * stride_sk);
    with PERM, x's columns gathered by perm_ptr (int32 [K]) first. Grid: (cdiv(M, BLOCK_M), spans along K)."""
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows64 = rows.to(tl.int64)  # row offsets in int64: M * K may exceed 2^31 elements
    row_mask = rows < M
    if GROUP_K == 0 and SOURCE == "local":
        k_lo = 0
        k_hi = K
    elif GROUP_K == 0:
        k_lo = pid_k * BLOCK_K
        k_hi = tl.minimum(k_lo + BLOCK_K, K)
    else:
        k_lo = pid_k * GROUP_K
        k_hi = tl.minimum(k_lo + GROUP_K, K)

    # A span holding NaN / Inf gets a NaN scale, so that every GEMM's epilogue makes its output row NaN
    # (humming.linear's rule for non-finite activations); its codes are then irrelevant.
    non_finite = tl.zeros([BLOCK_M], dtype=tl.int1)
    if SOURCE == "local":
        amax = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            mask = row_mask[:, None] & (cols[None, :] < k_hi)
            # A row's absmax does not depend on the column order: only groups gather their columns.
            src = _source_cols(perm_ptr, cols, k_hi, PERM and GROUP_K > 0)
            x = tl.load(x_ptr + rows64[:, None] * stride_xm + src[None, :], mask=mask, other=0.0)
            chunk_amax, chunk_non_finite = finite_absmax(x.to(tl.float32), 1)
            non_finite = non_finite | chunk_non_finite
            amax = tl.maximum(amax, chunk_amax)
    else:  # "tensor": the absmax pass's result ("static": unused, and amax_ptr is not an absmax)
        amax = tl.zeros([BLOCK_M], dtype=tl.float32)
        if SOURCE == "tensor":
            amax += tl.load(amax_ptr).to(tl.float32, bitcast=True)

    e8m0_exp = tl.zeros([BLOCK_M], dtype=tl.int32)
    s = tl.zeros([BLOCK_M], dtype=tl.float32)
    if SOURCE == "static":
        s = tl.load(scales_ptr) + tl.zeros([BLOCK_M], dtype=tl.float32)
    elif SCALE == "fp32" or SCALE == "e8m0":
        s, e8m0_exp = span_scale(amax, ELEMENT, SCALE)
    else:
        # NVFP4: global scale = 1 / fp32((max element * 448, the largest e4m3 scale) / tensor amax), the direct
        # quotient where that divisor overflows (humming.quantize's definition)
        tensor_amax = tl.load(amax_ptr).to(tl.float32, bitcast=True) + tl.zeros([BLOCK_M], dtype=tl.float32)
        top = tl.full([BLOCK_M], ELEMENT.MAXV * 448.0, tl.float32)
        divisor = tl.math.div_rn(top, tensor_amax)
        inverse = tl.math.div_rn(tl.full([BLOCK_M], 1.0, tl.float32), divisor)
        g = tl.where(divisor < float("inf"), inverse, tl.math.div_rn(tensor_amax, top))
        g = tl.where(g == 0, 1.0, g)
        g64 = g.to(tl.float64)
        s_ideal = tl.minimum(amax.to(tl.float64) / ELEMENT.MAXV / g64, 448.0).to(tl.float32)
        s_code = _encode(s_ideal, tl.zeros_like(s_ideal), False, 8, 3, 7, 448.0)
        s = _decode_e4m3(s_code).to(tl.float64) * g64  # exact: 4 x 24 significant bits
        tl.store(gscale_ptr, tl.max(g, axis=0), mask=(pid_m == 0) & (pid_k == 0))

    if SOURCE == "local":
        s_col = pid_k
        if SCALE == "e8m0":  # 255: the e8m0 NaN
            e8m0_code = tl.where(non_finite, 255, e8m0_exp + 127)
            tl.store(scales_ptr + rows64 * stride_sm + s_col * stride_sk, e8m0_code.to(tl.uint8), mask=row_mask)
        elif SCALE == "e4m3g":  # 0x7F: an e4m3 NaN
            e4m3_code = tl.where(non_finite, 0x7F, s_code)
            tl.store(scales_ptr + rows64 * stride_sm + s_col * stride_sk, e4m3_code.to(tl.uint8), mask=row_mask)
        else:
            scale = tl.where(non_finite, float("nan"), s)
            tl.store(scales_ptr + rows64 * stride_sm + s_col * stride_sk, scale, mask=row_mask)
    elif SOURCE == "tensor":
        tl.store(scales_ptr, tl.max(s, axis=0), mask=(pid_m == 0) & (pid_k == 0))

    for k0 in range(k_lo, k_hi, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        mask = row_mask[:, None] & (cols[None, :] < k_hi)
        src = _source_cols(perm_ptr, cols, k_hi, PERM)
        x = tl.load(x_ptr + rows64[:, None] * stride_xm + src[None, :], mask=mask, other=0.0).to(tl.float32)
        code = quantize_chunk(x, s[:, None], e8m0_exp[:, None], ELEMENT, SCALE)
        if VALUES:  # the e4m3 value of each code, in codes_ptr's 16-bit float type (exact)
            value = _decode_e4m3(code).to(codes_ptr.dtype.element_ty)
            tl.store(codes_ptr + rows64[:, None] * stride_cm + cols[None, :], value, mask=mask)
        else:
            tl.store(codes_ptr + rows64[:, None] * stride_cm + cols[None, :], code.to(tl.uint8), mask=mask)
