"""Activation quantization in Triton, bit-exact with :func:`humming.quantize_activation`.

One kernel covers every :data:`humming.ACT_SCHEMES` entry: per-token, per-tensor (dynamic or a static
scale) and groups along K (1x16, 1x32, 1x128); int8 / int4 / e4m3 / e5m2 / e2m1 elements; fp32, e8m0 and
e4m3 (+ fp32 global) scales. The reference divides in float64; the kernel divides in float32 and settles
the only case where that can differ (the float32 quotient lands exactly on a rounding midpoint of the
element grid) from the sign of the exact residual ``x - q * s``, computed in float64 (two operations per
element; the division itself stays float32). NVFP4 scales are ``e4m3 * global``, a 28-bit product, so
that scheme divides in float64 outright. NaN / Inf follow the reference's rule (README, "Non-finite
activations"): every absmax ignores them, they get the format's NaN code (0 where it has none), and a span
scale over one is NaN.

This module holds the entry points; the kernels live in ``_act_quant_kernel``, the checks, the tiling and the
passes made ready per kind of call in ``_act_quant_pass``.
"""

from __future__ import annotations

import torch

from ..ir.activation import ACT_SCHEMES, ActScheme, QuantizedActivation, get_act_scheme
from ..ir.dtypes import HALF_DTYPES
from . import registry
from ._act_quant_kernel import _absmax_kernel, _act_quant_kernel
from ._act_quant_pass import (
    ElementSpec,
    element_spec,
    pass_for,
    per_token_tile,
    scale_kind,
    scheme_unsupported,
    unsupported,
)

__all__ = [
    "ElementSpec",
    "element_spec",
    "per_token_tile",
    "quantize_activation",
    "quantize_activation_values",
    "quantize_pass",
    "scale_kind",
    "scheme_unsupported",
    "unsupported",
]


def quantize_activation(
    x: torch.Tensor, act: str | ActScheme, *, scale: torch.Tensor | None = None, perm: torch.Tensor | None = None
) -> QuantizedActivation:
    """Quantize ``x`` [M, K] (fp16/bf16/fp32, rows contiguous) with scheme ``act``; the Triton twin of
    :func:`humming.quantize_activation` (same codes, scales and global scale). A static per-tensor
    ``scale`` replaces the dynamic one. ``perm`` (int32 ``[K]``, a permutation of the columns: an act-order
    weight's :func:`~humming.ir.act_order.act_order_perm`) quantizes ``x[:, perm]``, gathered in the same
    pass: bit-exact with ``humming.quantize_activation(x[:, perm], act)``."""
    scheme = get_act_scheme(act)
    if perm is not None and (perm.dtype != torch.int32 or tuple(perm.shape) != (x.shape[-1],)):
        raise ValueError(f"perm: expected an int32 tensor [K={x.shape[-1]}], got {perm.dtype} {tuple(perm.shape)}")
    if perm is not None and perm.device != x.device:
        raise ValueError(f"perm: on {perm.device}, but x is on {x.device}")
    codes, scales, gscale = pass_for(x, scheme, scale is not None, None, 0, perm is not None)(x, scale, perm)
    if scale_kind(scheme) != "fp32":
        scales = scales.view(scheme.scale_dtype)
    return QuantizedActivation.from_kernel(scheme, codes, scales, gscale)


def quantize_activation_values(x: torch.Tensor, act: str | ActScheme) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values, scales)``: the codes of :func:`quantize_activation` for an e4m3 scheme with float32 scales,
    stored as the e4m3 values they stand for in ``x``'s 16-bit dtype (bfloat16 for float32 ``x``), where
    every e4m3 value is exact. For kernels that multiply them on 16-bit tensor cores (the CUDA backend's
    fp8-activation route through its WnA16 kernels); ``values * scales`` is the dequantized activation."""
    values, scales, _ = quantize_pass(x, act, values=True)(x)
    return values, scales


def quantize_pass(x: torch.Tensor, act: str | ActScheme, *, values: bool = False, scales_rows: int = 0):
    """A callable ``x -> (codes, scales, global_scale)``, :func:`quantize_activation`'s buffers (scales as
    stored: float32, or the uint8 bytes of 8-bit scales) without the :class:`QuantizedActivation`, for
    calls with x of ``x``'s dtype, shape and strides; everything but the launch is worked out (and checked)
    here, once, so that kernels that quantize on every call pay for the launch only.

    ``values``: the codes as :func:`quantize_activation_values` stores them. ``scales_rows`` (per-token or
    per-group float32 scales): the scales transposed into ``[spans along K, scales_rows]``, row-major,
    ``scales_rows >= M`` (columns ``M`` onwards are left unwritten), the layout of the CUDA FP8 GEMM's 1x128
    activation scales."""
    scheme = get_act_scheme(act)
    values_dtype = None
    if values:
        if scheme.element_format.name != "e4m3" or scale_kind(scheme) != "fp32":
            raise ValueError(f"act: values are produced for e4m3 schemes with float32 scales, not {scheme.name}")
        values_dtype = x.dtype if x.dtype in HALF_DTYPES else torch.bfloat16
    return pass_for(x, scheme, False, values_dtype, scales_rows)


def _compile_specs() -> list[registry.CompileSpec]:
    """Every activation scheme (per-token, per-tensor, groups) from bf16, and the absmax reduction."""
    specs = [
        registry.CompileSpec(
            name="act_quant-absmax-bf16",
            kernel=_absmax_kernel,
            pointers={"x_ptr": "*bf16", "amax_ptr": "*i32"},
            constexprs={"BLOCK_M": 32, "BLOCK_K": 128},
            aligned=("K", "stride_xm"),
        )
    ]
    for scheme in ACT_SCHEMES.values():
        fmt = scheme.element_format
        kind = scale_kind(scheme)
        bn, bk = scheme.group_shape
        source = "tensor" if bn == -1 else "local"
        # The launch's tiles (quantize_activation): groups, per-token rows, per-tensor;
        # (block_m, block_k, warps, name suffix, values, perm): fp8 per-token rows also as bf16 values;
        # the act-order gather (perm) for the per-token, per-tensor and 1x128 schemes of the scaled GEMM.
        tiles = [(4096 // bk, bk, 4, "", False, False)]
        if bk == -1 and source == "tensor":
            tiles = [(16, 256, 4, "", False, False)]
        elif bk == -1:
            tiles = [(1, 8192, 8, "", False, False)]
            if scheme.name == "fp8":
                tiles.append((1, 8192, 8, "-values", True, False))
        if scheme.name in ("int8", "fp8", "fp8_tensor", "fp8_g128"):
            tiles += [(*tile[:3], tile[3] + "-perm", False, True) for tile in tiles if not tile[4]]
        specs += [
            registry.CompileSpec(
                name=f"act_quant-{scheme.name}-bf16{suffix}",
                kernel=_act_quant_kernel,
                pointers={
                    "x_ptr": "*bf16",
                    "codes_ptr": "*bf16" if values else "*u8",
                    "scales_ptr": "*fp32" if kind == "fp32" else "*u8",
                    "amax_ptr": "*i32" if source == "tensor" or kind == "e4m3g" else ("*bf16" if values else "*u8"),
                    "gscale_ptr": "*fp32",
                    "perm_ptr": "*i32" if perm else "*u8",
                },
                constexprs={
                    "ELEMENT": element_spec(fmt),
                    "SCALE": kind,
                    "SOURCE": source,
                    "GROUP_K": 0 if bk == -1 else bk,
                    "BLOCK_M": block_m,
                    "BLOCK_K": block_k,
                    "VALUES": values,
                    "PERM": perm,
                },
                num_warps=num_warps,
                aligned=("K", "stride_xm", "stride_cm"),
            )
            for block_m, block_k, num_warps, suffix, values, perm in tiles
        ]
    return specs


registry.register("act_quant", _compile_specs)
