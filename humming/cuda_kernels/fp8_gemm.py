"""FP8 GEMMs for Hopper (``include/humming/fp8_gemm_sm90.cuh``): e4m3 activations x e4m3 weights (W8A8)
or x 4-bit weights turned into e4m3 in registers (W4A8): int4, or MXFP4 (e2m1 with e8m0 scales per 32).

``out[M, N] = x[M, K] @ dequantize(W)^T + bias`` with activations quantized to e4m3 (per token, per tensor,
or 1x128 groups) by the Triton activation pass, bit-exact with :func:`humming.quantize_activation`.
Dense integer- and MXFP4-weight x per-token / per-tensor fp8 calls run here or on the WnA16 kernels'
fp8-values route, as the dispatcher decides (``humming/dispatch/plan.py``); grouped W4A8 and MXFP4 x fp8
always run here.

Configs come in the three kinds of the house style:

- layout (:class:`PreparedFp8`): the e4m3 weight bytes ``[N, Kp]`` (K padded to 16 for the TMA row-stride
  rule), or 4-bit codes pre-tiled in wgmma fragment order (:func:`_pack_nibbles`), and fp32 scales; MXFP4
  tiles carry per-(row, 32-K group) shifts of the kernel's e2m1 -> e4m3 table, the rest of each e8m0
  scale is a per-row fp32 scale (where the row's scales span at most 12 binades), else one of each
  128-K block (:func:`_fold_mx`, exact); built once per
  ``QuantizedWeight`` by :func:`prepare`;
- compute: fp32 accumulation on wgmma, promoted into an fp32 total every 128 of K (every 512 where scales wait
  for the epilogue, ``promote_blocks``); scales in fp32 either
  in the epilogue (per-tensor / per-channel weights x per-token / per-tensor activations) or at each
  promotion (``block``: 128x128 weight blocks x 1x128 activation groups, the DeepSeek-V3 recipe;
  ``group``: int4 weight groups of a multiple of 128 along K, or MXFP4 scales folded per 128-K block, per
  row);
- tuning (:class:`Fp8Tuning`): warpgroups, tokens per block, pipeline stages, blocks per SM, raster
  grouping, K splits; a pure function of the problem and the device limits (:func:`choose_tuning`). A
  tuning change never changes results beyond fp32 summation order across K blocks (split-K: ``splits``
  contiguous ranges of K blocks, grid.z, whose scaled fp32 partial sums are added with ``red.add`` into a
  zero-filled fp32 workspace, then rounded to the output dtype; :func:`choose_split_tuning`).

The grouped (MoE) variant (:func:`run_grouped`, ``humming.moe.grouped_linear(act="fp8" | "fp8_g128")``) is the
same kernel with a compile-time flag: e4m3 or int4 experts ``[E, N, K]`` stacked along N, each padded to a
multiple of 128 rows (:func:`prepare`), activations ``[M_pad, K]`` in the contiguous grouped layout of
:mod:`humming.moe`, each token tile reading its ``block_m`` segment's expert id (-1: skipped, rows not
written). The whole ``[M_pad, K]`` is quantized by the same activation pass: padding rows hold whatever the
caller left there (their outputs are garbage, NaN / inf included) but cannot reach valid rows, since every
scale is per row (per token, or per 1x128 group) and each output column depends on one token only. Per-tensor
activation scales are refused: one scale over ``M_pad`` rows would mix in the padding.

The module holds the entry points, the support checks and the kernel object the dispatcher lists
(:data:`KERNEL`, ``cuda.fp8_gemm``; its grouped variant runs in :mod:`.grouped`); the tuning heuristics live
in ``_fp8_tuning``, the weight layout and :func:`prepare` in ``_fp8_layout``, the kernel specs and the launch
in ``_fp8_launch``.
"""

from __future__ import annotations

import torch

from ..device import DeviceLimits, device_index, device_info, device_limits
from ..ir.activation import get_act_scheme
from ..kernel import Kernel, LaunchesByWeight
from . import act_quant
from ._fp8_launch import FP8_CCS, Fp8Launch, _launch, call_spec, fp8_spec
from ._fp8_layout import (
    GROUPED_W_FORMATS,
    SCALE_MODES,
    W_FORMATS,
    PreparedFp8,
    _layout_unsupported,
    _scale_mode,
    _w_format,
    prepare,
    weight_unsupported,
)
from ._fp8_tuning import (
    Fp8Tuning,
    choose_grouped_tuning,
    choose_split_tuning,
    choose_tile_tuning,
    choose_tuning,
    smem_bytes,
)
from ._layout import DTYPE_CODE
from ._support import cached_launch, device_unsupported, runtime_unavailable
from .jit import KernelSpec

__all__ = [
    "FP8_CCS",
    "GROUPED_W_FORMATS",
    "KERNEL",
    "SCALE_MODES",
    "W_FORMATS",
    "DeviceLimits",
    "Fp8Launch",
    "Fp8Tuning",
    "PreparedFp8",
    "call_spec",
    "choose_grouped_tuning",
    "choose_split_tuning",
    "choose_tile_tuning",
    "choose_tuning",
    "fp8_spec",
    "grouped_unsupported",
    "grouped_warmup_jobs",
    "linear",
    "pass_warmup_jobs",
    "prepare",
    "run",
    "run_grouped",
    "smem_bytes",
    "unsupported",
    "warmup_jobs",
    "weight_unsupported",
]


def _act_unsupported(qw, act) -> str | None:
    if act is None:
        return "the FP8 GEMM needs fp8 activations (act='fp8', 'fp8_tensor' or 'fp8_g128')"
    if act.format != "e4m3" or act.scale_dtype != torch.float32 or act.global_scale:
        return f"the FP8 GEMM takes e4m3 activations with float32 scales, not act={act.name}"
    if qw.format.name in ("int4", "e2m1") and act.group not in ("token", "tensor"):
        return f"{qw.format.name} weights need per-token or per-tensor activations, not act={act.name}"
    if qw.layout == "block":
        if act.group != 128:
            return f"128x128-block weights need 1x128 activation groups (act='fp8_g128'), not act={act.name}"
    elif act.group not in ("token", "tensor"):
        return f"per-tensor / per-channel weights need per-token or per-tensor activations, not act={act.name}"
    return None


def unsupported(qweight, act, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> str | None:
    """``None`` when the FP8 kernel runs ``linear(x, qweight, act=act)``, else the reason it does not.

    ``x`` is the 2-D activation ``[M, K]`` (a float tensor, or the uint8 codes of a pre-quantized one).
    """
    return (
        weight_unsupported(qweight)
        or _act_unsupported(qweight, act)
        or device_unsupported("FP8 GEMM", x, FP8_CCS, "sm_90a", out_dtype)
    )


def grouped_unsupported(
    qweight, act, x: torch.Tensor, block_m: int, out_dtype: torch.dtype | None = None
) -> str | None:
    """``None`` when the grouped kernel runs ``run_grouped(prepare(qweight), x, act, ..., block_m)``, else why
    not. ``x`` is the grouped activation ``[M_pad, K]`` (float; its device matters)."""
    reason = _grouped_combination_unsupported(qweight, act)
    if reason is not None:
        return reason
    if isinstance(block_m, bool) or not isinstance(block_m, int) or block_m <= 0 or block_m % 8:
        return f"the grouped FP8 GEMM needs block_m % 8 == 0 (token tiles of 8 to 128 dividing it), got {block_m!r}"
    return device_unsupported("grouped FP8 GEMM", x, FP8_CCS, "sm_90a", out_dtype)


def _grouped_combination_unsupported(qweight, act) -> str | None:
    """The weight and activation checks of :func:`grouped_unsupported`."""
    if qweight.num_experts is None:
        return "the grouped FP8 GEMM needs expert-stacked weights [E, N, K]"
    if qweight.format.name not in GROUPED_W_FORMATS:
        return f"the grouped FP8 GEMM takes e4m3 (W8A8), int4 or MXFP4 (W4A8) experts, not {qweight.format.name}"
    reason = _layout_unsupported(qweight) or _act_unsupported(qweight, act)
    if reason is not None:
        return reason
    if act.group == "tensor":
        return (
            f"the grouped FP8 GEMM takes per-token or 1x128-group activation scales, not act={act.name}: one"
            " per-tensor scale over the grouped rows would mix in padding rows and skipped blocks"
        )
    return None


def warmup_jobs(
    qweight,
    act,
    m_values,
    out_dtype: torch.dtype,
    bias_dtype: torch.dtype | None,
    limits: DeviceLimits,
) -> list[tuple[KernelSpec, str]]:
    """``(spec, "sm_90a")`` of every kernel :func:`linear` runs for ``qweight`` and ``act`` at the token
    counts ``m_values`` (for ``humming.warmup``); empty when the combination has no kernel."""
    if weight_unsupported(qweight) or _act_unsupported(qweight, act) or out_dtype not in DTYPE_CODE:
        return []
    w_format, scale_mode = _w_format(qweight), _scale_mode(qweight)
    jobs = []
    for m in m_values:
        tuning = choose_tuning(m, qweight.N, qweight.K, limits, w_format)
        spec = call_spec(w_format, scale_mode, bias_dtype, out_dtype, tuning)
        if (spec, "sm_90a") not in jobs:
            jobs.append((spec, "sm_90a"))
    return jobs


def grouped_warmup_jobs(
    qweight,
    act,
    m_values,
    block_ms,
    out_dtype: torch.dtype,
    bias_dtype: torch.dtype | None,
    limits: DeviceLimits,
) -> list[tuple[KernelSpec, str]]:
    """``(spec, "sm_90a")`` of every grouped kernel :func:`run_grouped` runs for the expert-stacked
    ``qweight`` and ``act`` at the grouped row counts ``m_values`` (``M_pad``) and each ``block_m`` of
    ``block_ms``; empty when the combination has no grouped kernel."""
    if _grouped_combination_unsupported(qweight, act) is not None or out_dtype not in DTYPE_CODE:
        return []
    w_format, scale_mode = _w_format(qweight), _scale_mode(qweight)
    jobs = []
    for block_m in block_ms:
        for m in m_values:
            if block_m <= 0 or block_m % 8:
                continue
            tuning = choose_grouped_tuning(block_m, m, qweight.N, qweight.num_experts, limits, w_format)
            spec = call_spec(w_format, scale_mode, bias_dtype, out_dtype, tuning, grouped=True)
            if (spec, "sm_90a") not in jobs:
                jobs.append((spec, "sm_90a"))
    return jobs


def run(
    prep: PreparedFp8,
    x,
    act,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    tuning: Fp8Tuning | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x [M, K]`` (float, quantized here with ``act``, or a ``QuantizedActivation``) ``@ W^T + bias``
    -> ``[M, N]`` of ``out_dtype`` (bf16, fp16, fp32) on the current stream. Unless ``N`` fills whole
    16-byte rows the result is a view with a padded row stride (TMA needs 16-byte row strides).

    ``out``: an optional ``[M, N]`` tensor of ``out_dtype`` to write into (unit column stride, row stride
    and address multiples of 16 bytes)."""
    if prep.num_experts is not None:
        raise ValueError("prep: expert-stacked weights run through run_grouped")
    codes = getattr(x, "codes", x)
    if tuning is None and codes.shape[0]:
        tuning = choose_tuning(codes.shape[0], prep.n, prep.k, device_limits(device_index(codes.device)), prep.w_format)
    return _launch(prep, x, act, bias, out_dtype, tuning, out, None, 0)


def run_grouped(
    prep: PreparedFp8,
    x,
    act,
    expert_ids: torch.Tensor,
    block_m: int,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    tuning: Fp8Tuning | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Grouped ``x [M_pad, K]`` (float, quantized here with ``act``, or a ``QuantizedActivation``) times the
    expert-stacked ``prep`` -> ``[M_pad, N]`` of ``out_dtype`` on the current stream.

    Row ``r`` uses expert ``expert_ids[r // block_m]`` (int32 ``[M_pad // block_m]`` on the device, values
    in [-1, E), not checked: that would need a host sync); rows of segments whose id is -1 are not written.
    ``bias`` is ``[E, N]`` or ``None``; ``out`` as :func:`run`."""
    if prep.num_experts is None:
        raise ValueError("prep: expected expert-stacked weights (prepare of an [E, N, K] weight)")
    codes = getattr(x, "codes", x)
    m = codes.shape[0]
    if m % block_m or tuple(expert_ids.shape) != (m // block_m,) or expert_ids.dtype != torch.int32:
        raise ValueError(f"expert_ids: expected int32 of shape ({m // block_m},) for M_pad={m}, block_m={block_m}")
    if bias is not None and tuple(bias.shape) != (prep.num_experts, prep.n):
        raise ValueError(f"bias: expected shape ({prep.num_experts}, {prep.n}), got {tuple(bias.shape)}")
    if tuning is None:
        limits = device_limits(device_index(codes.device))
        tuning = choose_grouped_tuning(block_m, m, prep.n, prep.num_experts, limits, prep.w_format)
    if tuning.splits != 1:
        raise ValueError(f"tuning: the grouped FP8 GEMM has no split-K (splits must be 1, got {tuning.splits})")
    if block_m % tuning.block_m:
        raise ValueError(f"tuning: the token tile block_m={tuning.block_m} must divide the segment {block_m}")
    device, bias_dtype = device_index(codes.device), None if bias is None else bias.dtype
    make = lambda: Fp8Launch(prep, act, x, bias_dtype, out_dtype, tuning, device, block_m)
    key = (_activation_kind(x), act, bias_dtype, out_dtype, tuning, device, block_m)
    return _grouped_launches.get(prep, key, make)(x, bias, out, expert_ids.contiguous())


#: The grouped launches made ready, per prepared weight and kind of call: a fused_moe step with quantized
#: activations finds its launch (kernel, grid, tensor maps, the quantization pass) in one lookup.
_grouped_launches = LaunchesByWeight()


def _activation_kind(x) -> tuple:
    """What an :class:`Fp8Launch` made for ``x`` depends on: a float tensor's dtype, shape, strides and
    16-byte alignment (its quantization pass is made for them), or a ``QuantizedActivation``'s codes shape."""
    codes = getattr(x, "codes", None)
    if codes is not None:
        return "quantized", codes.dtype, codes.shape
    return x.dtype, x.shape, x.stride(), x.data_ptr() % 16 == 0


def linear(x, qweight, bias: torch.Tensor | None, act, out_dtype: torch.dtype) -> torch.Tensor:
    """``x [M, K] @ dequantize(qweight)^T + bias`` -> ``[M, N]`` of ``out_dtype`` (see :func:`unsupported`).

    ``x`` is a float tensor (quantized with ``act`` by the Triton activation pass) or a
    ``QuantizedActivation`` of scheme ``act``.
    """
    codes = getattr(x, "codes", x)
    reason = unsupported(qweight, act, codes, out_dtype)
    if reason is not None:
        raise ValueError(f"humming FP8 GEMM: {reason}")
    return run(prepare(qweight), x, act, bias, out_dtype)


def _kernel_unsupported(qweight, act, x) -> str | None:
    reason = runtime_unavailable()
    if reason is None and (act is None or act.format == "e2m1"):
        reason = "the FP8 GEMM takes 8-bit (fp8 / int8) activations"
    return reason or unsupported(qweight, act, x)


def _launcher(x: torch.Tensor, qweight, act, bias_dtype, out_dtype: torch.dtype, tuning):
    """A callable ``(x, bias) -> out`` for calls shaped as ``x`` (:func:`~._support.cached_launch`)."""
    m = x.shape[0]
    index = device_index(x.device)
    reason = unsupported(qweight, act, x, out_dtype)
    if reason is not None:
        raise ValueError(f"humming FP8 GEMM: {reason}")
    prep = prepare(qweight)
    if m and tuning is None:
        tuning = choose_tuning(m, prep.n, prep.k, device_info(index).limits, prep.w_format)
    return Fp8Launch(prep, act, x, bias_dtype, out_dtype, tuning, index)


def _run(x, qweight, bias, act, out_dtype, tuning):
    if not isinstance(x, torch.Tensor):  # a QuantizedActivation, which the kernel takes as it is
        return linear(x, qweight, bias, act, out_dtype)
    return cached_launch(KERNEL.name, _launcher, x, qweight, bias, act, out_dtype, tuning)


def pass_kernel(qweight, act, x: torch.Tensor) -> str:
    """The kernel of the activation pass the GEMM runs on 16-bit ``x``: the CUDA pass where K needs no padding
    (a multiple of 16, as :class:`Fp8Launch` takes it) and the pass takes ``x``, else Triton's, which pads."""
    if qweight.K % 16 == 0 and act_quant.cuda_unsupported(x, get_act_scheme(act)) is None:
        return "cuda.act_quant"
    return "triton.act_quant"


def pass_warmup_jobs(qweight, act, x: torch.Tensor) -> list:
    """The jobs of the CUDA activation pass the GEMM runs on 16-bit ``x`` itself (:func:`pass_kernel`)."""
    return act_quant.warmup_jobs(x, act) if pass_kernel(qweight, act, x) == "cuda.act_quant" else []


def _warmup_jobs(qweight, act, m, *, act_dtype, out_dtype, bias_dtype, device, block_m=None) -> list:
    """The GEMM of a call of ``m`` tokens and, for a dense call of 16-bit x, its activation pass."""
    jobs = warmup_jobs(qweight, act, (m,), out_dtype, bias_dtype, device_info(device).limits)
    if jobs and block_m is None:
        jobs += pass_warmup_jobs(qweight, act, torch.empty(m, qweight.K, dtype=act_dtype, device=f"cuda:{device}"))
    return jobs


#: ``cuda.fp8_gemm``: W8A8 / W4A8 on Hopper's fp8 wgmma; its tuning is chosen at launch.
KERNEL = Kernel(
    "cuda.fp8_gemm",
    "cuda",
    "fp8_gemm",
    _kernel_unsupported,
    _run,
    warmup_jobs=_warmup_jobs,
    prepare=lambda qweight, act=None: prepare(qweight),
    launcher=_launcher,
)
