"""``humming.linear``: the one entry point for quantized dense layers."""

from __future__ import annotations

import importlib
import weakref
from functools import partial

import torch

from . import ops
from ._env import env
from .cuda_kernels.jit import KernelNotReadyError
from .deterministic import is_deterministic
from .dispatch.kernels import DENSE_KERNELS
from .dispatch.plan import plan_linear, requested_backend, unwarmed_error
from .dispatch.support import combination_error
from .ir.activation import ActScheme, QuantizedActivation, get_act_scheme
from .ir.dtypes import FLOAT_DTYPES
from .ir.weight import QuantizedWeight

__all__ = ["linear"]


def linear(
    x: torch.Tensor | QuantizedActivation,
    qweight: QuantizedWeight,
    bias: torch.Tensor | None = None,
    *,
    act: str | ActScheme | None = None,
    out_dtype: torch.dtype | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """``y = x @ W^T + bias`` with ``W = humming.dequantize(qweight)``.

    Args:
        x: ``[..., K]`` float16 / bfloat16 (float32 on the reference backend), last dim contiguous; or a
            :class:`~humming.ir.activation.QuantizedActivation` ``[M, K]`` quantized beforehand.
        qweight: a 2-D :class:`QuantizedWeight` ``[N, K]``.
        bias: ``[N]``; defaults to ``qweight.bias``.
        act: activation quantization scheme (``"fp8"``, ``"int8"``, ``"nvfp4"``... see
            ``humming.ACT_SCHEMES``); ``None`` keeps activations in 16 bits (WnA16). With an act-order
            weight, ``x`` is quantized in the weight's group order (:mod:`humming.ir.act_order`).
        out_dtype: float16, bfloat16 or float32; defaults to ``x``'s dtype (bfloat16 for quantized x).
        backend: ``"auto"``, ``"reference"``, ``"triton"`` or ``"cuda"``; the ``HUMMING_BACKEND``
            environment variable replaces ``"auto"``. On CPU tensors ``"auto"`` runs the reference.
    Returns:
        ``[..., N]`` in ``out_dtype``.
    """
    if not isinstance(qweight, QuantizedWeight):
        raise ValueError(f"qweight: expected a humming.QuantizedWeight, got {type(qweight).__name__}")
    if bias is None:
        bias = qweight.bias
    if type(x) is torch.Tensor and not torch.compiler.is_compiling():
        call = _prepared_call(x, qweight, bias, act, out_dtype, backend)
        return call(x, bias)
    x2d, act, bias, out_dtype = _checked(x, qweight, bias, act, out_dtype)
    prequantized = isinstance(x, QuantizedActivation)
    x_data = x.codes if prequantized else x
    if ops.eager(x_data):
        out = run_linear(x2d, qweight, bias, act, out_dtype, backend)
    elif not torch.compiler.is_exporting():
        site = ops.bind(qweight, act, out_dtype, backend)
        scales = (x.scales, x.global_scale) if prequantized else (None, None)
        own_bias = bias is qweight.bias
        out = torch.ops.humming.linear_bound(x_data if prequantized else x2d, *scales, None if own_bias else bias, site)
    else:
        out = torch.ops.humming.linear(
            x_data if prequantized else x2d,
            x.scales if prequantized else None,
            x.global_scale if prequantized else None,
            *ops.weight_args(qweight),
            bias,
            ops.act_name(act),
            out_dtype,
            backend,
        )
    lead = x_data.shape[:-1]
    return out if len(lead) == 1 else out.reshape(*lead, qweight.N)


def _checked(x, qweight: QuantizedWeight, bias, act, out_dtype):
    """``(x2d, act, bias, out_dtype)`` of a linear call, every argument checked (the Python entry point's and
    the custom op's, which may be called directly): ``x`` as ``[M, K]`` (or the QuantizedActivation), the
    ActScheme or None, a contiguous bias or None, the output dtype."""
    if len(qweight.shape) != 2:
        raise ValueError(f"qweight: linear takes a 2-D weight [N, K], got an expert-stacked weight {qweight.shape}")
    n, k = qweight.shape

    prequantized = isinstance(x, QuantizedActivation)
    if prequantized:
        act = x.checked_scheme(act)
        x_data = x.codes
    elif isinstance(x, torch.Tensor):
        if x.dtype not in FLOAT_DTYPES:
            raise ValueError(f"x: expected dtype float16, bfloat16 or float32, got {x.dtype}")
        if x.dim() < 1:
            raise ValueError("x: expected rank >= 1 ([..., K]), got a 0-d tensor")
        if x.shape[-1] and x.stride(-1) != 1:
            raise ValueError(f"x: the last dimension must be contiguous (stride 1), got strides {tuple(x.stride())}")
        act = None if act is None else get_act_scheme(act)
        x_data = x
    else:
        raise ValueError(f"x: expected a torch.Tensor or QuantizedActivation, got {type(x).__name__}")

    if x_data.shape[-1] != k:
        raise ValueError(f"x: last dimension is {x_data.shape[-1]}, but qweight has K={k} (shape {qweight.shape})")
    if x_data.device != qweight.device:
        raise ValueError(f"x is on {x_data.device} but qweight is on {qweight.device}; move one with .to()")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (n,) or not bias.is_floating_point():
            raise ValueError(f"bias: expected a float tensor of shape ({n},), got {getattr(bias, 'shape', bias)!r}")
        if bias.device != qweight.device:
            raise ValueError(f"bias is on {bias.device} but qweight is on {qweight.device}")
        bias = bias.contiguous()  # every kernel reads bias[n] at n; a strided view gave wrong sums
    if out_dtype is None:
        out_dtype = torch.bfloat16 if prequantized else x.dtype
    if out_dtype not in FLOAT_DTYPES:
        raise ValueError(f"out_dtype: expected float16, bfloat16 or float32, got {out_dtype}")
    reason = combination_error(qweight.format, act)
    if reason:
        raise ValueError(reason)

    x2d = x if prequantized or x.dim() == 2 else x.reshape(-1, k)
    return x2d, act, bias, out_dtype


#: Prepared calls kept per weight (held weakly: they go with it), at most this many: then they start over.
_MAX_CALLS = 64
_calls: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # weight -> {call key: prepared call}


def _prepared_call(x: torch.Tensor, qweight: QuantizedWeight, bias, act, out_dtype, backend: str):
    """The callable ``(x, bias) -> out`` that runs ``linear(x, qweight, bias, act=act, out_dtype=out_dtype,
    backend=backend)`` (``bias`` as the call passes it: the weight's own already in) for a 16-bit ``x``,
    found in one lookup per weight and kind of call: ``x``'s dtype, shape, strides, 16-byte alignment and
    device, the bias's dtype, shape, strides and device, ``act``, ``out_dtype``, the backend it resolves to and
    the deterministic mode. Everything that depends only on those (argument checks, the plan, the kernel's
    launcher) is done when a kind of call is first seen; a kind the checks refuse raises, and is not kept."""
    if bias is None:
        bias_key = None
    elif type(bias) is torch.Tensor:
        bias_key = (bias.dtype, bias.shape, bias.stride(), bias.device)
    else:
        bias_key = bias  # not a tensor: the checks name it
    requested = env("HUMMING_BACKEND") if backend == "auto" else backend
    if out_dtype is None:  # x's dtype: the op's calls (which name it) and linear's share an entry
        out_dtype = x.dtype
    key = (x.dtype, x.shape, x.stride(), x.data_ptr() % 16 == 0, x.device, bias_key, act, out_dtype, requested)
    key += (is_deterministic(),)
    calls = _calls.get(qweight)
    try:
        call = None if calls is None else calls.get(key)
    except TypeError:  # an unhashable argument: the checks name it
        call = key = None
    if call is None:
        call = _make_call(x, qweight, bias, act, out_dtype, backend)
        if key is not None and x.numel():
            if calls is None:
                calls = _calls[qweight] = {}
            if len(calls) >= _MAX_CALLS:
                calls.clear()
            calls[key] = call
    return call


def activation_pass(x2d: torch.Tensor, act: ActScheme, backend: str):
    """The activation quantization pass of a kernel that takes one (``Kernel.pass_launcher``), for 16-bit ``x2d``
    with scheme ``act``: the CUDA pass where it applies (the Triton pass's bits, a packed launch), unless the
    Triton backend is asked for; else the Triton pass."""
    triton = requested_backend(backend) == "triton"
    module = "humming.triton_kernels.act_quant" if triton else "humming.cuda_kernels.act_quant"
    return importlib.import_module(module).quantize_pass(x2d, act)


def activation_pass_jobs(x2d: torch.Tensor, act: ActScheme, backend: str) -> list:
    """The NVRTC jobs of :func:`activation_pass`'s pass for calls shaped as ``x2d`` (``humming.warmup`` compiles
    them with the kernels' own, in parallel); none for Triton's pass."""
    if requested_backend(backend) == "triton":
        return []
    return importlib.import_module("humming.cuda_kernels.act_quant").warmup_jobs(x2d, act)


def _make_call(x: torch.Tensor, qweight: QuantizedWeight, bias, act, out_dtype, backend: str):
    """The prepared call of :func:`_prepared_call` for calls like this one (which it checks). It holds the
    weight weakly (it is kept in a dictionary keyed weakly by the weight, which it must not keep alive)."""
    x2d, act, checked_bias, out_dtype = _checked(x, qweight, bias, act, out_dtype)
    contiguous_bias, bias = checked_bias is bias, checked_bias
    lead = x.shape[:-1] if x.dim() != 2 else None
    n, weight = qweight.N, weakref.ref(qweight)
    plan = plan_linear(qweight, act, x2d, backend)
    kernel = DENSE_KERNELS[plan.kernel]
    poison = act is not None and (plan.backend == "reference" or act.group_shape[0] != 1)
    try:
        if x2d.shape[0] == 0:  # no tokens (an idle batch): nothing to launch
            launch = partial(_no_tokens, n, out_dtype, qweight.device)
        elif kernel.pass_launcher is not None and act is not None:
            bias_dtype = None if bias is None else bias.dtype
            quantize = activation_pass(x2d, act, backend)
            launch = kernel.pass_launcher(quantize, x2d, qweight, act, bias_dtype, out_dtype, plan.tuning)
        elif kernel.launcher is not None:
            bias_dtype = None if bias is None else bias.dtype
            launch = kernel.launcher(x2d, qweight, act, bias_dtype, out_dtype, plan.tuning)
        else:
            launch = partial(_run_kernel, kernel, weight, act, out_dtype, plan.tuning)
    except KernelNotReadyError as err:  # during a capture: name the warmup call this one needed
        raise unwarmed_error(err, qweight, act, x2d, backend) from None

    def call(x, bias):
        x2d = x if lead is None else x.reshape(-1, x.shape[-1])
        if not contiguous_bias:
            bias = bias.contiguous()  # every kernel reads bias[n] at n
        try:
            out = launch(x2d, bias)
        except KernelNotReadyError as err:  # a kernel loaded at its first launch, during a capture
            raise unwarmed_error(err, weight(), act, x2d, backend) from None
        if poison:
            out = poison_non_finite_rows(x2d, out)
        return out if lead is None else out.reshape(*lead, n)

    return call


def _no_tokens(n: int, out_dtype, device, x, bias) -> torch.Tensor:
    return torch.empty(0, n, dtype=out_dtype, device=device)


def _run_kernel(kernel, weight: weakref.ref, act, out_dtype, tuning, x, bias) -> torch.Tensor:
    return kernel.run(x, weight(), bias, act, out_dtype, tuning)


def run_linear(x2d, qweight: QuantizedWeight, bias, act: ActScheme | None, out_dtype, backend: str) -> torch.Tensor:
    """What :func:`linear` runs once its arguments are checked (``torch.ops.humming.linear`` too): plan,
    launch, non-finite rows. ``x2d`` is ``[M, K]`` (or a QuantizedActivation); returns ``[M, N]``."""
    prequantized = isinstance(x2d, QuantizedActivation)
    x_data = x2d.codes if prequantized else x2d
    plan = plan_linear(qweight, act, x_data, backend)  # also reports bad requests
    if x_data.shape[0] == 0:  # no tokens (an idle batch): nothing to launch
        return torch.empty(0, qweight.N, dtype=out_dtype, device=qweight.device)
    try:
        out = DENSE_KERNELS[plan.kernel].run(x2d, qweight, bias, act, out_dtype, plan.tuning)
    except KernelNotReadyError as err:  # during a capture: name the warmup call this one needed
        raise unwarmed_error(err, qweight, act, x_data, backend) from None
    if act is not None and not prequantized and (plan.backend == "reference" or act.group_shape[0] != 1):
        out = poison_non_finite_rows(x2d, out)
    return out


def _linear_op(x, x_scales, x_global_scale, *args):
    *weight, bias, act, out_dtype, backend = args
    qweight = ops.weight_from_args(*weight)
    return _linear_impl(x, x_scales, x_global_scale, qweight, bias, act, out_dtype, backend)


def _linear_impl(x, x_scales, x_global_scale, qweight, bias, act, out_dtype, backend):
    """Both linear ops' implementation, the weight found; ``act`` a scheme or its name."""
    if x_scales is None:
        return _prepared_call(x, qweight, bias, act, out_dtype, backend)(x, bias)
    if act is None:
        raise ValueError("act: quantized activations (x_scales given) need the scheme's name")
    x = QuantizedActivation(act, x, x_scales, x_global_scale)
    x2d, act, bias, out_dtype = _checked(x, qweight, bias, act, out_dtype)
    out = run_linear(x2d, qweight, bias, act, out_dtype, backend)
    return out.reshape(*x.shape[:-1], qweight.N)  # the fake's shape, for an x of any rank


def _linear_fake(x, x_scales, x_global_scale, qweight, *args):
    out_dtype = args[-2]
    return x.new_empty((*x.shape[:-1], qweight.shape[-2]), dtype=out_dtype)


ops.register("linear", _linear_op, _linear_fake)


def _linear_bound_op(x, x_scales, x_global_scale, bias, site):
    qweight, act, out_dtype, backend = ops.bound(site)
    bias = qweight.bias if bias is None else bias
    return _linear_impl(x, x_scales, x_global_scale, qweight, bias, act, out_dtype, backend)


def _linear_bound_fake(x, x_scales, x_global_scale, bias, site):
    qweight, _, out_dtype, _ = ops.bound(site)
    return x.new_empty((*x.shape[:-1], qweight.N), dtype=out_dtype)


ops.register("linear_bound", _linear_bound_op, _linear_bound_fake)


def poison_non_finite_rows(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out`` [M, N] with NaN in every row whose activations ``x`` [M, K] hold a NaN or an Inf.

    Quantized activations have no code for them (int8, e2m1); a 16-bit matmul gives such a row non-finite
    outputs, and so does humming (README, "Non-finite activations"). The Triton quantizer gives a row span
    holding one a NaN scale, which every kernel's epilogue carries into the row: this pass is needed only
    where one scale spans the tensor (per-tensor schemes, whose absmax ignores non-finite values so that
    other rows keep their outputs) and on the reference. One pass over ``x``, no host sync.
    """
    bad = ~torch.isfinite(x).all(dim=-1, keepdim=True)
    return out.masked_fill(bad, float("nan"))
