"""humming's CUDA backend: hand-written kernels compiled at run time with NVRTC (``jit``).

Each kernel module exports the kernel object the dispatcher lists (``humming.dispatch.kernels``; protocol:
:class:`humming.kernel.Kernel`); this package adds what is the backend's as a whole: :func:`unavailable`,
:func:`prepare` (``humming.prepare``) and :func:`compile_and_load` (``humming.warmup``). Kernels:

- ``cuda.wna16_decode`` (:mod:`.wna16_decode`, ``include/humming/decode.cuh``): weight-only GEMM for
  M <= 64, int4 / uint4 (+ zero points) / int8 / uint8 weights with per-tensor / per-channel / group scales
  (group size a multiple of 64), and MXFP4 (e2m1, e8m0 scales per 32); bfloat16 or float16 activations,
  compute capability 8.0 and newer.
- ``cuda.wna16_sm90`` (:mod:`.wna16_sm90`, ``include/humming/gemm_sm90.cuh``): the same weights for M > 32
  on Hopper (sm_90a): TMA + mbarrier pipeline, producer / consumer warpgroups with setmaxnreg, wgmma with
  the dequantized weights as the register A operand; any N % 16 == 0. Its grouped variant (the same
  kernel with a compile-time flag) runs ``humming.moe.grouped_linear`` (``cuda.grouped``, :mod:`.grouped`):
  token tiles of 16 to 256 rows (dividing ``block_m``), each reading its segment's expert id, skipping -1
  segments, offsetting its weight tiles.
- ``cuda.grouped_decode`` (:mod:`.grouped_decode`, the decode kernel's grouped variant): the MoE grouped GEMM
  of the decode regime (routing blocks of 8 and 16 rows), sm_80 and newer: a grid sized for the segments the
  routing can use, token rows read through the routing's index, fused_moe's gated activation in the epilogue.
- fp8 activations with integer weights (per-token or per-tensor e4m3; int4 / uint4 / int8 / uint8): the
  Triton pass writes the e4m3 values in x's 16-bit dtype (exact) and the two WnA16 kernels run them with the
  activation scales in the epilogue (one 4-bit weight read and no int4 -> e4m3 conversion: the
  dispatcher's tables say at which M this beats ``cuda.fp8_gemm``).
- ``cuda.fp8_gemm`` (:mod:`.fp8_gemm`, ``include/humming/fp8_gemm_sm90.cuh``): quantized activations on
  Hopper: W8A8 e4m3 x e4m3 (per-tensor / per-token x per-channel, 1x128 x 128x128 blocks) and W4A8 int4 x
  e4m3, on fp8 wgmma. Its grouped variant runs ``humming.moe.grouped_linear(act="fp8" | "fp8_g128")`` for
  e4m3 / int4 experts. W4A8 MXFP4 x e4m3 folds the e8m0 scales exactly (refusing weights whose scales span
  > 12 binades per 128-K block).
- ``cuda.scaled_mm`` (:mod:`.scaled_mm`): W8A8 e4m3 weights with per-tensor / per-channel scales x e4m3
  activations per token / per tensor on ``torch._scaled_mm`` (the vendor fp8 GEMM: no NVRTC build), which
  the dispatcher takes at large M where it outruns the FP8 GEMM's tiles.
- ``cuda.fp4_gemm`` (:mod:`.fp4_gemm`, ``include/humming/fp4_gemm_sm120.cuh``, ``fp4_gemm_sm100.cuh``):
  W4A4 NVFP4 / MXFP4 on sm_120a block-scaled ``mma.sync`` and on sm_100a ``tcgen05.mma`` (tensor memory);
  compiled and checked in CI, never run on hardware (BLACKWELL.md).

Each ``QuantizedWeight`` is re-tiled once into the layout of the kernel that runs it (the WnA16 kernels'
fragment layout, ``_layout``; :func:`prepare`, cached per weight object). ``humming.warmup`` compiles the
kernels a set of layers needs ahead of time, so that CUDA graph capture never compiles (an unprepared
kernel raises ``KernelNotReadyError`` during capture).
"""

from __future__ import annotations

from .. import _install_check  # noqa: F401  (its import is the check; before ..device, which it guards)
from ..ir.activation import get_act_scheme
from . import _wna16, fp4_gemm, fp8_gemm
from ._support import runtime_unavailable as unavailable
from ._warmup import WarmupReport, warmup_specs
from .jit import KernelNotReadyError

__all__ = ["KernelNotReadyError", "WarmupReport", "compile_and_load", "prepare", "release_codes", "unavailable"]


def prepare(qweight, act=None):
    """``qweight`` in the layout of the CUDA kernel that runs it with activation scheme ``act`` (``None``:
    the WnA16 fragment layout of ``_layout``; fp8 / int8 schemes: ``fp8_gemm``'s; FP4 schemes: ``fp4_gemm``'s
    for the weight's device); computed once per weight object."""
    if act is not None:
        act = get_act_scheme(act)
        if _wna16.wna8_weight_unsupported(qweight, act) is not None:
            kernel = fp4_gemm.KERNEL if act.format == "e2m1" else fp8_gemm.KERNEL
            return kernel.prepare(qweight, act)
    return _wna16.prepare(qweight)


def release_codes(qweight) -> bool:
    """Free ``qweight``'s IR codes where a prepared CUDA layout holds them (the WnA16 fragment layout, plain or
    in a gated epilogue's row order), rebuilt from it when read; whether it did."""
    return _wna16.release_codes(qweight)


def compile_and_load(jobs: list, device: int, progress: bool = True, max_workers: int | None = None) -> WarmupReport:
    """Compile ``jobs`` (``(spec, arch)``) in parallel and load them on CUDA device ``device``."""
    from . import _driver

    report = warmup_specs(jobs, max_workers=max_workers, progress=progress)
    for compiled in report.kernels:
        _driver.load(compiled, device)
    return report
