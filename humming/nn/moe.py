"""MoE modules on stacked experts: :class:`QuantizedExperts` (the caller routes) and :class:`FusedMoE`
(routed from router logits), both over :class:`MoeExperts`: the two expert-stacked weights and the options
of :func:`humming.moe.fused_moe` they run with."""

from __future__ import annotations

import torch

from ..ir._checks import non_finite_error
from ..ir.activation import ActScheme, get_act_scheme
from ..ir.quantize import quantize
from ..ir.weight import QuantizedWeight
from ..moe import MoeCall, fused_moe, topk_routing
from ..moe.routing import check_routing, layer_backend
from ..reference.moe_layer import check_activation
from ._buffers import QuantizedModule
from .linear import resolve_group_size

__all__ = ["FusedMoE", "MoeExperts", "QuantizedExperts"]


def _with_bias(name: str, qw: QuantizedWeight, bias) -> QuantizedWeight:
    """``qw`` with per-expert ``bias`` ``[E, N]`` in place of its own (``None``: ``qw`` as it is)."""
    if bias is None:
        return qw
    e, n = qw.shape[0], qw.shape[1]
    if not isinstance(bias, torch.Tensor) or not bias.is_floating_point() or tuple(bias.shape) != (e, n):
        raise ValueError(f"{name}: expected a float tensor of shape ({e}, {n}), got {getattr(bias, 'shape', bias)!r}")
    if bias.device != qw.device:
        raise ValueError(f"{name} is on {bias.device} but the experts are on {qw.device}")
    return qw.replace(bias=bias)


class MoeExperts(QuantizedModule):
    """What :class:`FusedMoE` and :class:`QuantizedExperts` share: two expert-stacked weights ``w13 [E, 2I,
    K]`` and ``w2 [E, K, I]`` and the options of :func:`humming.moe.fused_moe` they run with (the activation,
    the activation quantization and its static scales, the routing block, the backend)."""

    def _hold_experts(self, w13: QuantizedWeight, w2: QuantizedWeight) -> None:
        """Register the two expert-stacked weights and the expert count."""
        self._set_weight("w13_", w13)
        self._set_weight("w2_", w2)
        if w13.num_experts is None or w2.num_experts is None:
            raise ValueError(f"w13, w2: expected expert-stacked weights [E, N, K], got {w13.shape} and {w2.shape}")
        self.num_experts = w13.num_experts

    def _hold_activation(self, activation, alpha, limit, gate_up_layout) -> None:
        check_activation(activation, alpha, limit, gate_up_layout)
        self.activation, self.alpha, self.limit, self.gate_up_layout = activation, alpha, limit, gate_up_layout

    def _hold_act(self, act, w13_act_scale, w2_act_scale, block_m, backend) -> None:
        """Set the activation scheme and register the static activation scales as buffers ``w13_act_scale`` /
        ``w2_act_scale`` (in the ``state_dict``; ``None`` where the scale is per call); then the routing
        block and the backend."""
        self.act = None if act is None else get_act_scheme(act)
        for name, scale in (("w13_act_scale", w13_act_scale), ("w2_act_scale", w2_act_scale)):
            self._set_act_scale(name, scale, self.act, self.w13.device)
        self.block_m, self.backend = block_m, backend

    @property
    def w13(self) -> QuantizedWeight:
        return self._weight("w13_")

    @property
    def w2(self) -> QuantizedWeight:
        return self._weight("w2_")

    def _options(self) -> dict:
        """The fused_moe keyword arguments the module holds, but the expert map."""
        names = ("activation", "alpha", "limit", "gate_up_layout", "act", "w13_act_scale", "w2_act_scale")
        return {name: getattr(self, name) for name in (*names, "block_m", "backend")}

    def _experts_repr(self) -> str:
        """The weights, the activation and ``act=...``: the scheme, then ``static`` where both GEMMs' input
        scales are static (``static w13`` / ``static w2`` where one is)."""
        act = "act=None"
        if self.act is not None:
            static = [name for name in ("w13", "w2") if getattr(self, f"{name}_act_scale") is not None]
            act = f"act={self.act.name}" + {0: "", 1: f" static {''.join(static)}", 2: " static"}[len(static)]
        return f"{self.w13.describe()}, activation={self.activation} ({self.gate_up_layout}), {act}"


class FusedMoE(MoeExperts):
    """``sum_j w_j * w2_e(act_fn(gate, up))`` over each token's ``top_k`` experts
    (:func:`humming.moe.fused_moe`), the experts and their weights ``w_j`` picked by
    :func:`humming.moe.topk_routing` from the router logits.

    Args:
        w13: ``[E, 2I, K]`` (gate and up rows as ``gate_up_layout`` says); w2: ``[E, K, I]``.
        top_k: experts per token.
        scoring, renormalize, num_groups, topk_groups, correction_bias, routed_scaling, order: the routing,
            as :func:`humming.moe.topk_routing` (DeepSeek-V3: ``scoring="sigmoid", renormalize=True,
            num_groups=8, topk_groups=4, correction_bias=..., routed_scaling=2.5``; gpt-oss:
            ``order="topk_then_softmax"``). ``correction_bias`` ``[E_routed]`` is held as a buffer (in the
            ``state_dict``).
        activation, alpha, limit, gate_up_layout, act, block_m, backend: as :func:`humming.moe.fused_moe`
            (``backend`` ``"reference"`` or ``"triton"`` routes on that backend too).
        w13_act_scale, w2_act_scale: static per-tensor scales of the two GEMMs' inputs (one element each;
            ``x / scale`` is quantized, as a checkpoint's ``input_scale``) for a per-token or per-tensor
            ``act``, as :func:`humming.moe.fused_moe`; held as float32 buffers (in the ``state_dict``).
            ``None``: scales per call.
        w13_bias, w2_bias: per-expert biases ``[E, 2I]`` and ``[E, K]``, in place of the weights' own.
        expert_map: expert parallelism, as :func:`humming.moe.fused_moe`: integer ``[E_global]``, each global
            expert's index in ``w13`` / ``w2`` or -1; the router logits are then ``[..., E_global]``. Held as
            a buffer (moves with ``.to(device)``; not in the ``state_dict``).

    ``forward(hidden_states, router_logits)`` routes and runs the experts; engines that route themselves call
    :meth:`experts` with the top-k weights and ids (:meth:`route` gives the module's own).
    """

    def __init__(
        self,
        w13: QuantizedWeight,
        w2: QuantizedWeight,
        top_k: int,
        *,
        scoring: str = "softmax",
        renormalize: bool = False,
        num_groups: int | None = None,
        topk_groups: int | None = None,
        correction_bias: torch.Tensor | None = None,
        routed_scaling: float = 1.0,
        order: str = "score_then_topk",
        activation: str = "silu",
        alpha: float | None = None,
        limit: float | None = None,
        gate_up_layout: str = "concat",
        w13_bias: torch.Tensor | None = None,
        w2_bias: torch.Tensor | None = None,
        expert_map: torch.Tensor | None = None,
        act: str | ActScheme | None = None,
        w13_act_scale: torch.Tensor | None = None,
        w2_act_scale: torch.Tensor | None = None,
        block_m: int | None = None,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        if isinstance(w13, QuantizedWeight) and isinstance(w2, QuantizedWeight):
            w13, w2 = _with_bias("w13_bias", w13, w13_bias), _with_bias("w2_bias", w2, w2_bias)
        self._hold_experts(w13, w2)
        routed = self.num_experts
        if expert_map is not None:
            if not isinstance(expert_map, torch.Tensor) or expert_map.dim() != 1:
                raise ValueError(
                    f"expert_map: expected a 1-D tensor [E_global], got {getattr(expert_map, 'shape', expert_map)!r}"
                )
            routed = expert_map.shape[0]
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= routed:
            raise ValueError(f"top_k: expected an int in [1, {routed}], got {top_k!r}")
        # every routing argument checked now, on logits of no tokens (no data read)
        device = correction_bias.device if isinstance(correction_bias, torch.Tensor) else "meta"
        logits = torch.empty(0, routed, device=device)
        routing = (top_k, scoring, renormalize, num_groups, topk_groups, correction_bias, routed_scaling, order)
        spec = check_routing(logits, *routing, layer_backend(backend))
        if correction_bias is not None and non_finite_error("correction_bias", correction_bias):
            raise ValueError(non_finite_error("correction_bias", correction_bias))
        self.top_k, self.scoring, self.renormalize, self.order = top_k, scoring, renormalize, order
        self.num_groups, self.topk_groups, self.routed_scaling = num_groups, topk_groups, spec.routed_scaling
        self.register_buffer("correction_bias", correction_bias)
        self._hold_activation(activation, alpha, limit, gate_up_layout)
        self.register_buffer("expert_map", expert_map, persistent=False)
        self._hold_act(act, w13_act_scale, w2_act_scale, block_m, backend)

    @classmethod
    def from_float(
        cls, w13: torch.Tensor, w2: torch.Tensor, top_k: int, weight: str = "int4", group_size=None, **kwargs
    ) -> FusedMoE:
        """Quantize float experts ``w13 [E, 2I, K]`` and ``w2 [E, K, I]`` by round to nearest; ``kwargs``
        go to the constructor. ``group_size=None``: a named scheme's own, else 128."""
        group_size = resolve_group_size(weight, group_size)
        q = lambda w: quantize(w.detach(), weight, group_size=group_size)
        return cls(q(w13), q(w2), top_k, **kwargs)

    def route(self, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``router_logits [T, E_routed]`` -> ``(topk_weights float32, topk_ids int32)`` ``[T, top_k]``."""
        routed = self.num_experts if self.expert_map is None else self.expert_map.shape[0]
        width = router_logits.shape[-1] if isinstance(router_logits, torch.Tensor) and router_logits.dim() else None
        if width != routed:
            got = (
                tuple(router_logits.shape) if isinstance(router_logits, torch.Tensor) else type(router_logits).__name__
            )
            raise ValueError(f"router_logits: expected [T, {routed}] (one logit per routed expert), got {got}")
        return topk_routing(router_logits, self.top_k, **self._routing())

    def experts(self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """The experts on a routing made elsewhere: ``hidden_states [T, K]``, float ``topk_weights`` and
        integer ``topk_ids`` ``[T, top_k]`` (global ids with an expert map) -> ``[T, K]``."""
        return fused_moe(
            hidden_states, self.w13, self.w2, topk_weights, topk_ids, expert_map=self.expert_map, **self._options()
        )

    def forward(self, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """``hidden_states [..., K]``, ``router_logits [..., E_routed]`` -> ``[..., K]`` in ``hidden_states``'
        dtype."""
        x = hidden_states.reshape(-1, hidden_states.shape[-1])
        weights, ids = self.route(router_logits.reshape(-1, router_logits.shape[-1]))
        return self.experts(x, weights, ids).reshape(hidden_states.shape)

    def moe_call(self) -> MoeCall:
        """This layer as a :class:`humming.moe.MoeCall` (for :func:`humming.warmup`)."""
        routing = self._routing()
        return MoeCall(self.w13, self.w2, self.top_k, expert_map=self.expert_map, routing=routing, **self._options())

    def _routing(self) -> dict:
        """topk_routing's keyword arguments."""
        names = ("scoring", "renormalize", "num_groups", "topk_groups", "correction_bias", "routed_scaling", "order")
        return {name: getattr(self, name) for name in names} | {"backend": layer_backend(self.backend)}

    def extra_repr(self) -> str:
        local = "" if self.expert_map is None else f" (of {self.expert_map.shape[0]})"
        groups = "" if self.num_groups is None else f" groups {self.topk_groups}/{self.num_groups}"
        return f"experts={self.num_experts}{local}, top_k={self.top_k} ({self.scoring}{groups}), {self._experts_repr()}"


class QuantizedExperts(MoeExperts):
    """The experts of a MoE block with the routing done by the caller: ``forward(hidden_states [T, K],
    top_k_index [T, k], top_k_weights [T, k]) -> [T, K]``, ``sum_j w_j * w2_e(act_fn(gate, up))``, the
    interface of transformers' ``*Experts`` modules (Mixtral, Qwen2/3-MoE, OLMoE, gpt-oss...), which
    :func:`humming.nn.from_pretrained` puts it in place of.

    Args:
        w13: ``[E, 2I, K]`` (gate and up rows as ``gate_up_layout`` says); w2: ``[E, K, I]``; their ``bias``
            fields, if set, are the per-expert biases.
        activation, alpha, limit, gate_up_layout, act, block_m, backend: as :func:`humming.moe.fused_moe`.
        w13_act_scale, w2_act_scale: static activation scales, as :class:`FusedMoE`'s.
    """

    def __init__(
        self,
        w13: QuantizedWeight,
        w2: QuantizedWeight,
        *,
        activation: str = "silu",
        alpha: float | None = None,
        limit: float | None = None,
        gate_up_layout: str = "concat",
        act: str | ActScheme | None = None,
        w13_act_scale: torch.Tensor | None = None,
        w2_act_scale: torch.Tensor | None = None,
        block_m: int | None = None,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        self._hold_experts(w13, w2)
        self._hold_activation(activation, alpha, limit, gate_up_layout)
        self._hold_act(act, w13_act_scale, w2_act_scale, block_m, backend)

    def moe_call(self, top_k: int) -> MoeCall:
        """These experts at ``top_k`` experts per token as a :class:`humming.moe.MoeCall` (for
        :func:`humming.warmup`); the routing is the caller's."""
        return MoeCall(self.w13, self.w2, top_k, **self._options())

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        weights, ids = top_k_weights.to(torch.float32), top_k_index.to(torch.int32)
        return fused_moe(hidden_states, self.w13, self.w2, weights, ids, **self._options())

    def extra_repr(self) -> str:
        return f"experts={self.num_experts}, {self._experts_repr()}"
