"""RMSNorm with the activation quantization of the next layer fused in: ``humming.rmsnorm_quantize`` quantizes
a decoder layer's normed activations once, in the norm's own pass, and every ``humming.linear`` that reads
them (q/k/v, gate/up) takes the :class:`~humming.QuantizedActivation` as it is: no separate quantization pass.

:func:`rmsnorm` is the definition (:mod:`humming.reference.norm` states the formula); the Triton kernel
(:mod:`humming.triton_kernels.norm_quant`) is bit-exact with ``quantize_activation(rmsnorm(...), act)``.
"""

from __future__ import annotations

import math

import torch

from . import ops
from ._env import pass_backend
from .ir.activation import ActScheme, QuantizedActivation, get_act_scheme
from .ir.activation import quantize_activation as reference_quantize_activation
from .ir.dtypes import FLOAT_DTYPES
from .reference import norm as reference

__all__ = ["rmsnorm", "rmsnorm_quantize"]


def rmsnorm(
    x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of ``x`` ``[M, K]`` (float16 / bfloat16 / float32) with ``weight`` ``[K]``, in x's dtype (the
    reference; formula in :mod:`humming.reference.norm`). With ``residual`` (``[M, K]``, x's dtype): ``z = x
    + residual`` rounded to x's dtype is normalized, and ``(rmsnorm(z), z)`` is returned, the new residual
    second (vLLM's ``fused_add_rms_norm``, without writing in place)."""
    _check(x, weight, eps, residual)
    y, z = reference.rmsnorm(x, weight, eps, residual)
    return y if residual is None else (y, z)


def _check(x, weight, eps, residual) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype not in FLOAT_DTYPES or x.numel() == 0:
        raise ValueError(f"x: expected a non-empty [M, K] float16/bfloat16/float32 tensor, got {_describe(x)}")
    k = x.shape[1]
    if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != (k,) or not weight.is_floating_point():
        raise ValueError(f"weight: expected a float tensor [K={k}], got {_describe(weight)}")
    if weight.device != x.device:
        raise ValueError(f"weight: on {weight.device}, but x is on {x.device}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps < math.inf:
        raise ValueError(f"eps: expected a non-negative float (finite), got {eps!r}")
    if residual is not None and (
        not isinstance(residual, torch.Tensor) or residual.shape != x.shape or residual.dtype != x.dtype
    ):
        raise ValueError(f"residual: expected x's shape and dtype {_describe(x)}, got {_describe(residual)}")
    if residual is not None and residual.device != x.device:
        raise ValueError(f"residual: on {residual.device}, but x is on {x.device}")


def _describe(t) -> str:
    if isinstance(t, torch.Tensor):
        return f"{str(t.dtype).replace('torch.', '')} {tuple(t.shape)}"
    return type(t).__name__


def _rmsnorm_quantize_impl(x, weight, eps, scheme: ActScheme, residual, scale, backend: str):
    """``(QuantizedActivation, new residual or None)`` on ``backend``."""
    backend = pass_backend(backend)
    if backend == "triton" or (backend == "auto" and x.device.type == "cuda"):
        from .triton_kernels import norm_quant

        strided = [name for name, t in (("x", x), ("residual", residual)) if t is not None and t.stride(-1) != 1]
        strided += [] if weight.is_contiguous() else ["weight"]
        reason = f"{', '.join(strided)}: not contiguous along K" if strided else None
        reason = reason or norm_quant.unsupported(x, scheme, static=scale is not None)
        if reason is None:
            return norm_quant.rmsnorm_quantize(x, weight, eps, scheme, residual=residual, scale=scale)
        if backend == "triton":
            raise ValueError(f"backend: 'triton' cannot run this call: {reason}")
    normed = rmsnorm(x, weight, eps, residual=residual)
    y, new_residual = normed if residual is not None else (normed, None)
    return reference_quantize_activation(y, scheme, scale=scale), new_residual


def _op(x, weight, eps, act, residual, scale, backend):
    _check(x, weight, eps, residual)  # the op may be called directly
    qa, new_residual = _rmsnorm_quantize_impl(x, weight, eps, get_act_scheme(act), residual, scale, backend)
    return *ops.activation_outputs(qa, scale), x.new_empty(0) if new_residual is None else new_residual


def _fake(x, weight, eps, act, residual, scale, backend):
    scheme = get_act_scheme(act)
    m, k = x.shape
    return (
        x.new_empty((m, k), dtype=torch.uint8),
        x.new_empty(ops.act_scales_shape(scheme, m, k, scale is not None), dtype=scheme.scale_dtype),
        x.new_empty((), dtype=torch.float32),
        x.new_empty(0) if residual is None else torch.empty_like(x),
    )


ops.register("rmsnorm_quantize", _op, _fake)


def rmsnorm_quantize(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    act: str | ActScheme,
    *,
    residual: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
    backend: str = "auto",
) -> QuantizedActivation | tuple[QuantizedActivation, torch.Tensor]:
    """``quantize_activation(rmsnorm(x, weight, eps), act)`` in one pass: the next layer's quantized input,
    straight from the norm. ``x`` ``[M, K]`` float16 / bfloat16 / float32, ``weight`` ``[K]``; ``residual``
    (x's shape and dtype): normalize ``x + residual`` and return ``(QuantizedActivation, x + residual)``, the
    new residual second. ``scale``: a static per-tensor scale. ``backend``: ``"reference"`` (:func:`rmsnorm`
    then :func:`humming.quantize_activation`, the definition), ``"triton"`` (bit-exact with it) or ``"auto"``
    (Triton on CUDA tensors where it runs the scheme, else the reference). The Triton kernel takes per-token,
    per-group (1x128, MX) and static per-tensor schemes; a dynamic scale that spans rows (``int8_tensor``,
    ``fp8_tensor``, ``nvfp4``'s global scale) needs the whole normed tensor first and runs on the reference.
    """
    scheme = get_act_scheme(act)
    _check(x, weight, eps, residual)
    if ops.eager(x):
        qa, new_residual = _rmsnorm_quantize_impl(x, weight, eps, scheme, residual, scale, backend)
    else:
        codes, scales, gs, new_residual = torch.ops.humming.rmsnorm_quantize(
            x, weight, float(eps), ops.act_name(scheme), residual, scale, backend
        )
        qa = QuantizedActivation(scheme, codes, scales, gs if scheme.global_scale else None)
    return qa if residual is None else (qa, new_residual)
