"""Top-k expert routing (:func:`humming.moe.topk_routing`): the checked call, the torch reference that
defines it, and the choice between the reference and the Triton kernel
(:mod:`humming.triton_kernels.routing`).

The routing of a token, in float32:

1. Scores: ``softmax`` over the experts or ``sigmoid`` of each logit (``order="score_then_topk"``); with
   ``order="topk_then_softmax"`` nothing yet.
2. Ranking keys: the scores plus ``correction_bias`` (DeepSeek-V3's load-balancing bias: it moves the
   choice, not the weights). Without a bias and without groups, and with ``topk_then_softmax``, the keys
   are the logits themselves: softmax and sigmoid are increasing, so they rank the experts alike, without
   the ties that rounding makes between scores (saturated sigmoids, underflowing softmax terms).
3. Groups (``num_groups > 1``): a group's score is the sum of its two highest keys (its one key for groups
   of one expert); the ``topk_groups`` best groups are kept, the others' experts cannot be picked.
4. The ``top_k`` highest keys among the experts that can be picked, best first.
5. Weights: the picked experts' scores (without the bias); with ``topk_then_softmax`` the softmax over the
   picked logits. ``renormalize`` divides them by their sum, then they are multiplied by ``routed_scaling``.

Ties rank the lower expert (group) id first: the reference sorts stably (``torch.topk`` promises no order
among ties, and on CPU does not keep this one). A NaN key ranks below every number.
"""

from __future__ import annotations

import importlib
import math
import numbers
from dataclasses import dataclass

import torch

from ._env import pass_backend
from .dispatch.kernels import backend_unavailable
from .ir._checks import non_finite_error

__all__ = [
    "BACKENDS",
    "ORDERS",
    "SCORINGS",
    "RoutingSpec",
    "check_routing",
    "layer_backend",
    "reference",
    "route",
    "triton_unsupported",
]

SCORINGS = ("softmax", "sigmoid")
#: ``"score_then_topk"``: Mixtral, Qwen-MoE, DeepSeek-V3 (scores over every expert, then the top k);
#: ``"topk_then_softmax"``: gpt-oss (the top k logits, then a softmax over those k).
ORDERS = ("score_then_topk", "topk_then_softmax")
BACKENDS = ("auto", "reference", "triton")


@dataclass(frozen=True)
class RoutingSpec:
    """A checked routing call, everything but its tensors; ``num_groups == 1``: no groups."""

    num_experts: int
    top_k: int
    scoring: str
    order: str
    renormalize: bool
    num_groups: int
    topk_groups: int
    routed_scaling: float
    has_bias: bool

    @property
    def group_size(self) -> int:
        return self.num_experts // self.num_groups

    @property
    def keys_are_logits(self) -> bool:
        """Whether the experts are ranked by their logits (step 2 of the module doc)."""
        return self.order == "topk_then_softmax" or (not self.has_bias and self.num_groups == 1)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_routing(
    router_logits,
    top_k,
    scoring,
    renormalize,
    num_groups,
    topk_groups,
    correction_bias,
    routed_scaling,
    order,
    backend,
) -> RoutingSpec:
    """The :class:`RoutingSpec` of a :func:`humming.moe.topk_routing` call; ``ValueError`` naming the
    argument for anything it cannot run. Reads tensor data only on CPU (no host sync)."""
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
        reason = kernel.supports(router_logits, correction_bias, spec)
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
    return reference(router_logits, correction_bias, spec)


def reference(router_logits: torch.Tensor, correction_bias, spec: RoutingSpec):
    """The definition (module doc), in torch ops on any device: ``(weights float32 [T, top_k], ids int32
    [T, top_k])``."""
    logits = router_logits.float()
    t = logits.shape[0]
    if spec.order == "topk_then_softmax":
        scores = logits
    else:
        scores = logits.softmax(-1) if spec.scoring == "softmax" else logits.sigmoid()
    if spec.keys_are_logits:
        keys = logits
    else:
        keys = scores if correction_bias is None else scores + correction_bias.float()
    keys = _rankable(keys)
    pickable = None
    if spec.num_groups > 1:
        grouped = keys.view(t, spec.num_groups, spec.group_size)
        group_scores = _rankable(grouped.topk(min(2, spec.group_size), -1).values.sum(-1))
        kept = _ranked(group_scores)[:, : spec.topk_groups]
        pickable = torch.zeros(t, spec.num_groups, dtype=torch.bool, device=keys.device).scatter_(1, kept, True)
        pickable = pickable.repeat_interleave(spec.group_size, dim=1)
    ids = _ranked(keys, pickable)[:, : spec.top_k]
    weights = scores.gather(1, ids)
    if spec.order == "topk_then_softmax":
        weights = weights.softmax(-1)
    if spec.renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights * spec.routed_scaling, ids.to(torch.int32)


def _rankable(keys: torch.Tensor) -> torch.Tensor:
    """NaN keys ranked below every number (torch's sort puts them above)."""
    return torch.where(keys.isnan(), float("-inf"), keys)


def _ranked(keys: torch.Tensor, pickable: torch.Tensor | None = None) -> torch.Tensor:
    """Indices along the last dimension from the highest key down, the lower index first among equal keys
    (stable sorts); indices not ``pickable`` after every pickable one."""
    order = keys.sort(dim=-1, descending=True, stable=True).indices
    if pickable is not None:
        first = pickable.gather(-1, order).to(torch.uint8).sort(dim=-1, descending=True, stable=True).indices
        order = order.gather(-1, first)
    return order
