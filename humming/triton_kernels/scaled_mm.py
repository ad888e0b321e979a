"""Triton scaled GEMM: quantized activations x quantized weights (W8A8, W4A8, W4A4).

``y = dequantize_activation(qa) @ dequantize(W)^T + bias`` for activations quantized by
:mod:`.act_quant` (or given as a :class:`~humming.QuantizedActivation`) and any IR weight whose values the
tensor cores can take exactly. The IR is read as is (no repacking). One kernel, specialised by ``constexpr``:

- the tensor-core operand type (``MMA``): ``int8`` (int32 accumulation: int8 / int4 activations with int
  weights whose ``q - zero`` fits int8; sm_80+), ``e4m3`` (fp8 activations with weights exact in e4m3: int4,
  e2m1, e4m3, ...; sm_89+; products promoted to fp32 every K step), ``fp16`` / ``bf16`` / ``fp32`` (the
  upcasting path: codes decoded to values that the type holds exactly, e.g. e5m2 activations, int8 or nf4
  weights under fp8 activations, NVFP4, MXFP4 on Hopper), or ``scaled`` (``tl.dot_scaled``, sm_100+: MX
  activations x MXFP4 weights, the weight's packed codes and e8m0 scales fed as they are);
- per operand, where its scale is applied: ``end`` (constant along K: per-token / per-tensor / per-channel,
  in the epilogue), ``promote`` (changes along K: the partial dot of each K step is promoted to the fp32
  accumulator with its scales, as DeepSeek's 1x128 x 128x128 fp8 recipe), ``fold`` (multiplied into the
  operand before the dot, where the product is exact: e8m0 scales into bf16, e4m3 scales of e2m1 / int4
  values into fp16; MXFP4 x fp8, NVFP4, MXFP4 x MXFP4) or ``native`` (inside ``tl.dot_scaled``). A weight's
  global scale multiplies its scales first (``fp32(scale) * global``, as :func:`humming.dequantize` rounds it)
  where they are applied at the end or promoted, and the epilogue after a fold; e8m0 weight scales with a
  global scale are never folded. The activation's global scale multiplies the epilogue.

The plan (:func:`compute_plan`) is numerics and depends only on the formats and the device's capability; tile
sizes (:mod:`.scaled_mm_configs`) are tuning. Under the interpreter the plan is made for sm_90.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..device import device_info
from ..ir.activation import ActScheme, QuantizedActivation, get_act_scheme
from ..ir.formats import NumberFormat, get_format
from ..ir.weight import QuantizedWeight
from . import act_quant, registry
from ._weight_tile import (
    decode_codes,
    decode_scale,
    group_tile,
    kernel_tensors,
    pointer_types,
    triton_type,
    unpack_tile,
    weight_spec,
)
from .configs import MIN_GROUPED_BLOCK_M, device_limits, finish_split_k, grouped_tile
from .interpreter import INTERPRET, cast, dot
from .scaled_mm_configs import ScaledMMConfig, min_block_k, scaled_mm_config

__all__ = [
    "ComputePlan",
    "act_group_k",
    "compute_plan",
    "deterministic_config",
    "grouped_linear",
    "linear",
    "supports",
    "supports_grouped",
]

_X_DTYPES = (torch.float16, torch.bfloat16)
_SCALE_KINDS = {torch.float32: 1, torch.float8_e4m3fn: 2, torch.float8_e8m0fnu: 3}  # _weight_tile's S_KIND
_MMA_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
_TL_DTYPES = {
    "int8": tl.int8,
    "e4m3": tl.float8e4nv,
    "fp16": tl.float16,
    "bf16": tl.bfloat16,
    "fp32": tl.float32,
    "scaled": tl.uint8,  # tl.dot_scaled takes the codes as bytes
}


@triton.jit
def _scale_vec(ptr, stride, offs, limit, col, PER_ROW: tl.constexpr, GROUP: tl.constexpr, S_KIND: tl.constexpr):
    """fp32 scales [B] of rows ``offs`` at scale column ``col``: row groups of ``GROUP`` (0 = one for all)."""
    if PER_ROW:
        g = offs // GROUP if GROUP > 1 else offs
        s = tl.load(ptr + g.to(tl.int64) * stride + col, mask=offs < limit, other=0)
    else:
        s = tl.load(ptr + col + offs * 0)
    return decode_scale(s, S_KIND)


@triton.jit
def _global(w_scales, gs_ptr, HAS_GS: tl.constexpr):
    """The weight's scales times its global scale, rounded to fp32 once as :func:`humming.dequantize` does
    before they meet the accumulator: a scale near 2^127 times the accumulator could overflow where the
    product of the two scales does not."""
    if HAS_GS:
        w_scales = w_scales * tl.load(gs_ptr)
    return w_scales


@triton.jit
def _mma(a, b, acc, MMA: tl.constexpr, BK: tl.constexpr):
    """``acc + a @ b`` (int32 for int8 operands, else fp32). fp8 products are promoted to the fp32
    accumulator every ``BK`` (fp8 tensor cores accumulate with reduced precision)."""
    if MMA == "int8":
        return tl.dot(a, b, acc, out_dtype=tl.int32)
    elif MMA == "e4m3":
        return tl.dot(a, b, acc, max_num_imprecise_acc=BK)
    elif MMA == "fp32":
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return dot(a, b, acc)


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
    bias_ptr,
    out_ptr,
    expert_ptr,
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
    stride_be,
    route_bm,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SPLIT_K: tl.constexpr,  # > 1: program_id(1) takes a slice of K and adds fp32 into a zeroed [M, N] workspace
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,  # K % BK == 0: no masks along K
    HAS_BIAS: tl.constexpr,
    MMA: tl.constexpr,  # "int8", "e4m3", "fp16", "bf16", "fp32" or "scaled" (tl.dot_scaled, sm_100+)
    MMA_DTYPE: tl.constexpr,
    A_SCALE: tl.constexpr,  # "end", "promote", "fold" or "native" (inside tl.dot_scaled)
    W_SCALE: tl.constexpr,  # "none", "end", "promote", "fold" or "native"
    A_KIND: tl.constexpr,
    A_BITS: tl.constexpr,
    A_EBITS: tl.constexpr,
    A_MBITS: tl.constexpr,
    A_BIAS: tl.constexpr,
    A_S_KIND: tl.constexpr,
    A_PER_ROW: tl.constexpr,  # scales per token (else one for the tensor)
    A_GK: tl.constexpr,  # activation scale group along K; 0 = the whole K
    A_HAS_GS: tl.constexpr,
    W_KIND: tl.constexpr,
    W_BITS: tl.constexpr,
    W_EBITS: tl.constexpr,
    W_MBITS: tl.constexpr,
    W_BIAS: tl.constexpr,
    W_NAN: tl.constexpr,
    S_KIND: tl.constexpr,
    GN: tl.constexpr,
    GK: tl.constexpr,
    HAS_ZP: tl.constexpr,
    HAS_GS: tl.constexpr,
    GROUPED: tl.constexpr,  # MoE: rows use expert expert_ptr[row // route_bm] (as wna16's grouped kernel)
):
    # Grouped tile order: GROUP_M row tiles share each weight column tile while it is in L2.
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    if GROUPED:
        expert = tl.load(expert_ptr + (pid_m * BM) // route_bm)
        if expert < 0:
            return
        e = expert.to(tl.int64)
        qw_ptr += e * stride_qe
        qb_ptr += e * stride_qe * 4
        s_ptr += e * stride_se
        z_ptr += e * stride_ze
        gs_ptr += e * stride_gse
        bias_ptr += e * stride_be

    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    m_ok = offs_m[:, None] < M
    a_rows = a_ptr + offs_m.to(tl.int64)[:, None] * stride_am
    W_PER_ROW: tl.constexpr = GN > 0
    W_GN: tl.constexpr = GN if GN > 0 else 1
    PROMOTE: tl.constexpr = A_SCALE == "promote" or W_SCALE == "promote"
    ACC_DTYPE: tl.constexpr = tl.int32 if MMA == "int8" else tl.float32
    # 8-bit weights that are the MMA operand bit for bit are loaded as bytes, [BK, BN], straight to the dot.
    W_BYTES: tl.constexpr = (W_BITS == 8 and not HAS_ZP and W_SCALE != "fold") and (
        (MMA == "int8" and W_KIND == 0) or (MMA == "e4m3" and W_KIND == 2 and W_EBITS == 4 and W_MBITS == 3)
    )
    n_ok = offs_n[None, :] < N
    b_cols = qb_ptr + offs_n.to(tl.int64)[None, :] * stride_qb

    acc = tl.zeros((BM, BN), dtype=tl.float32 if PROMOTE else ACC_DTYPE)
    k_tiles = tl.cdiv(K, BK)
    per_split = tl.cdiv(k_tiles, SPLIT_K)
    first = tl.program_id(1) * per_split
    for t in range(first, tl.minimum(first + per_split, k_tiles)):
        k0 = t * BK
        offs_k = k0 + tl.arange(0, BK)
        a_mask = m_ok if EVEN_K else m_ok & (offs_k[None, :] < K)
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
            a_sc_rows = as_ptr + offs_m.to(tl.int64)[:, None] * stride_asm
            a_sc = tl.load(a_sc_rows + offs_ks[None, :], mask=m_ok & ks_ok, other=127)
            w_sc_rows = s_ptr + offs_n.to(tl.int64)[:, None] * stride_sn
            w_sc = tl.load(w_sc_rows + offs_ks[None, :], mask=(offs_n[:, None] < N) & ks_ok, other=127)
            acc = tl.dot_scaled(a_op, a_sc, "e2m1" if A_BITS == 4 else "e4m3", b_op, w_sc, "e2m1", acc)
        else:
            # Activation operand. Codes beyond K are 0 and decode to 0, so the weight's padding adds nothing.
            if MMA == "int8" and A_BITS == 8:
                a_op = a_raw.to(tl.int8, bitcast=True)
            elif MMA == "int8":
                a_op = ((a_raw.to(tl.int32) << (32 - A_BITS)) >> (32 - A_BITS)).to(tl.int8)
            elif MMA == "e4m3":
                a_op = a_raw.to(tl.float8e4nv, bitcast=True)
            else:
                a_val = decode_codes(a_raw.to(tl.int32), lut_ptr, A_KIND, A_BITS, A_EBITS, A_MBITS, A_BIAS, 0)
                if A_SCALE == "fold":
                    a_s = tl.load(
                        as_ptr + offs_m.to(tl.int64)[:, None] * stride_asm + (offs_k // A_GK)[None, :],
                        mask=m_ok & (offs_k[None, :] < K),
                        other=0,
                    )
                    a_val = a_val * decode_scale(a_s, A_S_KIND)
                a_op = cast(a_val, MMA_DTYPE)

            # Weight operand [BK, BN]: decode(q) - zero (times a folded scale), exact in the MMA type.
            if W_BYTES:
                b_mask = n_ok if EVEN_K else n_ok & (offs_k[:, None] < K)
                b_raw = tl.load(b_cols + offs_k[:, None], mask=b_mask, other=0)
                b_op = b_raw.to(MMA_DTYPE, bitcast=True)
            else:
                w_codes = unpack_tile(qw_ptr, stride_qn, offs_n, k0, N, K, BK, W_BITS)
                if MMA == "int8":
                    w_int = (w_codes << (32 - W_BITS)) >> (32 - W_BITS) if W_KIND == 0 else w_codes
                    if HAS_ZP:
                        z = group_tile(z_ptr, stride_zn, offs_n, offs_k, k0, N, K, z_ptr, BK, GN, GK, False)
                        w_int = w_int - z.to(tl.int32)
                    w_op = w_int.to(tl.int8)
                else:
                    w_val = decode_codes(w_codes, lut_ptr, W_KIND, W_BITS, W_EBITS, W_MBITS, W_BIAS, W_NAN)
                    if HAS_ZP:
                        z = group_tile(z_ptr, stride_zn, offs_n, offs_k, k0, N, K, z_ptr, BK, GN, GK, False)
                        w_val = w_val - z.to(tl.float32)
                    if W_SCALE == "fold":
                        s = group_tile(s_ptr, stride_sn, offs_n, offs_k, k0, N, K, s_ptr, BK, GN, GK, False)
                        w_val = w_val * decode_scale(s, S_KIND)
                    w_op = w_val.to(tl.float8e4nv) if MMA == "e4m3" else cast(w_val, MMA_DTYPE)
                b_op = tl.trans(w_op)

            if PROMOTE:
                # Each K step's partial product joins the fp32 accumulator with its scales.
                part = _mma(a_op, b_op, tl.zeros((BM, BN), dtype=ACC_DTYPE), MMA, BK).to(tl.float32)
                if A_SCALE == "promote":
                    part = part * _scale_vec(as_ptr, stride_asm, offs_m, M, k0 // A_GK, A_PER_ROW, 1, A_S_KIND)[:, None]
                if W_SCALE == "promote":
                    w_s = _scale_vec(s_ptr, stride_sn, offs_n, N, k0 // GK, W_PER_ROW, W_GN, S_KIND)
                    part = part * _global(w_s, gs_ptr, HAS_GS)[None, :]
                acc += part
            else:
                acc = _mma(a_op, b_op, acc, MMA, BK)

    acc = acc.to(tl.float32)
    if A_SCALE == "end":
        acc = acc * _scale_vec(as_ptr, stride_asm, offs_m, M, 0, A_PER_ROW, 1, A_S_KIND)[:, None]
    if W_SCALE == "end":
        w_s = _scale_vec(s_ptr, stride_sn, offs_n, N, 0, W_PER_ROW, W_GN, S_KIND)
        acc = acc * _global(w_s, gs_ptr, HAS_GS)[None, :]
    if A_HAS_GS:
        acc = acc * tl.load(ags_ptr)
    if HAS_GS and W_SCALE != "end" and W_SCALE != "promote":
        acc = acc * tl.load(gs_ptr)  # after folded scales: e4m3 only (see _compute_plan), too small to overflow
    out = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(out, cast(acc, out_ptr.dtype.element_ty), mask=m_ok & (offs_n[None, :] < N))
    else:
        # the bias differs per expert: the first K slice adds it (a compile-time test, then a run-time one)
        if GROUPED and HAS_BIAS:  # noqa: SIM102
            if tl.program_id(1) == 0:
                acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.atomic_add(out, acc, mask=m_ok & (offs_n[None, :] < N), sem="relaxed")


# --------------------------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class ComputePlan:
    """How a (weight, activation) pair is computed: the numerics, not the tiling.

    ``mma``: tensor-core operand type; ``a_scale`` / ``w_scale``: ``"end"``, ``"promote"`` or ``"fold"``
    (``w_scale`` is ``"none"`` without weight scales); ``k_step``: the promotion step along K (0 = none).
    """

    mma: str
    a_scale: str
    w_scale: str
    k_step: int

    @property
    def operand_bits(self) -> int:
        return 8 if self.mma in ("int8", "e4m3", "scaled") else 16

    @property
    def folds(self) -> bool:
        """Scales multiplied into an operand: the kernel loads scale tiles along K (more shared memory)."""
        return "fold" in (self.a_scale, self.w_scale)


def _weight_values(fmt: NumberFormat, zeros: str | None) -> torch.Tensor | None:
    """Every value ``decode(q) - zero`` can take (float64); None for float zero points."""
    table = fmt.value_table().to(torch.float64)
    if zeros is None:
        return table
    if zeros == "float":
        return None
    z = torch.arange(0, 1 << fmt.bits, dtype=torch.float64)
    return (table[:, None] - z[None, :]).flatten()


def _exact_in(values: torch.Tensor | None, fmt: str | NumberFormat | torch.dtype) -> bool:
    """True if every value is exactly representable in ``fmt`` (a humming format or a torch float dtype)."""
    if values is None:
        return False
    values = values[torch.isfinite(values)]
    if isinstance(fmt, torch.dtype):
        if fmt == torch.int8:
            return bool(((values == values.round()) & (values >= -128) & (values <= 127)).all())
        return bool((values.to(fmt).to(torch.float64) == values).all())
    fmt = get_format(fmt)
    return bool((fmt.quantize_values(values).to(torch.float64) == values).all())


def _fold_dtype(values: torch.Tensor | None, scale_dtype: torch.dtype) -> str | None:
    """The 16-bit type in which ``value * scale`` is exact for every value and scale, if one is."""
    if values is None:
        return None
    if scale_dtype == torch.float8_e8m0fnu:  # a power of two: exact in bf16 (same exponent range as e8m0)
        return "bf16" if _exact_in(values, torch.bfloat16) else None
    if scale_dtype == torch.float8_e4m3fn:
        scales = get_format("e4m3").value_table().to(torch.float64)
        products = (values[:, None] * scales[torch.isfinite(scales)][None, :]).flatten()
        return "fp16" if _exact_in(products, torch.float16) else None
    return None


def act_group_k(scheme: ActScheme, scales: torch.Tensor | None = None) -> int:
    """The activation scale group along K (0 = constant along K); a single scale is per-tensor, as
    :func:`humming.dequantize_activation` reads it."""
    if scales is not None and scales.numel() == 1:
        return 0
    bk = scheme.group_shape[1]
    return 0 if bk == -1 else bk


def compute_plan(qw: QuantizedWeight, scheme: ActScheme, a_gk: int, capability: tuple[int, int]) -> ComputePlan | str:
    """The :class:`ComputePlan` for weight ``qw`` with activations ``scheme`` (scale group ``a_gk`` along K)
    on a GPU of ``capability``, or the reason it cannot be computed exactly. Cached per format and layout."""
    zeros = None if qw.zeros is None else ("float" if qw.zeros.is_floating_point() else "int")
    w_gk = qw.group_shape[1] if qw.scales is not None and qw.group_shape[1] != -1 else 0
    w_scale_dtype = None if qw.scales is None else qw.scales.dtype
    w_global = qw.global_scale is not None
    return _compute_plan(qw.format, zeros, w_scale_dtype, w_gk, w_global, scheme, a_gk, tuple(capability))


@functools.cache
def _compute_plan(
    w_fmt: NumberFormat,
    zeros: str | None,
    w_scale_dtype: torch.dtype | None,
    w_gk: int,
    w_global: bool,
    scheme: ActScheme,
    a_gk: int,
    capability: tuple[int, int],
) -> ComputePlan | str:
    a_fmt = scheme.element_format
    a_values = a_fmt.value_table().to(torch.float64)
    w_values = _weight_values(w_fmt, zeros)
    if w_values is None:
        return "float zero points are only supported with 16-bit activations (act=None)"
    w_none = w_scale_dtype is None
    # e8m0 scales span fp32's range, and under a global scale quantize puts the largest near 2^127: folded into
    # an operand (or native) before the global scale they overflow where fp32(scale) * global does not, so they
    # are applied as that product (promoted or in the epilogue).
    w_unfoldable = w_global and w_scale_dtype == torch.float8_e8m0fnu

    def promoted(gk: int, min_step: int) -> str | None:
        return "end" if gk == 0 else ("promote" if gk >= min_step else None)

    def tileable(steps: list[int], operand_bits: int) -> bool:
        """Power-of-two K tiles of the tensor cores' minimum divide the promotion step (gcd of ``steps``)."""
        step = math.gcd(*steps)
        return not step or (step & -step) >= min_block_k(operand_bits)

    # Blackwell's block-scaled MMA takes MX operands as they are (e8m0 scales per 32 along K).
    mx_act = scheme.scale_dtype == torch.float8_e8m0fnu and a_gk == 32 and a_fmt.name in ("e2m1", "e4m3")
    mx_weight = w_fmt.name == "e2m1" and zeros is None and w_scale_dtype == torch.float8_e8m0fnu and w_gk == 32
    mx_weight = mx_weight and not w_unfoldable
    if mx_act and mx_weight and capability >= (10, 0):
        return ComputePlan("scaled", "native", "native", 0)

    # 8-bit tensor cores: exact operands, every scale in the epilogue or promoted per K step of >= 64 (finer
    # steps would spend as much time promoting on the CUDA cores as multiplying on the tensor cores).
    a_mode, w_mode = promoted(a_gk, 64), "none" if w_none else promoted(w_gk, 64)
    steps = [g for g, mode in ((a_gk, a_mode), (w_gk, w_mode)) if mode == "promote"]
    if a_mode and w_mode and tileable(steps, 8):
        if a_fmt.is_int and _exact_in(w_values, torch.int8) and capability >= (8, 0):  # Triton: no int8 MMA on sm_75
            return ComputePlan("int8", a_mode, w_mode, math.gcd(*steps) if steps else 0)
        if a_fmt.name == "e4m3" and _exact_in(w_values, "e4m3") and capability >= (8, 9):
            return ComputePlan("e4m3", a_mode, w_mode, math.gcd(*steps) if steps else 0)

    # Upcasting path: fold fine-grained fp8 scales where the product is exact, promote the others.
    a_fold = _fold_dtype(a_values, scheme.scale_dtype) if 0 < a_gk < 64 else None
    w_fold = None if w_none or w_unfoldable or not 0 < w_gk < 64 else _fold_dtype(w_values, w_scale_dtype)
    if a_fold and w_fold and a_fold != w_fold:
        w_fold = None
    mma = a_fold or w_fold or "fp16"
    if mma != "fp16" and not (_exact_in(a_values, _MMA_DTYPES[mma]) and _exact_in(w_values, _MMA_DTYPES[mma])):
        a_fold = w_fold = None  # the fold's type would round the other operand (nf4 in bf16): promote instead
        mma = "fp16"
    if not _exact_in(a_values, _MMA_DTYPES[mma]):
        return f"activation values ({a_fmt.name}) are not exact in {mma}"
    if not _exact_in(w_values, _MMA_DTYPES[mma]) and w_fmt.kind != "lut":
        return f"weight values ({w_fmt.name}) are not exact in {mma}"
    a_mode = "fold" if a_fold else promoted(a_gk, 16)
    w_mode = "none" if w_none else ("fold" if w_fold else promoted(w_gk, 16))
    if a_mode is None or w_mode is None:
        why = " (e8m0 weight scales under a global scale are not folded)" if w_unfoldable else ""
        return f"scale groups along K (act {a_gk}, weight {w_gk}) below 16 can be neither promoted nor folded{why}"
    steps = [g for g, mode in ((a_gk, a_mode), (w_gk, w_mode)) if mode == "promote"]
    if not tileable(steps, 16):
        return (
            f"the promotion step along K (scale groups: act {a_gk}, weight {w_gk}) needs a power-of-two "
            f"divisor >= {min_block_k(16)} (the K tile must divide it)"
        )
    if mma == "bf16" and capability < (8, 0):
        mma = "fp32"  # no bf16 tensor cores before Ampere: fp32 FMA, still exact
    return ComputePlan(mma, a_mode, w_mode, math.gcd(*steps) if steps else 0)


def _plan_constexprs(plan: ComputePlan, scheme: ActScheme, a_gk: int, per_row: bool) -> dict[str, object]:
    """The kernel's constexprs for the plan and the activation side."""
    a_fmt = scheme.element_format
    return {
        "MMA": plan.mma,
        "MMA_DTYPE": _TL_DTYPES[plan.mma],
        "A_SCALE": plan.a_scale,
        "W_SCALE": plan.w_scale,
        "A_KIND": 0 if a_fmt.is_int else 2,
        "A_BITS": a_fmt.bits,
        "A_EBITS": a_fmt.exponent_bits,
        "A_MBITS": a_fmt.mantissa_bits,
        "A_BIAS": a_fmt.bias,
        "A_S_KIND": _SCALE_KINDS[scheme.scale_dtype],
        "A_PER_ROW": per_row,
        "A_GK": a_gk,
        "A_HAS_GS": scheme.global_scale,
    }


# --------------------------------------------------------------------------------------------- entry points
_SUPPORTED = (
    "supported: act int8/int4 with int/uint weights (W8A8, W4A8-int, W4A4-int); act fp8 e4m3/e5m2 (per-token, "
    "per-tensor, 1x128, MXFP8) with int/uint, eXmY and nf4 weights (W8A8-fp8, W4A8); act NVFP4/MXFP4 with e2m1 "
    "and int<=4 weights (W4A4); any weight scale layout without act-order (g_idx) or float zero points"
)


def _capability(device: torch.device) -> tuple[int, int]:
    if device.type != "cuda":  # the interpreter runs the fp8 tensor-core path too
        return (9, 0)
    return device_info(device).capability


def supports(qweight: QuantizedWeight, act: ActScheme | str | None, x: torch.Tensor) -> str | None:
    """``None`` if :func:`linear` runs ``qweight`` with activations ``act`` like ``x`` (fp16/bf16 [M, K], or
    the uint8 codes of a QuantizedActivation), else the reason, with what is supported."""
    if act is None:
        return f"the scaled GEMM needs quantized activations (act=...); {_SUPPORTED}"
    scheme = get_act_scheme(act)
    if qweight.num_experts is not None:
        return f"expert-stacked weights {qweight.shape} are not supported by the dense GEMM"
    return _unsupported(qweight, scheme, x)


def supports_grouped(qweight: QuantizedWeight, act: ActScheme, x: torch.Tensor, block_m: int) -> str | None:
    """``None`` if :func:`grouped_linear` runs this MoE call, else the reason. Activation scales must be per
    token or per group (a dynamic per-tensor scale would span the unspecified rows of skipped blocks)."""
    if qweight.num_experts is None:
        return f"the grouped GEMM needs an expert-stacked weight [E, N, K], got {qweight.shape}"
    if act.group_shape[0] != 1 or act.global_scale:
        return f"act {act.name}: the grouped scaled GEMM takes per-token or per-group activation scales only"
    if block_m % MIN_GROUPED_BLOCK_M:
        return f"block_m={block_m}: the grouped scaled GEMM needs a multiple of {MIN_GROUPED_BLOCK_M}"
    return _unsupported(qweight, act, x)


def _unsupported(qweight: QuantizedWeight, scheme: ActScheme, x: torch.Tensor) -> str | None:
    if qweight.g_idx is not None:
        return f"act-order (g_idx) weights are not supported with quantized activations; {_SUPPORTED}"
    if x.dim() != 2 or (x.shape[1] and x.stride(1) != 1):
        return f"x must be 2-D [M, K] with a contiguous last dimension, got shape {tuple(x.shape)}"
    if x.dtype != torch.uint8:
        if x.dtype not in _X_DTYPES:
            return f"x dtype {x.dtype}: the scaled GEMM takes float16 or bfloat16 activations"
        reason = act_quant.supports(x, scheme)
        if reason:
            return reason
    if scheme.scale_dtype not in _SCALE_KINDS:
        return f"act {scheme.name}: scale dtype {scheme.scale_dtype} is not supported; {_SUPPORTED}"
    plan = compute_plan(qweight, scheme, act_group_k(scheme), _capability(x.device))
    if isinstance(plan, str):
        return f"weight {qweight.describe()} with act {scheme.name}: {plan}; {_SUPPORTED}"
    return None


def linear(
    x2d: torch.Tensor | QuantizedActivation,
    qweight: QuantizedWeight,
    bias: torch.Tensor | None,
    act: ActScheme | str | None,
    out_dtype: torch.dtype,
    config: ScaledMMConfig | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``dequantize_activation(quantize(x2d, act)) @ dequantize(qweight)^T + bias -> [M, N]`` in
    ``out_dtype`` (fp16 / bf16 / fp32).

    ``x2d``: fp16/bf16 ``[M, K]`` (quantized here by :mod:`.act_quant`, one extra pass) or a
    :class:`~humming.QuantizedActivation` (``act`` may then be None). ``config`` overrides the tiles of
    :func:`~.scaled_mm_configs.scaled_mm_config` (benchmarks); it never changes the promotion step. ``out``:
    an optional contiguous ``[M, N]`` tensor of ``out_dtype`` to write into.
    """
    if isinstance(x2d, QuantizedActivation):
        qa = x2d
        if act is not None and get_act_scheme(act) != qa.scheme:
            raise ValueError(f"act: x is quantized with {qa.scheme.name}, but act={act!r}")
        scheme = qa.scheme
        codes = qa.codes
    else:
        scheme = get_act_scheme(act) if act is not None else None
        codes = x2d
    reason = supports(qweight, scheme, codes)
    if reason:
        raise ValueError(f"triton scaled_mm: {reason}")
    m, k = codes.shape
    n = qweight.N
    if k != qweight.K:
        raise ValueError(f"triton scaled_mm: x has K={k}, qweight has K={qweight.K}")
    if codes.device.type != "cuda" and not INTERPRET:
        raise ValueError(f"triton scaled_mm: x is on {codes.device}; CPU tensors need TRITON_INTERPRET=1")
    if m == 0:
        return torch.empty(0, n, dtype=out_dtype, device=codes.device)
    if not isinstance(x2d, QuantizedActivation):
        qa = act_quant.quantize_activation(x2d, scheme)
    return _launch(qa, qweight, bias, out_dtype, config, out)


def deterministic_config(qweight: QuantizedWeight, act: ActScheme, x: torch.Tensor) -> ScaledMMConfig:
    """One tile configuration for every M (the one for M = 64, never split along K): each output row then
    comes from the same instructions in the same order whatever the batch (``humming.set_deterministic``)."""
    scheme = get_act_scheme(act)
    plan = compute_plan(qweight, scheme, act_group_k(scheme), _capability(x.device))
    if isinstance(plan, str):
        raise ValueError(f"triton scaled_mm: {plan}")
    smem = device_limits(x.device)[1]
    return scaled_mm_config(64, qweight.N, qweight.K, plan.operand_bits, plan.k_step, qweight.bits, 0, smem, plan.folds)


def grouped_linear(
    x: torch.Tensor,
    qweight: QuantizedWeight,
    expert_ids: torch.Tensor,
    block_m: int,
    bias: torch.Tensor | None,
    act: ActScheme,
    out_dtype: torch.dtype,
    config: ScaledMMConfig | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """MoE grouped scaled GEMM: ``x [M_pad, K]`` quantized per token (or 1 x g group) by ``act``, row ``r``
    times expert ``expert_ids[r // block_m]`` of ``qweight [E, N, K]`` (+ ``bias [E, N]``) -> ``[M_pad, N]``;
    blocks of expert -1 are skipped (their rows of ``out`` are left as they are). The tile's ``block_m``
    is cut to the largest of 16, 32, 64, 128 that divides the routing ``block_m``."""
    reason = supports_grouped(qweight, act, x, block_m)
    if reason:
        raise ValueError(f"triton scaled_mm: {reason}")
    if x.shape[0] == 0:
        return torch.empty(0, qweight.N, dtype=out_dtype, device=x.device)
    qa = act_quant.quantize_activation(x, act)  # per-token / per-group: rows are independent
    if config is None:
        plan = compute_plan(qweight, act, act_group_k(act, qa.scales), _capability(x.device))
        (n, k), (sm_count, smem) = (qweight.N, qweight.K), device_limits(x.device)
        cfg = scaled_mm_config(block_m, n, k, plan.operand_bits, plan.k_step, qweight.bits, sm_count, smem, plan.folds)
        config = grouped_tile(cfg, block_m, x.shape[0], n, k, sm_count)
    if block_m % config.block_m or config.block_m < MIN_GROUPED_BLOCK_M:
        raise ValueError(f"triton scaled_mm: config block_m={config.block_m} must divide block_m={block_m}, >= 16")
    bias = None if bias is None else bias.contiguous()
    return _launch(qa, qweight, bias, out_dtype, config, out, expert_ids.contiguous(), block_m)


def _launch(qa, qweight, bias, out_dtype, config, out, expert_ids=None, route_bm: int = 1) -> torch.Tensor:
    """One launch of the scaled GEMM on quantized activations ``qa``; ``expert_ids``: the grouped kernel."""
    scheme = qa.scheme
    m, k = qa.codes.shape
    n = qweight.N
    device = qa.codes.device
    a_gk = act_group_k(scheme, qa.scales)
    plan = compute_plan(qweight, scheme, a_gk, _capability(device))
    if isinstance(plan, str):
        raise ValueError(f"triton scaled_mm: {plan}")
    limits = device_limits(device)
    cfg = config or scaled_mm_config(m, n, k, plan.operand_bits, plan.k_step, qweight.bits, *limits, plan.folds)
    if plan.k_step and plan.k_step % cfg.block_k:
        raise ValueError(f"config: block_k={cfg.block_k} must divide the promotion step {plan.k_step}")

    t = kernel_tensors(qweight)
    grouped = expert_ids is not None
    e_stride = lambda name, per_expert_dims: t[name].stride(0) if grouped and t[name].dim() == per_expert_dims else 0
    a_scales = qa.scales if qa.scales.dtype == torch.float32 else qa.scales.view(torch.uint8)
    if out is None:
        out = torch.empty(m, n, dtype=out_dtype, device=device)
    elif out.shape != (m, n) or out.dtype != out_dtype or out.stride(1) != 1:
        raise ValueError(f"out: expected [{m}, {n}] {out_dtype} with contiguous rows, got {out.shape} {out.dtype}")
    split = cfg.split_k > 1
    dest = torch.zeros(m, n, dtype=torch.float32, device=device) if split else out
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n), cfg.split_k)
    _scaled_mm_kernel[grid](
        qa.codes,
        a_scales,
        qa.global_scale if qa.global_scale is not None else a_scales,
        t["qw"],
        t["qw"].view(torch.uint8),
        t["s"],
        t["z"],
        t["gs"],
        t["lut"],
        t["qw"] if bias is None else bias,
        dest,
        expert_ids if grouped else t["qw"],
        m,
        n,
        k,
        qa.codes.stride(0),
        a_scales.stride(0),
        t["qw"].stride(-2),
        t["qw"].stride(-2) * 4,
        t["s"].stride(-2),
        t["z"].stride(-2),
        dest.stride(0),
        e_stride("qw", 3),
        e_stride("s", 3),
        e_stride("z", 3),
        e_stride("gs", 1),
        bias.stride(0) if grouped and bias is not None else 0,
        route_bm,
        BM=cfg.block_m,
        BN=cfg.block_n,
        BK=cfg.block_k,
        SPLIT_K=cfg.split_k,
        GROUP_M=cfg.group_m,
        EVEN_K=k % cfg.block_k == 0,
        HAS_BIAS=bias is not None,
        **_plan_constexprs(plan, scheme, a_gk, per_row=qa.scales.numel() > 1),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **{k_: v for k_, v in weight_spec(qweight).constexprs().items() if k_ != "ACT_ORDER"},
        GROUPED=grouped,
    )
    if split:
        finish_split_k(dest, out, bias, expert_ids, route_bm)
    return out


def _compile_specs() -> list[registry.CompileSpec]:
    """Representative specialisations for the all-architecture compile check: each plan kind (int8, e4m3,
    fp16 / bf16 folds and promotions, the pre-Ampere fp32 fallback) at small- and large-M tiles."""
    from ..ir.quantize import quantize
    from .scaled_mm_configs import _BUCKETS_8BIT, _BUCKETS_16BIT

    w = torch.ones(256, 512)
    cases = (  # label, weight, act, capability the plan is made for, oldest arch, output dtype
        ("int8-channel", quantize(w, "int8", -1, scale_dtype=torch.float32), "int8", (8, 0), 80, torch.float16),
        ("int8-channel", quantize(w, "int8", -1, scale_dtype=torch.float32), "int8", (7, 5), 75, torch.float16),
        ("int4-g128", quantize(w, "int4", 128, scale_dtype=torch.float16), "int8", (8, 0), 80, torch.float16),
        ("int4-channel", quantize(w, "int4", -1, scale_dtype=torch.float32), "int4", (8, 0), 80, torch.float16),
        ("e4m3-channel", quantize(w, "e4m3", -1, scale_dtype=torch.float32), "fp8", (9, 0), 89, torch.bfloat16),
        ("fp8-block128", quantize(w, "fp8_block"), "fp8_g128", (9, 0), 89, torch.bfloat16),
        ("int4-g128", quantize(w, "int4", 128, scale_dtype=torch.bfloat16), "fp8", (9, 0), 89, torch.bfloat16),
        ("mxfp4", quantize(w, "mxfp4"), "fp8", (9, 0), 80, torch.bfloat16),
        ("nf4-g64", quantize(w, "nf4", 64, scale_dtype=torch.float16), "fp8", (8, 0), 75, torch.float16),
        ("nvfp4", quantize(w, "nvfp4"), "nvfp4", (8, 0), 75, torch.float16),
        ("mxfp4", quantize(w, "mxfp4"), "mxfp4", (8, 0), 80, torch.bfloat16),
        ("mxfp4-fp32", quantize(w, "mxfp4"), "mxfp4", (7, 5), 75, torch.float16),
        ("mxfp4-native", quantize(w, "mxfp4"), "mxfp4", (10, 0), 100, torch.bfloat16),
        ("mxfp4-native", quantize(w, "mxfp4"), "mxfp8", (10, 0), 100, torch.bfloat16),
        (
            "grouped-e4m3-channel",
            quantize(torch.ones(2, 256, 512), "e4m3", -1, scale_dtype=torch.float32),
            "fp8",
            (9, 0),
            89,
            torch.bfloat16,
        ),
    )
    specs = []
    for label, qw, act, capability, min_arch, out_dtype in cases:
        scheme = get_act_scheme(act)
        plan = compute_plan(qw, scheme, act_group_k(scheme), capability)
        buckets = _BUCKETS_8BIT if plan.operand_bits == 8 else _BUCKETS_16BIT
        for cfg in (buckets[0][1].replace(split_k=4), buckets[-1][1]):  # small M: the split-K epilogue
            if plan.k_step:
                cfg = cfg.replace(block_k=min(cfg.block_k, plan.k_step))
            specs.append(kernel_spec(f"{label}-{act}", qw, scheme, plan, out_dtype, cfg, min_arch))
    return specs


def kernel_spec(
    label: str,
    qw: QuantizedWeight,
    scheme: ActScheme,
    plan: ComputePlan,
    out_dtype: torch.dtype,
    cfg: ScaledMMConfig,
    min_arch: int = 75,
) -> registry.CompileSpec:
    """The :class:`~.registry.CompileSpec` of the kernel :func:`linear` (or :func:`grouped_linear`, for an
    expert-stacked ``qw``) launches for ``qw`` with activations ``scheme`` under ``plan`` and tile ``cfg``."""
    a_scale_type = "*fp32" if scheme.scale_dtype == torch.float32 else "*u8"
    # int8: Triton has no tcgen05 int8 path (mma.sync on sm_100); fp32: FMA, no tensor cores.
    mma_check = "best" if cfg.block_m >= 64 and plan.mma != "int8" else "any"
    if plan.mma == "fp32":
        mma_check = "none"
    return registry.CompileSpec(
        name=f"scaled_mm-{label}-{plan.mma}-{triton_type(out_dtype)}-{cfg.name()}",
        kernel=_scaled_mm_kernel,
        pointers={
            **pointer_types(qw),
            "qb_ptr": "*u8",
            "a_ptr": "*u8",
            "as_ptr": a_scale_type,
            "ags_ptr": "*fp32",
            "bias_ptr": "*fp32",
            "out_ptr": "*" + triton_type(out_dtype),
            "expert_ptr": "*i32",
        },
        constexprs={
            "BM": cfg.block_m,
            "BN": cfg.block_n,
            "BK": cfg.block_k,
            "SPLIT_K": cfg.split_k,
            "GROUP_M": cfg.group_m,
            "EVEN_K": True,
            "HAS_BIAS": True,
            **_plan_constexprs(plan, scheme, act_group_k(scheme), per_row=scheme.group_shape[0] == 1),
            **{k: v for k, v in weight_spec(qw).constexprs().items() if k != "ACT_ORDER"},
            "GROUPED": qw.num_experts is not None,
        },
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        mma=mma_check,
        min_arch=min_arch,
        aligned=("N", "K", "stride_am", "stride_qn", "stride_qb", "stride_om"),
    )


registry.register("scaled_mm", _compile_specs)
