"""fused_moe's weighted combine as a CUDA kernel (``include/humming/moe_combine.cuh``): the bits of the Triton
combine (:class:`humming.triton_kernels.moe_layer.PreparedCombine`), launched from packed parameters.

It exists for the host: at one token a fused_moe layer is a few microseconds of GPU work, and a Triton launch
(argument binding, Triton's launcher) costs the host more than that; this launch writes four addresses into a
parameter struct and calls the driver. ``humming.moe.fused.prepared_combine`` hands it out where
:func:`cuda_unsupported` allows (16-bit ``y`` and output, ``H % 8 == 0``, 16-byte rows, float ``topk_weights``, a
device it is built for) and the Triton combine everywhere else.
"""

from __future__ import annotations

import ctypes

import torch

from ..device import device_index, device_info
from ..ir.dtypes import FLOAT_DTYPES, HALF_DTYPES
from ._decode_launch import DECODE_CCS
from ._driver import PackedLaunch, current_stream, fields, get_kernel
from ._layout import CPP_DTYPE, DTYPE_CODE
from .jit import KernelSpec, compiler_unavailable_reason, device_arch, per_call_cache

__all__ = ["COMBINE_CCS", "CudaCombine", "combine_spec", "cuda_unsupported", "warmup_jobs"]

#: Compute capabilities the combine is built for: those of the grouped kernels whose output it reads.
COMBINE_CCS = DECODE_CCS
_THREADS = 128  # 1024 columns per block


@per_call_cache
def combine_spec(y: str, weights: str, out: str) -> KernelSpec:
    """The combine of ``y`` rows (dtype code), ``weights`` and ``out`` dtype codes."""
    return KernelSpec(
        family="moe_combine",
        name=f"humming_moe_combine_y{y}_w{weights}_o{out}",
        header="humming/moe_combine.cuh",
        entry=f"humming::moe_combine::run<{CPP_DTYPE[y]}, {CPP_DTYPE[weights]}, {CPP_DTYPE[out]}, {_THREADS}>",
        params="humming::moe_combine::Params",
        threads=_THREADS,
        ccs=COMBINE_CCS,
    )


def warmup_jobs(y_dtype: torch.dtype, weights_dtype: torch.dtype, dtype: torch.dtype, device: int) -> list:
    """The ``(spec, arch)`` job of the combine of ``y_dtype`` rows, ``weights_dtype`` weights and a ``dtype``
    output on CUDA device ``device``, for calls :func:`cuda_unsupported` allows (``humming.warmup`` compiles
    every job in parallel before the calls)."""
    spec = combine_spec(DTYPE_CODE[y_dtype], DTYPE_CODE[weights_dtype], DTYPE_CODE[dtype])
    arch = device_arch(spec, device_info(device).capability)
    return [] if arch is None else [(spec, arch)]


class _Params(ctypes.Structure):
    """Mirror of ``humming::moe_combine::Params``."""

    _fields_ = (
        *fields(ctypes.c_void_p, "y slot_rows weights out"),
        *fields(ctypes.c_int, "H y_stride weight_t weight_j out_stride num_experts topk slot_block"),
    )


def cuda_unsupported(y: torch.Tensor, topk_weights: torch.Tensor, dtype: torch.dtype) -> str | None:
    """``None`` when the CUDA combine takes calls shaped as these, else why not (the Triton one takes them)."""
    if y.dtype not in HALF_DTYPES or dtype not in HALF_DTYPES or topk_weights.dtype not in FLOAT_DTYPES:
        return "the CUDA combine takes 16-bit y and output, float weights"
    h = y.shape[1]
    if h == 0 or h % 8 or (y.shape[0] > 1 and y.stride(0) % 8) or y.stride(1) != 1 or topk_weights.numel() == 0:
        return f"the CUDA combine takes H % 8 == 0 and 16-byte rows, got y {tuple(y.shape)} {y.stride()}"
    if y.device.type != "cuda" or device_info(y.device).capability not in COMBINE_CCS:
        return f"the CUDA combine is built for compute capabilities {COMBINE_CCS}"
    return compiler_unavailable_reason()


class CudaCombine:
    """A combine made ready for the calls shaped as these (the arguments of the Triton ``PreparedCombine``, which
    checks them: ``fallback``), launched on CUDA with the same bits; ``y`` whose address is not 16-byte aligned
    goes through ``fallback``."""

    def __init__(
        self, fallback, y, topk_weights, dtype, slot_block: int = 0, num_experts: int = 0, programmatic: bool = True
    ) -> None:
        t, topk = topk_weights.shape
        h = y.shape[1]
        self.fallback, self.shape, self.dtype = fallback, (t, h), dtype
        self.device = device_index(y.device)
        self.torch_device = torch.device("cuda", self.device)
        params = _Params()
        params.H, params.y_stride, params.out_stride = h, y.stride(0) if y.shape[0] > 1 else h, h
        params.weight_t, params.weight_j = topk_weights.stride()
        params.num_experts, params.topk, params.slot_block = num_experts, topk, slot_block
        spec = combine_spec(DTYPE_CODE[y.dtype], DTYPE_CODE[topk_weights.dtype], DTYPE_CODE[dtype])
        grid = (t, -(-h // (8 * _THREADS)), 1)
        # programmatic unless asked not to: the combine waits for the kernel before it (w2) first
        self.packed = PackedLaunch(get_kernel(spec, self.device), grid, 0, params, programmatic)

    def __call__(self, y: torch.Tensor, slot_rows: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        if y.data_ptr() % 16:
            return self.fallback(y, slot_rows, topk_weights)
        if not slot_rows.is_contiguous():
            slot_rows = slot_rows.contiguous()
        out = torch.empty(self.shape, dtype=self.dtype, device=self.torch_device)
        packed = self.packed
        with packed.lock:
            params = packed.params
            params.y, params.slot_rows = y.data_ptr(), slot_rows.data_ptr()
            params.weights, params.out = topk_weights.data_ptr(), out.data_ptr()
            packed(current_stream(self.device))
        return out
