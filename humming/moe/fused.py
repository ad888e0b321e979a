"""``humming.moe.fused_moe``: a mixture-of-experts MLP in one call: align the routing, ``w13`` on the gathered
tokens, the gated activation, ``w2``, the weighted combine back to tokens (the Triton kernels of
:mod:`humming.triton_kernels.moe_layer` on CUDA tensors, else the torch definitions of
:mod:`humming.reference.moe_layer`)."""

from __future__ import annotations

import importlib

import torch

from .. import ops
from ..dispatch.kernels import backend_unavailable
from ..dispatch.plan import requested_backend
from ..dispatch.support import combination_error
from ..ir.activation import ActScheme, get_act_scheme
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
from .align import align, default_block_m
from .grouped import run_gated, run_grouped
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
        block_m: the routing block; ``None`` -> :func:`humming.moe.default_block_m`.
    Returns:
        ``[T, K]`` in ``x``'s dtype; the weighted sum accumulates in fp32 and is rounded once.
    """
    w13 = check_experts("w13", w13)
    w2 = check_experts("w2", w2)
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
    block_m = default_block_m(topk_ids.numel(), e) if block_m is None else block_m
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


def _fused_moe_op(x, topk_weights, topk_ids, *args):
    w13, w13_bias, w2, w2_bias, expert_map = args[:7], args[7], args[8:15], args[15], args[16]
    name, alpha, limit, gate_up_layout, act, w13_act_scale, w2_act_scale, block_m, backend = args[17:]
    w13 = check_experts("w13", ops.weight_from_args(*w13))
    w2 = check_experts("w2", ops.weight_from_args(*w2))
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
