"""Top-k expert routing (:func:`humming.moe.topk_routing`), defined in torch: the reference that the Triton
kernel (:mod:`humming.triton_kernels.routing`) is tested against.

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

from dataclasses import dataclass

import torch

__all__ = ["ORDERS", "SCORINGS", "RoutingSpec", "topk_routing"]

SCORINGS = ("softmax", "sigmoid")
#: ``"score_then_topk"``: Mixtral, Qwen-MoE, DeepSeek-V3 (scores over every expert, then the top k);
#: ``"topk_then_softmax"``: gpt-oss (the top k logits, then a softmax over those k).
ORDERS = ("score_then_topk", "topk_then_softmax")


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


def topk_routing(router_logits: torch.Tensor, correction_bias, spec: RoutingSpec):
    """The definition (module doc) of a checked call (``humming.moe.routing.check_routing``), in torch ops on
    any device: ``(weights float32 [T, top_k], ids int32 [T, top_k])``."""
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
