"""What the two CUDA WnA16 kernels (:mod:`.wna16_decode`, :mod:`.wna16_sm90`) share: the fragment weight
layout they read (``_layout``, prepared once per weight object), the checks both make before their own, and
their launcher: 16-bit rows as they are (a copy per call for unaligned rows), or for fp8 activations the
e4m3 values written in x's 16-bit dtype by a Triton pass (exact), with the per-token / per-tensor scales in
the kernel's epilogue."""

from __future__ import annotations

import weakref
from functools import partial

import torch

from ..device import device_index, device_info
from ..ir.dtypes import HALF_DTYPES
from ..kernel import Kernel
from ._decode_launch import DECODE_CCS
from ._layout import (
    PreparedWeight,
    aligned_rows,
    gate_up_rows,
    prepare_weight,
    restore_codes,
    rows_aligned,
    x_scale_stride,
)
from ._support import cached_launch, runtime_unavailable

__all__ = [
    "kernel",
    "launcher",
    "prepare",
    "prepare_gate_up",
    "release_codes",
    "unsupported",
    "wna8_weight_unsupported",
]

_prepared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_gate_up_prepared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # weight -> {gate_up_layout: prep}


def prepare_gate_up(qweight, gate_up_layout: str) -> PreparedWeight:
    """w13 ``qweight`` ``[E, 2I, K]`` with its rows in the gated epilogue's order (:func:`gate_up_rows`),
    re-tiled (once per weight object and layout: it is what fused_moe's first GEMM reads on this path)."""
    by_layout = _gate_up_prepared.setdefault(qweight, {})
    prep = by_layout.get(gate_up_layout)
    if prep is None:
        rows = gate_up_rows(qweight.N, gate_up_layout)
        prep = by_layout[gate_up_layout] = prepare_weight(qweight, rows)
    return prep


def prepare(qweight, act=None) -> PreparedWeight:
    """``qweight`` re-tiled into the fragment layout (computed once per weight object), which serves 16-bit
    and fp8 (``act``: their e4m3 values) activations alike."""
    prep = _prepared.get(qweight)
    if prep is None:
        prep = _prepared[qweight] = prepare_weight(qweight)
    return prep


def release_codes(qweight) -> bool:
    """Free ``qweight``'s IR codes when a fragment layout prepared from it holds them: they are then rebuilt
    from that layout when read (:meth:`~humming.ir.QuantizedWeight.release_codes`). Whether it did."""
    prep, rows = _prepared.get(qweight), None
    if prep is None and _gate_up_prepared.get(qweight):
        gate_up_layout, prep = next(iter(_gate_up_prepared[qweight].items()))
        rows = gate_up_rows(qweight.N, gate_up_layout).to(prep.qweight.device)
    if prep is None:
        return False
    qweight.release_codes(partial(_restored_codes, prep, rows, tuple(qweight.held_codes.shape)))
    return True


def _restored_codes(prep: PreparedWeight, rows, shape: tuple[int, ...]) -> torch.Tensor:
    return restore_codes(prep, rows).reshape(shape)


def kernel(name: str, unsupported, launch_class, tuning, warmup_jobs) -> Kernel:
    """The dispatcher's object for one of the two WnA16 kernels: the CUDA backend on the fragment layout,
    ``unsupported`` after the runtime check, prepared by :func:`prepare`, launched through ``launch_class``
    (:func:`launcher`)."""
    make_launcher = partial(launcher, launch_class)

    def run(x, qweight, bias, act, out_dtype, tuning):
        return cached_launch(name, make_launcher, x, qweight, bias, act, out_dtype, tuning)

    return Kernel(
        name,
        "cuda",
        "fragment",
        lambda qweight, act, x: runtime_unavailable() or unsupported(qweight, act, x),
        run,
        tuning=tuning,
        warmup_jobs=warmup_jobs,
        prepare=prepare,
        launcher=make_launcher,
    )


def wna8_weight_unsupported(qweight, act) -> str | None:
    """``None`` when the decode kernel and the sm_90a GEMM take ``act``'s e4m3 activations with this weight:
    per-token or per-tensor fp32 scales, integer or MXFP4 weights, else why not. The e4m3 values are exact
    in x's 16-bit dtype and so is each product with a dequantized weight (an integer, or e2m1 times a power
    of two) in the fp32 accumulator, as in the FP8 GEMM's e4m3 MMA; the activation scales go in the
    epilogue. Each kernel's own checks still apply."""
    if act.format != "e4m3" or act.group not in ("token", "tensor") or act.global_scale:
        return f"the WnA16 kernels take fp8 activations as per-token or per-tensor e4m3 values, not act={act.name}"
    if act.scale_dtype != torch.float32:
        return f"the WnA16 kernels take float32 activation scales, not act={act.name}"
    if qweight.format.name not in ("int4", "uint4", "int8", "uint8", "e2m1"):
        return f"the WnA16 route for fp8 activations takes integer or MXFP4 weights, not {qweight.format.name}"
    if qweight.num_experts is not None:
        return "expert-stacked weights run through grouped_linear (humming.moe), not linear"
    return None


def unsupported(qweight, act, x, kernel_unsupported) -> str | None:
    """``None`` when a WnA16 kernel runs ``linear(x, qweight, act=act)``, else why not: the checks both
    kernels make, then ``kernel_unsupported(qweight, x, cc)``, the kernel's own. ``x``: the 2-D activation,
    or a ``QuantizedActivation``'s codes."""
    if act is not None:
        reason = wna8_weight_unsupported(qweight, act)
        if reason:
            return reason
        if x.dtype not in HALF_DTYPES:
            return "fp8 activations reach the WnA16 kernels as bfloat16 / float16 x (not pre-quantized)"
    if x.device.type != "cuda":
        return f"x is on {x.device}, not a CUDA device"
    if qweight.num_experts is not None:
        return "expert-stacked weights run through grouped_linear (humming.moe), not linear"
    cc = device_info(x.device).capability
    if cc not in DECODE_CCS:
        return f"the CUDA kernels are built for compute capabilities {DECODE_CCS}, not {cc}"
    return kernel_unsupported(qweight, x, cc)


def launcher(make, x: torch.Tensor, qweight, act, bias_dtype, out_dtype: torch.dtype, tuning):
    """A callable ``(x, bias) -> out`` for calls shaped as ``x`` (:func:`~._support.cached_launch`) on the
    kernel's launch class ``make`` (``DecodeLaunch``, ``GemmLaunch``)."""
    m, k = x.shape
    index = device_index(x.device)
    if act is not None:
        from .act_quant import CudaQuantizePass, quantize_pass

        # fp8 activations: their e4m3 values in x's 16-bit dtype (contiguous rows), the scales in the epilogue
        quantize = quantize_pass(x, act, values=True)
        cuda_pass = isinstance(quantize, CudaQuantizePass)
        # behind the CUDA pass, the GEMM starts while the pass runs (programmatic launch)
        launch = make(prepare(qweight), m, x.dtype, k, bias_dtype, out_dtype, tuning, index, programmatic=cuda_pass)
        if cuda_pass:  # values and scales in one allocation
            scale_stride = x_scale_stride(quantize.scales_shape[0] * quantize.scales_shape[1], m)

            def run_values_at(x, bias):
                held, values, scales = quantize.addresses(x)
                out = launch.at(values, bias, None, (scales, scale_stride))
                del held  # the kernel is queued: the buffer may be reused in stream order
                return out

            return run_values_at

        def run_values(x, bias):
            values, scales, _ = quantize(x)
            return launch(values, bias, x_scale=scales)

        return run_values
    if not rows_aligned(x):  # a copy per call: contiguous rows
        launch = make(prepare(qweight), m, x.dtype, k, bias_dtype, out_dtype, tuning, index)
        return lambda x, bias: launch(aligned_rows(x), bias)
    return make(prepare(qweight), m, x.dtype, x.stride(0), bias_dtype, out_dtype, tuning, index)
