"""Triton dequantization of the weight IR: ``QuantizedWeight`` -> bf16 / fp16 / fp32 ``[N, K]``.

The first Triton kernel of humming and the proof of its CPU plumbing: it reads the IR directly (no
repacking) through the same :func:`~humming.triton_kernels._weight_tile.load_weight_tile` the GEMMs use,
and is bit-exact with :func:`humming.dequantize` for every format and layout.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ir.dtypes import FLOAT_DTYPES
from ..ir.weight import QuantizedWeight
from . import registry
from ._weight_tile import WeightArgs, kernel_tensors, load_weight_tile, pointer_types, weight_spec
from .interpreter import cast

__all__ = ["dequantize"]

_BLOCK_N = 32
_BLOCK_K = 256


@triton.jit
def _dequant_kernel(
    qw_ptr,
    s_ptr,
    z_ptr,
    gs_ptr,
    gidx_ptr,
    lut_ptr,
    out_ptr,
    N,
    K,
    stride_qn,
    stride_sn,
    stride_zn,
    stride_on,
    BN: tl.constexpr,
    BK: tl.constexpr,
    WEIGHT: tl.constexpr,  # the weight's WeightSpec (_weight_tile)
    EVEN_K: tl.constexpr,
):
    weight = WeightArgs(qw_ptr, s_ptr, z_ptr, gs_ptr, gidx_ptr, lut_ptr, stride_qn, stride_sn, stride_zn)
    offs_n = tl.program_id(0) * BN + tl.arange(0, BN)
    k0 = tl.program_id(1) * BK
    w = load_weight_tile(weight, WEIGHT, offs_n, k0, N, K, BK, EVEN_K)
    offs_k = k0 + tl.arange(0, BK)
    out = out_ptr + offs_n.to(tl.int64)[:, None] * stride_on + offs_k[None, :]
    tl.store(out, cast(w, out_ptr.dtype.element_ty), mask=(offs_n[:, None] < N) & (offs_k[None, :] < K))


def dequantize(qw: QuantizedWeight, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``humming.dequantize(qw, dtype)`` computed by a Triton kernel; 2-D weights ``[N, K]`` only.

    Returns a new ``[N, K]`` tensor of ``dtype`` (bfloat16, float16 or float32), bit-exact with the reference.
    """
    if qw.num_experts is not None:
        raise ValueError(f"dequantize: expected a 2-D weight [N, K], got shape {qw.shape}")
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"dequantize: dtype must be bfloat16, float16 or float32, got {dtype}")
    n, k = qw.N, qw.K
    t = kernel_tensors(qw)
    out = torch.empty(n, k, dtype=dtype, device=qw.device)
    grid = (triton.cdiv(n, _BLOCK_N), triton.cdiv(k, _BLOCK_K))
    _dequant_kernel[grid](
        t["qw"],
        t["s"],
        t["z"],
        t["gs"],
        t["gidx"],
        t["lut"],
        out,
        n,
        k,
        t["qw"].stride(0),
        t["s"].stride(0),
        t["z"].stride(0),
        out.stride(0),
        BN=_BLOCK_N,
        EVEN_K=k % _BLOCK_K == 0,
        BK=_BLOCK_K,
        WEIGHT=weight_spec(qw),
    )
    return out


def _compile_specs() -> list[registry.CompileSpec]:
    from ..ir.quantize import quantize

    specs = []
    for label, qw in (
        ("int4-g128", quantize(torch.ones(64, 256), "int4", group_size=128)),
        ("nvfp4", quantize(torch.ones(64, 256), "nvfp4")),
        ("uint3-zp-actorder", quantize(torch.ones(64, 256), "int3", 32, True, g_idx=torch.arange(256) % 8)),
    ):
        specs.append(
            registry.CompileSpec(
                name=f"dequant-{label}",
                kernel=_dequant_kernel,
                pointers={**pointer_types(qw), "out_ptr": "*bf16"},
                constexprs={"BN": _BLOCK_N, "BK": _BLOCK_K, "EVEN_K": True, "WEIGHT": weight_spec(qw)},
                aligned=("K", "stride_qn", "stride_on"),
            )
        )
    return specs


registry.register("dequant", _compile_specs)
