"""``humming.moe.fused_moe``: a mixture-of-experts MLP in one call: align the routing, ``w13`` on the gathered
tokens, the gated activation, ``w2``, the weighted combine back to tokens (the Triton kernels of
:mod:`humming.triton_kernels.moe_layer` on CUDA tensors, else the torch definitions of
:mod:`humming.reference.moe_layer`)."""

from __future__ import annotations

import importlib
import weakref

import torch

from .. import ops
from .._env import env
from ..deterministic import is_deterministic
from ..dispatch.kernels import GROUPED_KERNELS, backend_unavailable
from ..dispatch.plan import plan_grouped, requested_backend
from ..dispatch.support import combination_error
from ..ir.activation import ActScheme, QuantizedActivation, get_act_scheme
from ..ir.weight import QuantizedWeight
from ..reference import moe_layer
from ._checks import (
    check_act_scale,
    check_block_m,
    check_expert_map,
    check_experts,
    check_range,
    check_topk_ids,
    check_x,
    expert_bias,
)
from .align import align, padded_rows, prepare_align
from .grouped import grouped_step, layer_block_m, run_gated, run_grouped
from .routing import layer_backend

__all__ = ["fused_moe", "local_ids", "on_triton", "run_fused_moe"]


def fused_moe(
    x: torch.Tensor,
    w13: QuantizedWeight,
    w2: QuantizedWeight,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "silu",
    alpha: float | None = None,
    limit: float | None = None,
    gate_up_layout: str = "concat",
    expert_map: torch.Tensor | None = None,
    act=None,
    w13_act_scale: torch.Tensor | None = None,
    w2_act_scale: torch.Tensor | None = None,
    block_m: int | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """A mixture-of-experts MLP: ``sum_j topk_weights[t, j] * w2_e(act_fn(gate, up))`` with
    ``[gate, up] = w13_e(x[t])``, ``e = topk_ids[t, j]``.

    Args:
        x: ``[T, K]`` float16 / bfloat16 (float32 on the reference backend).
        w13: ``[E, 2I, K]``, gate and up rows as ``gate_up_layout`` says.
        w2: ``[E, K, I]``. Their ``bias`` fields (``[E, 2I]``, ``[E, K]``), if set, are added.
        topk_weights: float ``[T, topk]``; topk_ids: integer ``[T, topk]`` (see :func:`humming.moe.moe_align`).
        activation: ``"silu"`` (SwiGLU), ``"gelu"`` (exact erf GELU, vLLM's ``"gelu"``), ``"gelu_tanh"``
            (tanh approximation) or ``"swiglu_oai"`` (gpt-oss: ``clamp(gate, max=limit)`` times
            ``sigmoid(alpha * gate)`` times ``clamp(up, -limit, limit) + 1``); computed in float32, rounded
            to ``x``'s dtype. ``alpha``, ``limit``: swiglu_oai's only (``None``: 1.702 and 7.0).
        gate_up_layout: ``"concat"`` (gate rows ``[0, I)``, then up rows: vLLM's and transformers'
            convention) or ``"interleaved"`` (gate rows even, up rows odd: gpt-oss checkpoints).
        expert_map: expert parallelism (vLLM's): an integer ``[E_global]`` tensor on ``x``'s device giving
            each global expert id its index in ``w13`` / ``w2``, or -1 where the expert is not on this rank;
            ``topk_ids`` are then global ids in ``[0, E_global)``, and slots of experts not here add nothing
            (the rank's partial sum, to be reduced across ranks). Mapped on the device, no host sync; values
            are checked on CPU only (on a GPU, ids or map values out of range drop their slots).
        act, backend: as :func:`humming.moe.grouped_linear`, for both GEMMs. ``w13`` gathers the tokens
            (``grouped_linear``'s ``rows``): a dynamic tensor-wide scale of its input spans the ``T`` tokens,
            those of ``w2``'s input the grouped rows in use. With a per-token or per-group ``act``, the
            activation pass of the Triton path writes ``w2``'s quantized input itself.
        w13_act_scale, w2_act_scale: static per-tensor scales of the two GEMMs' inputs (one element each;
            ``x / scale`` is quantized, as a checkpoint's ``input_scale``) for an ``act`` with float32 scales
            and no global scale; ``None``: dynamic scales.
        block_m: the routing block; ``None`` -> :func:`humming.moe.default_block_m` for the blocks the grouped
            GEMMs take (:func:`humming.moe.grouped.layer_block_m`).
    Returns:
        ``[T, K]`` in ``x``'s dtype; the weighted sum accumulates in fp32 and is rounded once.
    """
    w13 = check_experts("w13", w13)
    w2 = check_experts("w2", w2)
    if type(x) is torch.Tensor and x.dim() == 2 and x.shape[0] and not torch.compiler.is_compiling():
        biases, scales = (w13.bias, w2.bias), (w13_act_scale, w2_act_scale)
        args = (expert_map, (activation, alpha, limit, gate_up_layout), act, scales, block_m, backend)
        call = _prepared_call(x, w13, w2, topk_weights, topk_ids, *biases, *args)
        return call(x, topk_weights, topk_ids, *biases, expert_map, *scales)
    activation, act, scales, block_m = _checked(
        x,
        w13,
        w2,
        topk_weights,
        topk_ids,
        (activation, alpha, limit, gate_up_layout),
        expert_map,
        act,
        (w13_act_scale, w2_act_scale),
        block_m,
    )
    if ops.eager(x):
        args = (topk_weights, topk_ids, expert_map, activation, act, *scales, block_m, backend)
        return run_fused_moe(x, w13, w13.bias, w2, w2.bias, *args)
    if not torch.compiler.is_exporting():
        site = ops.bind(w13, w2, activation.name, activation.gate_up_layout, act, backend)
        numbers = (activation.alpha, activation.limit, 0 if block_m is None else block_m)
        return torch.ops.humming.fused_moe_bound(x, topk_weights, topk_ids, expert_map, *scales, *numbers, site)
    return torch.ops.humming.fused_moe(
        x,
        topk_weights,
        topk_ids,
        *ops.weight_args(w13),
        w13.bias,
        *ops.weight_args(w2),
        w2.bias,
        expert_map,
        activation.name,
        activation.alpha,
        activation.limit,
        activation.gate_up_layout,
        ops.act_name(act),
        *scales,
        0 if block_m is None else block_m,
        backend,
    )


def _checked(x, w13, w2, topk_weights, topk_ids, activation, expert_map, act, act_scales, block_m):
    """``(activation, act, (w13_act_scale, w2_act_scale), block_m)`` of a fused_moe call, every argument checked
    (the entry point's and the custom op's); ``activation`` is ``(name, alpha, limit, gate_up_layout)``."""
    e, two_i, k = w13.shape
    activation = moe_layer.check_activation(*activation)
    if two_i % 2:
        raise ValueError(f"w13: expected [E, 2I, K] (gate and up rows), got an odd N={two_i}")
    inter = two_i // 2
    if w2.shape != (e, k, inter):
        raise ValueError(f"w2: expected shape {(e, k, inter)} for w13 {w13.shape}, got {w2.shape}")
    if w2.device != w13.device:
        raise ValueError(f"w2 is on {w2.device} but w13 is on {w13.device}")
    check_x("x", x, k, w13.device)
    if not isinstance(topk_ids, torch.Tensor) or topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"topk_ids: expected shape [T={x.shape[0]}, topk], got {getattr(topk_ids, 'shape', topk_ids)}")
    if topk_ids.shape[1] == 0:
        raise ValueError(
            f"topk_ids: expected at least one expert per token (topk >= 1), got shape {tuple(topk_ids.shape)}"
        )
    if topk_ids.device != x.device:
        raise ValueError(f"topk_ids is on {topk_ids.device} but x is on {x.device}")
    check_topk_ids(topk_ids)
    if not isinstance(topk_weights, torch.Tensor) or not topk_weights.is_floating_point():
        raise ValueError(f"topk_weights: expected a float tensor, got {getattr(topk_weights, 'dtype', topk_weights)}")
    if topk_weights.shape != topk_ids.shape or topk_weights.device != x.device:
        raise ValueError(
            f"topk_weights: expected shape {tuple(topk_ids.shape)} on {x.device} (as topk_ids), "
            f"got {tuple(topk_weights.shape)} on {topk_weights.device}"
        )
    if expert_map is not None:
        check_expert_map(expert_map, e, x.device)
    block_m = check_block_m(block_m) if block_m is not None else None
    act = None if act is None else get_act_scheme(act)
    reason = combination_error(w13.format, act) or combination_error(w2.format, act)
    if reason:
        raise ValueError(reason)
    scales = tuple(
        check_act_scale(name, scale, act, x.device)
        for name, scale in zip(("w13_act_scale", "w2_act_scale"), act_scales)
    )
    return activation, act, scales, block_m


def local_ids(topk_ids: torch.Tensor, expert_map: torch.Tensor, num_local: int) -> torch.Tensor:
    """Global ``topk_ids`` -> indices in ``w13`` / ``w2`` through ``expert_map``; -1 for experts not on this
    rank and for ids or map values out of range (unchecked on a GPU), whose slots :func:`~.align.align` drops."""
    ids = topk_ids.long()
    local = expert_map.long()[ids.clamp(0, expert_map.shape[0] - 1)]
    keep = (ids >= 0) & (ids < expert_map.shape[0]) & (local >= 0) & (local < num_local)
    return torch.where(keep, local, -1)


def on_triton(x: torch.Tensor, backend: str) -> bool:
    """Whether fused_moe's activation and combine run as Triton kernels (else in torch): on CUDA tensors
    unless the reference is asked for, and on any device with ``backend="triton"``."""
    requested = requested_backend(backend)
    if requested == "triton":
        return True
    return requested != "reference" and x.device.type == "cuda" and backend_unavailable("triton") is None


def combine_kernel(y, topk_weights, dtype, backend: str) -> str:
    """The combine fused_moe's kernel layer (``on_triton``) runs for ``y`` (w2's output), ``topk_weights`` and
    the output ``dtype``: ``"cuda.moe_combine"`` (the Triton combine's bits, a cheaper launch) where it applies,
    unless ``backend="triton"``; else ``"triton.moe_combine"``."""
    if requested_backend(backend) != "triton":
        moe_combine = importlib.import_module("humming.cuda_kernels.moe_combine")
        if moe_combine.cuda_unsupported(y, topk_weights, dtype) is None:
            return "cuda.moe_combine"
    return "triton.moe_combine"


def prepared_combine(
    y, slot_rows, topk_weights, dtype, backend: str, slot_block: int = 0, num_experts: int = 0, programmatic=True
):
    """The prepared combine of fused_moe's kernel layer (:func:`combine_kernel`'s); ``programmatic``: the CUDA
    combine's programmatic launch behind w2."""
    kernels = importlib.import_module("humming.triton_kernels.moe_layer")
    combine = kernels.PreparedCombine(y, slot_rows, topk_weights, dtype, slot_block, num_experts)
    if combine_kernel(y, topk_weights, dtype, backend) == "triton.moe_combine":
        return combine
    moe_combine = importlib.import_module("humming.cuda_kernels.moe_combine")
    return moe_combine.CudaCombine(combine, y, topk_weights, dtype, slot_block, num_experts, programmatic)


def run_fused_moe(
    x,
    w13,
    w13_bias,
    w2,
    w2_bias,
    topk_weights,
    topk_ids,
    expert_map,
    activation: moe_layer.Activation,
    act: ActScheme | None,
    w13_act_scale: torch.Tensor | None,
    w2_act_scale: torch.Tensor | None,
    block_m: int | None,
    backend: str,
):
    """What :func:`fused_moe` runs once its arguments are checked (``torch.ops.humming.fused_moe`` too);
    the biases are passed apart from the weights, as the ops take them. Checks the ids and the expert map of
    CPU tensors here, where they are data. A static scale quantizes its GEMM's input beforehand (the
    Triton quantizer on the Triton path, else the reference)."""
    e, _, k = w13.shape
    if expert_map is None:
        check_range("topk_ids", topk_ids, 0, e)
        ids = topk_ids
    else:
        check_range("topk_ids", topk_ids, 0, expert_map.shape[0])
        check_range("expert_map", expert_map, -1, e)
        ids = local_ids(topk_ids, expert_map, e)
    if x.shape[0] == 0:
        return torch.empty(0, k, dtype=x.dtype, device=x.device)
    if block_m is None:
        block_m = layer_block_m(topk_ids.numel(), w13, w2, x, act, backend)
    routing = align(ids, e, block_m, layer_backend(backend))
    triton_layer = on_triton(x, backend)
    quant = "triton" if triton_layer else "reference"
    static = lambda v, scale: v if scale is None else ops.quantize_activation(v, act, scale=scale, backend=quant)
    # w13 reads each routed row's token through the index (padding rows read zeros: finite, then dropped)
    rows = routing.token_rows(topk_ids.shape[1])
    if triton_layer:
        kernels = importlib.import_module("humming.triton_kernels.moe_layer")
        # 16-bit activations: the activation in w13's epilogue where its grouped kernel has one
        hidden = None
        if act is None:
            hidden = run_gated(x, w13, routing.expert_ids, block_m, w13_bias, activation, x.dtype, backend, rows)
        if hidden is None:
            h = run_grouped(
                static(x, w13_act_scale), w13, routing.expert_ids, block_m, w13_bias, act, x.dtype, backend, rows
            )
            # w2's quantization in the activation pass, where its scales are per token or per group
            fuse = act is not None and w2_act_scale is None and kernels.act_unsupported(act) is None
            hidden = kernels.activate(h, activation, act if fuse else None, routing.num_rows)
        hidden = static(hidden, w2_act_scale)
        y = run_grouped(hidden, w2, routing.expert_ids, block_m, w2_bias, act, x.dtype, backend)
        return kernels.combine(y, routing.slot_rows, topk_weights, x.dtype)
    h = run_grouped(static(x, w13_act_scale), w13, routing.expert_ids, block_m, w13_bias, act, x.dtype, backend, rows)
    hidden = static(moe_layer.activate(h, activation, x.dtype), w2_act_scale)
    y = run_grouped(hidden, w2, routing.expert_ids, block_m, w2_bias, act, x.dtype, backend)
    return moe_layer.combine(y, routing.slot_rows, topk_weights, x.dtype)


#: Prepared calls kept per pair of weights (held weakly: they go with either), at most this many: then they
#: start over.
_MAX_CALLS = 64
_calls: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # w13 -> {w2 -> {call key: prepared call}}


def _kind(t):
    """What a prepared call depends on of an optional tensor argument: its dtype, shape, strides and device
    (anything else as it is: the checks name it)."""
    return (t.dtype, t.shape, t.stride(), t.device) if type(t) is torch.Tensor else t


def _prepared_call(
    x, w13, w2, topk_weights, topk_ids, w13_bias, w2_bias, expert_map, activation, act, act_scales, block_m, backend
):
    """The callable ``(x, topk_weights, topk_ids, w13_bias, w2_bias, expert_map, w13_act_scale, w2_act_scale)
    -> out`` that runs this fused_moe call (``activation``: ``(name, alpha, limit, gate_up_layout)``), found in
    one lookup per weight and kind of call: ``x``'s dtype, shape, strides, 16-byte alignment and device, the
    other tensors' dtypes, shapes, strides and devices (or their absence), the activation, ``act``,
    ``block_m``, the backend asked, ``HUMMING_BACKEND`` and the deterministic mode. Everything that depends
    only on those (the checks, the routing block, the plans and launches of both GEMMs, the alignment's and
    the combine's launch arguments) is done when a kind of call is first seen; a kind the checks refuse
    raises, and is not kept. Calls of no tokens are not prepared."""
    key = (x.dtype, x.shape, x.stride(), x.data_ptr() % 16 == 0, x.device, _kind(topk_ids), _kind(topk_weights))
    key += (_kind(w13_bias), _kind(w2_bias), _kind(expert_map), activation, act, *map(_kind, act_scales), block_m)
    key += (backend, env("HUMMING_BACKEND"), is_deterministic())
    by_w2 = _calls.get(w13)
    calls = None if by_w2 is None else by_w2.get(w2)
    try:
        call = None if calls is None else calls.get(key)
    except TypeError:  # an unhashable argument: the checks name it
        call = key = None
    if call is None:
        args = (expert_map, activation, act, act_scales, block_m, backend)
        call = _make_call(x, w13, w2, topk_weights, topk_ids, w13_bias, w2_bias, *args)
        if key is not None:
            if by_w2 is None:
                by_w2 = _calls[w13] = weakref.WeakKeyDictionary()
            calls = by_w2.get(w2)
            if calls is None:
                calls = by_w2[w2] = {}
            if len(calls) >= _MAX_CALLS:
                calls.clear()
            calls[key] = call
    return call


def _make_call(
    x, w13, w2, topk_weights, topk_ids, w13_bias, w2_bias, expert_map, activation, act, act_scales, block_m, backend
):
    """The prepared call of :func:`_prepared_call` for calls like this one (which it checks): what
    :func:`run_fused_moe` runs, step for step, with each step's plan and launch made here. It holds the
    weights weakly (it is kept in dictionaries keyed weakly by them)."""
    activation, act, _, block_m = _checked(
        x, w13, w2, topk_weights, topk_ids, activation, expert_map, act, act_scales, block_m
    )
    expert_bias(w13_bias, w13, "w13_bias")
    expert_bias(w2_bias, w2, "w2_bias")
    e, _, k = w13.shape
    topk, dtype, device = topk_ids.shape[1], x.dtype, x.device
    on_cpu = device.type == "cpu"  # values are checked on CPU tensors only (check_range)
    num_global = None if expert_map is None else expert_map.shape[0]
    if block_m is None:
        block_m = layer_block_m(topk_ids.numel(), w13, w2, x, act, backend)
    bias13 = None if w13_bias is None else w13_bias.dtype
    bias2 = None if w2_bias is None else w2_bias.dtype
    slots = slot_route(
        x, w13, w2, topk_weights, topk_ids, expert_map, act, block_m, (bias13, bias2), backend, activation
    )
    if slots is not None:
        return slots
    ids = topk_ids if expert_map is None else topk_ids.new_empty(topk_ids.shape, dtype=torch.int64)  # local_ids'
    route = prepare_align(ids, e, block_m, layer_backend(backend))
    m_pad = padded_rows(topk_ids.numel(), e, block_m)
    triton_layer = on_triton(x, backend)
    kernels = importlib.import_module("humming.triton_kernels.moe_layer") if triton_layer else None
    quant = "triton" if triton_layer else "reference"
    static = lambda v, scale: v if scale is None else ops.quantize_activation(v, act, scale=scale, backend=quant)
    weight13, weight2 = weakref.ref(w13), weakref.ref(w2)

    if act is None:
        # the activation in w13's epilogue where its grouped kernel has one (the Triton layer's path), else a pass
        gated = triton_layer and (launch := grouped_step(w13, x, m_pad, block_m, bias13, dtype, backend, activation))
        if gated:
            first = lambda x, ids, bias, rows, num_rows: launch(x, ids, bias, rows)
        else:
            launch13 = grouped_step(w13, x, m_pad, block_m, bias13, dtype, backend)
            if triton_layer:
                activate = kernels.PreparedActivate(x.new_empty(m_pad, w13.N), activation)
                first = lambda x, ids, bias, rows, num_rows: activate(launch13(x, ids, bias, rows), num_rows)
            else:
                first = lambda x, ids, bias, rows, num_rows: moe_layer.activate(
                    launch13(x, ids, bias, rows), activation, dtype
                )
        launch2 = grouped_step(w2, x.new_empty(m_pad, w13.N // 2), None, block_m, bias2, dtype, backend)
        second = lambda hidden, ids, bias: launch2(hidden, ids, bias, None)
    elif steps := prepared_quantized_steps(
        x, w13, w2, m_pad, block_m, act, act_scales, activation, bias13, bias2, backend
    ):
        launch13, activate, launch2 = steps

        def first(x, ids, bias, rows, num_rows, w13_scale=None, w2_scale=None):
            return static(activate(launch13(static(x, w13_scale), ids, bias, rows), num_rows), w2_scale)

        second = lambda hidden, ids, bias: launch2(hidden, ids, bias, None)
    else:
        # quantized activations: each GEMM through run_grouped (its quantization and non-finite rows per call)
        fuse = act_scales[1] is None and triton_layer and kernels.act_unsupported(act) is None

        def first(x, ids, bias, rows, num_rows, w13_scale=None, w2_scale=None):
            h = run_grouped(static(x, w13_scale), weight13(), ids, block_m, bias, act, dtype, backend, rows)
            if triton_layer:
                return static(kernels.activate(h, activation, act if fuse else None, num_rows), w2_scale)
            return static(moe_layer.activate(h, activation, dtype), w2_scale)

        def second(hidden, ids, bias):
            return run_grouped(hidden, weight2(), ids, block_m, bias, act, dtype, backend)

    if triton_layer:
        slot_rows = torch.empty(topk_ids.numel(), dtype=torch.int32, device=device)
        combine = prepared_combine(x.new_empty(m_pad, k), slot_rows, topk_weights, dtype, backend)
    else:
        combine = lambda y, slot_rows, topk_weights: moe_layer.combine(y, slot_rows, topk_weights, dtype)

    def call(x, topk_weights, topk_ids, w13_bias, w2_bias, expert_map, w13_act_scale, w2_act_scale):
        if expert_map is None:
            if on_cpu:
                check_range("topk_ids", topk_ids, 0, e)
            ids = topk_ids
        else:
            if on_cpu:
                check_range("topk_ids", topk_ids, 0, num_global)
                check_range("expert_map", expert_map, -1, e)
            ids = local_ids(topk_ids, expert_map, e)
        src_slots, expert_ids, num_rows, slot_rows, rows = route(ids)
        if rows is None:
            rows = torch.where(src_slots >= 0, src_slots // topk, -1)
        if act is None:
            hidden = first(x, expert_ids, w13_bias, rows, num_rows)
        else:
            scales = (None if s is None else s.to(torch.float32).reshape(1, 1) for s in (w13_act_scale, w2_act_scale))
            hidden = first(x, expert_ids, w13_bias, rows, num_rows, *scales)
        return combine(second(hidden, expert_ids, w2_bias), slot_rows, topk_weights)

    return call


def prepared_quantized_steps(
    x, w13, w2, m_pad: int, block_m: int, act, act_scales, activation, bias13, bias2, backend: str
) -> tuple | None:
    """``(w13's GEMM, the activation pass, w2's GEMM)`` made ready for a Triton layer of quantized activations,
    as :func:`run_fused_moe` runs them, for biases of dtypes ``bias13`` / ``bias2`` (``None``: none): a GEMM of
    a dynamic scale quantizes its 16-bit input (w2's is quantized in the activation pass where it can be), one
    of a static scale (``act_scales``: given for the call kind, or ``None``) takes the caller's
    :class:`QuantizedActivation` of ``[1, 1]`` scales. ``None`` where a step is not prepared so (dynamic
    tensor-wide scales, kernels that do not gather, the CUDA layer): the caller then runs :func:`run_grouped`
    per call."""
    if not on_triton(x, backend):
        return None
    from ..triton_kernels import moe_layer as kernels

    scheme, (static13, static2) = get_act_scheme(act), (scale is not None for scale in act_scales)
    statically_quantized = lambda rows, width: QuantizedActivation.from_kernel(
        scheme, x.new_empty(rows, width, dtype=torch.uint8), x.new_empty(1, 1, dtype=torch.float32)
    )
    dtype = x.dtype
    w13_input = statically_quantized(*x.shape) if static13 else x
    launch13 = grouped_step(w13, w13_input, m_pad, block_m, bias13, dtype, backend, act=act)
    if launch13 is None:
        return None
    fuse = not static2 and kernels.act_unsupported(act) is None
    activate = kernels.PreparedActivate(x.new_empty(m_pad, w13.N), activation, act if fuse else None)
    w2_input = statically_quantized(m_pad, w13.N // 2) if static2 else activate.empty()
    launch2 = grouped_step(w2, w2_input, None, block_m, bias2, dtype, backend, act=act)
    return None if launch2 is None else (launch13, activate, launch2)


#: The grouped kernel the slot-major route runs both GEMMs on (it skips segments whose expert id is out of
#: range, so unaligned routing ids can be its segments' experts).
SLOT_ROUTE_KERNEL = "cuda.grouped_decode"


def slot_route_rows(x, w13, w2, top_k: int, ids_dtype, mapped: bool, act, block_m: int, backend, activation) -> int:
    """The grouped rows (``top_k * block_m``) of a fused_moe call of ``x`` (``[T, K]``) in slot-major rows
    (:func:`slot_route`), or 0 where the call does not take that route: one token of 16-bit activations, int32
    ids (``ids_dtype``; vLLM's and SGLang's) and no expert map (``mapped``) on CUDA tensors, both GEMMs
    planning :data:`SLOT_ROUTE_KERNEL` at those rows, w13's activation in its epilogue."""
    if x.shape[0] != 1 or mapped or act is not None or ids_dtype != torch.int32 or x.device.type != "cuda":
        return 0
    if not on_triton(x, backend):  # the combine
        return 0
    m_pad = top_k * block_m
    for weight, rows, gather in ((w13, x, m_pad), (w2, x.new_empty(m_pad, w13.N // 2), None)):
        try:
            if plan_grouped(weight, None, rows, block_m, backend, gather).kernel != SLOT_ROUTE_KERNEL:
                return 0
        except ValueError:
            return 0
    return m_pad if GROUPED_KERNELS[SLOT_ROUTE_KERNEL].gates(w13, x, activation) else 0


def slot_route(x, w13, w2, topk_weights, topk_ids, expert_map, act, block_m: int, bias_dtypes, backend, activation):
    """The prepared call of one token's fused_moe in slot-major rows, or ``None`` where it does not apply
    (:func:`slot_route_rows`).

    One token's top-k slots are distinct experts, so no alignment is needed: segment ``j`` (``block_m`` rows,
    the first one the token's) belongs to slot ``j``, its expert ``topk_ids[0, j]`` read in place as the
    segment's id, and the combine reads row ``j * block_m``. That saves the alignment kernel and its
    allocations; each row is computed exactly as in the aligned layout (same kernels, same per-row sums, the
    slots combined in the same order), so the results are the same bits. Ids out of range drop their slots
    (the kernel skips their segments, the combine their rows), as the alignment would. ``bias_dtypes``:
    w13's and w2's bias dtypes (``None``: no bias)."""
    top_k = topk_ids.shape[1]
    mapped = expert_map is not None
    m_pad = slot_route_rows(x, w13, w2, top_k, topk_ids.dtype, mapped, act, block_m, backend, activation)
    if not m_pad or not topk_ids.is_contiguous():
        return None
    dtype = x.dtype
    # plain launches: one token's three kernels measured slower launched programmatically (each waiting for the
    # one before it), the layers of more tokens faster (bench/results/h100/pdl_2026-12-07/pdl_moe.json)
    launch13 = grouped_step(w13, x, m_pad, block_m, bias_dtypes[0], dtype, backend, activation, programmatic=False)
    hidden = x.new_empty(m_pad, w13.N // 2)
    launch2 = grouped_step(w2, hidden, None, block_m, bias_dtypes[1], dtype, backend, programmatic=False)
    ids = topk_ids.reshape(-1)
    y = x.new_empty(m_pad, w13.shape[2])
    combine = prepared_combine(y, ids, topk_weights, dtype, backend, block_m, w13.num_experts, programmatic=False)
    rows = torch.full((m_pad,), -1, dtype=torch.int32, device=x.device)
    rows[::block_m] = 0  # each segment's first row reads the token

    def call(x, topk_weights, topk_ids, w13_bias, w2_bias, expert_map, w13_act_scale, w2_act_scale):
        ids = topk_ids.view(-1)
        hidden = launch13(x, ids, w13_bias, rows)
        return combine(launch2(hidden, ids, w2_bias, None), ids, topk_weights)

    return call


def _fused_moe_op(x, topk_weights, topk_ids, *args):
    w13, w13_bias, w2, w2_bias, expert_map = args[:7], args[7], args[8:15], args[15], args[16]
    w13 = check_experts("w13", ops.weight_from_args(*w13))
    w2 = check_experts("w2", ops.weight_from_args(*w2))
    return _fused_moe_impl(x, topk_weights, topk_ids, w13, w13_bias, w2, w2_bias, expert_map, *args[17:])


def _fused_moe_bound_op(
    x, topk_weights, topk_ids, expert_map, w13_act_scale, w2_act_scale, alpha, limit, block_m, site
):
    w13, w2, name, gate_up_layout, act, backend = ops.bound(site)
    activation = (name, alpha, limit, gate_up_layout)
    args = (expert_map, *activation, act, w13_act_scale, w2_act_scale, block_m, backend)
    return _fused_moe_impl(x, topk_weights, topk_ids, w13, w13.bias, w2, w2.bias, *args)


def _fused_moe_impl(
    x, topk_weights, topk_ids, w13, w13_bias, w2, w2_bias, expert_map, name, alpha, limit, gate_up_layout, *args
):
    """Both fused_moe ops' implementation, the weights found; ``args``: ``act`` (scheme or name),
    ``w13_act_scale``, ``w2_act_scale``, ``block_m`` (0 or None: the default), ``backend``."""
    act, w13_act_scale, w2_act_scale, block_m, backend = args
    if type(x) is torch.Tensor and x.dim() == 2 and x.shape[0]:
        scales = (w13_act_scale, w2_act_scale)
        args = (expert_map, (name, alpha, limit, gate_up_layout), act, scales, block_m or None, backend)
        call = _prepared_call(x, w13, w2, topk_weights, topk_ids, w13_bias, w2_bias, *args)
        return call(x, topk_weights, topk_ids, w13_bias, w2_bias, expert_map, *scales)
    activation, act, scales, block_m = _checked(
        x,
        w13,
        w2,
        topk_weights,
        topk_ids,
        (name, alpha, limit, gate_up_layout),
        expert_map,
        act,
        (w13_act_scale, w2_act_scale),
        block_m or None,
    )
    w13_bias, w2_bias = expert_bias(w13_bias, w13, "w13_bias"), expert_bias(w2_bias, w2, "w2_bias")
    args = (topk_weights, topk_ids, expert_map, activation, act, *scales, block_m, backend)
    return run_fused_moe(x, w13, w13_bias, w2, w2_bias, *args)


def _fused_moe_fake(x, topk_weights, topk_ids, *args):
    return torch.empty_like(x)


ops.register("fused_moe", _fused_moe_op, _fused_moe_fake)
ops.register("fused_moe_bound", _fused_moe_bound_op, _fused_moe_fake)
