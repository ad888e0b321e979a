"""The Triton backend of ``humming.linear`` (protocol: humming/dispatch/kernels.py).

- Weight-only (``act=None``, WnA16): :mod:`.wna16`, every weight format and layout of the IR.
- Quantized activations (W8A8, W4A8, W4A4): :mod:`.scaled_mm`, imported on first use.
- MoE grouped GEMM (``humming.moe``): the same two kernels with an expert-id path,
  :func:`.wna16.grouped_linear` (WnA16) and :func:`.scaled_mm.grouped_linear` (every activation scheme of
  the dense path); both can read token rows through a row index (``rows``), so the routed activations are
  never copied into grouped order.
- ``fused_moe``'s steps around the grouped GEMMs: :mod:`.moe_layer` (the activation pass, which can
  quantize ``w2``'s input, and the weighted combine).

Without a GPU the kernels run under Triton's CPU interpreter when ``TRITON_INTERPRET=1`` (see
:mod:`.interpreter`); :mod:`.registry` lists every kernel for the all-architecture compile check.
"""

from __future__ import annotations

import importlib

import torch

from ..device import device_info
from ..ir.weight import QuantizedWeight
from . import wna16
from .interpreter import INTERPRET

__all__ = ["grouped_linear", "is_available", "linear", "prepare", "supports", "supports_grouped"]

_MIN_CAPABILITY = (7, 5)


def is_available() -> str | None:
    """``None`` when Triton kernels can run here (a CUDA GPU of sm_75 or newer, or the interpreter)."""
    if INTERPRET:
        return None
    if not torch.cuda.is_available():
        return "no CUDA GPU (set TRITON_INTERPRET=1 to run the Triton kernels on the CPU interpreter)"
    cap = device_info().capability
    if cap < _MIN_CAPABILITY:
        return f"GPU compute capability {cap} is below the {_MIN_CAPABILITY} the Triton kernels need"
    return None


def _scaled_mm():
    """The quantized-activation GEMM module, imported on first use: weight-only callers never import it."""
    return importlib.import_module("humming.triton_kernels.scaled_mm")


def prepare(qweight: QuantizedWeight, act=None) -> QuantizedWeight:
    """The weight the Triton kernels read: ``qweight`` itself (the IR, in place), except a dense act-order
    weight with quantized activations, which the scaled GEMM reads sorted by group (sorted here once per
    weight object, then cached; ``qweight`` where its groups cannot be sorted: the reference runs it)."""
    if act is None or qweight.g_idx is None or qweight.num_experts is not None:
        return qweight
    from ._act_order import act_order_layout

    layout = act_order_layout(qweight)
    return qweight if isinstance(layout, str) else layout.weight


def _unsupported_before_kernels(x: torch.Tensor) -> str | None:
    """What rules out every Triton kernel: the device."""
    if x.device.type != "cuda" and not INTERPRET:
        return f"x is on {x.device}; the Triton kernels run on CUDA tensors (or CPU ones under TRITON_INTERPRET=1)"
    return None


def supports(qweight: QuantizedWeight, act, x: torch.Tensor) -> str | None:
    """``None`` if :func:`linear` runs this call, else the reason."""
    reason = _unsupported_before_kernels(x)
    if reason is not None:
        return reason
    return wna16.supports(qweight, x) if act is None else _scaled_mm().supports(qweight, act, x)


def supports_grouped(qweight: QuantizedWeight, act, x: torch.Tensor, block_m: int) -> str | None:
    """``None`` if :func:`grouped_linear` runs this MoE call, else the reason."""
    reason = _unsupported_before_kernels(x)
    if reason is not None:
        return reason
    if act is None:
        return wna16.supports_grouped(qweight, x, block_m)
    return _scaled_mm().supports_grouped(qweight, act, x, block_m)


def grouped_linear(
    x, qweight: QuantizedWeight, expert_ids, block_m: int, bias, act, out_dtype, rows=None
) -> torch.Tensor:
    """MoE grouped GEMM ``[M_pad, K] -> [M_pad, N]`` (``humming.moe.grouped_linear``); ``x`` may be a
    QuantizedActivation (the scaled GEMM then skips its quantization pass); with ``rows`` (int32 ``[M_pad]``)
    ``x`` is ``[T, K]`` and row ``r`` reads ``x[rows[r]]``."""
    reason = supports_grouped(qweight, act, getattr(x, "codes", x), block_m)
    if reason:
        raise ValueError(f"triton: {reason}")
    if act is not None:
        return _scaled_mm().grouped_linear(x, qweight, expert_ids, block_m, bias, act, out_dtype, rows=rows)
    return wna16.grouped_linear(x, qweight, expert_ids, block_m, bias, out_dtype, rows=rows)


def linear(x2d, qweight: QuantizedWeight, bias, act, out_dtype: torch.dtype) -> torch.Tensor:
    """``x2d [M, K] @ dequantize(qweight)^T + bias -> [M, N]`` in ``out_dtype``; ``act`` quantizes ``x2d``."""
    if act is not None:
        return _scaled_mm().linear(x2d, qweight, bias, act, out_dtype)
    return wna16.linear(x2d, qweight, bias, out_dtype)
