"""Activation quantization in Triton, bit-exact with :func:`humming.quantize_activation`.

One kernel covers every :data:`humming.ACT_SCHEMES` entry: per-token, per-tensor (dynamic or a static
scale) and groups along K (1x16, 1x32, 1x128); int8 / int4 / e4m3 / e5m2 / e2m1 elements; fp32, e8m0 and
e4m3 (+ fp32 global) scales. The reference divides in float64; the kernel divides in float32 and settles
the only case where that can differ (the float32 quotient lands exactly on a rounding midpoint of the
element grid) from the sign of the exact residual ``x - q * s``, computed in float64 (two operations per
element; the division itself stays float32). NVFP4 scales are ``e4m3 * global``, a 28-bit product, so
that scheme divides in float64 outright. NaN / Inf follow the reference's rule (README, "Non-finite
activations"): every absmax ignores them, they get the format's NaN code (0 where it has none), and a span
scale over one is NaN.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..ir.activation import ACT_SCHEMES, ActScheme, QuantizedActivation, get_act_scheme
from . import registry
from ._launch import CompiledLaunches

__all__ = [
    "element_constexprs",
    "per_token_tile",
    "quantize_activation",
    "quantize_activation_values",
    "quantize_chunk",
    "quantize_pass",
    "scale_kind",
    "scheme_unsupported",
    "span_scale",
    "supports",
]

_X_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


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
def quantize_chunk(
    x,
    s,
    e8m0_exp,
    INT: tl.constexpr,
    BITS: tl.constexpr,
    MBITS: tl.constexpr,
    BIAS: tl.constexpr,
    MAXV: tl.constexpr,
    SCALE: tl.constexpr,
):
    """Codes of float32 ``x`` [BM, BK] for scale ``s`` ([BM, 1], float64 for "e4m3g", else float32) or,
    for SCALE == "e8m0", the int32 exponent ``e8m0_exp`` [BM, 1]."""
    if SCALE == "e8m0":
        q = x * _exp2i(-e8m0_exp)  # exact: a power of two
        up = tl.zeros_like(q)
        zero = tl.zeros_like(q) != 0
    elif SCALE == "e4m3g":
        q64 = x.to(tl.float64) / tl.where(s == 0, 1.0, s)
        q = q64.to(tl.float32)
        d = q64 - q.to(tl.float64)
        up = tl.where(d > 0, 1.0, tl.where(d < 0, -1.0, 0.0))
        zero = (s == 0) & (x == x)
    else:
        s_safe = tl.where(s == 0, 1.0, s)
        q = tl.math.div_rn(x, s_safe + tl.zeros_like(x))
        d = x.to(tl.float64) - q.to(tl.float64) * s_safe.to(tl.float64)  # exact: the residual of q
        up = tl.where(d > 0, 1.0, tl.where(d < 0, -1.0, 0.0))
        zero = (s == 0) & (x == x)
    code = _encode(q, up, INT, BITS, MBITS, BIAS, MAXV)
    # NaN / Inf elements: the format's NaN code (0x7F, all ones but the sign, in every 8-bit eXmY format), else
    # code 0, as humming.quantize_activation sets them (README, "Non-finite activations").
    if INT or BITS < 8:
        nan_code = 0
    else:
        nan_code = 0x7F
    return tl.where(tl.abs(x) < float("inf"), tl.where(zero, 0, code), nan_code)


@triton.jit
def span_scale(amax, INT: tl.constexpr, MAXV: tl.constexpr, EMAX_ELEM: tl.constexpr, SCALE: tl.constexpr):
    """``(s, e8m0_exp)`` of spans whose absmax is ``amax`` (float32 [BM]): for SCALE == "fp32" the float32
    scale ``s`` (``e8m0_exp`` zero), for SCALE == "e8m0" the int32 exponent of the e8m0 scale (``s`` zero)."""
    if SCALE == "fp32":
        # float32(float64(amax) / max) (no double rounding: the quotient of these operands is never within
        # 2^-53 of a float32 midpoint); integer grids round the scale up so that no code clips.
        s = tl.math.div_rn(amax, tl.full(amax.shape, MAXV, tl.float32))
        if INT:
            below = s.to(tl.float64) * MAXV < amax.to(tl.float64)  # exact: 24 x 8 significant bits
            s = tl.where(below, (s.to(tl.int32, bitcast=True) + 1).to(tl.float32, bitcast=True), s)
        e8m0_exp = tl.zeros(amax.shape, dtype=tl.int32)
    else:
        # OCP MX: 2^(floor(log2(amax)) - emax(element)), at least 2^-127 (exact for every fp16/bf16/fp32 amax).
        e8m0_exp = tl.minimum(tl.maximum(_floor_log2(amax) - EMAX_ELEM, -127), 127)
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
    # NaN / Inf are left out of the absmax (|x| < inf is false for both): a row holding one gets a NaN
    # output row from humming.linear, and the other rows keep the scale they have without it.
    mag = tl.abs(x)
    amax = tl.max(tl.max(tl.where(mag < float("inf"), mag, 0.0), axis=1), axis=0)
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
    INT: tl.constexpr,
    BITS: tl.constexpr,
    MBITS: tl.constexpr,
    BIAS: tl.constexpr,
    MAXV: tl.constexpr,
    EMAX_ELEM: tl.constexpr,
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
            mag = tl.abs(x.to(tl.float32))
            non_finite = non_finite | (tl.max((mag < float("inf")) == 0, axis=1) != 0)
            amax = tl.maximum(amax, tl.max(tl.where(mag < float("inf"), mag, 0.0), axis=1))
    else:  # "tensor": the absmax pass's result ("static": unused, and amax_ptr is not an absmax)
        amax = tl.zeros([BLOCK_M], dtype=tl.float32)
        if SOURCE == "tensor":
            amax += tl.load(amax_ptr).to(tl.float32, bitcast=True)

    e8m0_exp = tl.zeros([BLOCK_M], dtype=tl.int32)
    s = tl.zeros([BLOCK_M], dtype=tl.float32)
    if SOURCE == "static":
        s = tl.load(scales_ptr) + tl.zeros([BLOCK_M], dtype=tl.float32)
    elif SCALE == "fp32" or SCALE == "e8m0":
        s, e8m0_exp = span_scale(amax, INT, MAXV, EMAX_ELEM, SCALE)
    else:
        # NVFP4: global scale = 1 / fp32((max element * 448, the largest e4m3 scale) / tensor amax), the direct
        # quotient where that divisor overflows (humming.quantize's definition)
        tensor_amax = tl.load(amax_ptr).to(tl.float32, bitcast=True) + tl.zeros([BLOCK_M], dtype=tl.float32)
        top = tl.full([BLOCK_M], MAXV * 448.0, tl.float32)
        divisor = tl.math.div_rn(top, tensor_amax)
        inverse = tl.math.div_rn(tl.full([BLOCK_M], 1.0, tl.float32), divisor)
        g = tl.where(divisor < float("inf"), inverse, tl.math.div_rn(tensor_amax, top))
        g = tl.where(g == 0, 1.0, g)
        g64 = g.to(tl.float64)
        s_ideal = tl.minimum(amax.to(tl.float64) / MAXV / g64, 448.0).to(tl.float32)
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
        code = quantize_chunk(x, s[:, None], e8m0_exp[:, None], INT, BITS, MBITS, BIAS, MAXV, SCALE)
        if VALUES:  # the e4m3 value of each code, in codes_ptr's 16-bit float type (exact)
            value = _decode_e4m3(code).to(codes_ptr.dtype.element_ty)
            tl.store(codes_ptr + rows64[:, None] * stride_cm + cols[None, :], value, mask=mask)
        else:
            tl.store(codes_ptr + rows64[:, None] * stride_cm + cols[None, :], code.to(tl.uint8), mask=mask)


def supports(x: torch.Tensor, act: str | ActScheme) -> str | None:
    """``None`` if :func:`quantize_activation` runs ``x`` with ``act``, else the reason."""
    reason = scheme_unsupported(get_act_scheme(act))
    if reason is None and (x.dim() != 2 or x.dtype not in _X_DTYPES or x.stride(-1) != 1):
        return f"x: expected a 2-D float16/bfloat16/float32 tensor with contiguous rows, got {x.dtype} {tuple(x.shape)}"
    return reason


def scheme_unsupported(scheme: ActScheme) -> str | None:
    """``None`` if the kernel quantizes with ``scheme`` (whatever the activations), else the reason."""
    fmt = scheme.element_format
    if fmt.kind not in ("int", "float") or (fmt.is_int and not fmt.signed):
        return f"act {scheme.name}: element format {fmt.name} is not supported (signed int or eXmY only)"
    kind = scale_kind(scheme)
    if kind is None:
        return (
            f"act {scheme.name}: scale dtype {scheme.scale_dtype} with global_scale={scheme.global_scale} is not "
            "supported (float32; e8m0; e4m3 with a global scale)"
        )
    bn, bk = scheme.group_shape
    if bn == -1 and kind != "fp32":
        return f"act {scheme.name}: per-tensor scales must be float32"
    if bk != -1 and (bn != 1 or bk & (bk - 1) or bk < 16):
        return f"act {scheme.name}: groups along K must be a power of two >= 16, got {scheme.group_shape}"
    return None


def element_constexprs(fmt) -> dict[str, object]:
    """The element format's constexprs of the quantizing kernels (``INT`` ... ``EMAX_ELEM``, in their order)."""
    return {
        "INT": fmt.is_int,
        "BITS": fmt.bits,
        "MBITS": fmt.mantissa_bits,
        "BIAS": fmt.bias,
        "MAXV": fmt.max_value,
        "EMAX_ELEM": math.floor(math.log2(fmt.max_value)),
    }


def scale_kind(scheme: ActScheme) -> str | None:
    """How the kernel computes ``scheme``'s scales: ``"fp32"``, ``"e8m0"``, ``"e4m3g"`` (e4m3 under a float32
    global scale), or ``None`` (not supported)."""
    if scheme.scale_dtype == torch.float32 and not scheme.global_scale:
        return "fp32"
    if scheme.scale_dtype == torch.float8_e8m0fnu and not scheme.global_scale:
        return "e8m0"
    if scheme.scale_dtype == torch.float8_e4m3fn and scheme.global_scale:
        return "e4m3g"
    return None


def quantize_activation(
    x: torch.Tensor, act: str | ActScheme, *, scale: torch.Tensor | None = None, perm: torch.Tensor | None = None
) -> QuantizedActivation:
    """Quantize ``x`` [M, K] (fp16/bf16/fp32, rows contiguous) with scheme ``act``; the Triton twin of
    :func:`humming.quantize_activation` (same codes, scales and global scale). A static per-tensor
    ``scale`` replaces the dynamic one. ``perm`` (int32 ``[K]``, a permutation of the columns: an act-order
    weight's :func:`~humming.ir.act_order.act_order_perm`) quantizes ``x[:, perm]``, gathered in the same
    pass: bit-exact with ``humming.quantize_activation(x[:, perm], act)``."""
    scheme = get_act_scheme(act)
    if perm is not None and (perm.dtype != torch.int32 or tuple(perm.shape) != (x.shape[-1],)):
        raise ValueError(f"perm: expected an int32 tensor [K={x.shape[-1]}], got {perm.dtype} {tuple(perm.shape)}")
    if perm is not None and perm.device != x.device:
        raise ValueError(f"perm: on {perm.device}, but x is on {x.device}")
    codes, scales, gscale = _pass(x, scheme, scale is not None, None, 0, perm is not None)(x, scale, perm)
    if scale_kind(scheme) != "fp32":
        scales = scales.view(scheme.scale_dtype)
    return QuantizedActivation(scheme, codes, scales, gscale)


def quantize_activation_values(x: torch.Tensor, act: str | ActScheme) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values, scales)``: the codes of :func:`quantize_activation` for an e4m3 scheme with float32 scales,
    stored as the e4m3 values they stand for in ``x``'s 16-bit dtype (bfloat16 for float32 ``x``), where
    every e4m3 value is exact. For kernels that multiply them on 16-bit tensor cores (the CUDA backend's
    fp8-activation route through its WnA16 kernels); ``values * scales`` is the dequantized activation."""
    values, scales, _ = quantize_pass(x, act, values=True)(x)
    return values, scales


def quantize_pass(x: torch.Tensor, act: str | ActScheme, *, values: bool = False, scales_rows: int = 0):
    """A callable ``x -> (codes, scales, global_scale)``, :func:`quantize_activation`'s buffers (scales as
    stored: float32, or the uint8 bytes of 8-bit scales) without the :class:`QuantizedActivation`, for
    calls with x of ``x``'s dtype, shape and strides; everything but the launch is worked out (and checked)
    here, once, so that kernels that quantize on every call pay for the launch only.

    ``values``: the codes as :func:`quantize_activation_values` stores them. ``scales_rows`` (per-token or
    per-group float32 scales): the scales transposed into ``[spans along K, scales_rows]``, row-major,
    ``scales_rows >= M`` (columns ``M`` onwards are left unwritten), the layout of the CUDA FP8 GEMM's 1x128
    activation scales."""
    scheme = get_act_scheme(act)
    values_dtype = None
    if values:
        if scheme.element_format.name != "e4m3" or scale_kind(scheme) != "fp32":
            raise ValueError(f"act: values are produced for e4m3 schemes with float32 scales, not {scheme.name}")
        values_dtype = x.dtype if x.dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
    return _pass(x, scheme, False, values_dtype, scales_rows)


#: The passes made ready, by what decides them (bounded: serving sees many M).
_passes: dict = {}
_MAX_PASSES = 4096


def _pass(x, scheme: ActScheme, static: bool, values_dtype, scales_rows: int, perm: bool = False) -> _Pass:
    key = (x.dtype, x.shape, x.stride(), scheme, static, values_dtype, scales_rows, perm)
    quant = _passes.get(key)
    if quant is None:
        quant = _Pass(x, scheme, static, values_dtype, scales_rows, perm)
        if len(_passes) >= _MAX_PASSES:
            _passes.clear()
        _passes[key] = quant
    return quant


class _Pass:
    """How one kind of call is quantized: x's dtype, shape and strides, the scheme, a static scale or not, the
    codes' dtype (uint8, or 16-bit e4m3 values), the scales' layout and a column permutation or not decide
    the buffers, the tiles, the
    grids and the constexprs, worked out (and checked) once; a call allocates and launches (the absmax pass
    first for tensor-wide scales), through :class:`~._launch.CompiledLaunches`."""

    def __init__(
        self, x: torch.Tensor, scheme: ActScheme, static: bool, values_dtype, scales_rows: int, perm: bool
    ) -> None:
        reason = supports(x, scheme)
        if reason:
            raise ValueError(reason)
        fmt = scheme.element_format
        m, k = x.shape
        bn, bk = scheme.group_shape
        kind = scale_kind(scheme)
        if m == 0 or k == 0:
            raise ValueError(f"x: expected a non-empty [M, K], got {tuple(x.shape)}")
        if static and kind != "fp32":
            raise ValueError(f"scale: a static scale needs a float32-scale scheme, got {scheme.name}")
        if static:
            source, group_k, n_spans = "static", 0, 1
        elif bn == -1:
            source, group_k, n_spans = "tensor", 0, 1
        else:
            source, group_k, n_spans = "local", 0 if bk == -1 else bk, 1 if bk == -1 else triton.cdiv(k, bk)
        self.m, self.k = m, k
        self.codes_dtype = values_dtype or torch.uint8
        self.static = static
        self.scales_shape, self.scale_strides = (1, 1), (1, 1)
        self.scales_dtype = torch.float32 if kind == "fp32" else torch.uint8
        if source == "local" and scales_rows:
            if kind != "fp32" or scales_rows < m:
                raise ValueError(f"scales_rows: expected >= M={m} rows of float32 scales, got {scales_rows} ({kind})")
            self.scales_shape, self.scale_strides = (n_spans, scales_rows), (1, scales_rows)
        elif source == "local":
            self.scales_shape, self.scale_strides = (m, n_spans), (n_spans, 1)
        self.global_scale = kind == "e4m3g"
        self.absmax = source == "tensor" or kind == "e4m3g"  # the tensor-wide absmax pass first
        self.absmax_grid = (triton.cdiv(m, 32), triton.cdiv(k, 128), 1)

        num_warps = 4
        if group_k:
            block_k = group_k
            block_m = max(1, min(triton.next_power_of_2(m), 4096 // block_k, 64))
        elif source == "local":  # per-token: four rows per program, or for fewer rows one row in one pass
            block_k, block_m, num_warps = per_token_tile(m, k)
        else:
            block_k = min(triton.next_power_of_2(k), 256)
            block_m = max(1, min(triton.next_power_of_2(m), 16))
        self.num_warps = num_warps
        self.grid = (triton.cdiv(m, block_m), n_spans if source == "local" else triton.cdiv(k, block_k), 1)
        self.constexprs = (
            *element_constexprs(fmt).values(),  # INT ... EMAX_ELEM
            "fp32" if source == "static" else kind,  # SCALE
            source,  # SOURCE
            group_k,  # GROUP_K
            block_m,  # BLOCK_M
            block_k,  # BLOCK_K
            values_dtype is not None,  # VALUES
            perm,  # PERM
        )
        self.kernel = CompiledLaunches(_act_quant_kernel)
        self.absmax_kernel = CompiledLaunches(_absmax_kernel)

    def __call__(self, x: torch.Tensor, scale: torch.Tensor | None = None, perm: torch.Tensor | None = None):
        m, k, dev = self.m, self.k, x.device
        codes = torch.empty((m, k), dtype=self.codes_dtype, device=dev)
        if self.static:
            scales = scale.to(device=dev, dtype=torch.float32).reshape(1, 1).contiguous()
        else:
            scales = torch.empty(self.scales_shape, dtype=self.scales_dtype, device=dev)
        gscale = torch.empty((), dtype=torch.float32, device=dev) if self.global_scale else None
        # Launch keys: the device and the alignment of the pointers that are not fresh allocations (those are
        # 16-byte aligned); every other argument is decided by the pass.
        index, x_align = dev.index, x.data_ptr() % 16
        amax = codes  # read only by the tensor-wide schemes, which zero it first (no memset per call otherwise)
        if self.absmax:
            amax = torch.zeros(1, dtype=torch.int32, device=dev)
            args = (x, amax, m, k, x.stride(0), 32, 128)
            self.absmax_kernel.launch((index, x_align), self.absmax_grid, args, 4, index)
        args = (
            x,
            codes,
            scales,
            amax,
            gscale if gscale is not None else amax,
            perm if perm is not None else amax,
            m,
            k,
            x.stride(0),
            k,
            *self.scale_strides,
            *self.constexprs,
        )
        perm_align = 0 if perm is None else perm.data_ptr() % 16
        key = (index, x_align, scales.data_ptr() % 16, perm_align)
        self.kernel.launch(key, self.grid, args, self.num_warps, index)
        return codes, scales, gscale


def per_token_tile(m: int, k: int) -> tuple[int, int, int]:
    """(BLOCK_K, BLOCK_M, num_warps) of per-token scales. Few rows (decode): a program per row that holds
    up to 8192 columns at once, so the absmax pass and the quantize pass each read the row in one go
    (the row is then in L1 for the second) instead of eight dependent 1024-column loads per pass. Many
    rows: four rows per program, 1024 columns per step."""
    if m >= 1024:
        return min(triton.next_power_of_2(k), 1024), 4, 4
    block_k = min(triton.next_power_of_2(k), 8192)
    return block_k, 1, max(4, min(16, block_k // 512))


def _compile_specs() -> list[registry.CompileSpec]:
    """Every activation scheme (per-token, per-tensor, groups) from bf16, and the absmax reduction."""
    specs = [
        registry.CompileSpec(
            name="act_quant-absmax-bf16",
            kernel=_absmax_kernel,
            pointers={"x_ptr": "*bf16", "amax_ptr": "*i32"},
            constexprs={"BLOCK_M": 32, "BLOCK_K": 128},
            aligned=("K", "stride_xm"),
        )
    ]
    for scheme in ACT_SCHEMES.values():
        fmt = scheme.element_format
        kind = scale_kind(scheme)
        bn, bk = scheme.group_shape
        source = "tensor" if bn == -1 else "local"
        # The launch's tiles (quantize_activation): groups, per-token rows (M >= 1024 and decode), per-tensor;
        # (block_m, block_k, warps, name suffix, values): fp8 per-token decode rows also as bf16 values.
        # (block_m, block_k, warps, name suffix, values, perm): fp8 per-token decode rows also as bf16 values;
        # the act-order gather (perm) for the per-token, per-tensor and 1x128 schemes of the scaled GEMM.
        tiles = [(4096 // bk, bk, 4, "", False, False)]
        if bk == -1 and source == "tensor":
            tiles = [(16, 256, 4, "", False, False)]
        elif bk == -1:
            tiles = [(4, 1024, 4, "", False, False), (1, 8192, 16, "-decode", False, False)]
            if scheme.name == "fp8":
                tiles.append((1, 8192, 16, "-decode-values", True, False))
        if scheme.name in ("int8", "fp8", "fp8_tensor", "fp8_g128"):
            tiles += [(*tile[:3], tile[3] + "-perm", False, True) for tile in tiles if not tile[4]]
        specs += [
            registry.CompileSpec(
                name=f"act_quant-{scheme.name}-bf16{suffix}",
                kernel=_act_quant_kernel,
                pointers={
                    "x_ptr": "*bf16",
                    "codes_ptr": "*bf16" if values else "*u8",
                    "scales_ptr": "*fp32" if kind == "fp32" else "*u8",
                    "amax_ptr": "*i32" if source == "tensor" or kind == "e4m3g" else ("*bf16" if values else "*u8"),
                    "gscale_ptr": "*fp32",
                    "perm_ptr": "*i32" if perm else "*u8",
                },
                constexprs={
                    **element_constexprs(fmt),
                    "SCALE": kind,
                    "SOURCE": source,
                    "GROUP_K": 0 if bk == -1 else bk,
                    "BLOCK_M": block_m,
                    "BLOCK_K": block_k,
                    "VALUES": values,
                    "PERM": perm,
                },
                num_warps=num_warps,
                aligned=("K", "stride_xm", "stride_cm"),
            )
            for block_m, block_k, num_warps, suffix, values, perm in tiles
        ]
    return specs


registry.register("act_quant", _compile_specs)
