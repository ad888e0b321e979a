"""The dense GEMM of :func:`humming.linear`, defined in torch: dequantize, then one float32 matmul. Runs on any
device; the definition that every fast GEMM is tested against."""

from __future__ import annotations

import torch

from ..deterministic import is_deterministic
from ..ir.act_order import act_order_perm
from ..ir.activation import QuantizedActivation, dequantize_activation, quantize_activation
from ..ir.quantize import dequantize
from ..kernel import Kernel, no_tuning

__all__ = ["KERNEL", "finite", "fixed_order_matmul", "linear"]


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


def _run(x, qweight, bias, act, out_dtype, tuning):
    return linear(x, qweight, bias, act, out_dtype)


#: The reference as a dense kernel: every call, on any device; batch-invariant in deterministic mode.
KERNEL = Kernel("reference", "reference", "ir", lambda qweight, act, x: None, _run, deterministic_tuning=no_tuning)
