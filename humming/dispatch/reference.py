"""The reference backend: dequantize, then matmul in float32. Runs on any device; the definition that
every fast backend is tested against."""

from __future__ import annotations

import torch

from .._moe_layer import gather_rows
from ..deterministic import is_deterministic
from ..ir.act_order import act_order_perm
from ..ir.activation import QuantizedActivation, dequantize_activation, quantize_activation
from ..ir.quantize import dequantize
from ..ir.weight import expert_weight

__all__ = ["fixed_order_matmul", "grouped_linear", "is_available", "linear", "supports", "supports_grouped"]


def is_available() -> str | None:
    return None


def supports(qweight, act, x) -> str | None:
    return None


def supports_grouped(qweight, act, x, block_m) -> str | None:
    return None


def _finite(x: torch.Tensor) -> torch.Tensor:
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
            xf = dequantize_activation(quantize_activation(_finite(x), act))
        else:  # quantized as x[:, perm], then put back in x's column order
            xf = torch.empty(x.shape, dtype=torch.float32, device=x.device)
            xf[:, perm] = dequantize_activation(quantize_activation(_finite(x)[:, perm], act))
    else:
        xf = x.to(torch.float32)
    w = dequantize(qweight, torch.float32)
    out = fixed_order_matmul(xf, w) if is_deterministic() else xf @ w.T
    if bias is not None:
        out = out + bias.to(torch.float32)
    return out.to(out_dtype)


#: Elements of one ``[rows, cols, K]`` product block of :func:`fixed_order_matmul` (64 MiB of float32).
_FIXED_ORDER_BLOCK = 1 << 24


def fixed_order_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x [M, K] @ w [N, K]^T`` in float32, each dot product summed in one fixed pairwise order: the K
    products (K zero-padded to a power of two) are added in halves, ``p[:h] + p[h:]``, down to one. Every
    step is an elementwise float32 operation, so each output element depends on its row of ``x`` and
    column of ``w`` alone: bit-identical whatever M, whatever rows share the batch, on any device. A
    library matmul does not promise that (its blocking follows M). Deterministic mode's reference."""
    m, k = x.shape
    n = w.shape[0]
    out = torch.empty(m, n, dtype=torch.float32, device=x.device)
    if k == 0 or m == 0 or n == 0:
        return out.zero_()
    width = 1 << (k - 1).bit_length()
    x = torch.nn.functional.pad(x.float(), (0, width - k))
    w = torch.nn.functional.pad(w.float(), (0, width - k))
    cols = max(1, min(n, _FIXED_ORDER_BLOCK // width))
    rows = max(1, min(m, _FIXED_ORDER_BLOCK // (width * cols)))
    for r in range(0, m, rows):
        for c in range(0, n, cols):
            terms = x[r : r + rows, None, :] * w[None, c : c + cols, :]
            half = width
            while half > 1:
                half //= 2
                terms = terms[..., :half] + terms[..., half:]
            out[r : r + rows, c : c + cols] = terms[..., 0]
    return out


def grouped_linear(x, qweight, expert_ids, block_m, bias, act, out_dtype, rows=None):
    """``x [M_pad, K]`` (float, or a QuantizedActivation): each block's rows times its expert
    (``humming.moe.grouped_linear``), one expert at a time; rows of blocks with expert -1 are zero. Reads the
    routing on the host (not capturable).

    With ``rows`` (int32 ``[M_pad]``), ``x`` holds ``T`` token rows: with ``act`` they are quantized once,
    all ``T`` of them (a tensor-wide scale spans every token, routed or not), then row ``r`` is token
    ``rows[r]`` (zeros for -1, :func:`humming._moe_layer.gather_rows`)."""
    if rows is not None:
        if act is not None and not isinstance(x, QuantizedActivation) and x.shape[0]:
            x = quantize_activation(_finite(x), act)
        x = gather_rows(x, rows)
    row_expert = expert_ids.long().repeat_interleave(block_m)
    used = row_expert >= 0
    if isinstance(x, QuantizedActivation):  # quantized beforehand; rows of unused blocks are never read
        xf = dequantize_activation(x)
    elif act is not None:  # one quantization of every row in use: per-tensor scales span all experts
        xf = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        if used.any():  # none with an expert map that puts no slot on this rank
            xf[used] = dequantize_activation(quantize_activation(_finite(x[used]), act))
    else:
        xf = x.to(torch.float32)
    out = torch.zeros(xf.shape[0], qweight.N, dtype=out_dtype, device=xf.device)
    for e in row_expert[used].unique().tolist():
        rows = (row_expert == e).nonzero()[:, 0]
        out[rows] = linear(xf[rows], expert_weight(qweight, e), None if bias is None else bias[e], None, out_dtype)
    return out
