"""Host planning of the Triton scaled GEMM (:mod:`.scaled_mm`), private: the compute plan (numerics: the
tensor-core operand type, where each scale is applied, the promotion step along K) and the kernel constexprs
it implies; the tile configuration (tuning, :mod:`.scaled_mm_configs`) and the grid of a call.

The plan depends on the formats and the device's capability (under the interpreter it is made for sm_90),
and for MXFP4 weights under fp8 activations on whether the weight's scales fold per row (:func:`row_tops`).
"""

from __future__ import annotations

import functools
import math
import weakref
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..device import DeviceLimits, device_info, device_limits
from ..ir.activation import ActScheme
from ..ir.formats import NumberFormat, get_format
from ..ir.quantize import live_exponents
from ..ir.weight import QuantizedWeight
from ._weight_tile import scale_kind
from .configs import grouped_tile
from .scaled_mm_configs import ScaledMMConfig, min_block_k, scaled_mm_config

__all__ = [
    "ACT_SCALE_DTYPES",
    "ComputePlan",
    "act_group_k",
    "call_config",
    "compute_plan",
    "deterministic_call_config",
    "device_capability",
    "grid",
    "grouped_call_config",
    "plan_config",
    "plan_constexprs",
    "row_tops",
    "weight_decode",
]

#: The activation scale dtypes the kernel reads (fp32 as it is, fp8 as codes: :func:`._weight_tile.scale_kind`).
ACT_SCALE_DTYPES = (torch.float32, torch.float8_e4m3fn, torch.float8_e8m0fnu)
_MMA_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
_TL_DTYPES = {
    "int8": tl.int8,
    "e4m3": tl.float8e4nv,
    "fp16": tl.float16,
    "bf16": tl.bfloat16,
    "fp32": tl.float32,
    "scaled": tl.uint8,  # tl.dot_scaled takes the codes as bytes
}


def device_capability(device: torch.device) -> tuple[int, int]:
    """The capability the plan is made for: the device's, sm_90 under the interpreter (which runs the fp8
    tensor-core path too)."""
    if device.type != "cuda":
        return (9, 0)
    return device_info(device).capability


@dataclass(frozen=True)
class ComputePlan:
    """How a (weight, activation) pair is computed: the numerics, not the tiling.

    ``mma``: tensor-core operand type; ``a_scale`` / ``w_scale``: ``"end"``, ``"promote"`` or ``"fold"``
    (``w_scale`` is ``"none"`` without weight scales, or ``"rowfold"``: e8m0 group scales split into a scale
    per row, applied at the end, and a power of two per group folded into the operand, :func:`row_tops`);
    ``k_step``: the promotion step along K (0 = none).
    """

    mma: str
    a_scale: str
    w_scale: str
    k_step: int

    @property
    def operand_bits(self) -> int:
        return 8 if self.mma in ("int8", "e4m3", "scaled") else 16

    def accumulators(self, capability: tuple[int, int]) -> int:
        """fp32 accumulator tiles the K loop holds on ``capability``: two where each K step's product is
        promoted into the accumulator (scales that change along K; fp8 on sm_90, whose wgmma accumulates with
        reduced precision: ``max_num_imprecise_acc``), else one."""
        promoted = "promote" in (self.a_scale, self.w_scale) or (self.mma == "e4m3" and capability == (9, 0))
        return 2 if promoted else 1

    @property
    def folds(self) -> bool:
        """Scales multiplied into an operand: the kernel loads scale tiles along K (more shared memory)."""
        return "fold" in (self.a_scale, self.w_scale) or self.w_scale == "rowfold"


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
    on a GPU of ``capability``, or the reason it cannot be computed exactly. Cached per format and layout (and
    per weight, where it depends on whether its scales fold per row)."""
    zeros = None if qw.zeros is None else ("float" if qw.zeros.is_floating_point() else "int")
    w_gk = qw.group_shape[1] if qw.scales is not None and qw.group_shape[1] != -1 else 0
    w_scale_dtype = None if qw.scales is None else qw.scales.dtype
    w_global = qw.global_scale is not None
    args = (qw.format, zeros, w_scale_dtype, w_gk, w_global, scheme, a_gk, tuple(capability))
    plan = _compute_plan(*args, True)
    if not isinstance(plan, str) and plan.w_scale == "rowfold" and isinstance(row_tops(qw), str):
        plan = _compute_plan(*args, False)
    return plan


#: e2m1 values times 2^d are e4m3 values for these d: 0.5 * 2^-8 = 2^-9 (e4m3's least subnormal) .. 6 * 2^6 = 384.
ROW_FOLD_SHIFTS = (-8, 6)
_row_tops: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def row_tops(qw: QuantizedWeight) -> torch.Tensor | str:
    """int32 ``[*E, N]`` (contiguous): each row's largest e8m0 scale code over its groups that hold a nonzero
    code (127 for a row without one), or why the weight's scales do not fold per row. An MXFP4 weight under
    e4m3 activations then runs on the fp8 MMA: a group of exponent code ``e`` in a row of top ``t`` folds
    ``2^(e - t + 6)`` into its e2m1 values, exact in e4m3 while ``e - t + 6`` is in :data:`ROW_FOLD_SHIFTS`
    (every such group of the row lies within 15 binades of its top), and the row's ``2^(t - 127 - 6)`` scales
    the accumulator at the end. Computed once per weight (it reads the weight: one host synchronisation)."""
    tops = _row_tops.get(qw)
    if tops is None:
        dead = -(1 << 20)
        e = live_exponents(qw, dead)
        top = e.amax(-1, keepdim=True)
        low = torch.where(e > dead, e - top, 0).amin()
        if int(low) + ROW_FOLD_SHIFTS[1] < ROW_FOLD_SHIFTS[0]:
            span = ROW_FOLD_SHIFTS[1] - ROW_FOLD_SHIFTS[0] + 1
            tops = f"the e8m0 scales of a row span {1 - int(low)} binades; fp8 activations fold at most {span} per row"
        else:
            tops = torch.where(top > dead, top + 127, 127).squeeze(-1).to(torch.int32).contiguous()
        _row_tops[qw] = tops
    return tops


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
    row_fold: bool,
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
    # MXFP4 weights (e8m0 scales per 32 along K) under e4m3 activations: each group's scale relative to its row's
    # largest folds into the e4m3 operand, the row's scale applies at the end (row_tops says where that is exact).
    a_steps = [a_gk] if a_mode == "promote" else []
    if row_fold and mx_weight and a_mode and a_fmt.name == "e4m3" and capability >= (8, 9) and tileable(a_steps, 8):
        return ComputePlan("e4m3", a_mode, "rowfold", a_gk if a_steps else 0)

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


def plan_constexprs(plan: ComputePlan, scheme: ActScheme, a_gk: int, per_row: bool) -> dict[str, object]:
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
        "A_S_KIND": scale_kind(scheme.scale_dtype),
        "A_PER_ROW": per_row,
        "A_GK": a_gk,
        "A_HAS_GS": scheme.global_scale,
    }


# ------------------------------------------------------------------------------------------ tiles, grid
def plan_config(
    plan: ComputePlan,
    qweight: QuantizedWeight,
    m: int,
    capability: tuple[int, int],
    limits: DeviceLimits,
    shape: tuple[int, int] | None = None,
) -> ScaledMMConfig:
    """:func:`~.scaled_mm_configs.scaled_mm_config` of ``m`` rows for the plan and the weight (its format; its
    ``[N, K]`` unless ``shape`` is given) on a device of ``capability`` with ``limits``: a pure function, which
    the SASS reader and the plan checks call for capabilities without the device at hand."""
    n, k = shape or (qweight.N, qweight.K)
    return scaled_mm_config(
        m,
        n,
        k,
        plan.operand_bits,
        plan.k_step,
        qweight.bits,
        limits.sm_count,
        limits.smem_per_block,
        plan.folds,
        capability,
        plan.accumulators(capability),
        weight_decode(plan, qweight),
    )


def weight_decode(plan: ComputePlan, qweight: QuantizedWeight) -> str:
    """How the weight reaches the plan's MMA, as :data:`~.scaled_mm_configs.DECODES` names it (``"lean"`` and
    ``"zero_points"`` only for 8-bit MMA operands, the case their tables and budgets were compiled for)."""
    if qweight.bits == 8 and qweight.zeros is None and plan.w_scale != "fold" and plan.operand_bits == 8:
        return "none"
    if qweight.format.kind != "int" or 32 % qweight.bits or plan.operand_bits != 8:
        return "other"
    return "lean" if qweight.zeros is None else "zero_points"


def _config(plan: ComputePlan, qweight: QuantizedWeight, m: int, device: torch.device, sm_count: int | None = None):
    """:func:`plan_config` for the device (its multiprocessor count unless ``sm_count`` is given)."""
    limits = device_limits(device)
    if sm_count is not None:
        limits = limits._replace(sm_count=sm_count)
    return plan_config(plan, qweight, m, device_capability(device), limits)


def call_config(plan: ComputePlan, qweight: QuantizedWeight, m: int, device: torch.device) -> ScaledMMConfig:
    """The tile of a dense call of ``m`` rows: :func:`~.scaled_mm_configs.scaled_mm_config` for the plan's
    operand width, promotion step and accumulators, on the device's capability, within its multiprocessor
    count, shared memory and registers."""
    return _config(plan, qweight, m, device)


def grouped_call_config(
    plan: ComputePlan, qweight: QuantizedWeight, block_m: int, m_pad: int, device: torch.device
) -> ScaledMMConfig:
    """The tile of a grouped (MoE) call of ``m_pad`` rows in routing blocks of ``block_m``: the dense tile for
    ``block_m`` rows, cut by :func:`~.configs.grouped_tile` so that its ``block_m`` divides the routing one."""
    cfg = _config(plan, qweight, block_m, device)
    return grouped_tile(cfg, block_m, m_pad, qweight.N, qweight.K, device_limits(device).sm_count)


def deterministic_call_config(plan: ComputePlan, qweight: QuantizedWeight, device: torch.device) -> ScaledMMConfig:
    """One tile for every M (the one for M = 64, never split along K: no multiprocessor count)."""
    return _config(plan, qweight, 64, device, sm_count=0)


def grid(cfg: ScaledMMConfig, m: int, n: int) -> tuple[int, int]:
    """The kernel's grid: one program per output tile (in :func:`._tiles.tile_ids` order) and K slice."""
    return (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n), cfg.split_k)
