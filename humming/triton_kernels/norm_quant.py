"""RMSNorm (optionally after a residual add) and activation quantization in one Triton pass over the rows,
bit-exact with :func:`humming.rmsnorm` followed by :func:`humming.quantize_activation`.

A program takes ``BLOCK_M`` rows and reads each row a few times (from L1/L2 after the first): the absmax
that fixes the row's exponent ``E``, the exact sum of squares (:func:`humming.reference.norm.rms_inverse` defines it),
then, per-token, the normalized row's absmax, and the codes. Groups along K (1x128, MX) take their absmax
and codes from the same read. Schemes whose scale spans rows (dynamic per-tensor, NVFP4's global scale) would
need the whole tensor's normalized absmax before the first code: they are refused (:func:`unsupported`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ir.activation import ACT_SCHEMES, ActScheme, QuantizedActivation, get_act_scheme
from ..ir.dtypes import FLOAT_DTYPES
from . import registry
from ._act_quant_kernel import finite_absmax, quantize_chunk, span_scale
from ._launch import CompiledLaunches
from .act_quant import element_spec, per_token_tile, scale_kind, scheme_unsupported
from .interpreter import cast

__all__ = ["rmsnorm_quantize", "unsupported"]


@triton.jit
def _pow2_f64(n):
    """2.0**n as float64 for an int32 tensor n in [-1022, 1023] (exact)."""
    return ((n.to(tl.int64) + 1023) << 52).to(tl.float64, bitcast=True)


@triton.jit
def _load_z(
    x_ptr, res_ptr, res_out_ptr, rows64, cols, mask, stride_xm, stride_rm, RESIDUAL: tl.constexpr, STORE: tl.constexpr
):
    """float32 values of ``z`` [BM, BK] (x, or x + residual rounded to x's dtype; stored to res_out with STORE)."""
    z = tl.load(x_ptr + rows64[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0)
    if RESIDUAL:
        r = tl.load(res_ptr + rows64[:, None] * stride_rm + cols[None, :], mask=mask, other=0.0)
        z = cast(z.to(tl.float32) + r.to(tl.float32), x_ptr.dtype.element_ty)
        if STORE:
            tl.store(res_out_ptr + rows64[:, None] * stride_xm + cols[None, :], z, mask=mask)
    return z.to(tl.float32)


@triton.jit
def _normalize(z, inv_rms, w_ptr, cols, k_ok, X_DTYPE: tl.constexpr):
    """``dtype(float32(dtype(z * inv_rms)) * float32(w))`` as float32 (each rounding to x's dtype X_DTYPE)."""
    w = tl.load(w_ptr + cols, mask=k_ok, other=0.0).to(tl.float32)
    y = cast(z * inv_rms[:, None], X_DTYPE).to(tl.float32)
    return cast(y * w[None, :], X_DTYPE).to(tl.float32)


@triton.jit
def _rmsnorm_quant_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    res_out_ptr,
    codes_ptr,
    scales_ptr,
    M,
    K,
    stride_xm,
    stride_rm,
    stride_sm,
    eps,
    P,
    ELEMENT: tl.constexpr,  # the element format's ElementSpec (_act_quant_pass)
    SCALE: tl.constexpr,  # "fp32" or "e8m0"
    STATIC: tl.constexpr,  # scales_ptr holds a static per-tensor scale
    GROUP_K: tl.constexpr,  # span of one scale along K; 0 = the whole row
    RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """x (+ residual) [M, K] -> codes uint8 [M, K] (row stride K), scales (span j of row r at r * stride_sm + j)
    and, with RESIDUAL, the sum in res_out (row stride stride_xm). Grid: (cdiv(M, BLOCK_M),)."""
    X_DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rows64 = rows.to(tl.int64)  # row offsets in int64: M * K may exceed 2^31 elements
    row_ok = rows < M

    # The row's exponent E (|z| < 2^E for its finite values) and whether it holds NaN / Inf.
    amax = tl.zeros([BLOCK_M], dtype=tl.float32)
    non_finite = tl.zeros([BLOCK_M], dtype=tl.int1)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        mask = row_ok[:, None] & (cols[None, :] < K)
        z = _load_z(x_ptr, res_ptr, res_out_ptr, rows64, cols, mask, stride_xm, stride_rm, RESIDUAL, True)
        chunk_amax, chunk_non_finite = finite_absmax(z, 1)
        non_finite = non_finite | chunk_non_finite
        amax = tl.maximum(amax, chunk_amax)
    e = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 126

    # Sum of floor(z^2 * 2^(P - 2E)): integers below 2^P each, below 2^52 in all: exact in any order.
    up = _pow2_f64(P - 2 * e)
    total = tl.zeros([BLOCK_M], dtype=tl.float64)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        mask = row_ok[:, None] & (cols[None, :] < K)
        z = _load_z(x_ptr, res_ptr, res_out_ptr, rows64, cols, mask, stride_xm, stride_rm, RESIDUAL, False)
        z64 = z.to(tl.float64)
        total += tl.sum(tl.floor(z64 * z64 * up[:, None]), axis=1)
    # float64 division and square root round correctly (div.rn.f64, sqrt.rn.f64), as torch's do.
    one = tl.full([BLOCK_M], 1.0, tl.float64)
    mean_sq = total * _pow2_f64(2 * e - P) / (one * K)
    inv_rms = one / tl.sqrt(mean_sq + eps * one)
    inv_rms = inv_rms.to(tl.float32)

    # Per-token scales: the normalized row's absmax first. Static: the one scale.
    s = tl.zeros([BLOCK_M], dtype=tl.float32)
    e8m0_exp = tl.zeros([BLOCK_M], dtype=tl.int32)
    if STATIC:
        s += tl.load(scales_ptr)
    elif GROUP_K == 0:
        y_amax = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            mask = row_ok[:, None] & (cols[None, :] < K)
            z = _load_z(x_ptr, res_ptr, res_out_ptr, rows64, cols, mask, stride_xm, stride_rm, RESIDUAL, False)
            chunk_amax, chunk_non_finite = finite_absmax(_normalize(z, inv_rms, w_ptr, cols, cols < K, X_DTYPE), 1)
            non_finite = non_finite | chunk_non_finite
            y_amax = tl.maximum(y_amax, chunk_amax)
        s, e8m0_exp = span_scale(y_amax, ELEMENT, SCALE)
        # A row holding NaN / Inf gets a NaN scale (act_quant's rule: every GEMM's epilogue makes it NaN).
        tl.store(scales_ptr + rows64 * stride_sm, tl.where(non_finite, float("nan"), s), mask=row_ok)

    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        mask = row_ok[:, None] & (cols[None, :] < K)
        z = _load_z(x_ptr, res_ptr, res_out_ptr, rows64, cols, mask, stride_xm, stride_rm, RESIDUAL, False)
        y = _normalize(z, inv_rms, w_ptr, cols, cols < K, X_DTYPE)
        if GROUP_K == 0 or STATIC:
            code = quantize_chunk(y, s[:, None], e8m0_exp[:, None], ELEMENT, SCALE)
        else:
            # Groups of GROUP_K columns: [BM, groups, GROUP_K], a scale per group from this read.
            G: tl.constexpr = BLOCK_K // GROUP_K
            y3 = tl.reshape(y, (BLOCK_M, G, GROUP_K))
            group_amax, bad = finite_absmax(y3, 2)
            g_s, g_e = span_scale(group_amax, ELEMENT, SCALE)
            code3 = quantize_chunk(y3, g_s[:, :, None], g_e[:, :, None], ELEMENT, SCALE)
            code = tl.reshape(code3, (BLOCK_M, BLOCK_K))
            span = k0 // GROUP_K + tl.arange(0, G)
            s_ptrs = scales_ptr + rows64[:, None] * stride_sm + span[None, :]
            s_ok = row_ok[:, None] & (span[None, :] * GROUP_K < K)
            if SCALE == "e8m0":  # 255: the e8m0 NaN
                tl.store(s_ptrs, tl.where(bad, 255, g_e + 127).to(tl.uint8), mask=s_ok)
            else:
                tl.store(s_ptrs, tl.where(bad, float("nan"), g_s), mask=s_ok)
        tl.store(codes_ptr + rows64[:, None] * K + cols[None, :], code.to(tl.uint8), mask=mask)


def sum_bits(k: int) -> int:
    """``P`` of :func:`humming.reference.norm.rms_inverse`: each of the ``k`` terms of the sum of squares is an integer
    below ``2^P``, so their sum stays below ``2^52`` (exact in float64)."""
    return 52 - (k - 1).bit_length()


def unsupported(x: torch.Tensor, act: str | ActScheme, *, static: bool = False) -> str | None:
    """``None`` if :func:`rmsnorm_quantize` runs ``x`` with ``act`` (``static``: a static per-tensor scale is
    given), else the reason."""
    scheme = get_act_scheme(act)
    reason = scheme_unsupported(scheme)
    if reason:
        return reason
    kind = scale_kind(scheme)
    if scheme.group_shape == (1, -1) and kind != "fp32":
        return f"act {scheme.name}: per-token scales must be float32"
    if static and kind != "fp32":
        return f"act {scheme.name}: a static scale needs a float32-scale scheme"
    if not static and (scheme.group_shape[0] == -1 or kind == "e4m3g"):
        return (
            f"act {scheme.name}: its scale spans rows (the whole tensor's absmax after the norm), which one pass "
            "over the rows cannot know before the first code; use humming.rmsnorm then "
            "humming.ops.quantize_activation, or a static scale"
        )
    if x.dim() != 2 or x.dtype not in FLOAT_DTYPES or x.stride(-1) != 1 or x.numel() == 0:
        dims = tuple(x.shape)
        return f"x: expected a non-empty 2-D float16/bfloat16/float32 tensor with contiguous rows, got {x.dtype} {dims}"
    return None


def rmsnorm_quantize(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    act: str | ActScheme,
    *,
    residual: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
) -> tuple[QuantizedActivation, torch.Tensor | None]:
    """``(quantize_activation(rmsnorm(x, weight, eps, residual=residual), act), x + residual)`` in one kernel,
    bit-exact with :func:`humming.rmsnorm` and :func:`humming.quantize_activation` (the second item ``None``
    without ``residual``). Arguments are checked by :func:`humming.rmsnorm_quantize`; ``scale``: a static
    per-tensor scale."""
    scheme = get_act_scheme(act)
    reason = unsupported(x, scheme, static=scale is not None)
    if reason:
        raise ValueError(reason)
    m, k = x.shape
    dev = x.device
    kind = scale_kind(scheme)
    bk = scheme.group_shape[1]
    group_k = 0 if bk == -1 or scale is not None else bk
    codes = torch.empty((m, k), dtype=torch.uint8, device=dev)
    if scale is not None:
        scales = scale.to(device=dev, dtype=torch.float32).reshape(1, 1).contiguous()
    else:
        n_spans = 1 if group_k == 0 else triton.cdiv(k, group_k)
        scales = torch.empty((m, n_spans), dtype=torch.float32 if kind == "fp32" else torch.uint8, device=dev)
    res_out = None if residual is None else torch.empty_like(x)
    block_k, block_m, num_warps = per_token_tile(m, k)
    block_k = max(block_k, group_k)
    constexprs = tuple(_constexprs(scheme, scale is not None, residual is not None, block_m, block_k).values())
    args = (
        x,
        x if residual is None else residual,
        weight,
        x if res_out is None else res_out,
        codes,
        scales,
        m,
        k,
        x.stride(0),
        x.stride(0) if residual is None else residual.stride(0),
        scales.stride(0),
        float(eps),
        sum_bits(k),
        *constexprs,
    )
    # Launch key: everything Triton specialises on that the constexprs do not fix (dtypes, the integers'
    # divisibility by 16 and equality to 1, the pointers' alignment).
    ints = (m, k, args[8], args[9], args[10])
    key = (
        dev.index,
        x.dtype,
        weight.dtype,
        tuple((v % 16 == 0, v == 1) for v in ints),
        tuple(t.data_ptr() % 16 for t in (x, args[1], weight)),
        constexprs,
    )
    _LAUNCHES.launch(key, (triton.cdiv(m, block_m), 1, 1), args, num_warps, dev.index)
    if kind != "fp32" and scale is None:
        scales = scales.view(scheme.scale_dtype)
    return QuantizedActivation(scheme, codes, scales), res_out


_LAUNCHES = CompiledLaunches(_rmsnorm_quant_kernel)


def _constexprs(scheme: ActScheme, static: bool, residual: bool, block_m: int, block_k: int) -> dict[str, object]:
    """The kernel's constexprs for ``scheme`` (``static``: with a static scale), by name, in the kernel's
    order (the launch passes them positionally)."""
    bk = scheme.group_shape[1]
    return {
        "ELEMENT": element_spec(scheme.element_format),
        "SCALE": "fp32" if static else scale_kind(scheme),
        "STATIC": static,
        "GROUP_K": 0 if bk == -1 or static else bk,
        "RESIDUAL": residual,
        "BLOCK_M": block_m,
        "BLOCK_K": block_k,
    }


def _compile_specs() -> list[registry.CompileSpec]:
    """Per-token rows, 1x128 and MX groups, and a static scale, from bf16 with a residual (and fp8 per-token
    without one), on the launch's tile (:func:`~.act_quant.per_token_tile`)."""
    cases = [  # act, static, residual, (block_m, block_k, warps)
        ("fp8", False, True, (1, 8192, 8)),
        ("fp8", False, False, (1, 8192, 8)),
        ("int8", False, True, (1, 8192, 8)),
        ("fp8_g128", False, True, (1, 8192, 8)),
        ("mxfp4", False, True, (1, 8192, 8)),
        ("fp8_tensor", True, True, (1, 8192, 8)),
    ]
    specs = []
    for act, static, residual, (block_m, block_k, num_warps) in cases:
        scheme = ACT_SCHEMES[act]
        kind = scale_kind(scheme)
        specs.append(
            registry.CompileSpec(
                name=f"rmsnorm_quant-{act}{'-static' if static else ''}{'-residual' if residual else ''}-bf16",
                kernel=_rmsnorm_quant_kernel,
                pointers={
                    "x_ptr": "*bf16",
                    "res_ptr": "*bf16",
                    "w_ptr": "*bf16",
                    "res_out_ptr": "*bf16",
                    "codes_ptr": "*u8",
                    "scales_ptr": "*fp32" if kind == "fp32" else "*u8",
                },
                constexprs=_constexprs(scheme, static, residual, block_m, block_k),
                num_warps=num_warps,
                aligned=("K", "stride_xm", "stride_rm"),
                scalars={"eps": "fp32"},
            )
        )
    return specs


registry.register("rmsnorm_quant", _compile_specs)
