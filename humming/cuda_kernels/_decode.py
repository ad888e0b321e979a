"""Small-M weight-only GEMM (``include/humming/decode.cuh``): heuristics, kernel specs and launch.

Configs come in the three kinds of the house style:

- layout (:class:`~humming.cuda_kernels._layout.WeightLayout`): what the prepared weights are (code
  bits, zero points, scale dtype); fixed by ``prepare_weight``.
- compute: fp32 accumulation of exact integer-times-activation products, scaled per row and 64-column
  chunk in fp32; the same for every tuning.
- tuning (:class:`DecodeTuning`): token tiles, row tiles per warp, warps, loads in flight, split-K. A
  tuning change never changes results beyond fp32 summation order.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch

from ._layout import DTYPE_CODE, PreparedWeight, WeightLayout, weight_unsupported
from .jit import KernelSpec

__all__ = [
    "DECODE_CCS",
    "DECODE_MAX_M",
    "DecodeTuning",
    "choose_decode_tuning",
    "decode_spec",
    "decode_unsupported",
    "default_tuning",
    "device_limits",
    "run_decode",
]

#: Compute capabilities the decode kernel is built for (bf16 mma.sync m16n8k16 needs sm_80).
DECODE_CCS = ((8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0))
#: Largest M the decode kernel takes (8 token tiles of 8).
DECODE_MAX_M = 64

_CPP_DTYPE = {"f32": "humming::DType::f32", "bf16": "humming::DType::bf16", "f16": "humming::DType::f16"}


@dataclass(frozen=True)
class DecodeTuning:
    """Speed-only knobs: token tiles of 8 (``mt``), 16-row tiles per warp (``r``), ``warps`` per block,
    cp.async pipeline ``stages`` (chunks in flight per thread) and blocks along K (``splits``)."""

    mt: int
    r: int
    warps: int
    stages: int
    splits: int

    def smem_bytes(self, bits: int) -> int:
        """Dynamic shared memory of the pipeline (``stage_bytes_per_thread`` in decode.cuh)."""
        per_thread = self.r * (bits // 4) * 16 + self.mt * 32 + self.r * 8 + self.r * 4
        return self.stages * self.warps * 32 * per_thread


def decode_unsupported(qw, x: torch.Tensor) -> str | None:
    """``None`` when the decode kernel runs this call, else why not."""
    reason = weight_unsupported(qw, x)
    if reason is None and x.shape[0] > DECODE_MAX_M:
        reason = f"the decode kernel takes M <= {DECODE_MAX_M}, got M={x.shape[0]}"
    return reason


def choose_decode_tuning(m: int, n: int, k: int, bits: int, sm_count: int, smem_per_block: int) -> DecodeTuning:
    """Tuning for ``out[m, n] = x[m, k] @ W^T`` with ``bits``-bit weights: a pure function of the problem
    and the device's SM count and shared memory per block (``sharedMemPerBlockOptin``)."""
    mt = 1
    while mt * 8 < m:
        mt *= 2
    # Two row tiles per warp halve the per-chunk overhead (activation fragments, pipeline bookkeeping)
    # per weight byte; one when that would leave SMs without a block, or with 8 token tiles (registers).
    r = 2 if n % 32 == 0 and n // 32 >= sm_count and mt < 8 else 1
    warps = 8
    # Measured on the H200 (bench/results/h200/cuda_decode_v4.json): 3 stages keep two blocks per SM,
    # which beats deeper pipelines with one block per SM.
    stages = {1: 3, 2: 3, 4: 3, 8: 2}[mt]
    while stages > 2 and DecodeTuning(mt, r, warps, stages, 1).smem_bytes(bits) > smem_per_block:
        stages -= 1
    if DecodeTuning(mt, r, warps, stages, 1).smem_bytes(bits) > smem_per_block:
        warps = 4
    blocks = n // (16 * r)
    chunks = k // 64
    splits = 1
    if blocks < sm_count:  # too few row tiles to fill the GPU: split K across blocks
        splits = max(1, min(-(-2 * sm_count // blocks), chunks // (warps * 2)))
    return DecodeTuning(mt, r, warps, stages, splits)


def decode_spec(layout: WeightLayout, act: str, out: str, bias: str, tuning: DecodeTuning) -> KernelSpec:
    """The kernel spec for a layout, activation / output / bias dtype codes and tuning."""
    out_kernel = "f32" if tuning.splits > 1 else out
    zp = "zp" if layout.zero < 0 else f"z{layout.zero}"
    name = (
        f"humming_decode_u{layout.bits}{zp}_a{act}_s{layout.scale}_o{out_kernel}_b{bias}"
        f"_mt{tuning.mt}_r{tuning.r}_w{tuning.warps}_s{tuning.stages}" + ("_splitk" if tuning.splits > 1 else "")
    )
    args = ", ".join(
        (
            _CPP_DTYPE[act],
            str(layout.bits),
            str(layout.zero),
            _CPP_DTYPE[layout.scale],
            _CPP_DTYPE[out_kernel],
            _CPP_DTYPE[bias],
            str(tuning.mt),
            str(tuning.r),
            str(tuning.warps),
            str(tuning.stages),
            "true" if tuning.splits > 1 else "false",
        )
    )
    return KernelSpec(
        family="decode",
        name=name,
        header="humming/decode.cuh",
        entry=f"humming::decode::run<{args}>",
        params="humming::decode::Params",
        threads=32 * tuning.warps,
        ccs=DECODE_CCS,
    )


@functools.cache
def device_limits(device: int) -> tuple[int, int]:
    """(SM count, opt-in shared memory per block) of CUDA device ``device``."""
    props = torch.cuda.get_device_properties(device)
    return props.multi_processor_count, props.shared_memory_per_block_optin


def default_tuning(m: int, n: int, k: int, bits: int, device: int) -> DecodeTuning:
    """:func:`choose_decode_tuning` with the limits of CUDA device ``device``."""
    return choose_decode_tuning(m, n, k, bits, *device_limits(device))


class _Params(ctypes.Structure):
    """Mirror of ``humming::decode::Params``."""

    _fields_ = (
        ("qweight", ctypes.c_void_p),
        ("x", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
        ("zeros", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("M", ctypes.c_int),
        ("N", ctypes.c_int),
        ("K", ctypes.c_int),
        ("x_stride", ctypes.c_int),
        ("out_stride", ctypes.c_int),
        ("groups", ctypes.c_int),
        ("group_shift", ctypes.c_int),
        ("chunks_per_split", ctypes.c_int),
        ("tile_group", ctypes.c_int),
    )


def decode_call_spec(
    prep: PreparedWeight, x: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype, tuning: DecodeTuning
) -> KernelSpec:
    bias_code = DTYPE_CODE[bias.dtype] if bias is not None else DTYPE_CODE[x.dtype]
    return decode_spec(prep.layout, DTYPE_CODE[x.dtype], DTYPE_CODE[out_dtype], bias_code, tuning)


def run_decode(
    prep: PreparedWeight,
    x: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    tuning: DecodeTuning | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x [M, K] @ W^T + bias`` -> ``[M, N]`` of ``out_dtype`` on the current stream.

    ``out``: an optional ``[M, N]`` tensor of ``out_dtype`` (unit column stride) to write into.
    """
    from .jit import get_kernel

    m, k = x.shape
    device = x.device.index if x.device.index is not None else torch.cuda.current_device()
    if tuning is None:
        tuning = default_tuning(m, prep.n, k, prep.layout.bits, device)
    kernel = get_kernel(decode_call_spec(prep, x, bias, out_dtype, tuning), device)
    if x.stride(1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:
        x = x.contiguous()
    split = tuning.splits > 1
    result = out
    if out is not None and (tuple(out.shape) != (m, prep.n) or out.dtype != out_dtype or out.stride(1) != 1):
        raise ValueError(f"out: expected a [{m}, {prep.n}] {out_dtype} tensor with unit column stride")
    if split:
        out = torch.zeros(m, prep.n, device=x.device, dtype=torch.float32)
    elif out is None:
        out = result = torch.empty(m, prep.n, device=x.device, dtype=out_dtype)
    chunks = k // 64
    params = _Params(
        prep.qweight.data_ptr(),
        x.data_ptr(),
        prep.scales.data_ptr(),
        prep.zeros.data_ptr() if prep.zeros is not None else None,
        bias.data_ptr() if bias is not None else None,
        out.data_ptr(),
        m,
        prep.n,
        k,
        x.stride(0),
        out.stride(0),
        prep.groups,
        31 if prep.groups == 1 else prep.chunks_per_group.bit_length() - 1,
        -(-chunks // tuning.splits),
        prep.tile_group,
    )
    grid = (prep.n // (16 * tuning.r), tuning.splits, 1)
    kernel.launch(grid, tuning.smem_bytes(prep.layout.bits), params, torch.cuda.current_stream(device).cuda_stream)
    if not split:
        return result
    if result is None:
        return out.to(out_dtype)
    return result.copy_(out)
