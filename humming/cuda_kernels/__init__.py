"""humming's CUDA backend: hand-written kernels compiled at run time with NVRTC (``jit``).

Backend interface (``humming.dispatch.backends``): :func:`is_available`, :func:`supports`,
:func:`linear`, and for expert-stacked (MoE) weights :func:`supports_grouped`, :func:`grouped_linear`.
Kernels today:

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
  with the activation scales in the epilogue (faster on the H200 than the FP8 GEMM's int4 -> e4m3 path:
  bench/results/h200/README.md, session 4); shapes they do not take go to ``fp8_gemm``.
- ``fp8_gemm`` (``include/humming/fp8_gemm_sm90.cuh``): quantized activations on Hopper: W8A8 e4m3 x e4m3
  (per-tensor / per-token x per-channel, 1x128 x 128x128 blocks) and W4A8 int4 x e4m3, on fp8 wgmma. Its
  grouped variant runs ``humming.moe.grouped_linear(act="fp8" | "fp8_g128")`` for e4m3 / int4 experts.
  W4A8 MXFP4 x e4m3 folds the e8m0 scales exactly (refusing weights whose scales span > 12 binades per
  128-K block).
- ``fp4_gemm`` (``include/humming/fp4_gemm_sm120.cuh``, ``fp4_gemm_sm100.cuh``): W4A4 NVFP4 / MXFP4 on
  sm_120a block-scaled ``mma.sync`` and on sm_100a ``tcgen05.mma`` (tensor memory); compiled and checked
  in CI, never run on hardware (BLACKWELL.md).

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
from ._layout import prepare_weight, weight_unsupported
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
    "warmup",
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


def supports(qweight, act, x: torch.Tensor) -> str | None:
    """``None`` when a CUDA kernel runs ``linear(x, qweight, act=act)``, else the reason it does not.

    ``x`` is the 2-D activation ``[M, K]`` (its dtype, device and M matter).
    """
    if act is not None and act.format == "e2m1":
        return fp4_gemm.supports(qweight, act, x)
    if act is not None:
        return None if _wna8_unsupported(qweight, act, x) is None else fp8_gemm.supports(qweight, act, x)
    if x.device.type != "cuda":
        return f"x is on {x.device}, not a CUDA device"
    if qweight.num_experts is not None:
        return "expert-stacked weights run through grouped_linear (humming.moe), not linear"
    return _route(qweight, x)[1]


_routes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # weight -> {call key: route}


def _route(qweight, x: torch.Tensor) -> tuple[str | None, str | None]:
    """``("decode" | "gemm_sm90", None)``, or ``(None, reason)`` when no CUDA kernel runs the call.

    Computed once per weight and call shape (everything it reads of ``x``: dtype, device, M, row
    alignment) and then looked up: supports() and linear() both ask, on every call of a microsecond kernel.
    """
    key = (x.dtype, x.device, x.shape[0], x.stride(0) % 8 == 0 and x.data_ptr() % 16 == 0)
    routes = _routes.get(qweight)
    if routes is None:
        routes = _routes[qweight] = {}
    route = routes.get(key)
    if route is None:
        route = routes[key] = _compute_route(qweight, x)
    return route


def _compute_route(qweight, x: torch.Tensor) -> tuple[str | None, str | None]:
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


def _wna8_weight_unsupported(qweight, act) -> str | None:
    """The weight and scheme checks of :func:`_wna8_unsupported`."""
    if act.format != "e4m3" or act.group not in ("token", "tensor") or act.global_scale:
        return f"the WnA16 kernels take fp8 activations as per-token or per-tensor e4m3 values, not act={act.name}"
    if act.scale_dtype != torch.float32:
        return f"the WnA16 kernels take float32 activation scales, not act={act.name}"
    if qweight.format.name not in ("int4", "uint4", "int8", "uint8"):  # MXFP4: the FP8 GEMM serves every M
        return f"the WnA16 route for fp8 activations takes integer weights, not {qweight.format.name}"
    if qweight.num_experts is not None:
        return "expert-stacked weights run through grouped_linear (humming.moe), not linear"
    return None


def _wna8_unsupported(qweight, act, x) -> str | None:
    """:func:`_wna8_route`'s reason."""
    return _wna8_route(qweight, act, x)[1]


def _wna8_route(qweight, act, x) -> tuple[str | None, str | None]:
    """``(kernel, None)`` when ``linear(x, qweight, act=act)`` with e4m3 activations runs through the WnA16 kernels
    (decode, sm_90a GEMM) on the activations' e4m3 values, held exactly in x's 16-bit dtype, with the
    activation scales applied in the epilogue. On the H200 that beats the FP8 GEMM's int4 -> e4m3 path
    (bench/results/h200: W4A16 decode 41.8 us vs W4A8 81 us at 28672 x 8192, M = 1; 619 vs 728 us at
    M = 1024) and computes the same products exactly in fp32; else ``(None, reason)``. ``x``: a 16-bit
    float tensor (its values tensor has the same dtype, M and a contiguous layout)."""
    reason = _wna8_weight_unsupported(qweight, act)
    if reason is not None:
        return None, reason
    if not isinstance(x, torch.Tensor) or x.dtype not in (torch.bfloat16, torch.float16) or x.device.type != "cuda":
        return None, "the WnA16 route for fp8 activations takes a bfloat16 / float16 CUDA x (not pre-quantized)"
    return _route(qweight, x)


def _linear_wna8(kernel: str, x: torch.Tensor, qweight, bias, act, out_dtype: torch.dtype) -> torch.Tensor:
    """:func:`_wna8_route`'s ``kernel``: quantize ``x`` to e4m3 values (Triton), then decode / GEMM with the
    per-token or per-tensor scales in the epilogue."""
    from ..triton_kernels.act_quant import quantize_activation_values

    values, scales = quantize_activation_values(x, act)
    if kernel == "decode":
        return _decode.run_decode(prepare(qweight), values, bias, out_dtype, x_scale=scales)
    return _gemm_sm90.run_gemm(prepare(qweight), values, bias, out_dtype, x_scale=scales)


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
    cc = torch.cuda.get_device_capability(x.device)
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
    checked (that would need a host sync) and fault. ``bias`` is ``[E, N]`` or ``None``."""
    reason = supports_grouped(qweight, act, x, block_m)
    if reason is not None:
        raise ValueError(f"humming CUDA backend: {reason}")
    m, e, n = x.shape[0], qweight.num_experts, qweight.N
    if m % block_m or expert_ids.shape != (m // block_m,):
        raise ValueError(f"expert_ids: expected shape ({m // block_m},) for M_pad={m}, block_m={block_m}")
    if expert_ids.dtype != torch.int32 or expert_ids.device != x.device:
        raise ValueError(f"expert_ids: expected int32 on {x.device}, got {expert_ids.dtype} on {expert_ids.device}")
    if bias is not None and (tuple(bias.shape) != (e, n) or bias.device != x.device):
        raise ValueError(f"bias: expected shape ({e}, {n}) on {x.device}, got {tuple(bias.shape)} on {bias.device}")
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
        if _wna8_weight_unsupported(qweight, act) is None:
            return prepare(qweight)
        if act.format == "e2m1":
            cc = torch.cuda.get_device_capability(qweight.device)
            if cc not in fp4_gemm.ARCHS:
                raise ValueError(f"act: no CUDA FP4 GEMM for compute capability {cc} (needs sm_100a / sm_120a)")
            return fp4_gemm.prepare(qweight, fp4_gemm.ARCHS[cc])
        return fp8_gemm.prepare(qweight)
    prep = _prepared.get(qweight)
    if prep is None:
        prep = _prepared[qweight] = prepare_weight(qweight)
    return prep


def linear(x: torch.Tensor, qweight, bias: torch.Tensor | None, act, out_dtype: torch.dtype) -> torch.Tensor:
    """``x [M, K] @ dequantize(qweight)^T + bias`` -> ``[M, N]`` of ``out_dtype`` (see :func:`supports`)."""
    if act is not None and act.format == "e2m1":  # before supports(), as below
        return fp4_gemm.linear(x, qweight, bias, act, out_dtype)
    if act is not None:  # before supports(): a pre-quantized x is a QuantizedActivation, not a tensor
        kernel = _wna8_route(qweight, act, x)[0]
        if kernel is not None:
            return _linear_wna8(kernel, x, qweight, bias, act, out_dtype)
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
    block_ms: tuple[int, ...] = (16, 32, 64, 128),
) -> WarmupReport:
    """Compile (in parallel) and load every kernel that ``layers`` need for the token counts ``m_values``.

    ``layers`` are ``QuantizedWeight`` objects on a CUDA device; ``act`` the activation scheme they run with
    (``None`` = WnA16); combinations with no CUDA kernel are skipped. Expert-stacked layers get the grouped
    kernels of ``grouped_linear`` (WnA16, or FP8 with an e4m3 ``act``) for each ``block_m`` of ``block_ms``,
    with ``m_values`` read as grouped row counts (``M_pad`` of ``humming.moe.moe_align``). The report holds
    each kernel's origin (``compiled`` = cold, ``disk``, ``memory``) and time.
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
        if act is not None and qw.num_experts is not None:
            limits = fp8_gemm.device_limits(device)
            jobs += fp8_gemm.grouped_warmup_jobs(qw, act, m_values, block_ms, out_dtype, bias_dtype, limits)
            continue
        if act is not None and _wna8_weight_unsupported(qw, act) is not None:
            jobs += fp8_gemm.warmup_jobs(qw, act, m_values, out_dtype, bias_dtype, fp8_gemm.device_limits(device))
            continue
        if qw.num_experts is not None:
            jobs += _grouped_jobs(qw, m_values, block_ms, act_dtype, out_dtype, bias_dtype, device, cc)
            continue
        for m in m_values:  # WnA16, and fp8 activations through the WnA16 kernels (the same kernels)
            x = torch.empty(m, qw.K, dtype=act_dtype, device=f"cuda:{device}")
            if act is not None and _wna8_unsupported(qw, act, x) is not None:
                limits = fp8_gemm.device_limits(device)
                jobs += fp8_gemm.warmup_jobs(qw, act, (m,), out_dtype, bias_dtype, limits)
                continue
            if act is None and supports(qw, None, x) is not None:
                continue
            prep = prepare(qw)
            bias = None if bias_dtype is None else torch.empty(0, dtype=bias_dtype)
            if _route(qw, x)[0] == "decode":
                tuning = _decode.default_tuning(m, qw.N, qw.K, qw.bits, device)
                spec = _decode.decode_call_spec(prep, x, bias, out_dtype, tuning)
                _decode.reserve_workspace(m, qw.N, tuning, device)  # stream-K: capture cannot allocate
            else:
                gemm_tuning = _gemm_sm90.default_gemm_tuning(m, prep.layout, _decode.device_limits(device)[1])
                spec = _gemm_sm90.gemm_call_spec(prep, x, bias, out_dtype, gemm_tuning)
            jobs.append((spec, device_arch(spec, cc)))
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
