"""``humming.moe.topk_routing``: the checked call, the choice between the torch definition
(:mod:`humming.reference.routing`) and the Triton kernel (:mod:`humming.triton_kernels.routing`), and its
custom op."""

from __future__ import annotations

import importlib
import inspect
import math
import numbers

import torch

from .. import ops
from .._env import pass_backend
from ..dispatch.kernels import backend_unavailable
from ..ir._checks import non_finite_error
from ..reference import routing as reference
from ..reference.routing import ORDERS, SCORINGS, RoutingSpec

__all__ = ["BACKENDS", "check_routing", "layer_backend", "route", "topk_routing", "triton_unsupported"]

BACKENDS = ("auto", "reference", "triton")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_routing(
    router_logits,
    top_k,
    scoring="softmax",
    renormalize=False,
    num_groups=None,
    topk_groups=None,
    correction_bias=None,
    routed_scaling=1.0,
    order="score_then_topk",
    backend="auto",
) -> RoutingSpec:
    """The :class:`~humming.reference.routing.RoutingSpec` of a :func:`topk_routing` call (its arguments in the
    op schema's order, with its defaults); ``ValueError`` naming the argument for anything it cannot run.
    Reads tensor data only on CPU (no host sync)."""
    if not isinstance(router_logits, torch.Tensor) or not router_logits.is_floating_point():
        raise ValueError(
            f"router_logits: expected a float tensor, got {getattr(router_logits, 'dtype', router_logits)}"
        )
    if router_logits.dim() != 2:
        raise ValueError(f"router_logits: expected shape [T, E], got {tuple(router_logits.shape)}")
    e = router_logits.shape[1]
    if not _is_int(top_k) or not 1 <= top_k <= e:
        raise ValueError(f"top_k: expected an int in [1, {e}] (E = router_logits.shape[1]), got {top_k!r}")
    if scoring not in SCORINGS:
        raise ValueError(f"scoring: expected one of {SCORINGS}, got {scoring!r}")
    if order not in ORDERS:
        raise ValueError(f"order: expected one of {ORDERS}, got {order!r}")
    if not isinstance(renormalize, bool):
        raise ValueError(f"renormalize: expected a bool, got {renormalize!r}")
    if (num_groups is None) != (topk_groups is None):
        raise ValueError(
            f"num_groups, topk_groups: give both or neither, got num_groups={num_groups!r}, topk_groups={topk_groups!r}"
        )
    if num_groups is None:
        num_groups = topk_groups = 1
    if not _is_int(num_groups) or num_groups < 1 or e % num_groups:
        raise ValueError(f"num_groups: expected a positive int that divides E={e}, got {num_groups!r}")
    if not _is_int(topk_groups) or not 1 <= topk_groups <= num_groups:
        raise ValueError(f"topk_groups: expected an int in [1, num_groups={num_groups}], got {topk_groups!r}")
    if top_k > topk_groups * (e // num_groups):
        raise ValueError(
            f"top_k: {top_k} experts cannot be picked from the {topk_groups} kept groups of {e // num_groups} experts"
        )
    if correction_bias is not None:
        if not isinstance(correction_bias, torch.Tensor) or not correction_bias.is_floating_point():
            raise ValueError(
                f"correction_bias: expected a float tensor, got {getattr(correction_bias, 'dtype', correction_bias)}"
            )
        if tuple(correction_bias.shape) != (e,):
            raise ValueError(f"correction_bias: expected shape ({e},) (E), got {tuple(correction_bias.shape)}")
        if correction_bias.device != router_logits.device:
            raise ValueError(
                f"correction_bias is on {correction_bias.device} but router_logits is on {router_logits.device}"
            )
        # Its values, where reading them costs no host sync (CPU): a NaN would rank every expert alike.
        reason = non_finite_error("correction_bias", correction_bias) if correction_bias.device.type == "cpu" else None
        if reason is not None:
            raise ValueError(reason)
    if (
        isinstance(routed_scaling, bool)
        or not isinstance(routed_scaling, numbers.Real)
        or not 0 < routed_scaling < math.inf  # comparisons, not math.isfinite: dynamo folds them (NaN fails)
    ):
        raise ValueError(f"routed_scaling: expected a positive finite number, got {routed_scaling!r}")
    if order == "topk_then_softmax":
        if scoring != "softmax":
            raise ValueError(
                f"scoring: order='topk_then_softmax' takes a softmax of the picked logits, not {scoring!r}"
            )
        if correction_bias is not None or num_groups > 1:
            raise ValueError(
                "order: 'topk_then_softmax' ranks the raw logits; correction_bias and num_groups act on scores "
                "(use order='score_then_topk')"
            )
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    return RoutingSpec(
        e,
        top_k,
        scoring,
        order,
        renormalize,
        num_groups,
        topk_groups,
        float(routed_scaling),
        correction_bias is not None,
    )


def triton_unsupported(router_logits: torch.Tensor, correction_bias, spec: RoutingSpec, backend: str) -> str | None:
    """``None`` when :func:`route` runs a checked call on the Triton kernel (``backend="triton"``, or
    ``"auto"`` on CUDA tensors, within the kernel's limits), else why not."""
    if backend == "reference" or (backend == "auto" and router_logits.device.type != "cuda"):
        return f"backend {backend!r} on {router_logits.device} routes with the reference"
    reason = backend_unavailable("triton")
    if reason is None:
        kernel = importlib.import_module("humming.triton_kernels.routing")
        reason = kernel.unsupported(router_logits, correction_bias, spec)
    return reason


def layer_backend(backend: str) -> str:
    """The routing backend of an MoE layer whose GEMMs run on ``backend``: ``"reference"`` and ``"triton"``
    as they are, else ``"auto"``."""
    return backend if backend in ("reference", "triton") else "auto"


def route(router_logits: torch.Tensor, correction_bias, spec: RoutingSpec, backend: str):
    """Run a checked call: the Triton kernel for ``backend="triton"``, and for ``"auto"`` (which
    ``HUMMING_BACKEND`` may set) on CUDA tensors where it runs the call; else the reference."""
    backend = pass_backend(backend)
    reason = triton_unsupported(router_logits, correction_bias, spec, backend)
    if reason is None:
        kernel = importlib.import_module("humming.triton_kernels.routing")
        return kernel.topk_routing(router_logits, correction_bias, spec)
    if backend == "triton":
        raise ValueError(f"backend: 'triton' cannot run this routing call: {reason}")
    return reference.topk_routing(router_logits, correction_bias, spec)


def topk_routing(
    router_logits: torch.Tensor,
    top_k: int,
    *,
    scoring: str = "softmax",
    renormalize: bool = False,
    num_groups: int | None = None,
    topk_groups: int | None = None,
    correction_bias: torch.Tensor | None = None,
    routed_scaling: float = 1.0,
    order: str = "score_then_topk",
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick each token's ``top_k`` experts from ``router_logits`` and weight them (the routing of Mixtral,
    Qwen-MoE, DeepSeek-V3, Kimi-K2 and gpt-oss; defined step by step in :mod:`humming.reference.routing`).

    Args:
        router_logits: float ``[T, E]``; everything is computed in float32.
        top_k: experts per token.
        scoring: ``"softmax"`` over the experts (Mixtral, Qwen-MoE) or ``"sigmoid"`` of each logit
            (DeepSeek-V3, Kimi-K2).
        renormalize: divide the picked weights by their sum.
        num_groups, topk_groups: grouped top-k (DeepSeek-V3: 8 and 4), both or neither. The experts form
            ``num_groups`` groups of consecutive ids; a group's score is the sum of its two highest ranking
            keys, and only the experts of the ``topk_groups`` best groups can be picked.
        correction_bias: float ``[E]`` added to the scores to rank the experts, not to the weights
            (DeepSeek-V3's ``e_score_correction_bias``).
        routed_scaling: multiplies the weights (after ``renormalize``).
        order: ``"score_then_topk"`` (scores over every expert, then the top k) or ``"topk_then_softmax"``
            (gpt-oss: the k highest logits, then a softmax over those k; softmax scoring, without groups or
            bias).
        backend: ``"auto"`` (the Triton kernel on CUDA tensors, within its limits: E up to 1024 once
            padded to powers of two per group, ``top_k`` up to 32; else the reference), ``"reference"``
            (torch ops, the definition) or ``"triton"``.
    Returns:
        ``(topk_weights float32 [T, top_k], topk_ids int32 [T, top_k])``, best first: what
        :func:`humming.moe.fused_moe` takes. Ties rank the lower expert id first; a NaN ranks below every
        number. No host sync on any backend (CUDA-graph capturable).
    """
    options = (scoring, renormalize, num_groups, topk_groups, correction_bias, routed_scaling, order, backend)
    if ops.eager(router_logits):
        return _topk_routing_op(router_logits, top_k, *options)
    spec = check_routing(router_logits, top_k, *options)
    return torch.ops.humming.topk_routing(router_logits, top_k, *options[:5], spec.routed_scaling, order, backend)


def _topk_routing_op(router_logits, top_k, *options, **named):
    """The op's implementation (and the eager call's): the schema's defaults stand for the options a caller
    leaves out (a Python implementation gets only the arguments a caller passes)."""
    spec = check_routing(router_logits, top_k, *options, **named)
    bound = dict(zip(_OPTIONS, options)) | named
    return route(router_logits, bound.get("correction_bias"), spec, bound.get("backend", "auto"))


#: topk_routing's options in the op schema's order (after router_logits and top_k).
_OPTIONS = tuple(inspect.signature(check_routing).parameters)[2:]


def _topk_routing_fake(router_logits, top_k, *args, **kwargs):
    shape = (router_logits.shape[0], top_k)
    return router_logits.new_empty(shape, dtype=torch.float32), router_logits.new_empty(shape, dtype=torch.int32)


ops.register("topk_routing", _topk_routing_op, _topk_routing_fake)
