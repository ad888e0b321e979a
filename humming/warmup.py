"""``humming.warmup``: compile ahead of time every kernel the dispatcher would pick for a set of layers.

For each layer and token count it asks the one decision (:mod:`humming.dispatch.plan`) which kernel runs,
then makes that kernel ready: CUDA kernels compile through NVRTC in parallel (and load), then every call runs
once on random inputs, which compiles its Triton kernels (the kernel itself, or the activation quantization
pass before a CUDA GEMM) and builds its cached launcher. A fused MoE layer (:class:`humming.moe.MoeCall`)
lists its launches (:meth:`~humming.moe.MoeCall.launches`: routing, the two grouped GEMMs, the activation
pass, the combine): the CUDA GEMMs (each in the variant the call launches: gathering, gated), their CUDA
activation passes and the CUDA combine among them compile with the rest, then the whole call runs once per
token count, which readies its Triton kernels with the launch keys of that shape. Serving, and CUDA graph
capture, then never compile.
"""

from __future__ import annotations

import operator

import torch

from .dispatch.kernels import DENSE_KERNELS, GROUPED_KERNELS, backend_module
from .dispatch.plan import plan_grouped, plan_linear
from .ir.activation import get_act_scheme
from .ir.dtypes import FLOAT_DTYPES, HALF_DTYPES
from .ir.weight import QuantizedWeight
from .linear import activation_pass, activation_pass_jobs
from .moe.call import MoeCall
from .reference.moe_layer import Activation

__all__ = ["warmup"]


def warmup(
    layers,
    m_values=(1, 16, 64),
    act=None,
    *,
    act_dtype: torch.dtype = torch.bfloat16,
    out_dtype: torch.dtype | None = None,
    bias_dtype: torch.dtype | None = None,
    block_ms: tuple[int, ...] = (16, 32, 64, 128),
    backend: str = "auto",
    progress: bool = True,
    max_workers: int | None = None,
    keep_codes: bool = True,
):
    """Make ready every kernel ``humming.linear`` (dense layers), ``humming.moe.grouped_linear``
    (expert-stacked layers, once per routing ``block_m`` of ``block_ms``, ``m_values`` read as grouped row
    counts) or ``humming.moe.fused_moe`` (:class:`humming.moe.MoeCall` layers, ``m_values`` read as token
    counts: routing, grouped GEMMs, activation pass, combine) would run for these layers at the token counts
    ``m_values``.

    Args:
        layers: ``QuantizedWeight`` and ``MoeCall`` objects (``FusedMoE.moe_call()``,
            ``QuantizedExperts.moe_call(top_k)``) on one CUDA device.
        act: the activation scheme the weights run with (``None``: 16-bit activations); an ``MoeCall``
            holds its own.
        act_dtype, out_dtype, bias_dtype: what the calls will pass (kernels are specialised on them); an
            ``MoeCall`` runs on ``act_dtype`` activations (its outputs too) with its weights' biases, and
            routes router logits of float32 and of ``act_dtype``.
        keep_codes: ``False`` frees each weight's IR codes once the CUDA layout prepared from them holds them,
            where every kernel planned for these token counts reads that layout (the WnA16 fragment layout:
            the decode, sm_90a and grouped kernels): a served int4 / MXFP4 weight then takes its memory once.
            The codes are rebuilt from the layout whenever something reads ``qweight``
            (:meth:`~humming.ir.QuantizedWeight.release_codes`).
    Returns:
        The CUDA kernels' :class:`~humming.cuda_kernels.WarmupReport` (origin and seconds of each), or
        ``None`` when no CUDA kernel is involved.
    """
    if not isinstance(keep_codes, bool):
        raise TypeError(f"keep_codes: expected a bool, got {keep_codes!r}")
    if isinstance(layers, QuantizedWeight | MoeCall) or not hasattr(layers, "__iter__"):
        raise TypeError(f"layers: expected an iterable of QuantizedWeight or MoeCall, got {type(layers).__name__}")
    layers = list(layers)
    for i, layer in enumerate(layers):
        if not isinstance(layer, QuantizedWeight | MoeCall):
            raise TypeError(f"layers[{i}]: expected a QuantizedWeight or an MoeCall, got {type(layer).__name__}")
        if _device(layer).type != "cuda":
            raise ValueError(f"layers[{i}]: is on {_device(layer)}; warmup compiles kernels for weights on a GPU")
    devices = {_device(layer) for layer in layers}
    if len(devices) > 1:
        raise ValueError(f"layers: expected weights on one CUDA device, got {sorted(map(str, devices))}")
    m_values = _counts("m_values", m_values)
    block_ms = _counts("block_ms", block_ms)
    if any(bm % 8 for bm in block_ms):
        raise ValueError(f"block_ms: expected multiples of 8 (routing blocks, as moe.grouped_linear), got {block_ms}")
    if act_dtype not in HALF_DTYPES:
        raise ValueError(f"act_dtype: expected float16 or bfloat16, got {act_dtype}")
    if out_dtype not in (None, *FLOAT_DTYPES):
        raise ValueError(f"out_dtype: expected None, float16, bfloat16 or float32, got {out_dtype}")
    if bias_dtype not in (None, *FLOAT_DTYPES):
        raise ValueError(f"bias_dtype: expected None, float16, bfloat16 or float32, got {bias_dtype}")
    if backend != "auto":
        backend_module(backend)  # an unknown name is an error before any layer is looked at
    if max_workers is not None and (
        not isinstance(max_workers, int) or isinstance(max_workers, bool) or max_workers < 1
    ):
        raise ValueError(f"max_workers: expected None or a positive int, got {max_workers!r}")
    act = None if act is None else get_act_scheme(act)
    out_dtype = out_dtype or act_dtype
    if not layers:
        return None
    device = next(iter(devices))
    cuda_jobs, runs = [], []
    planned: dict[QuantizedWeight, set[str]] = {}  # weight -> the backends of the kernels planned for it
    calls = [layer for layer in layers if isinstance(layer, MoeCall)]
    for qw in (layer for layer in layers if isinstance(layer, QuantizedWeight)):
        for m in m_values:
            for block_m in block_ms if qw.num_experts is not None else (None,):
                jobs, run, planned_backend = _plan_call(
                    qw, act, m, block_m, act_dtype, out_dtype, bias_dtype, backend, device
                )
                cuda_jobs += jobs
                runs.append(run)
                planned.setdefault(qw, set()).add(planned_backend)
    for call in calls:
        for m in m_values:
            cuda_jobs += _moe_cuda_jobs(call, m, act_dtype, device)
            for launch in call.launches(m, act_dtype):
                if launch.step in ("w13", "w2"):
                    weight = call.w13 if launch.step == "w13" else call.w2
                    planned.setdefault(weight, set()).add(GROUPED_KERNELS.backend(launch.kernel))
    report = None
    if cuda_jobs:
        from . import cuda_kernels
        from .device import device_index

        report = cuda_kernels.compile_and_load(cuda_jobs, device_index(device), progress, max_workers)
    for run in runs:
        run()
    for call in calls:
        for m in m_values:
            call.run(m, act_dtype)
            if call.routing is not None and act_dtype != torch.float32:
                call.route(m, act_dtype)
    if not keep_codes:
        _release_codes(planned)
    return report


def _release_codes(planned: dict) -> None:
    """``keep_codes=False``: free the IR codes of each weight whose planned kernels are all CUDA kernels, where
    a prepared layout holds them (:func:`humming.cuda_kernels.release_codes`). A weight that some planned
    kernel reads the IR codes of on every call (Triton, the reference) keeps them."""
    from . import cuda_kernels

    for qw, backends in planned.items():
        if backends == {"cuda"}:
            cuda_kernels.release_codes(qw)


def _device(layer) -> torch.device:
    return layer.w13.device if isinstance(layer, MoeCall) else layer.device


def _moe_cuda_jobs(call: MoeCall, m: int, act_dtype, device) -> list:
    """The CUDA compile jobs of the grouped GEMMs, their activation passes and the combine a fused_moe call at
    ``m`` tokens launches (what the call's own run would otherwise compile one at a time): each GEMM's variant
    as the call runs it, w13 gathering the tokens where its kernel does and with the gated activation in its
    epilogue where no activation pass follows it (:class:`~humming.moe.MoeLaunch`)."""
    from .cuda_kernels import act_quant, moe_combine
    from .device import device_index

    block_m, m_pad = call.grouped_shape(m, act_dtype)
    act = None if call.act is None else get_act_scheme(call.act)
    launches = call.launches(m, act_dtype)
    gated = None
    if all(launch.step != "activation" for launch in launches):
        gated = Activation(call.activation, call.alpha, call.limit, call.gate_up_layout)
    index = device_index(device)
    jobs = []
    for launch in launches:
        if launch.step in ("w13", "w2") and launch.kernel.startswith("cuda."):
            first = launch.step == "w13"
            qw, kernel = call.w13 if first else call.w2, GROUPED_KERNELS[launch.kernel]
            jobs += kernel.warmup_jobs(
                qw,
                act,
                m_pad,
                act_dtype=act_dtype,
                out_dtype=act_dtype,
                bias_dtype=None if qw.bias is None else qw.bias.dtype,
                device=index,
                block_m=block_m,
                gather=first and kernel.gathers(qw, act, m, m_pad),
                gated=gated if first else None,
            )
        elif launch.kernel == "cuda.act_quant":  # the CUDA pass quantizing the grouped rows the FP8 GEMM reads
            qw = call.w13 if launch.step == "w13 input" else call.w2
            jobs += act_quant.warmup_jobs(torch.empty(m_pad, qw.K, dtype=act_dtype, device=device), act)
        elif launch.kernel == "cuda.moe_combine":  # rows and output of act_dtype, the routing's float32 weights
            jobs += moe_combine.warmup_jobs(act_dtype, torch.float32, act_dtype, index)
    return jobs


def _counts(name: str, values) -> tuple[int, ...]:
    """``values`` (an iterable of positive integers) as a tuple of ints; a string, a float (1.5 is not a
    token count) or a bool is an error."""
    if isinstance(values, str) or not hasattr(values, "__iter__"):
        raise TypeError(f"{name}: expected an iterable of positive ints, got {values!r}")
    values = tuple(values)
    try:
        if any(isinstance(v, bool) for v in values):
            raise TypeError
        counts = tuple(operator.index(v) for v in values)
    except TypeError:
        raise TypeError(f"{name}: expected an iterable of positive ints, got {values!r}") from None
    if not counts or any(v < 1 for v in counts):
        raise ValueError(f"{name}: expected positive ints, got {counts}")
    return counts


def _plan_call(qw, act, m, block_m, act_dtype, out_dtype, bias_dtype, backend, device):
    """The CUDA compile jobs of the kernel planned for this call, a callable that runs the call once through
    that plan once the jobs are loaded (a no-op for the reference, which compiles nothing), and the planned
    kernel's backend."""
    rows = m if block_m is None else -(-m // block_m) * block_m
    x = torch.randn(rows, qw.K, dtype=act_dtype, device=device)
    grouped = block_m is not None
    plan = plan_grouped(qw, act, x, block_m, backend) if grouped else plan_linear(qw, act, x, backend)
    kernel = (GROUPED_KERNELS if grouped else DENSE_KERNELS)[plan.kernel]

    def run():  # its inputs made when it runs: many layers' calls are planned before any runs
        x = torch.randn(rows, qw.K, dtype=act_dtype, device=device)
        bias_shape = (qw.num_experts, qw.N) if grouped else (qw.N,)
        bias = None if bias_dtype is None else torch.randn(bias_shape, dtype=bias_dtype, device=device)
        if grouped:
            ids = torch.zeros(rows // block_m, dtype=torch.int32, device=device)
            kernel.run(x, qw, ids, block_m, bias, act, out_dtype, plan.tuning)
            # and reading token rows through an index (fused_moe's w13): another specialisation, which a call of
            # few tokens spread over these grouped rows takes
            if kernel.gathers(qw, act, 1, rows):
                index = torch.arange(rows, dtype=torch.int32, device=device)
                kernel.run(x, qw, ids, block_m, bias, act, out_dtype, plan.tuning, rows=index)
        elif kernel.pass_launcher is not None and act is not None:  # the activation pass humming.linear picks
            quantize = activation_pass(x, act, backend)
            kernel.pass_launcher(quantize, x, qw, act, bias_dtype, out_dtype, plan.tuning)(x, bias)
        else:
            kernel.run(x, qw, bias, act, out_dtype, plan.tuning)

    if plan.backend == "reference":  # nothing to compile
        return [], lambda: None, plan.backend
    from .device import device_index

    options = dict(act_dtype=act_dtype, out_dtype=out_dtype, bias_dtype=bias_dtype, block_m=block_m)
    jobs = kernel.warmup_jobs(qw, act, rows, device=device_index(device), **options)
    if not grouped and kernel.pass_launcher is not None and act is not None:
        jobs = [*jobs, *activation_pass_jobs(x, act, backend)]
    elif grouped and plan.backend == "cuda" and act is not None:  # run's 16-bit rows, which the FP8 GEMM quantizes
        from .cuda_kernels import fp8_gemm

        jobs = [*jobs, *fp8_gemm.pass_warmup_jobs(qw, act, x)]
    return jobs, run, plan.backend
