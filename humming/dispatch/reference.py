"""The reference backend: dequantize, then matmul in float32. Runs on any device; the definition that
every fast backend is tested against."""

from __future__ import annotations

import torch

from ..ir.activation import QuantizedActivation, dequantize_activation, quantize_activation
from ..ir.quantize import dequantize

__all__ = ["is_available", "linear", "supports"]


def is_available() -> str | None:
    return None


def supports(qweight, act, x) -> str | None:
    return None


def linear(x, qweight, bias, act, out_dtype):
    """``x`` [M, K] (float, or a QuantizedActivation) -> ``[M, N]`` in ``out_dtype``."""
    if isinstance(x, QuantizedActivation):
        xf = dequantize_activation(x)
    elif act is not None:
        xf = dequantize_activation(quantize_activation(x, act))
    else:
        xf = x.to(torch.float32)
    out = xf @ dequantize(qweight, torch.float32).T
    if bias is not None:
        out = out + bias.to(torch.float32)
    return out.to(out_dtype)
