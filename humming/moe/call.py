""":class:`MoeCall`: a :func:`humming.moe.fused_moe` layer described once (experts, ``top_k``, activation,
routing), for :func:`humming.warmup`. :meth:`MoeCall.launches` lists the kernels a call at ``T`` tokens
launches, decided by the same functions the call runs (the dispatcher's grouped plans, the Triton routing's
and activation pass's own checks); :meth:`MoeCall.run` makes that call on random inputs, which is how warmup
readies every Triton kernel with the exact launch keys a later call of that shape uses (the activation and
combine kernels are keyed on their row counts, so each ``T`` is run)."""

from __future__ import annotations

import functools
import importlib
import inspect
from dataclasses import dataclass

import torch

from .._env import pass_backend
from ..dispatch.kernels import GROUPED_KERNELS
from ..dispatch.plan import plan_grouped
from ..ir.activation import ActScheme, get_act_scheme
from ..ir.weight import QuantizedWeight
from ..reference.moe_layer import Activation, check_activation
from ._checks import check_act_scale, check_expert_map, check_experts
from .align import padded_rows
from .align import triton_unsupported as align_unsupported
from .fused import combine_kernel, fused_moe, on_triton, slot_route_rows
from .grouped import copies_on_triton, layer_block_m
from .routing import check_routing, layer_backend, topk_routing, triton_unsupported

__all__ = ["MoeCall", "MoeLaunch", "top_k_unsupported"]


def top_k_unsupported(top_k, w13, expert_map) -> str | None:
    """``None`` when ``top_k`` is an int in ``[1, routed experts]`` (``E_global`` with an expert map, else
    w13's ``E``), else why not: :class:`MoeCall`'s check, for callers that hold a layer's own ``top_k``."""
    routed = w13.num_experts if expert_map is None else expert_map.shape[0]
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= routed:
        return f"top_k: expected an int in [1, {routed}], got {top_k!r}"
    return None


@functools.cache
def _routing_defaults() -> dict:
    """topk_routing's keyword arguments and their defaults (what :attr:`MoeCall.routing` may hold)."""
    params = inspect.signature(topk_routing).parameters.values()
    return {p.name: p.default for p in params if p.kind == p.KEYWORD_ONLY}


@dataclass(frozen=True)
class MoeLaunch:
    """One kernel launch of a fused_moe call: its ``step`` (``"routing"``, ``"align"``, ``"w13 input"``, ``"w13"``,
    ``"activation"``, ``"w2 input"``, ``"w2"``, ``"combine"``), the ``kernel`` (``"triton.topk_routing"``,
    ``"triton.moe_align"`` (or its three launches ``"triton.moe_align_count"``, ``"..._offsets"``,
    ``"..._scatter"``), ``"triton.act_quant"`` / ``"cuda.act_quant"``, a grouped plan's kernel such as
    ``"cuda.grouped"`` / ``"triton.grouped"`` / ``"reference"``, ``"triton.moe_act"``, ``"triton.moe_combine"`` /
    ``"cuda.moe_combine"``, or ``"torch"`` for torch ops) and what it is specialised on. A ``"w13"`` launch whose
    kernel applies the activation in its epilogue (``Kernel.gates``) has no ``"activation"`` launch after it."""

    step: str
    kernel: str
    detail: str


@dataclass(frozen=True, eq=False)
class MoeCall:
    """A fused_moe layer: the arguments of :func:`humming.moe.fused_moe` other than its activations and
    routing (the weights and the static activation scales included), plus ``top_k`` and ``routing``, the
    keyword arguments of :func:`humming.moe.topk_routing` when the layer routes from router logits (``None``:
    the caller routes; ``{}``: a softmax top-k; its ``backend`` defaults to ``"reference"`` / ``"triton"``
    where the layer's is, else ``"auto"``). Checked on construction."""

    w13: QuantizedWeight
    w2: QuantizedWeight
    top_k: int
    activation: str = "silu"
    alpha: float | None = None
    limit: float | None = None
    gate_up_layout: str = "concat"
    expert_map: torch.Tensor | None = None
    act: str | ActScheme | None = None
    w13_act_scale: torch.Tensor | None = None
    w2_act_scale: torch.Tensor | None = None
    block_m: int | None = None
    backend: str = "auto"
    routing: dict | None = None

    def __post_init__(self) -> None:
        w13, w2 = check_experts("w13", self.w13), check_experts("w2", self.w2)
        if w2.shape != (w13.shape[0], w13.shape[2], w13.shape[1] // 2):
            raise ValueError(f"w2: expected shape {(w13.shape[0], w13.shape[2], w13.shape[1] // 2)}, got {w2.shape}")
        if self.expert_map is not None:
            check_expert_map(self.expert_map, w13.num_experts, w13.device)
        reason = top_k_unsupported(self.top_k, w13, self.expert_map)
        if reason is not None:
            raise ValueError(reason)
        routed = self.num_routed
        check_activation(self.activation, self.alpha, self.limit, self.gate_up_layout)
        act = None if self.act is None else get_act_scheme(self.act)
        for name in ("w13_act_scale", "w2_act_scale"):
            check_act_scale(name, getattr(self, name), act, w13.device)
        if self.routing is not None:
            if not isinstance(self.routing, dict) or set(self.routing) - set(_routing_defaults()):
                raise ValueError(
                    f"routing: expected a dict of topk_routing's keyword arguments {sorted(_routing_defaults())}, "
                    f"got {self.routing!r}"
                )
            self._routing_spec(torch.empty(0, routed, device="meta"))

    @property
    def num_routed(self) -> int:
        """The experts the router picks from: ``E_global`` with an expert map, else ``E``."""
        return self.w13.num_experts if self.expert_map is None else self.expert_map.shape[0]

    def _routing_kwargs(self) -> dict:
        """topk_routing's keyword arguments: ``routing``'s, the routing backend following the layer's."""
        return {"backend": layer_backend(self.backend)} | self.routing

    def _routing_spec(self, logits: torch.Tensor):
        r = _routing_defaults() | self._routing_kwargs()
        bias = r["correction_bias"]
        if bias is not None and logits.device.type == "meta":
            bias = bias.to("meta")
        return check_routing(logits, self.top_k, **(r | {"correction_bias": bias})), bias, r["backend"]

    def grouped_shape(self, num_tokens: int, x_dtype: torch.dtype = torch.bfloat16) -> tuple[int, int]:
        """``(block_m, M_pad)`` of a call at ``num_tokens`` tokens of ``x_dtype``: the grouped GEMMs' routing
        block and rows."""
        slots, e = num_tokens * self.top_k, self.w13.num_experts
        block_m = self.block_m
        if not block_m:
            x = torch.empty(0, self.w13.K, dtype=x_dtype, device=self.w13.device)
            act = None if self.act is None else get_act_scheme(self.act)
            block_m = layer_block_m(slots, self.w13, self.w2, x, act, self.backend)
        return block_m, self._slot_rows(num_tokens, x_dtype, block_m) or padded_rows(slots, e, block_m)

    def _slot_rows(self, num_tokens: int, x_dtype: torch.dtype, block_m: int) -> int:
        """The grouped rows of the slot-major route where a call at ``num_tokens`` tokens takes it (its ids are
        :meth:`route`'s, int32), else 0 (:func:`humming.moe.fused.slot_route_rows`)."""
        x = torch.empty(num_tokens, self.w13.K, dtype=x_dtype, device=self.w13.device)
        act = None if self.act is None else get_act_scheme(self.act)
        activation = Activation(self.activation, self.alpha, self.limit, self.gate_up_layout)
        mapped = self.expert_map is not None
        return slot_route_rows(
            x, self.w13, self.w2, self.top_k, torch.int32, mapped, act, block_m, self.backend, activation
        )

    def launches(
        self, num_tokens: int, x_dtype: torch.dtype = torch.bfloat16, logits_dtype: torch.dtype = torch.float32
    ) -> list[MoeLaunch]:
        """The kernels a call at ``num_tokens`` tokens of ``x_dtype`` (router logits of ``logits_dtype``)
        launches, in order. Makes the grouped GEMMs' plans (cached, as the call would)."""
        device, act = self.w13.device, None if self.act is None else get_act_scheme(self.act)
        launches = []
        if self.routing is not None:
            logits = torch.empty(num_tokens, self.num_routed, dtype=logits_dtype, device=device)
            spec, bias, backend = self._routing_spec(logits)
            triton = triton_unsupported(logits, bias, spec, backend) is None
            detail = f"E={spec.num_experts} top_k={spec.top_k} {spec.scoring} {spec.order} logits {logits_dtype}"
            launches.append(MoeLaunch("routing", "triton.topk_routing" if triton else "reference", detail))
        block_m, m_pad = self.grouped_shape(num_tokens, x_dtype)
        if not self._slot_rows(num_tokens, x_dtype, block_m):  # the slot-major route has no alignment
            launches += self._align_launches(num_tokens, block_m)
        x = torch.empty(num_tokens, self.w13.K, dtype=x_dtype, device=device)
        triton_layer = on_triton(x, self.backend)
        copier = "triton.gather_rows" if copies_on_triton(device) else "torch"  # into grouped order

        def gemm(step: str, qw: QuantizedWeight, x: torch.Tensor, scale, gather: bool = False) -> None:
            """``x``: the GEMM's input, the ``T`` tokens where it gathers them (w13) else the grouped rows;
            ``scale``: its static activation scale, which quantizes ``x`` before the GEMM (the Triton
            quantizer where the activation pass is Triton's, else torch's reference)."""
            if scale is not None:
                kernel = "triton.act_quant" if triton_layer else "torch"
                launches.append(MoeLaunch(f"{step} input", kernel, f"{act.name} static rows={x.shape[0]}"))
                x = torch.empty(x.shape, dtype=torch.uint8, device=device)
            plan = plan_grouped(qw, act, x, block_m, self.backend, m_pad if gather else None)
            gathers = gather and GROUPED_KERNELS[plan.kernel].gathers(qw, act, num_tokens, m_pad)
            if gather and not gathers:  # a kernel that reads grouped rows: the tokens copied into that order
                launches.append(MoeLaunch(f"{step} input", copier, f"gather rows={m_pad}"))
            if act is not None and x.dtype != torch.uint8 and plan.backend != "reference":
                # the CUDA and Triton scaled GEMMs quantize their 16-bit input in a pass first (a gathering kernel
                # quantizes the T tokens): the CUDA kernels' own where it applies, else Triton's
                rows = x.shape[0] if gathers else m_pad
                kernel = "triton.act_quant"
                if plan.backend == "cuda":
                    fp8_gemm = importlib.import_module("humming.cuda_kernels.fp8_gemm")
                    kernel = fp8_gemm.pass_kernel(qw, act, torch.empty(rows, x.shape[1], dtype=x.dtype, device=device))
                launches.append(MoeLaunch(f"{step} input", kernel, f"{act.name} rows={rows}"))
            detail = f"block_m={block_m} rows={m_pad} x {x.dtype} act={_name(act)}" + (" gathered" if gathers else "")
            launches.append(MoeLaunch(step, plan.kernel, detail))

        activation = Activation(self.activation, self.alpha, self.limit, self.gate_up_layout)
        hidden = torch.empty(m_pad, self.w2.K, dtype=x_dtype, device=device)
        detail = f"{activation.name} {activation.gate_up_layout} rows={m_pad}"
        gated = None  # the activation in w13's epilogue, where its grouped kernel has one (16-bit activations)
        if triton_layer and act is None:
            plan = plan_grouped(self.w13, None, x, block_m, self.backend, m_pad)
            gated = plan.kernel if GROUPED_KERNELS[plan.kernel].gates(self.w13, x, activation) else None
        if gated is not None:
            gathered = GROUPED_KERNELS[gated].gathers(self.w13, None, num_tokens, m_pad)
            if not gathered:
                launches.append(MoeLaunch("w13 input", copier, f"gather rows={m_pad}"))
            how = " gathered" if gathered else ""
            w13_detail = f"block_m={block_m} rows={m_pad} x {x.dtype} act=None{how}, then {detail}"
            launches.append(MoeLaunch("w13", gated, w13_detail))
        else:
            gemm("w13", self.w13, x, self.w13_act_scale, gather=True)
            if triton_layer:
                kernels = importlib.import_module("humming.triton_kernels.moe_layer")
                # w2's input quantized in this pass, unless its scale is static
                if act is not None and self.w2_act_scale is None and kernels.act_unsupported(act) is None:
                    hidden = torch.empty(m_pad, self.w2.K, dtype=torch.uint8, device=device)
                    detail += f" -> {act.name} codes"
            launches.append(MoeLaunch("activation", "triton.moe_act" if triton_layer else "torch", detail))
        gemm("w2", self.w2, hidden, self.w2_act_scale)
        detail = f"top_k={self.top_k} tokens={num_tokens}"
        combine = "torch"
        if triton_layer:
            y = torch.empty(m_pad, self.w2.N, dtype=x_dtype, device=device)
            weights = torch.empty(num_tokens, self.top_k, dtype=torch.float32, device=device)
            combine = combine_kernel(y, weights, x_dtype, self.backend)
        launches.append(MoeLaunch("combine", combine, detail))
        return launches

    def _align_launches(self, num_tokens: int, block_m: int) -> list[MoeLaunch]:
        """moe_align's launches: the Triton kernels' (one, or three past ``ONE_PROGRAM_SLOTS`` slots) or the
        reference's torch ops."""
        e, slots = self.w13.num_experts, num_tokens * self.top_k
        ids = torch.empty(num_tokens, self.top_k, dtype=torch.int32, device=self.w13.device)
        detail = f"E={e} block_m={block_m} slots={slots}"
        if align_unsupported(ids, e, pass_backend(layer_backend(self.backend))) is not None:
            return [MoeLaunch("align", "torch", detail)]
        if importlib.import_module("humming.triton_kernels.align").layout(slots, e).blocks == 1:
            return [MoeLaunch("align", "triton.moe_align", detail)]
        return [MoeLaunch("align", f"triton.moe_align_{part}", detail) for part in ("count", "offsets", "scatter")]

    def route(self, num_tokens: int, logits_dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """``(topk_weights, topk_ids)`` of random router logits of ``logits_dtype`` through ``routing``
        (without routing: the top k of a softmax, in torch)."""
        logits = torch.randn(num_tokens, self.num_routed, dtype=logits_dtype, device=self.w13.device)
        if self.routing is None:
            weights, ids = logits.float().softmax(-1).topk(self.top_k)
            return weights, ids.to(torch.int32)
        return topk_routing(logits, self.top_k, **self._routing_kwargs())

    def run(
        self, num_tokens: int, x_dtype: torch.dtype = torch.bfloat16, logits_dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """The call on random inputs at ``num_tokens`` tokens: :meth:`route`, then fused_moe -> ``[T, K]``."""
        x = torch.randn(num_tokens, self.w13.K, dtype=x_dtype, device=self.w13.device)
        weights, ids = self.route(num_tokens, logits_dtype)
        return fused_moe(
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
            w13_act_scale=self.w13_act_scale,
            w2_act_scale=self.w2_act_scale,
            block_m=self.block_m,
            backend=self.backend,
        )


def _name(act: ActScheme | None) -> str:
    return "None" if act is None else act.name
