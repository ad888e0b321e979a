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
from ._dequant16 import dequantized_tile, packed_asm, packed_decode
from ._launch import LaunchesByWeight, PreparedLaunch
from ._weight_tile import WeightArgs, kernel_tensors, pointer_args, pointer_types, weight_spec

__all__ = ["dequantize"]

_BLOCK_N = 32
_BLOCK_K = 256
_NUM_WARPS = 4  # Triton's default


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
    PACKED: tl.constexpr,  # the packed 16-bit decode's PTX, or "" (_dequant16.packed_decode)
):
    weight = WeightArgs(qw_ptr, s_ptr, z_ptr, gs_ptr, gidx_ptr, lut_ptr, stride_qn, stride_sn, stride_zn)
    offs_n = tl.program_id(0) * BN + tl.arange(0, BN)
    k0 = tl.program_id(1) * BK
    w = dequantized_tile(weight, WEIGHT, offs_n, k0, N, K, BK, EVEN_K, out_ptr.dtype.element_ty, PACKED)
    offs_k = k0 + tl.arange(0, BK)
    out = out_ptr + offs_n.to(tl.int64)[:, None] * stride_on + offs_k[None, :]
    tl.store(out, w, mask=(offs_n[:, None] < N) & (offs_k[None, :] < K))


def dequantize(qw: QuantizedWeight, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``humming.dequantize(qw, dtype)`` computed by a Triton kernel; 2-D weights ``[N, K]`` only.

    Returns a new ``[N, K]`` tensor of ``dtype`` (bfloat16, float16 or float32), bit-exact with the reference.
    The launch is made ready once per weight and dtype (the dequantize-first GEMM calls this on every call).
    """
    if qw.num_experts is not None:
        raise ValueError(f"dequantize: expected a 2-D weight [N, K], got shape {qw.shape}")
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"dequantize: dtype must be bfloat16, float16 or float32, got {dtype}")
    out = torch.empty(qw.N, qw.K, dtype=dtype, device=qw.device)
    _ready.get(qw, (dtype, qw.device), lambda: _prepared(qw, dtype))(qw.device.index, out)
    return out


#: The dequantization launches made ready, per weight object, by output dtype and device.
_ready = LaunchesByWeight()


def _prepared(qw: QuantizedWeight, dtype: torch.dtype) -> PreparedLaunch:
    """The dequantization of ``qw`` into a contiguous ``[N, K]`` output of ``dtype`` (the one tensor each call
    passes)."""
    n, k = qw.N, qw.K
    t = kernel_tensors(qw)
    values = {
        **pointer_args(t),
        "N": n,
        "K": k,
        "stride_qn": t["qw"].stride(0),
        "stride_sn": t["s"].stride(0),
        "stride_zn": t["z"].stride(0),
        "stride_on": k,
        "BN": _BLOCK_N,
        "EVEN_K": k % _BLOCK_K == 0,
        "BK": _BLOCK_K,
        "WEIGHT": weight_spec(qw),
        "PACKED": packed_decode(qw, dtype, _BLOCK_K, qw.device),
    }
    grid = (triton.cdiv(n, _BLOCK_N), triton.cdiv(k, _BLOCK_K))
    return PreparedLaunch(_dequant_kernel, grid, values, ("out_ptr",), _NUM_WARPS)


def _compile_specs() -> list[registry.CompileSpec]:
    from ..ir.quantize import quantize

    specs = []
    for label, qw in (
        ("int4-g128", quantize(torch.ones(64, 256), "int4", group_size=128)),
        ("uint4-zp-g64-bf16", quantize(torch.ones(64, 256), "int4", 64, True, scale_dtype=torch.bfloat16)),
        ("nvfp4", quantize(torch.ones(64, 256), "nvfp4")),
        ("uint3-zp-actorder", quantize(torch.ones(64, 256), "int3", 32, True, g_idx=torch.arange(256) % 8)),
    ):
        specs.append(
            registry.CompileSpec(
                name=f"dequant-{label}",
                kernel=_dequant_kernel,
                pointers={**pointer_types(qw), "out_ptr": "*bf16"},
                constexprs={
                    "BN": _BLOCK_N,
                    "BK": _BLOCK_K,
                    "EVEN_K": True,
                    "WEIGHT": weight_spec(qw),
                    "PACKED": packed_asm(qw, torch.bfloat16, _BLOCK_K, (8, 0)),
                },
                aligned=("K", "stride_qn", "stride_on"),
            )
        )
    return specs


registry.register("dequant", _compile_specs)
