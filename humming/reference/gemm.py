"""The dense GEMM of :func:`humming.linear`, defined in torch: dequantize, then one float32 matmul. Runs on any
device; the definition that every fast GEMM is tested against."""

from __future__ import annotations

import torch

from ..ir.act_order import act_order_perm
from ..ir.activation import QuantizedActivation, dequantize_activation, quantize_activation
from ..ir.quantize import dequantize

__all__ = ["finite", "linear"]


def finite(x: torch.Tensor) -> torch.Tensor:
    """``x`` with NaN / Inf replaced by 0 before quantizing: formats without NaN codes (int8, e2m1) cannot
    encode them, and an absmax ignores them, as the Triton quantizer does. The caller (``humming.linear``,
    ``humming.moe.grouped_linear``) then sets those rows of the output to NaN."""
    return torch.where(torch.isfinite(x), x, torch.zeros((), dtype=x.dtype, device=x.device))


def linear(x, qweight, bias, act, out_dtype):
    """``x`` [M, K] (float, or a QuantizedActivation) -> ``[M, N]`` in ``out_dtype``. With an act-order weight,
    float ``x`` is quantized in the weight's group order (:mod:`humming.ir.act_order`)."""
    if isinstance(x, QuantizedActivation):
        xf = dequantize_activation(x)
    elif act is not None:
        perm = act_order_perm(qweight)
        if perm is None:
            xf = dequantize_activation(quantize_activation(finite(x), act))
        else:  # quantized as x[:, perm], then put back in x's column order
            xf = torch.empty(x.shape, dtype=torch.float32, device=x.device)
            xf[:, perm] = dequantize_activation(quantize_activation(finite(x)[:, perm], act))
    else:
        xf = x.to(torch.float32)
    out = xf @ dequantize(qweight, torch.float32).T
    if bias is not None:
        out = out + bias.to(torch.float32)
    return out.to(out_dtype)
