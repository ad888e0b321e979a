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
  values into fp16; NVFP4, MXFP4 x MXFP4), ``rowfold`` (MXFP4 weights under e4m3 activations on the fp8
  MMA: each group's e8m0 scale relative to its row's largest folded into the e4m3 operand, the row's scale in
  the epilogue; exact where a row's groups span at most 15 binades, else the bf16 fold) or ``native`` (inside
  ``tl.dot_scaled``). A weight's global scale multiplies its scales first (``fp32(scale) * global``, as
  :func:`humming.dequantize` rounds it) where they are applied at the end or promoted, and the epilogue after
  a fold; e8m0 weight scales with a global scale are never folded. The activation's global scale multiplies
  the epilogue.

The plan (:func:`compute_plan`) is numerics and depends on the formats and the device's capability (and, for
MXFP4 weights under fp8 activations, on whether the weight's scales fold per row: :func:`row_tops`); tile sizes
(:mod:`.scaled_mm_configs`) are tuning. Under the interpreter the plan is made for sm_90.

This module holds the entry points, the support checks and the kernel object the dispatcher lists
(:data:`KERNEL`, ``triton.scaled_mm``); the kernel lives in ``_scaled_mm_kernel``, the plan, the tile choice
and the grid in ``_scaled_mm_plan``, the kernel's arguments and the compile-check specs in
``_scaled_mm_launch``.
"""

from __future__ import annotations

import weakref

import torch

from ..ir.activation import ActScheme, QuantizedActivation, get_act_scheme
from ..ir.dtypes import HALF_DTYPES
from ..ir.weight import QuantizedWeight
from ..kernel import Kernel
from ..workspaces import WORKSPACES
from . import act_quant, registry
from ._act_order import act_order_layout
from ._act_quant_pass import pass_for
from ._scaled_mm_launch import compile_specs, dense_launcher, grouped_launch, kernel_spec, launch, launch_codes
from ._scaled_mm_plan import (
    ACT_SCALE_DTYPES,
    ComputePlan,
    act_group_k,
    call_config,
    compute_plan,
    deterministic_call_config,
    device_capability,
    grid,
    grouped_call_config,
    row_tops,
)
from ._support import device_unsupported, unavailable
from ._tiles import split_k_words
from .configs import MIN_GROUPED_BLOCK_M
from .interpreter import INTERPRET
from .scaled_mm_configs import ScaledMMConfig

__all__ = [
    "KERNEL",
    "ComputePlan",
    "act_group_k",
    "compute_plan",
    "deterministic_config",
    "device_capability",
    "grouped_launcher",
    "grouped_linear",
    "grouped_unsupported",
    "kernel_spec",
    "linear",
    "prepare",
    "row_tops",
    "unsupported",
]

_SUPPORTED = (
    "supported: act int8/int4 with int/uint weights (W8A8, W4A8-int, W4A4-int); act fp8 e4m3/e5m2 (per-token, "
    "per-tensor, 1x128, MXFP8) with int/uint, eXmY and nf4 weights (W8A8-fp8, W4A8); act NVFP4/MXFP4 with e2m1 "
    "and int<=4 weights (W4A4); any weight scale layout without float zero points; act-order (g_idx) weights whose "
    "groups sort into group_size consecutive columns each (GPTQ desc_act), in the dense GEMM"
)


def unsupported(qweight: QuantizedWeight, act: ActScheme | str | None, x: torch.Tensor) -> str | None:
    """``None`` if :func:`linear` runs ``qweight`` with activations ``act`` like ``x`` (fp16/bf16 [M, K], or
    the uint8 codes of a QuantizedActivation), else the reason, with what is supported."""
    if act is None:
        return f"the scaled GEMM needs quantized activations (act=...); {_SUPPORTED}"
    scheme = get_act_scheme(act)
    if qweight.num_experts is not None:
        return f"expert-stacked weights {qweight.shape} are not supported by the dense GEMM"
    if qweight.g_idx is not None:
        layout = act_order_layout(qweight)
        if isinstance(layout, str):
            return f"{layout}; {_SUPPORTED}"
        if x.dtype == torch.uint8 and scheme.group_shape[1] != -1:
            return (
                f"act {scheme.name}: activations quantized beforehand in groups along K of x's column order; an "
                "act-order weight's K runs in group order (pass x unquantized: it is then quantized in that order)"
            )
        qweight = layout.weight
    return _unsupported(qweight, scheme, x)


def grouped_unsupported(qweight: QuantizedWeight, act: ActScheme, x: torch.Tensor, block_m: int) -> str | None:
    """``None`` if :func:`grouped_linear` runs this MoE call, else the reason."""
    if qweight.num_experts is None:
        return f"the grouped GEMM needs an expert-stacked weight [E, N, K], got {qweight.shape}"
    if block_m % MIN_GROUPED_BLOCK_M:
        return f"block_m={block_m}: the grouped scaled GEMM needs a multiple of {MIN_GROUPED_BLOCK_M}"
    return _unsupported(qweight, act, x)


def _unsupported(qweight: QuantizedWeight, scheme: ActScheme, x: torch.Tensor) -> str | None:
    if qweight.g_idx is not None:
        return f"act-order (g_idx) weights are not supported with quantized activations; {_SUPPORTED}"
    if x.dim() != 2 or (x.shape[1] and x.stride(1) != 1):
        return f"x must be 2-D [M, K] with a contiguous last dimension, got shape {tuple(x.shape)}"
    if x.dtype != torch.uint8:
        if x.dtype not in HALF_DTYPES:
            return f"x dtype {x.dtype}: the scaled GEMM takes float16 or bfloat16 activations"
        reason = act_quant.unsupported(x, scheme)
        if reason:
            return reason
    if scheme.scale_dtype not in ACT_SCALE_DTYPES:
        return f"act {scheme.name}: scale dtype {scheme.scale_dtype} is not supported; {_SUPPORTED}"
    plan = compute_plan(qweight, scheme, act_group_k(scheme), device_capability(x.device))
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
    :class:`~humming.QuantizedActivation` (``act`` may then be None). An act-order weight runs sorted by group
    (:mod:`._act_order`, once per weight): ``x2d``'s columns are gathered by that order as they are quantized
    (:mod:`humming.ir.act_order`: groups along K span the gathered columns), a QuantizedActivation's codes
    (per-token or per-tensor scales) are gathered by it. ``config`` overrides the tiles of
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
    reason = unsupported(qweight, scheme, codes)
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
    perm = None
    if qweight.g_idx is not None:
        layout = act_order_layout(qweight)
        qweight, perm = layout.weight, layout.perm
    if not isinstance(x2d, QuantizedActivation):
        qa = act_quant.quantize_activation(x2d, scheme, perm=perm)
    elif perm is not None:  # scales constant along K (supports): the codes' columns in the weight's order
        qa = QuantizedActivation(qa.scheme, qa.codes.index_select(1, perm), qa.scales, qa.global_scale)
    return launch(qa, qweight, bias, out_dtype, config, out)


def deterministic_config(qweight: QuantizedWeight, act: ActScheme, x: torch.Tensor) -> ScaledMMConfig:
    """One tile configuration for every M (the one for M = 64, never split along K): each output row then
    comes from the same instructions in the same order whatever the batch (``humming.set_deterministic``)."""
    scheme = get_act_scheme(act)
    plan = compute_plan(qweight, scheme, act_group_k(scheme), device_capability(x.device))
    if isinstance(plan, str):
        raise ValueError(f"triton scaled_mm: {plan}")
    return deterministic_call_config(plan, qweight, x.device)


def grouped_linear(
    x: torch.Tensor | QuantizedActivation,
    qweight: QuantizedWeight,
    expert_ids: torch.Tensor,
    block_m: int,
    bias: torch.Tensor | None,
    act: ActScheme,
    out_dtype: torch.dtype,
    config: ScaledMMConfig | None = None,
    out: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """MoE grouped scaled GEMM: ``x [M_pad, K]`` quantized by ``act`` (or a
    :class:`~humming.QuantizedActivation` of that scheme), row ``r`` times expert ``expert_ids[r // block_m]``
    of ``qweight [E, N, K]`` (+ ``bias [E, N]``) -> ``[M_pad, N]``; blocks of expert -1 are skipped (their
    rows of ``out`` are left as they are). The tile's ``block_m`` is cut to the largest of 16, 32, 64, 128
    that divides the routing ``block_m``.

    With ``rows`` (int32 ``[M_pad]``, -1 for padding rows), ``x`` holds ``T`` token rows, quantized once
    (a dynamic per-tensor scale, or NVFP4's global scale, spans the ``T`` rows), and row ``r`` reads the codes
    and scales of token ``rows[r]`` in the kernel. Without it, a tensor-wide scale spans the rows of the
    blocks in use (expert id >= 0): the others are unspecified."""
    prequantized = isinstance(x, QuantizedActivation)
    if prequantized and x.scheme != act:
        raise ValueError(f"triton scaled_mm: x is quantized with {x.scheme.name}, but act={getattr(act, 'name', act)}")
    codes = x.codes if prequantized else x
    reason = grouped_unsupported(qweight, act, codes, block_m)
    if reason:
        raise ValueError(f"triton scaled_mm: {reason}")
    m_pad = codes.shape[0] if rows is None else rows.shape[0]
    if m_pad == 0 or codes.shape[0] == 0:  # no rows, or only padding rows (unspecified)
        return torch.empty(m_pad, qweight.N, dtype=out_dtype, device=codes.device) if out is None else out
    if prequantized:
        qa = x
    elif rows is None and (act.group_shape[0] != 1 or act.global_scale):
        # a tensor-wide scale over the rows in use only: the rows of skipped blocks read as zeros
        routed = (expert_ids >= 0).repeat_interleave(block_m)[:, None]
        qa = act_quant.quantize_activation(torch.where(routed, x, 0), act)
    else:
        qa = act_quant.quantize_activation(x, act)
    if config is None:
        plan = compute_plan(qweight, act, act_group_k(act, qa.scales), device_capability(codes.device))
        config = grouped_call_config(plan, qweight, block_m, m_pad, codes.device)
    if block_m % config.block_m or config.block_m < MIN_GROUPED_BLOCK_M:
        raise ValueError(f"triton scaled_mm: config block_m={config.block_m} must divide block_m={block_m}, >= 16")
    bias = None if bias is None else bias.contiguous()
    rows = None if rows is None else rows.contiguous()
    return launch(qa, qweight, bias, out_dtype, config, out, expert_ids.contiguous(), block_m, rows)


def grouped_launcher(x, qweight: QuantizedWeight, act, block_m: int, m_pad: int, out_dtype: torch.dtype):
    """:func:`grouped_linear` made ready for every call shaped as this one (``humming.moe.grouped_step``):
    ``(x, expert_ids, bias, rows) -> out``, ``m_pad`` grouped rows, ``x`` 16-bit tokens or grouped rows (quantized
    by their cached pass) or a :class:`~humming.QuantizedActivation` (its codes and scales then shape the
    calls); checked here, once. ``None`` where every call must take :func:`grouped_linear`: 16-bit ``x`` under
    tensor-wide or global activation scales (quantized over the routed rows of each call), or no rows."""
    scheme = get_act_scheme(act)
    prequantized = isinstance(x, QuantizedActivation)
    codes = x.codes if prequantized else x
    if codes.shape[0] == 0 or m_pad == 0:
        return None
    if not prequantized and (scheme.group_shape[0] != 1 or scheme.global_scale):
        return None
    if prequantized and x.scheme != scheme:
        raise ValueError(f"triton scaled_mm: x is quantized with {x.scheme.name}, but act={scheme.name}")
    reason = grouped_unsupported(qweight, scheme, codes, block_m)
    if reason:
        raise ValueError(f"triton scaled_mm: {reason}")
    quantize = None if prequantized else pass_for(x, scheme, False, None, 0)
    return grouped_launch(scheme, quantize, qweight, out_dtype, block_m, m_pad)


def prepare(qweight: QuantizedWeight, act=None) -> QuantizedWeight:
    """The weight the scaled GEMM reads: ``qweight`` itself, except a dense act-order weight, read sorted by
    group (sorted here once per weight object, then cached; ``qweight`` where its groups cannot be sorted:
    the reference runs it)."""
    if qweight.g_idx is None or qweight.num_experts is not None:
        return qweight
    layout = act_order_layout(qweight)
    return qweight if isinstance(layout, str) else layout.weight


def _kernel_unsupported(qweight: QuantizedWeight, act, x: torch.Tensor) -> str | None:
    if act is None:
        return "the scaled GEMM needs quantized activations (act=...)"
    return unavailable() or device_unsupported(x) or unsupported(qweight, act, x)


def _run(x, qweight, bias, act, out_dtype, tuning):
    """The dispatcher's call, whose plan has checked it (``unsupported``, for this weight, scheme, dtype, device,
    M and alignment): 16-bit ``x`` is quantized by its cached pass and launched without building a
    QuantizedActivation; act-order weights and quantized ``x`` take :func:`linear`."""
    if isinstance(x, QuantizedActivation) or qweight.g_idx is not None:
        return linear(x, qweight, bias, act, out_dtype, config=tuning)
    codes, scales, global_scale = pass_for(x, act, False, None, 0)(x)
    return launch_codes(act, codes, scales, global_scale, qweight, bias, out_dtype, tuning, None)


def _launcher(x, qweight, act, bias_dtype, out_dtype, tuning):
    """:attr:`humming.kernel.Kernel.launcher`: ``(x, bias) -> out`` for 16-bit ``x`` shaped as this one on the
    plan's ``tuning`` (the deterministic mode's one tile, else ``None``), x quantized by its Triton pass."""
    return _pass_launcher(pass_for(x, act, False, None, 0), x, qweight, act, bias_dtype, out_dtype, tuning)


def _pass_launcher(quantize, x, qweight, act, bias_dtype, out_dtype, tuning):
    """:attr:`humming.kernel.Kernel.pass_launcher`: :func:`_launcher` with ``quantize``, a pass of the same
    buffers and bits as Triton's, found once; the launch made ready at the first call (act-order weights take
    :func:`linear`, which quantizes them in group order)."""
    if qweight.g_idx is not None:
        weight = weakref.ref(qweight)  # the prepared call is kept per weight, weakly: it must not hold it
        return lambda x, bias: linear(x, weight(), bias, act, out_dtype, config=tuning)
    return dense_launcher(act, quantize, qweight, out_dtype, tuning)


def _warmup_jobs(qweight, act, m, *, act_dtype, out_dtype, bias_dtype, device, block_m=None) -> list:
    """Nothing to compile ahead (Triton compiles at the first launch, which warmup runs); sets aside the
    split-K workspace of a dense call of ``m`` rows, which a CUDA graph capture cannot allocate."""
    torch_device = torch.device("cuda", device)
    plan = compute_plan(qweight, act, act_group_k(act), device_capability(torch_device))
    if block_m is None and not isinstance(plan, str):
        cfg = call_config(plan, qweight, m, torch_device)
        if cfg.split_k > 1:
            WORKSPACES.reserve(split_k_words(m, qweight.N, grid(cfg, m, qweight.N)[0]), device)
    return []


#: ``triton.scaled_mm``: quantized activations x quantized weights (W8A8, W4A8, W4A4), batch-invariant with
#: one tile for every M; its tiles are chosen at launch.
KERNEL = Kernel(
    "triton.scaled_mm",
    "triton",
    "ir",
    _kernel_unsupported,
    _run,
    deterministic_tuning=deterministic_config,
    prepare=prepare,
    warmup_jobs=_warmup_jobs,
    launcher=_launcher,
    pass_launcher=_pass_launcher,
)

registry.register("scaled_mm", compile_specs)
