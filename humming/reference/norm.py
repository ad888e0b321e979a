"""RMSNorm, defined in torch: what :func:`humming.rmsnorm` computes and the Triton pass of
:func:`humming.rmsnorm_quantize` (:mod:`humming.triton_kernels.norm_quant`) is bit-exact with. For a row ``z``
of x (or of ``dtype(x + residual)``, the residual add rounded to x's dtype as engines do) with K columns:

- ``E``: the exponent with ``|z_k| < 2^E`` for every finite ``z_k`` (from the float32 bits of the absmax),
  and ``P = 52 - ceil(log2 K)``;
- ``mean_sq = (sum_k floor(z_k^2 * 2^(P - 2E))) * 2^(2E - P) / K`` in float64: each term is an integer below
  ``2^P``, so the sum is exact in any order (what makes the kernel bit-exact); it is the exact mean of
  squares to within ``2^-P`` of the largest square, far below float32 resolution;
- ``inv_rms = float32(1 / sqrt(mean_sq + float32(eps)))`` (float64, correctly rounded operations);
- ``y = dtype(float32(dtype(float32(z) * inv_rms)) * float32(weight))``: Llama / vLLM's rounding to x's dtype
  before the weight multiplies.
"""

from __future__ import annotations

import torch

__all__ = ["rms_inverse", "rmsnorm"]


def rms_inverse(z: torch.Tensor, eps: float) -> torch.Tensor:
    """float32 ``[M, 1]``: ``1 / sqrt(mean(z^2) + eps)`` of each row of ``z`` ``[M, K]``, as the module
    docstring defines it (exact sum of squares, float64 square root and division, one rounding to float32)."""
    k = z.shape[-1]
    p = 52 - (k - 1).bit_length()
    mag = z.float().abs()
    amax = torch.where(torch.isfinite(mag), mag, 0.0).amax(-1, keepdim=True)
    e = ((amax.view(torch.int32) >> 23) & 0xFF) - 126
    z64 = z.double()
    total = torch.floor(torch.ldexp(z64 * z64, p - 2 * e)).sum(-1, keepdim=True)
    mean_sq = torch.ldexp(total, 2 * e - p) / k
    eps64 = torch.tensor(eps, dtype=torch.float32).double()
    return (1.0 / torch.sqrt(mean_sq + eps64)).float()


def rmsnorm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y, z)``: the RMSNorm ``y`` of ``z`` (``x``, or ``x + residual`` rounded to x's dtype) with ``weight``
    ``[K]``, in x's dtype (module doc). Arguments are checked by :func:`humming.rmsnorm`."""
    z = x if residual is None else (x.float() + residual.float()).to(x.dtype)
    y = (z.float() * rms_inverse(z, eps)).to(x.dtype)
    return (y.float() * weight.float()).to(x.dtype), z
