"""``cuda.scaled_mm``: W8A8 fp8 GEMMs on ``torch._scaled_mm`` (cuBLASLt's fp8 GEMM for per-tensor scales,
torch's row-wise-scaled kernel on Hopper for per-token / per-channel ones), for e4m3 weights with per-tensor
or per-channel scales and e4m3 activations per token or per tensor.

At large M the vendor GEMM is the compute roof for these formats (fp8 tiles with nothing to dequantize),
and the dispatcher's tables put it ahead of ``cuda.fp8_gemm`` where it measured faster; the activations are
quantized by the Triton activation pass (bit-exact with :func:`humming.quantize_activation`), or taken as
they come in a ``QuantizedActivation``. The scales multiply the fp32 sums in the epilogue and the result is
rounded once to the output dtype (bfloat16 with per-token / per-channel scales; calls asking for another
output dtype run on ``cuda.fp8_gemm``); a bias is added afterwards (one more rounding).

The weight is read in place: the e4m3 bytes ``[N, K]`` seen as the ``[K, N]`` column-major operand the GEMM
takes, its scales as fp32 ``[1, N]`` (or ``[1, 1]``), built once per ``QuantizedWeight`` (:func:`prepare`).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from ..device import device_info
from ..kernel import Kernel
from . import fp8_gemm
from ._support import cached_launch

__all__ = ["KERNEL", "PreparedScaledMm", "prepare", "unsupported"]

#: Compute capability of torch's row-wise-scaled fp8 GEMM (per-token / per-channel scales).
ROWWISE_CC = (9, 0)
#: The oldest compute capability with fp8 tensor cores (per-tensor scales through cuBLASLt).
TENSORWISE_MIN_CC = (8, 9)


@dataclass(frozen=True)
class PreparedScaledMm:
    """The GEMM's view of the weight: ``weight_t`` float8_e4m3fn ``[K, N]`` (column-major: the transposed
    ``[N, K]`` bytes), ``scale`` fp32 ``[1, N]`` per channel (a per-tensor scale expanded) and
    ``tensor_scale`` fp32 ``[1, 1]`` for per-tensor weights (``None`` otherwise)."""

    weight_t: torch.Tensor
    scale: torch.Tensor
    tensor_scale: torch.Tensor | None


_prepared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def prepare(qweight) -> PreparedScaledMm:
    """The weight as the GEMM reads it (cached per ``QuantizedWeight``)."""
    prep = _prepared.get(qweight)
    if prep is None:
        n, k = qweight.N, qweight.K
        codes = qweight.qweight.contiguous().view(torch.uint8)[:, :k].contiguous().view(torch.float8_e4m3fn)
        scales = qweight.scales.to(torch.float32)
        if qweight.global_scale is not None:
            scales = scales * qweight.global_scale.to(torch.float32)
        scale = scales.reshape(1, -1).expand(1, n).contiguous()
        tensor_scale = scale[:, :1].contiguous() if qweight.layout == "tensor" else None
        prep = _prepared[qweight] = PreparedScaledMm(codes.t(), scale, tensor_scale)
    return prep


def _rowwise(qweight, act) -> bool:
    """Whether the call needs the row-wise-scaled GEMM (a per-token or a per-channel factor)."""
    return act.group == "token" or qweight.layout != "tensor"


def unsupported(qweight, act, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> str | None:
    """``None`` when ``torch._scaled_mm`` runs ``linear(x, qweight, act=act)``, else why not. ``x`` is the 2-D
    activation ``[M, K]`` (a float tensor, or the uint8 codes of a pre-quantized one)."""
    if not hasattr(torch, "_scaled_mm"):
        return "this torch has no torch._scaled_mm"
    if qweight.format.name != "e4m3" or qweight.num_experts is not None:
        return f"torch._scaled_mm takes 2-D e4m3 weights, not {qweight.describe()}"
    if qweight.layout not in ("tensor", "channel") or qweight.zeros is not None or qweight.g_idx is not None:
        return f"torch._scaled_mm takes per-tensor or per-channel weight scales, not {qweight.describe()}"
    if act is None or act.format != "e4m3" or act.group not in ("token", "tensor") or act.global_scale:
        return f"torch._scaled_mm takes e4m3 activations per token or per tensor, not act={getattr(act, 'name', None)}"
    if qweight.K % 16 or qweight.N % 16:
        return f"torch._scaled_mm needs K % 16 == 0 and N % 16 == 0, got N={qweight.N}, K={qweight.K}"
    if x.device.type != "cuda":
        return f"x is on {x.device}, not a CUDA device"
    cc = device_info(x.device).capability
    if _rowwise(qweight, act):
        if cc != ROWWISE_CC:
            return f"torch._scaled_mm scales per token / per channel on compute capability {ROWWISE_CC}, not {cc}"
        if out_dtype not in (None, torch.bfloat16):
            return f"torch._scaled_mm writes bfloat16 with per-token / per-channel scales, not {out_dtype}"
    elif cc < TENSORWISE_MIN_CC:
        return f"torch._scaled_mm needs fp8 tensor cores (compute capability {TENSORWISE_MIN_CC}+), not {cc}"
    elif out_dtype not in (None, torch.bfloat16, torch.float16, torch.float32):
        return f"torch._scaled_mm writes bfloat16, float16 or float32, not {out_dtype}"
    return None


def _runs_here(qweight, act, x: torch.Tensor, out_dtype: torch.dtype) -> bool:
    """``True`` when this kernel runs the call; ``False`` for an output dtype the row-wise GEMM does not write
    (bfloat16 only) on a call it otherwise takes: that call runs on ``cuda.fp8_gemm``, which takes every W8A8
    call this kernel takes (the dispatcher plans a call before it knows its output dtype). Raises for the
    rest."""
    reason = unsupported(qweight, act, x, out_dtype)
    if reason is None:
        return True
    if unsupported(qweight, act, x) is None:
        return False
    raise ValueError(f"humming cuda.scaled_mm: {reason}")


def _launcher(x, qweight, act, bias_dtype, out_dtype: torch.dtype, tuning):
    """A callable ``(x, bias) -> out`` for calls shaped as ``x`` (:func:`~._support.cached_launch`): the
    activation pass made ready, the weight's operand and scales picked once."""
    from .act_quant import quantize_pass

    if not _runs_here(qweight, act, x, out_dtype):
        return fp8_gemm.KERNEL.launcher(x, qweight, act, bias_dtype, out_dtype, tuning)
    prep = prepare(qweight)
    rowwise, m = _rowwise(qweight, act), x.shape[0]
    if m == 0:
        return lambda x, bias: torch.empty(0, qweight.N, dtype=out_dtype, device=x.device)
    scale_b = prep.scale if rowwise else prep.tensor_scale
    quantize = quantize_pass(x, act)

    def run(x, bias):
        codes, scales, _ = quantize(x)
        return _scaled_mm(codes, scales, prep.weight_t, scale_b, m, rowwise, bias, out_dtype)

    return run


def _scaled_mm(codes, scales, weight_t, scale_b, m: int, rowwise: bool, bias, out_dtype) -> torch.Tensor:
    if m == 0:
        return torch.empty(0, weight_t.shape[1], dtype=out_dtype, device=codes.device)
    if rowwise and scales.shape[0] != m:  # a per-tensor activation scale with per-channel weights
        scales = scales.expand(m, 1).contiguous()
    a = codes.view(torch.float8_e4m3fn)
    out = torch._scaled_mm(a, weight_t, scale_a=scales, scale_b=scale_b, out_dtype=out_dtype)
    return out if bias is None else out.add_(bias)


def linear(x, qweight, bias: torch.Tensor | None, act, out_dtype: torch.dtype) -> torch.Tensor:
    """``x [M, K] @ dequantize(qweight)^T + bias`` -> ``[M, N]`` of ``out_dtype`` (see :func:`unsupported`);
    ``x`` a float tensor (quantized here with ``act``) or a ``QuantizedActivation`` of scheme ``act``."""
    codes = getattr(x, "codes", x)
    if not _runs_here(qweight, act, codes, out_dtype):
        return fp8_gemm.linear(x, qweight, bias, act, out_dtype)
    if isinstance(x, torch.Tensor):
        return cached_launch(KERNEL.name, _launcher, x, qweight, bias, act, out_dtype, None)
    prep, rowwise = prepare(qweight), _rowwise(qweight, act)
    codes = codes if codes.stride(1) == 1 and codes.stride(0) % 16 == 0 else codes.contiguous()
    scale_b = prep.scale if rowwise else prep.tensor_scale
    return _scaled_mm(codes, x.scales, prep.weight_t, scale_b, codes.shape[0], rowwise, bias, out_dtype)


def _run(x, qweight, bias, act, out_dtype, tuning):
    return linear(x, qweight, bias, act, out_dtype)


#: ``cuda.scaled_mm``: W8A8 e4m3 per-tensor / per-channel x per-token / per-tensor on torch._scaled_mm.
KERNEL = Kernel(
    "cuda.scaled_mm",
    "cuda",
    "scaled_mm",
    unsupported,
    _run,
    prepare=lambda qweight, act=None: prepare(qweight),
    launcher=_launcher,
)
