"""Hopper weight-only GEMM for large M (``include/humming/gemm_sm90.cuh``): specs, checks and launch.

Layout: the shared fragment layout (``_layout``) with tile groups of 8 (N % 128 == 0). Compute: w =
(q - z) * s rounded once to the activation dtype, bf16/fp16 wgmma with fp32 accumulation. Tuning:
tokens per block tile (the block tile is 128 weight rows x ``bm`` tokens) and pipeline ``stages``.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from ._decode import device_limits
from ._layout import DTYPE_CODE, PreparedWeight, WeightLayout
from .jit import KernelSpec

__all__ = ["GEMM_CCS", "GEMM_MIN_M", "GemmTuning", "default_gemm_tuning", "gemm_spec", "gemm_unsupported", "run_gemm"]

GEMM_CCS = ((9, 0),)
#: The GEMM takes M above this (measured on the H200: at M = 64 one 128-token tile beats the decode
#: kernel's 8 token tiles; at M = 32 the decode kernel wins).
GEMM_MIN_M = 32
_CPP_DTYPE = {"f32": "humming::DType::f32", "bf16": "humming::DType::bf16", "f16": "humming::DType::f16"}


@dataclass(frozen=True)
class GemmTuning:
    """Speed-only knobs: tokens per block tile (``bm``, 128 or 256) and pipeline ``stages`` (chunks of
    64 columns in flight)."""

    bm: int
    stages: int

    def smem_bytes(self, layout: WeightLayout) -> int:
        """Dynamic shared memory (``SmemLayout::kTotal`` in gemm_sm90.cuh) plus 1 KiB alignment slack."""
        per_stage = self.bm * 128 + 128 * 64 * layout.bits // 8 + 128 * (4 if layout.scale == "f32" else 2)
        per_stage += 128 * 2 if layout.zero < 0 else 0
        return self.stages * (per_stage + 16) + 1024


def default_gemm_tuning(m: int, layout: WeightLayout, smem_per_block: int) -> GemmTuning:
    """256-token tiles from M >= 512 (half the dequantization per FLOP), and as many stages (up to 6)
    as the device's shared memory per block allows."""
    bm = 256 if m >= 512 else 128
    stages = 6
    while stages > 2 and GemmTuning(bm, stages).smem_bytes(layout) > smem_per_block:
        stages -= 1
    return GemmTuning(bm, stages)


def gemm_unsupported(qw, x: torch.Tensor, cc: tuple[int, int]) -> str | None:
    """``None`` when the sm_90a GEMM runs this call (given the checks of ``decode_unsupported`` pass)."""
    if cc not in GEMM_CCS:
        return f"the large-M CUDA GEMM needs compute capability 9.0 (wgmma, TMA), got {cc}"
    if qw.N % 128:
        return f"the large-M CUDA GEMM needs N % 128 == 0, got N={qw.N}"
    if x.stride(0) % 8 or x.data_ptr() % 16:
        return "the large-M CUDA GEMM needs 16-byte aligned activation rows (TMA)"
    return None


def gemm_spec(layout: WeightLayout, act: str, out: str, bias: str, tuning: GemmTuning) -> KernelSpec:
    zp = "zp" if layout.zero < 0 else f"z{layout.zero}"
    name = f"humming_gemm_sm90_u{layout.bits}{zp}_a{act}_s{layout.scale}_o{out}_b{bias}_bm{tuning.bm}_s{tuning.stages}"
    args = ", ".join(
        (
            _CPP_DTYPE[act],
            str(layout.bits),
            str(layout.zero),
            _CPP_DTYPE[layout.scale],
            _CPP_DTYPE[out],
            _CPP_DTYPE[bias],
            str(tuning.bm),
            str(tuning.stages),
        )
    )
    return KernelSpec(
        family="gemm_sm90",
        name=name,
        header="humming/gemm_sm90.cuh",
        entry=f"humming::gemm_sm90::run<{args}>",
        params="humming::gemm_sm90::Params",
        threads=384,
        ccs=GEMM_CCS,
        min_blocks=1,
        arch_specific=True,
    )


def gemm_call_spec(
    prep: PreparedWeight, x: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype, tuning: GemmTuning
) -> KernelSpec:
    bias_code = DTYPE_CODE[bias.dtype] if bias is not None else DTYPE_CODE[x.dtype]
    return gemm_spec(prep.layout, DTYPE_CODE[x.dtype], DTYPE_CODE[out_dtype], bias_code, tuning)


class _Params(ctypes.Structure):
    """Mirror of ``humming::gemm_sm90::Params`` (192 bytes, the tensor map first)."""

    _fields_ = (
        ("x_map", ctypes.c_uint8 * 128),
        ("qweight", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
        ("zeros", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("M", ctypes.c_int),
        ("N", ctypes.c_int),
        ("K", ctypes.c_int),
        ("out_stride", ctypes.c_int),
        ("groups", ctypes.c_int),
        ("chunks_per_group", ctypes.c_int),
    )


def _x_tensor_map(x: torch.Tensor, bm: int) -> bytes:
    """TMA descriptor of ``x [M, K]``: 64 x ``bm`` boxes (128 bytes wide), 128-byte swizzle, zero fill."""
    from ._driver import tensor_map_2d

    return tensor_map_2d(x, 64, bm)


def run_gemm(
    prep: PreparedWeight,
    x: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    tuning: GemmTuning | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x [M, K] @ W^T + bias`` -> ``[M, N]`` of ``out_dtype`` on the current stream (sm_90a)."""
    from .jit import get_kernel

    m, k = x.shape
    device = x.device.index if x.device.index is not None else torch.cuda.current_device()
    if tuning is None:
        tuning = default_gemm_tuning(m, prep.layout, device_limits(device)[1])
    kernel = get_kernel(gemm_call_spec(prep, x, bias, out_dtype, tuning), device)
    if x.stride(1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:
        x = x.contiguous()
    if out is None:
        out = torch.empty(m, prep.n, device=x.device, dtype=out_dtype)
    elif tuple(out.shape) != (m, prep.n) or out.dtype != out_dtype or out.stride(1) != 1:
        raise ValueError(f"out: expected a [{m}, {prep.n}] {out_dtype} tensor with unit column stride")
    params = _Params(
        (ctypes.c_uint8 * 128).from_buffer_copy(_x_tensor_map(x, tuning.bm)),
        prep.qweight.data_ptr(),
        prep.scales.data_ptr(),
        prep.zeros.data_ptr() if prep.zeros is not None else None,
        bias.data_ptr() if bias is not None else None,
        out.data_ptr(),
        m,
        prep.n,
        k,
        out.stride(0),
        prep.groups,
        prep.chunks_per_group,
    )
    grid = (prep.n // 128, -(-m // tuning.bm), 1)
    kernel.launch(grid, tuning.smem_bytes(prep.layout), params, torch.cuda.current_stream(device).cuda_stream)
    return out
