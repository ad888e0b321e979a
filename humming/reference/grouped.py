"""The grouped (MoE) GEMM of :func:`humming.moe.grouped_linear`, defined in torch: each routing block's rows
times its expert, one expert at a time, through :func:`humming.reference.gemm.linear`."""

from __future__ import annotations

import torch

from ..ir.activation import QuantizedActivation, dequantize_activation, quantize_activation
from ..ir.weight import expert_weight
from ..kernel import Kernel, always_gathers
from .gemm import finite, linear
from .moe_layer import gather_rows

__all__ = ["KERNEL", "grouped_linear"]


def grouped_linear(x, qweight, expert_ids, block_m, bias, act, out_dtype, rows=None):
    """``x [M_pad, K]`` (float, or a QuantizedActivation): each block's rows times its expert
    (``humming.moe.grouped_linear``), one expert at a time; rows of blocks with expert -1 are zero. Reads the
    routing on the host (not capturable).

    With ``rows`` (int32 ``[M_pad]``), ``x`` holds ``T`` token rows: with ``act`` they are quantized once,
    all ``T`` of them (a tensor-wide scale spans every token, routed or not), then row ``r`` is token
    ``rows[r]`` (zeros for -1, :func:`humming.reference.moe_layer.gather_rows`)."""
    if rows is not None:
        if act is not None and not isinstance(x, QuantizedActivation) and x.shape[0]:
            x = quantize_activation(finite(x), act)
        x = gather_rows(x, rows)
    row_expert = expert_ids.long().repeat_interleave(block_m)
    used = row_expert >= 0
    if isinstance(x, QuantizedActivation):  # quantized beforehand; rows of unused blocks are never read
        xf = dequantize_activation(x)
    elif act is not None:  # one quantization of every row in use: per-tensor scales span all experts
        xf = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        if used.any():  # none with an expert map that puts no slot on this rank
            xf[used] = dequantize_activation(quantize_activation(finite(x[used]), act))
    else:
        xf = x.to(torch.float32)
    out = torch.zeros(xf.shape[0], qweight.N, dtype=out_dtype, device=xf.device)
    for e in row_expert[used].unique().tolist():
        rows = (row_expert == e).nonzero()[:, 0]
        out[rows] = linear(xf[rows], expert_weight(qweight, e), None if bias is None else bias[e], None, out_dtype)
    return out


def _run(x, qweight, expert_ids, block_m, bias, act, out_dtype, tuning, rows=None):
    return grouped_linear(x, qweight, expert_ids, block_m, bias, act, out_dtype, rows)


#: The reference as a grouped kernel: every call, on any device, gathering token rows itself.
KERNEL = Kernel("reference", "reference", "ir", lambda qweight, act, x, block_m: None, _run, gathers=always_gathers)
