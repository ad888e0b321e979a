"""``FusedMoE``: a mixture-of-experts MLP on stacked experts, routed from router logits."""

from __future__ import annotations

import torch

from .._moe_layer import check_activation
from ..ir.activation import ActScheme, get_act_scheme
from ..ir.quantize import quantize
from ..ir.weight import QuantizedWeight
from ..moe import fused_moe, topk_routing
from ._buffers import QuantizedModule
from .linear import resolve_group_size

__all__ = ["FusedMoE", "QuantizedExperts"]


def _hold_experts(module: QuantizedModule, w13: QuantizedWeight, w2: QuantizedWeight) -> None:
    """Register an MoE module's two expert-stacked weights and its expert count."""
    module._set_weight("w13_", w13)
    module._set_weight("w2_", w2)
    if w13.num_experts is None or w2.num_experts is None:
        raise ValueError(f"w13, w2: expected expert-stacked weights [E, N, K], got {w13.shape} and {w2.shape}")
    module.num_experts = w13.num_experts


class FusedMoE(QuantizedModule):
    """``sum_j w_j * w2_e(act_fn(gate, up))`` over each token's ``top_k`` experts
    (:func:`humming.moe.fused_moe`), the experts picked by :func:`humming.moe.topk_routing` from the router
    logits.

    Args:
        w13: ``[E, 2I, K]`` (gate and up rows as ``gate_up_layout`` says); w2: ``[E, K, I]``.
        top_k: experts per token.
        scoring: ``"softmax"`` or ``"sigmoid"``; renormalize: rescale the picked weights to sum to 1.
        activation, alpha, limit, gate_up_layout, act, block_m, backend: as :func:`humming.moe.fused_moe`.
        expert_map: expert parallelism, as :func:`humming.moe.fused_moe`: integer ``[E_global]``, each global
            expert's index in ``w13`` / ``w2`` or -1; the router logits are then ``[..., E_global]``. Held as
            a buffer (moves with ``.to(device)``; not in the ``state_dict``).
    """

    def __init__(
        self,
        w13: QuantizedWeight,
        w2: QuantizedWeight,
        top_k: int,
        *,
        scoring: str = "softmax",
        renormalize: bool = False,
        activation: str = "silu",
        alpha: float | None = None,
        limit: float | None = None,
        gate_up_layout: str = "concat",
        expert_map: torch.Tensor | None = None,
        act: str | ActScheme | None = None,
        block_m: int | None = None,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        _hold_experts(self, w13, w2)
        routed = self.num_experts
        if expert_map is not None:
            if not isinstance(expert_map, torch.Tensor) or expert_map.dim() != 1:
                raise ValueError(
                    f"expert_map: expected a 1-D tensor [E_global], got {getattr(expert_map, 'shape', expert_map)!r}"
                )
            routed = expert_map.shape[0]
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= routed:
            raise ValueError(f"top_k: expected an int in [1, {routed}], got {top_k!r}")
        self.top_k, self.scoring, self.renormalize = top_k, scoring, renormalize
        check_activation(activation, alpha, limit, gate_up_layout)
        self.activation, self.alpha, self.limit, self.gate_up_layout = activation, alpha, limit, gate_up_layout
        self.register_buffer("expert_map", expert_map, persistent=False)
        self.act = None if act is None else get_act_scheme(act)
        self.block_m, self.backend = block_m, backend

    @property
    def w13(self) -> QuantizedWeight:
        return self._weights["w13_"]

    @property
    def w2(self) -> QuantizedWeight:
        return self._weights["w2_"]

    @classmethod
    def from_float(
        cls, w13: torch.Tensor, w2: torch.Tensor, top_k: int, weight: str = "int4", group_size=None, **kwargs
    ) -> FusedMoE:
        """Quantize float experts ``w13 [E, 2I, K]`` and ``w2 [E, K, I]`` by round to nearest; ``kwargs``
        go to the constructor. ``group_size=None``: a named scheme's own, else 128."""
        group_size = resolve_group_size(weight, group_size)
        q = lambda w: quantize(w.detach(), weight, group_size=group_size)
        return cls(q(w13), q(w2), top_k, **kwargs)

    def forward(self, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """``hidden_states [..., K]``, ``router_logits [..., E]`` -> ``[..., K]`` in ``hidden_states``' dtype."""
        x = hidden_states.reshape(-1, hidden_states.shape[-1])
        logits = router_logits.reshape(-1, router_logits.shape[-1])
        weights, ids = topk_routing(logits, self.top_k, scoring=self.scoring, renormalize=self.renormalize)
        y = fused_moe(
            x,
            self.w13,
            self.w2,
            weights,
            ids,
            activation=self.activation,
            alpha=self.alpha,
            limit=self.limit,
            gate_up_layout=self.gate_up_layout,
            expert_map=self.expert_map,
            act=self.act,
            block_m=self.block_m,
            backend=self.backend,
        )
        return y.reshape(hidden_states.shape)

    def extra_repr(self) -> str:
        act = "None" if self.act is None else self.act.name
        local = "" if self.expert_map is None else f" (of {self.expert_map.shape[0]})"
        return (
            f"experts={self.num_experts}{local}, top_k={self.top_k}, {self.w13.describe()}, "
            f"activation={self.activation} ({self.gate_up_layout}), act={act}"
        )


class QuantizedExperts(QuantizedModule):
    """The experts of a MoE block with the routing done by the caller: ``forward(hidden_states [T, K],
    top_k_index [T, k], top_k_weights [T, k]) -> [T, K]``, ``sum_j w_j * w2_e(silu(gate) * up)``, the
    interface of transformers' ``*Experts`` modules (Mixtral, Qwen2/3-MoE, OLMoE...), which
    :func:`humming.nn.from_pretrained` puts it in place of.

    Args:
        w13: ``[E, 2I, K]`` (gate rows, then up rows); w2: ``[E, K, I]``.
        act, block_m, backend: as :func:`humming.moe.fused_moe`.
    """

    def __init__(
        self,
        w13: QuantizedWeight,
        w2: QuantizedWeight,
        *,
        act: str | ActScheme | None = None,
        block_m: int | None = None,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        _hold_experts(self, w13, w2)
        self.act = None if act is None else get_act_scheme(act)
        self.block_m, self.backend = block_m, backend

    @property
    def w13(self) -> QuantizedWeight:
        return self._weights["w13_"]

    @property
    def w2(self) -> QuantizedWeight:
        return self._weights["w2_"]

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        ids = top_k_index.to(torch.int32)
        weights = top_k_weights.to(torch.float32)
        return fused_moe(
            hidden_states, self.w13, self.w2, weights, ids, act=self.act, block_m=self.block_m, backend=self.backend
        )

    def extra_repr(self) -> str:
        act = "None" if self.act is None else self.act.name
        return f"experts={self.num_experts}, {self.w13.describe()}, act={act}"
