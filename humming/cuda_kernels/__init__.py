"""humming's CUDA backend: hand-written kernels compiled at run time with NVRTC (``jit``).

Backend interface (``humming.dispatch.backends``): :func:`is_available`, :func:`supports`,
:func:`linear`. Kernels today:

- ``decode`` (``include/humming/decode.cuh``): weight-only GEMM for M <= 64, int4 / uint4 (+ zero points)
  / int8 / uint8 weights, bfloat16 or float16 activations, per-tensor / per-channel / group scales
  (group size a multiple of 64), compute capability 8.0 and newer.
- ``gemm_sm90`` (``include/humming/gemm_sm90.cuh``): the same weights for M > 32 on Hopper (sm_90a):
  TMA + mbarrier pipeline, producer / consumer warpgroups with setmaxnreg, wgmma with the dequantized
  weights as the register A operand; needs N % 128 == 0.
- ``fp8_gemm`` (``include/humming/fp8_gemm_sm90.cuh``): quantized activations on Hopper: W8A8 e4m3 x e4m3
  (per-tensor / per-token x per-channel, 1x128 x 128x128 blocks) and W4A8 int4 x e4m3, on fp8 wgmma.
- ``fp4_gemm`` (``include/humming/fp4_gemm_sm120.cuh``): W4A4 NVFP4 / MXFP4 on sm_120a block-scaled
  ``mma.sync``; compiled and checked in CI, never run on hardware (BLACKWELL.md).

Each ``QuantizedWeight`` is re-tiled once into the fragment layout that every kernel here reads
(``_layout``; :func:`prepare`, cached per weight object). :func:`warmup` compiles the kernels a set
of layers needs ahead of time, so that CUDA graph capture never compiles (an unprepared kernel raises
``KernelNotReadyError`` during capture).
"""

from __future__ import annotations

import functools
import weakref

import torch

from . import _decode, _gemm_sm90, fp4_gemm, fp8_gemm
from ._layout import PreparedWeight, prepare_weight, weight_unsupported
from ._warmup import WarmupReport, warmup_specs
from .jit import KernelNotReadyError, compiler_unavailable_reason

__all__ = ["KernelNotReadyError", "WarmupReport", "is_available", "linear", "prepare", "supports", "warmup"]

_prepared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@functools.cache
def _runtime_unavailable_reason() -> str | None:
    reason = compiler_unavailable_reason()
    if reason is not None:
        return reason
    try:
        from cuda.bindings import driver  # noqa: F401
    except Exception as exc:
        return f"cuda.bindings.driver cannot be imported ({type(exc).__name__}: {exc})"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return None


def is_available() -> str | None:
    """``None`` when the CUDA backend can run here, else why not (missing package, no GPU...)."""
    return _runtime_unavailable_reason()


def supports(qweight, act, x: torch.Tensor) -> str | None:
    """``None`` when a CUDA kernel runs ``linear(x, qweight, act=act)``, else the reason it does not.

    ``x`` is the 2-D activation ``[M, K]`` (its dtype, device and M matter).
    """
    if act is not None and act.format == "e2m1":
        return fp4_gemm.supports(qweight, act, x)
    if act is not None:
        return fp8_gemm.supports(qweight, act, x)
    if x.device.type != "cuda":
        return f"x is on {x.device}, not a CUDA device"
    if qweight.num_experts is not None:
        return "no CUDA kernel for expert-stacked weights yet"
    return _route(qweight, x)[1]


def _route(qweight, x: torch.Tensor) -> tuple[str | None, str | None]:
    """``("decode" | "gemm_sm90", None)``, or ``(None, reason)`` when no CUDA kernel runs the call."""
    cc = torch.cuda.get_device_capability(x.device)
    if cc not in _decode.DECODE_CCS:
        return None, f"the CUDA kernels are built for compute capabilities {_decode.DECODE_CCS}, not {cc}"
    reason = weight_unsupported(qweight, x)
    if reason is not None:
        return None, reason
    m = x.shape[0]
    gemm_reason = _gemm_sm90.gemm_unsupported(qweight, x, cc) if m > _gemm_sm90.GEMM_MIN_M else "M too small"
    if gemm_reason is None:
        return "gemm_sm90", None
    if m <= _decode.DECODE_MAX_M:
        return "decode", None
    return None, f"M={m} > {_decode.DECODE_MAX_M} needs the large-M GEMM, but {gemm_reason}"


def prepare(qweight) -> PreparedWeight:
    """``qweight`` in the CUDA kernels' fragment layout (``_layout``); computed once per weight object."""
    prep = _prepared.get(qweight)
    if prep is None:
        prep = _prepared[qweight] = prepare_weight(qweight)
    return prep


def linear(x: torch.Tensor, qweight, bias: torch.Tensor | None, act, out_dtype: torch.dtype) -> torch.Tensor:
    """``x [M, K] @ dequantize(qweight)^T + bias`` -> ``[M, N]`` of ``out_dtype`` (see :func:`supports`)."""
    if act is not None and act.format == "e2m1":  # before supports(), as below
        return fp4_gemm.linear(x, qweight, bias, act, out_dtype)
    if act is not None:  # before supports(): a pre-quantized x is a QuantizedActivation, not a tensor
        return fp8_gemm.linear(x, qweight, bias, act, out_dtype)
    reason = supports(qweight, act, x)
    if reason is not None:
        raise ValueError(f"humming CUDA backend: {reason}")
    if _route(qweight, x)[0] == "decode":
        return _decode.run_decode(prepare(qweight), x, bias, out_dtype)
    return _gemm_sm90.run_gemm(prepare(qweight), x, bias, out_dtype)


def warmup(
    layers,
    m_values=(1, 16, 64),
    act=None,
    act_dtype: torch.dtype = torch.bfloat16,
    out_dtype: torch.dtype | None = None,
    bias_dtype: torch.dtype | None = None,
    device: int | None = None,
    progress: bool = True,
    max_workers: int | None = None,
) -> WarmupReport:
    """Compile (in parallel) and load every kernel that ``layers`` need for the token counts ``m_values``.

    ``layers`` are ``QuantizedWeight`` objects on a CUDA device; ``act`` the activation scheme they run with
    (``None`` = WnA16); combinations with no CUDA kernel are skipped. The report holds each kernel's
    origin (``compiled`` = cold, ``disk``, ``memory``) and time.
    """
    from . import _driver
    from .jit import device_arch

    out_dtype = out_dtype or act_dtype
    device = torch.cuda.current_device() if device is None else device
    cc = torch.cuda.get_device_capability(device)
    jobs = []
    if act is not None:
        from humming.ir.activation import get_act_scheme

        act = get_act_scheme(act)
    for qw in layers:
        if act is not None and act.format == "e2m1":
            sm_count = torch.cuda.get_device_properties(device).multi_processor_count
            jobs += fp4_gemm.warmup_jobs(qw, act, m_values, out_dtype, bias_dtype, sm_count)
            continue
        if act is not None:
            jobs += fp8_gemm.warmup_jobs(qw, act, m_values, out_dtype, bias_dtype, fp8_gemm.device_limits(device))
            continue
        for m in m_values:
            x = torch.empty(m, qw.K, dtype=act_dtype, device=f"cuda:{device}")
            if supports(qw, None, x) is not None:
                continue
            prep = prepare(qw)
            bias = None if bias_dtype is None else torch.empty(0, dtype=bias_dtype)
            if _route(qw, x)[0] == "decode":
                tuning = _decode.default_tuning(m, qw.N, qw.K, qw.bits, device)
                spec = _decode.decode_call_spec(prep, x, bias, out_dtype, tuning)
            else:
                gemm_tuning = _gemm_sm90.default_gemm_tuning(m, prep.layout, _decode.device_limits(device)[1])
                spec = _gemm_sm90.gemm_call_spec(prep, x, bias, out_dtype, gemm_tuning)
            jobs.append((spec, device_arch(spec, cc)))
    report = warmup_specs(jobs, max_workers=max_workers, progress=progress)
    for compiled in report.kernels:
        _driver.load(compiled, device)
    return report
