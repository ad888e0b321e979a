"""The Triton backend. Each kernel module exports the kernel object the dispatcher lists
(``humming.dispatch.kernels``; protocol: :class:`humming.kernel.Kernel`):

- Weight-only (``act=None``, WnA16): :mod:`.wna16` (``triton.wna16``), every weight format and layout of the IR.
- Quantized activations (W8A8, W4A8, W4A4): :mod:`.scaled_mm` (``triton.scaled_mm``).
- MoE grouped GEMM (``humming.moe``): :mod:`.grouped` (``triton.grouped``), the same two kernels with an
  expert-id path (:func:`.wna16.grouped_linear`, :func:`.scaled_mm.grouped_linear`: every activation scheme
  of the dense path); both can read token rows through a row index (``rows``), so the routed activations are
  never copied into grouped order.
- ``fused_moe``'s steps around the grouped GEMMs: :mod:`.moe_layer` (the activation pass, which can
  quantize ``w2``'s input, and the weighted combine); the routing: :mod:`.routing`.
- Activation quantization: :mod:`.act_quant`, and fused with RMSNorm: :mod:`.norm_quant`.

Without a GPU the kernels run under Triton's CPU interpreter when ``TRITON_INTERPRET=1`` (see
:mod:`.interpreter`); :mod:`.registry` lists every kernel for the all-architecture compile check.
"""

from __future__ import annotations

import importlib

from ..ir.weight import QuantizedWeight
from ._support import unavailable

__all__ = ["prepare", "unavailable"]


def prepare(qweight: QuantizedWeight, act=None) -> QuantizedWeight:
    """The weight the Triton kernels read with activation scheme ``act``: ``qweight`` itself (the IR, in
    place), except what the scaled GEMM prepares (:func:`.scaled_mm.prepare`; imported on first use, so that
    weight-only callers never import it)."""
    if act is None:
        return qweight
    return importlib.import_module("humming.triton_kernels.scaled_mm").prepare(qweight, act)
