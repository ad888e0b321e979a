"""humming's CUDA backend: hand-written kernels compiled at run time with NVRTC (``jit``).

Backend interface (``humming.dispatch.kernels``): :func:`is_available`, :func:`supports`,
:func:`linear`, and for expert-stacked (MoE) weights :func:`supports_grouped`, :func:`grouped_linear`.
Kernels:

- ``decode`` (``include/humming/decode.cuh``): weight-only GEMM for M <= 64, int4 / uint4 (+ zero points)
  / int8 / uint8 weights with per-tensor / per-channel / group scales (group size a multiple of 64), and
  MXFP4 (e2m1, e8m0 scales per 32); bfloat16 or float16 activations, compute capability 8.0 and newer.
- ``gemm_sm90`` (``include/humming/gemm_sm90.cuh``): the same weights for M > 32 on Hopper (sm_90a):
  TMA + mbarrier pipeline, producer / consumer warpgroups with setmaxnreg, wgmma with the dequantized
  weights as the register A operand; needs N % 128 == 0. Its grouped variant (the same kernel with a
  compile-time flag) runs ``humming.moe.grouped_linear``: token tiles of 16 to 256 rows (dividing
  ``block_m``), each reading its segment's expert id, skipping -1 segments, offsetting its weight tiles.
- fp8 activations with integer weights (per-token or per-tensor e4m3; int4 / uint4 / int8 / uint8): the
  Triton pass writes the e4m3 values in x's 16-bit dtype (exact) and ``decode`` / ``gemm_sm90`` run them
  with the activation scales in the epilogue (one 4-bit weight read and no int4 -> e4m3 conversion: the
  dispatcher's tables say at which M this beats ``fp8_gemm``).
- ``fp8_gemm`` (``include/humming/fp8_gemm_sm90.cuh``): quantized activations on Hopper: W8A8 e4m3 x e4m3
  (per-tensor / per-token x per-channel, 1x128 x 128x128 blocks) and W4A8 int4 x e4m3, on fp8 wgmma. Its
  grouped variant runs ``humming.moe.grouped_linear(act="fp8" | "fp8_g128")`` for e4m3 / int4 experts.
  W4A8 MXFP4 x e4m3 folds the e8m0 scales exactly (refusing weights whose scales span > 12 binades per
  128-K block).
- ``fp4_gemm`` (``include/humming/fp4_gemm_sm120.cuh``, ``fp4_gemm_sm100.cuh``): W4A4 NVFP4 / MXFP4 on
  sm_120a block-scaled ``mma.sync`` and on sm_100a ``tcgen05.mma`` (tensor memory); compiled and checked
  in CI, never run on hardware (BLACKWELL.md).

Each ``QuantizedWeight`` is re-tiled once into the fragment layout that every kernel here reads
(``_layout``; :func:`prepare`, cached per weight object). ``humming.warmup`` compiles the kernels a set
of layers needs ahead of time, so that CUDA graph capture never compiles (an unprepared kernel raises
``KernelNotReadyError`` during capture).
"""

from __future__ import annotations

import functools
import weakref

import torch

from .. import _install_check  # noqa: F401  (its import is the check; before ..device, which it guards)
from ..device import device_index, device_info
from . import _decode, _gemm_sm90, fp4_gemm, fp8_gemm
from ._layout import aligned_rows, prepare_weight, rows_aligned, weight_unsupported
from ._warmup import WarmupReport, warmup_specs
from .jit import KernelNotReadyError, compiler_unavailable_reason

__all__ = [
    "KernelNotReadyError",
    "WarmupReport",
    "grouped_linear",
    "is_available",
    "linear",
    "prepare",
    "supports",
    "supports_grouped",
    "warmup_jobs",
]

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


#: This backend's dense kernels in the order :func:`supports` / :func:`linear` try them when called directly;
#: ``humming.linear`` chooses among them (and the other backends' kernels) in ``humming.dispatch.plan``.
KERNELS = ("gemm_sm90", "decode", "fp8_gemm", "fp4_gemm")


def supports(qweight, act, x: torch.Tensor) -> str | None:
    """``None`` when a CUDA kernel runs ``linear(x, qweight, act=act)``, else the reasons each does not.

    ``x`` is the 2-D activation ``[M, K]`` (its dtype, device and M matter).
    """
    return _first_kernel(qweight, act, x)[1]


def _first_kernel(qweight, act, x) -> tuple[str | None, str | None]:
    reasons = []
    for name in KERNELS:
        reason = kernel_unsupported(name, qweight, act, x)
        if reason is None:
            return name, None
        reasons.append(f"{name}: {reason}")
    return None, "; ".join(reasons)


def wna8_weight_unsupported(qweight, act) -> str | None:
    """``None`` when the decode kernel and the sm_90a GEMM take ``act``'s e4m3 activations with this weight:
    per-token or per-tensor fp32 scales, integer weights (their e4m3 values are exact in x's 16-bit dtype,
    the scales go in the epilogue), else why not."""
    if act.format != "e4m3" or act.group not in ("token", "tensor") or act.global_scale:
        return f"the WnA16 kernels take fp8 activations as per-token or per-tensor e4m3 values, not act={act.name}"
    if act.scale_dtype != torch.float32:
        return f"the WnA16 kernels take float32 activation scales, not act={act.name}"
    if qweight.format.name not in ("int4", "uint4", "int8", "uint8"):  # MXFP4: the FP8 GEMM serves every M
        return f"the WnA16 route for fp8 activations takes integer weights, not {qweight.format.name}"
    if qweight.num_experts is not None:
        return "expert-stacked weights run through grouped_linear (humming.moe), not linear"
    return None


def kernel_unsupported(kernel: str, qweight, act, x) -> str | None:
    """``None`` when ``kernel`` (one of :data:`KERNELS`) runs ``linear(x, qweight, act=act)``, else why not.
    ``x``: the 2-D activation, or a ``QuantizedActivation``'s codes. Computed on each call: ``humming.linear``
    asks once per weight and call shape and keeps the answer in its plan (``humming.dispatch.plan``)."""
    if kernel == "fp8_gemm":
        if act is None or act.format == "e2m1":
            return "the FP8 GEMM takes 8-bit (fp8 / int8) activations"
        return fp8_gemm.supports(qweight, act, x)
    if kernel == "fp4_gemm":
        if act is None or act.format != "e2m1":
            return "the FP4 GEMM takes FP4 (nvfp4 / mxfp4) activations"
        return fp4_gemm.supports(qweight, act, x)
    if act is not None:
        reason = wna8_weight_unsupported(qweight, act)
        if reason:
            return reason
        if x.dtype not in (torch.bfloat16, torch.float16):
            return "fp8 activations reach the WnA16 kernels as bfloat16 / float16 x (not pre-quantized)"
    if x.device.type != "cuda":
        return f"x is on {x.device}, not a CUDA device"
    if qweight.num_experts is not None:
        return "expert-stacked weights run through grouped_linear (humming.moe), not linear"
    return _wnax_unsupported(kernel, qweight, x)


def _wnax_unsupported(kernel: str, qweight, x: torch.Tensor) -> str | None:
    cc = device_info(x.device).capability
    if cc not in _decode.DECODE_CCS:
        return f"the CUDA kernels are built for compute capabilities {_decode.DECODE_CCS}, not {cc}"
    if kernel == "decode":
        return _decode.decode_unsupported(qweight, x)
    reason = weight_unsupported(qweight, x)
    if reason is None and x.shape[0] <= _gemm_sm90.GEMM_MIN_M:
        reason = f"the sm_90a GEMM takes M > {_gemm_sm90.GEMM_MIN_M} (smaller M: the decode kernel)"
    return reason or _gemm_sm90.gemm_unsupported(qweight, x, cc)


def default_tuning(kernel: str, qweight, x: torch.Tensor):
    """The tuning ``kernel`` runs ``x [M, K]`` with (its pure heuristic of the problem and the device's
    limits), or ``None`` where the kernel picks it at launch (the FP8 / FP4 GEMMs)."""
    if kernel not in ("decode", "gemm_sm90"):
        return None
    prep, m, index = prepare(qweight), x.shape[0], device_index(x.device)
    if kernel == "decode":
        return _decode.default_tuning(m, prep.n, prep.k, prep.layout.bits, index)
    return _gemm_sm90.default_gemm_tuning(m, prep.n, prep.layout, device_info(index).limits)


#: Call shapes made ready per weight (a launcher each, :func:`run`), at most this many: then they start over.
_MAX_LAUNCHERS = 64
_launchers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # weight -> {call key: launcher}


def run(kernel: str, x, qweight, bias, act, out_dtype: torch.dtype, tuning=None) -> torch.Tensor:
    """``kernel`` (one of :data:`KERNELS`, checked by :func:`kernel_unsupported`) with ``tuning`` (``None``:
    its default). For fp8 ``act`` on decode / gemm_sm90, Triton first writes x's e4m3 values in x's 16-bit
    dtype (exact) and the kernel applies the per-token / per-tensor scales in its epilogue.

    Everything a call does not need its tensors' addresses for (checks, tuning, kernel, grid, parameter
    struct, descriptor encoders) is made once per weight and call shape: kernel, ``act``, x's dtype, shape,
    strides, alignment and device, the bias dtype, ``out_dtype`` and ``tuning``."""
    if kernel == "fp4_gemm":
        return fp4_gemm.linear(x, qweight, bias, act, out_dtype)
    if not isinstance(x, torch.Tensor):  # a QuantizedActivation, which the FP8 GEMM takes as it is
        return fp8_gemm.linear(x, qweight, bias, act, out_dtype)
    bias_dtype = None if bias is None else bias.dtype
    key = (kernel, act, x.dtype, x.shape, x.stride(), x.data_ptr() % 16 == 0, x.device, bias_dtype, out_dtype, tuning)
    launchers = _launchers.get(qweight)
    if launchers is None:
        launchers = _launchers[qweight] = {}
    launch = launchers.get(key)
    if launch is None:
        launch = _launcher(kernel, x, qweight, act, bias_dtype, out_dtype, tuning)
        if len(launchers) >= _MAX_LAUNCHERS:
            launchers.clear()
        launchers[key] = launch
    return launch(x, bias)


def _launcher(kernel: str, x: torch.Tensor, qweight, act, bias_dtype, out_dtype: torch.dtype, tuning):
    """A callable ``(x, bias) -> out`` for calls shaped as ``x`` (see :func:`run`)."""
    m, k = x.shape
    index = device_index(x.device)
    if kernel == "fp8_gemm":
        reason = fp8_gemm.supports(qweight, act, x, out_dtype)
        if reason is not None:
            raise ValueError(f"humming FP8 GEMM: {reason}")
        prep = fp8_gemm.prepare(qweight)
        if m:
            tuning = fp8_gemm.choose_tuning(m, prep.n, prep.k, device_info(index).limits, prep.w_format)
        return fp8_gemm.Fp8Launch(prep, act, x, bias_dtype, out_dtype, tuning, index)
    make = _decode.DecodeLaunch if kernel == "decode" else _gemm_sm90.GemmLaunch
    if act is not None:
        from ..triton_kernels.act_quant import quantize_pass

        # fp8 activations: their e4m3 values in x's 16-bit dtype (contiguous rows), the scales in the epilogue
        quantize = quantize_pass(x, act, values=True)
        launch = make(prepare(qweight), m, x.dtype, k, bias_dtype, out_dtype, tuning, index)

        def run_values(x, bias):
            values, scales, _ = quantize(x)
            return launch(values, bias, x_scale=scales)

        return run_values
    if not rows_aligned(x):  # a copy per call: contiguous rows
        launch = make(prepare(qweight), m, x.dtype, k, bias_dtype, out_dtype, tuning, index)
        return lambda x, bias: launch(aligned_rows(x), bias)
    return make(prepare(qweight), m, x.dtype, x.stride(0), bias_dtype, out_dtype, tuning, index)


def supports_grouped(qweight, act, x: torch.Tensor, block_m: int) -> str | None:
    """``None`` when a grouped sm_90a GEMM runs ``grouped_linear(x, qweight, ..., block_m, act=act)``, else
    why not: the WnA16 GEMM for ``act=None``, the FP8 GEMM for e4m3 activations. ``x`` is the grouped
    activation ``[M_pad, K]`` (its dtype, device and alignment matter)."""
    if act is not None:
        return fp8_gemm.grouped_unsupported(qweight, act, x, block_m)
    if x.device.type != "cuda":
        return f"x is on {x.device}, not a CUDA device"
    if qweight.num_experts is None:
        return "the grouped CUDA GEMM needs expert-stacked weights [E, N, K]"
    cc = device_info(x.device).capability
    return weight_unsupported(qweight, x) or _gemm_sm90.grouped_unsupported(qweight, x, block_m, cc)


def grouped_linear(
    x: torch.Tensor,
    qweight,
    expert_ids: torch.Tensor,
    block_m: int,
    bias: torch.Tensor | None,
    act,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """``x [M_pad, K]`` grouped by expert -> ``[M_pad, N]`` of ``out_dtype``: row ``r`` is ``x[r] @
    dequantize(qweight)[e]^T + bias[e]`` with ``e = expert_ids[r // block_m]`` (int32, ``M_pad // block_m``
    entries); segments whose id is -1 are skipped (their rows unspecified). Ids outside [-1, E) are not
    checked (that would need a host sync) and fault. ``bias`` is ``[E, N]`` or ``None``. With ``act``, ``x``
    may be a ``QuantizedActivation`` of that scheme (the FP8 GEMM then skips its quantization pass)."""
    codes = getattr(x, "codes", x)
    reason = supports_grouped(qweight, act, codes, block_m)
    if reason is not None:
        raise ValueError(f"humming CUDA backend: {reason}")
    m, e, n, device = codes.shape[0], qweight.num_experts, qweight.N, codes.device
    if m % block_m or expert_ids.shape != (m // block_m,):
        raise ValueError(f"expert_ids: expected shape ({m // block_m},) for M_pad={m}, block_m={block_m}")
    if expert_ids.dtype != torch.int32 or expert_ids.device != device:
        raise ValueError(f"expert_ids: expected int32 on {device}, got {expert_ids.dtype} on {expert_ids.device}")
    if bias is not None and (tuple(bias.shape) != (e, n) or bias.device != device):
        raise ValueError(f"bias: expected shape ({e}, {n}) on {device}, got {tuple(bias.shape)} on {bias.device}")
    bias = bias.contiguous() if bias is not None else None
    if act is not None:
        return fp8_gemm.run_grouped(fp8_gemm.prepare(qweight), x, act, expert_ids, block_m, bias, out_dtype)
    prep = prepare(qweight)
    return _gemm_sm90.run_grouped_gemm(prep, x, expert_ids.contiguous(), block_m, bias, out_dtype)


def prepare(qweight, act=None):
    """``qweight`` in the layout of the CUDA kernel that runs it with activation scheme ``act`` (``None``:
    the WnA16 fragment layout of ``_layout``; fp8 / int8 schemes: ``fp8_gemm``'s; FP4 schemes: ``fp4_gemm``'s
    for the weight's device); computed once per weight object."""
    if act is not None:
        from humming.ir.activation import get_act_scheme

        act = get_act_scheme(act)
        if wna8_weight_unsupported(qweight, act) is None:
            return prepare(qweight)
        if act.format == "e2m1":
            cc = device_info(qweight.device).capability
            if cc not in fp4_gemm.ARCHS:
                raise ValueError(f"act: no CUDA FP4 GEMM for compute capability {cc} (needs sm_100a / sm_120a)")
            return fp4_gemm.prepare(qweight, fp4_gemm.ARCHS[cc])
        return fp8_gemm.prepare(qweight)
    prep = _prepared.get(qweight)
    if prep is None:
        prep = _prepared[qweight] = prepare_weight(qweight)
    return prep


def linear(x: torch.Tensor, qweight, bias: torch.Tensor | None, act, out_dtype: torch.dtype) -> torch.Tensor:
    """``x [M, K] @ dequantize(qweight)^T + bias`` -> ``[M, N]`` of ``out_dtype`` on the first kernel of
    :data:`KERNELS` that runs it (see :func:`supports`)."""
    kernel, reason = _first_kernel(qweight, act, getattr(x, "codes", x))
    if kernel is None:
        raise ValueError(f"humming CUDA backend: {reason}")
    return run(kernel, x, qweight, bias, act, out_dtype)


def warmup_jobs(
    kernel: str,
    qw,
    act,
    m: int,
    *,
    act_dtype: torch.dtype,
    out_dtype: torch.dtype,
    bias_dtype: torch.dtype | None,
    device: int,
    block_m: int | None = None,
) -> list:
    """The ``(spec, arch)`` compile jobs of ``kernel`` for one call shape: ``m`` tokens of ``act_dtype`` (dense
    kernels), or ``m`` grouped rows in routing blocks of ``block_m`` (``kernel == "grouped"``). The dispatcher
    (``humming.warmup``) decides which kernel each call runs; this says what that kernel compiles. Also sets
    aside the stream-K workspace a decode kernel uses, since a CUDA graph capture cannot allocate it."""
    from .jit import device_arch

    info = device_info(device)
    if kernel == "fp4_gemm":
        return fp4_gemm.warmup_jobs(qw, act, (m,), out_dtype, bias_dtype, info.sm_count, info.capability)
    if kernel == "fp8_gemm":
        return fp8_gemm.warmup_jobs(qw, act, (m,), out_dtype, bias_dtype, info.limits)
    if kernel == "grouped" and act is not None:
        return fp8_gemm.grouped_warmup_jobs(qw, act, (m,), (block_m,), out_dtype, bias_dtype, info.limits)
    if kernel == "grouped":
        return _grouped_jobs(qw, (m,), (block_m,), act_dtype, out_dtype, bias_dtype, device, info.capability)
    x = torch.empty(m, qw.K, dtype=act_dtype, device=f"cuda:{device}")
    tuning = default_tuning(kernel, qw, x)
    bias = None if bias_dtype is None else torch.empty(0, dtype=bias_dtype)
    if kernel == "decode":
        spec = _decode.decode_call_spec(prepare(qw), x, bias, out_dtype, tuning)
        _decode.reserve_workspace(m, qw.N, tuning, device)
    else:
        spec = _gemm_sm90.gemm_call_spec(prepare(qw), x, bias, out_dtype, tuning)
    return [(spec, device_arch(spec, info.capability))]


def compile_and_load(jobs: list, device: int, progress: bool = True, max_workers: int | None = None) -> WarmupReport:
    """Compile ``jobs`` (``(spec, arch)``) in parallel and load them on CUDA device ``device``."""
    from . import _driver

    report = warmup_specs(jobs, max_workers=max_workers, progress=progress)
    for compiled in report.kernels:
        _driver.load(compiled, device)
    return report


def _grouped_jobs(qw, m_values, block_ms, act_dtype, out_dtype, bias_dtype, device, cc) -> list:
    """The ``(spec, arch)`` of the grouped GEMM for each ``block_m`` and grouped row count ``m``."""
    from .jit import device_arch

    jobs = []
    bias = None if bias_dtype is None else torch.empty(0, dtype=bias_dtype)
    for block_m in block_ms:
        x = torch.empty(block_m, qw.K, dtype=act_dtype, device=f"cuda:{device}")
        if supports_grouped(qw, None, x, block_m) is not None:
            continue
        prep = prepare(qw)
        smem = _decode.device_limits(device)[1]
        for m in m_values:
            tuning = _gemm_sm90.default_grouped_tuning(block_m, m, qw.num_experts, prep.layout, smem)
            spec = _gemm_sm90.gemm_call_spec(prep, x, bias, out_dtype, tuning, grouped=True)
            jobs.append((spec, device_arch(spec, cc)))
    return jobs
