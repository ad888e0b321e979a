"""Op ``moe`` of ``python -m humming bench``: the models, the parts of their MoE layers, the systems timed.

A :class:`MoeModel` is one model's routed-expert MLP: ``experts`` experts of ``w13 [2 * inter, hidden]``
(gate and up rows) and ``w2 [hidden, inter]``, ``topk`` experts per token, its activation (gate / up row
layout, biases) and the weight formats it is served in (``humming.dispatch.tune.CASES``). For one (model,
case, dtype), :class:`Experts` holds both stacks: the 16-bit weights drawn expert by expert and humming's
quantized ones quantized expert by expert (no float32 or float64 temporary of a whole stack: a DeepSeek-V3
``w13`` alone is 15 GB in bf16). A :class:`MoeGroup` is one part of the layer under one routing
(``random`` or ``skewed``, :func:`humming.bench.inputs.routing`):

- ``grouped_w13``: the up-projection grouped GEMM, the tokens ``x [M, H]`` routed to ``w13``;
- ``grouped_w2``: the down-projection grouped GEMM, one hidden row ``[I]`` per routed slot, to ``w2``;
- ``layer``: the whole layer, :func:`humming.moe.fused_moe` from the top-k ids and weights to the combined
  ``[M, H]`` (alignment, gather, both grouped GEMMs, the activation, the combine).

Systems (rows):

- ``humming``: grouped parts, ``humming.moe.grouped_linear`` on ``moe_align``'s padded rows, ``w13``'s
  read from the tokens through the routing's row index as :func:`humming.moe.fused_moe` does (``kernel``:
  what the dispatcher picked); ``layer``, ``fused_moe`` (``kernel``: the two GEMMs' kernels);
- ``humming:<kernel>``: grouped parts, each grouped kernel but the reference where it supports the call;
- ``torch-grouped-mm``: ``torch._grouped_mm`` on the 16-bit weights, the routed rows sorted by expert (no
  padding); a bias is added after the call (``_grouped_mm`` takes none);
- ``torch-scaled-grouped-mm``: ``torch._scaled_grouped_mm`` on e4m3 weights (per-channel scales), the sorted
  rows quantized to e4m3 per row in the call (CUDA only);
- ``humming-kernels``: upstream Humming's grouped-contiguous GEMM on the same sorted rows
  (:mod:`humming.bench.peer`).

A row's floor is the bytes of humming's quantized experts that the routing hits (both stacks for the
layer) over the copy bandwidth.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from ..dispatch.kernels import GROUPED_KERNELS
from ..dispatch.tune import CASES
from ..reference.moe_layer import SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT, activate, check_activation
from . import inputs
from .peer import CONFIGS as PEER_CONFIGS
from .systems import (
    PEER,
    Group,
    Inputs,
    Prepared,
    Shape,
    System,
    copies,
    e4m3_rows,
    missing_torch,
    nbytes,
    weight_copies,
)

__all__ = [
    "GROUPED",
    "MODELS",
    "PARTS",
    "Experts",
    "MoeGroup",
    "MoeModel",
    "coarse_to_fine",
    "grouped_call",
    "grouped_reference",
    "scaled_grouped_mm",
    "sweep_points",
    "systems",
    "warm",
]

#: The parts of a MoE layer that get rows (see the module doc); the first two are grouped GEMMs.
PARTS = ("grouped_w13", "grouped_w2", "layer")
GROUPED = PARTS[:2]
#: Seeds of the two stacks' weights and biases (:func:`humming.bench.inputs.weight`).
_SEEDS = {"w13": 0, "w2": 1}


@dataclass(frozen=True)
class MoeModel:
    """One model's routed experts (see the module doc); ``cases``: the formats it is benchmarked in."""

    name: str
    experts: int
    topk: int
    hidden: int
    inter: int
    cases: tuple[str, ...]
    activation: str = "silu"
    gate_up_layout: str = "concat"
    alpha: float | None = None
    limit: float | None = None
    bias: bool = False

    def dims(self, stack: str) -> tuple[int, int]:
        """``(N, K)`` of one expert of ``stack`` (``"w13"`` or ``"w2"``)."""
        return (2 * self.inter, self.hidden) if stack == "w13" else (self.hidden, self.inter)

    @classmethod
    def from_shape(cls, shape: Shape, cases) -> MoeModel:
        """``--shapes ExNxK/TOPK``: a SwiGLU layer whose ``w13`` is ``[E, N, K]`` (H = K, I = N / 2), named by
        its shape."""
        if shape.n % 2:
            raise ValueError(f"shapes: {shape} has an odd N; MoE shapes give w13 [E, 2I, H] (gate and up rows)")
        return cls(str(shape), shape.experts, shape.topk, shape.k, shape.n // 2, tuple(cases))


#: The presets of ``--models``, cheapest first (a sweep's budget left over by one model goes to the next).
MODELS = {
    m.name: m
    for m in (
        MoeModel("qwen3-30b-a3b", 128, 8, 2048, 768, ("w4a16-int4-g128",)),
        MoeModel(
            "gpt-oss-120b",
            128,
            4,
            2880,
            2880,
            ("mxfp4-a16",),
            activation="swiglu_oai",
            gate_up_layout="interleaved",
            alpha=SWIGLU_OAI_ALPHA,
            limit=SWIGLU_OAI_LIMIT,
            bias=True,
        ),
        MoeModel("deepseek-v3", 256, 8, 7168, 2048, ("w4a16-int4-g128", "w8a8-fp8-block")),
        MoeModel("kimi-k2", 384, 8, 7168, 2048, ("w4a16-int4-g32",)),
    )
}


class Experts:
    """One (model, case, dtype) on one device: both stacks, built on first use and shared by the parts."""

    def __init__(self, model: MoeModel, case: str, dtype: torch.dtype, device: str):
        self.model, self.case, self.dtype, self.device = model, case, dtype, device
        self.qargs = CASES[case][0]
        self._cache: dict = {}

    def cached(self, key, build: Callable[[], object]):
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def w(self, stack: str) -> torch.Tensor:
        """The 16-bit ``[E, N, K]`` stack."""
        n, k = self.model.dims(stack)
        args = (n, k, self.model.experts, self.dtype, self.device, _SEEDS[stack])
        return self.cached(("w", stack), lambda: inputs.weight(*args))

    def bias(self, stack: str) -> torch.Tensor | None:
        """``[E, N]`` in the 16-bit dtype, or ``None`` for a model without biases."""
        if not self.model.bias:
            return None
        n, _ = self.model.dims(stack)
        args = (n, self.model.experts, self.dtype, self.device, _SEEDS[stack])
        return self.cached(("bias", stack), lambda: inputs.bias(*args))

    def qweights(self, stack: str) -> list:
        """humming's quantized copies of ``stack`` (:func:`humming.bench.systems.copies`)."""
        return self.cached(("q", stack), lambda: copies(self.device, lambda: self.quantize(stack), nbytes))

    def fp8_copies(self, stack: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Copies of :meth:`fp8`."""

        def build():
            first = self.fp8(stack)
            return copies(self.device, lambda: tuple(t.clone() for t in first), lambda c: c[0].nbytes, first)

        return self.cached(("fp8", stack), build)

    def quantize(self, stack: str):
        """humming's quantized stack (bias attached), one expert at a time."""
        import humming

        n, k = self.model.dims(stack)
        b = self.bias(stack)
        parts = []
        for e in range(self.model.experts):
            w = inputs.expert_weight(e, n, k, self.dtype, self.device, _SEEDS[stack])
            parts.append(humming.quantize(w, bias=None if b is None else b[e], **self.qargs))
        return humming.stack(parts)

    def fp8(self, stack: str) -> tuple[torch.Tensor, torch.Tensor]:
        """e4m3 codes ``[E, N, K]`` of the 16-bit stack and their per-channel float32 scales ``[E, N]``, one
        expert at a time."""
        w = self.w(stack)
        codes = torch.empty(w.shape, dtype=torch.float8_e4m3fn, device=w.device)
        scales = torch.empty(w.shape[:2], dtype=torch.float32, device=w.device)
        for e in range(w.shape[0]):
            codes[e], scale = e4m3_rows(w[e])
            scales[e] = scale.squeeze(1)
        return codes, scales


class MoeGroup(Group):
    """One part (:data:`PARTS`) of a model's layer under one routing, on the stacks of ``experts``. Its
    ``shape`` is the GEMM's ``[E, N, K]`` (``w13``'s for the layer)."""

    def __init__(self, experts: Experts, part: str, routing: str):
        model = experts.model
        self.stack = "w2" if part == "grouped_w2" else "w13"
        shape = Shape(*model.dims(self.stack), model.experts, model.topk)
        super().__init__("moe", experts.case, shape, experts.dtype, experts.device)
        self.experts, self.model, self.part, self.routing = experts, model, part, routing

    @property
    def label(self) -> str:
        return f"{self.model.name} {self.part} {self.routing}"

    @property
    def where(self) -> str:
        return f"{self.model.name} {self.part}"

    def fields(self) -> dict:
        return dict(model=self.model.name, routing=self.routing, part=self.part)

    def peer_fields(self) -> dict:
        """What the humming-kernels worker needs to draw the same weight and inputs."""
        return dict(
            seed=_SEEDS[self.stack], routing=self.routing, per_slot=self.part == "grouped_w2", bias=self.model.bias
        )

    @property
    def w(self) -> torch.Tensor:
        return self.experts.w(self.stack)

    @property
    def bias(self) -> torch.Tensor | None:
        return self.experts.bias(self.stack)

    def qweights(self, stack: str | None = None) -> list:
        """humming's quantized copies of ``stack`` (default: this part's)."""
        return self.experts.qweights(stack or self.stack)

    def inputs(self, m: int) -> Inputs:
        def build() -> Inputs:
            model, dtype, device = self.model, self.dtype, self.device
            ids = inputs.routing(m, model.experts, model.topk, device, self.routing)
            if self.part == "grouped_w2":  # one hidden row per routed slot
                x = inputs.activations(m * model.topk, self.shape.k, dtype, device)
                return Inputs(m, x, ids.reshape(-1, 1))
            x = inputs.activations(m, self.shape.k, dtype, device)
            return Inputs(m, x, ids, inputs.topk_weights(ids) if self.part == "layer" else None)

        return self.cached(("inputs", m), build)

    def reference(self, inp: Inputs) -> torch.Tensor:
        """float32, from the unquantized weights: per routed slot (grouped parts) or the layer's ``[M, H]``."""
        if self.part != "layer":
            return inputs.moe_reference(inp.x, self.w, inp.ids, self.bias)
        model, ex = self.model, self.experts
        h = inputs.moe_reference(inp.x, ex.w("w13"), inp.ids, ex.bias("w13"))
        activation = check_activation(model.activation, model.alpha, model.limit, model.gate_up_layout)
        hidden = activate(h, activation, torch.float32)
        y = inputs.moe_reference(hidden, ex.w("w2"), inp.ids.reshape(-1, 1), ex.bias("w2"))
        return (y.view(inp.m, model.topk, -1) * inp.weights[..., None]).sum(1)

    def floor_bytes(self, inp: Inputs) -> int:
        """The bytes of humming's quantized experts that ``inp``'s routing hits (both stacks for the layer)."""
        stacks = ("w13", "w2") if self.part == "layer" else (self.stack,)
        per_expert = sum(nbytes(self.qweights(s)[0]) for s in stacks) // self.model.experts
        return per_expert * inp.ids.unique().numel()

    def grouped(self, inp: Inputs, backend: str = "auto"):
        """humming's grouped layout for ``inp`` on the routing of ``backend``'s layer (:func:`block_m_of`):
        ``(rows [M_pad, K], routing, block_m)``."""
        block_m = block_m_of(self.experts, inp.ids.numel(), inp.x, backend)

        def build():
            from ..moe import moe_align

            routing = moe_align(inp.ids, self.shape.experts, block_m)
            rows = inp.x[routing.src_slots.clamp_min(0).long() // inp.ids.shape[1]]
            return rows, routing, block_m

        return self.cached(("grouped", inp.m, block_m), build)

    def sorted_rows(self, inp: Inputs):
        """The unpadded grouped layout: ``(rows [M * topk, K] sorted by expert, slot order, rows per expert)``."""

        def build():
            order, counts = inputs.sorted_routing(inp.ids, self.shape.experts)
            return inp.x[order // inp.ids.shape[1]], order, counts

        return self.cached(("sorted", inp.m), build)


def grouped_reference(x, qw, ids: torch.Tensor, block_m: int, rows, bias) -> torch.Tensor:
    """float64 grouped rows of a grouped GEMM's call on the dequantized experts of ``qw``: row ``r`` of
    ``x`` (or token ``rows[r]`` of it, zeros for -1) times expert ``ids[r // block_m]``, plus its bias; NaN in
    rows of unused segments. The reference of the kernel sweeps in ``bench/tools``."""
    from .. import dequantize
    from ..moe import expert_weight

    grouped = x if rows is None else torch.where(rows[:, None] >= 0, x[rows.clamp(min=0).long()], 0)
    row_expert = ids.repeat_interleave(block_m)
    ref = torch.full((grouped.shape[0], qw.N), float("nan"), device=x.device, dtype=torch.float64)
    for e in row_expert.unique().tolist():
        if e >= 0:
            sel = row_expert == e
            w = dequantize(expert_weight(qw, e), x.dtype).double()
            ref[sel] = grouped[sel].double() @ w.T + (0 if bias is None else bias[e].double())
    return ref


def grouped_call(inp, stack: str, num_experts: int, block_m: int):
    """fused_moe's view of one grouped GEMM of ``inp`` (a :class:`MoeGroup`'s inputs) in routing blocks of
    ``block_m``: w13 reads the tokens through the routing's row index, w2 reads grouped rows. Returns ``(x,
    rows, expert_ids, m_pad, used)``; ``rows`` is ``None`` for w2, ``used`` flags the grouped rows that hold a
    routed slot (the rows a check compares)."""
    from ..moe import moe_align

    routing = moe_align(inp.ids, num_experts, block_m)
    if stack == "w13":
        x, rows = inp.x, routing.token_rows(inp.ids.shape[1])
    else:
        x, rows = inp.x[routing.src_slots.clamp_min(0).long()], None
    ids, m_pad = routing.expert_ids, routing.src_slots.shape[0]
    used = ids.repeat_interleave(block_m) >= 0
    if rows is not None:
        used &= rows >= 0
    return x, rows, ids, m_pad, used


def sweep_points(models, stacks, m_values, budget_s: float, cases: dict):
    """The points of a kernel sweep (``bench/tools``): ``(model name, part, MoeGroup, M)`` for each model of
    ``models`` (its experts built once, bfloat16, in the case ``cases`` names for it, else int4 g128, and freed
    after it), each part of ``stacks`` (``grouped_w13`` / ``grouped_w2``, random routing) and each M; no new
    point once ``budget_s`` seconds have passed since the first."""
    import time

    start = time.monotonic()
    for name in models:
        experts = Experts(MODELS[name], cases.get(name, "w4a16-int4-g128"), torch.bfloat16, "cuda")
        for stack in stacks:
            for m in m_values:
                if time.monotonic() - start > budget_s:
                    break
                yield name, stack, MoeGroup(experts, stack, "random"), m
        del experts
        torch.cuda.empty_cache()


def run_sweep(points, measure, summarize, op: str, out) -> None:
    """A kernel sweep over ``points`` (:func:`sweep_points`): ``measure(group, m)`` gives a point's rows (none:
    the point is skipped), ``summarize(rows)`` its line after the model, stack and M, printed as it comes. The
    rows go to the JSON file ``out`` under a header naming ``op``, the device and the command; the lines are
    printed again at the end."""
    import json
    import sys
    from pathlib import Path

    rows, summary = [], []
    for name, stack, group, m in points:
        got = measure(group, m)
        if not got:
            continue
        rows += got
        summary.append(f"{name:14} {stack:11} M={m:<5} " + summarize(got))
        print(summary[-1], flush=True)
    header = dict(op=op, device=torch.cuda.get_device_name(), command=" ".join(sys.argv))
    Path(out).write_text(json.dumps(dict(header=header, rows=rows), indent=1))
    print("\n".join(summary))


def coarse_to_fine(values) -> list[int]:
    """``values`` sorted, then reordered so that every prefix spans the range: both ends, then the middle of
    each gap, level by level (a sweep cut short by its budget still has small and large M)."""
    values = sorted(set(values))
    if len(values) <= 2:
        return values
    picked, gaps = [0, len(values) - 1], [(0, len(values) - 1)]
    while gaps:
        lo, hi = gaps.pop(0)
        if hi - lo > 1:
            mid = (lo + hi) // 2
            picked.append(mid)
            gaps += [(lo, mid), (mid, hi)]
    return [values[i] for i in picked]


def block_m_of(experts: Experts, num_slots: int, x: torch.Tensor, backend: str = "auto") -> int:
    """The routing block humming's fused_moe takes for ``num_slots`` slots of 16-bit tokens like ``x`` on
    ``backend`` (:func:`humming.moe.grouped.layer_block_m`): the grouped parts are timed on the routing of the
    layer that runs them (a Triton kernel's tile divides the routing block: on the CUDA layer's fitted blocks,
    such as 144, it would run 16-row tiles)."""
    from ..ir.activation import get_act_scheme
    from ..moe.grouped import layer_block_m

    w13, w2 = experts.qweights("w13")[0], experts.qweights("w2")[0]
    act = None if CASES[experts.case][1] is None else get_act_scheme(CASES[experts.case][1])
    return layer_block_m(num_slots, w13, w2, x, act, backend)


def warm(experts: Experts, m_values, act) -> None:
    """Compile, in parallel, the CUDA kernels humming's grouped GEMMs of both stacks run at ``m_values``
    tokens (the routing's padded row counts, per ``block_m``)."""
    import humming

    from ..moe import padded_rows

    model = experts.model
    by_block: dict[int, list[int]] = {}
    x = torch.empty(0, model.hidden, dtype=experts.dtype, device=experts.device)
    for m in m_values:
        block_m = block_m_of(experts, m * model.topk, x)
        by_block.setdefault(block_m, []).append(padded_rows(m * model.topk, model.experts, block_m))
    bias = experts.bias("w13")
    for stack in ("w13", "w2"):
        for block_m, rows in by_block.items():
            humming.warmup(
                experts.qweights(stack)[:1],
                rows,
                act,
                act_dtype=experts.dtype,
                bias_dtype=None if bias is None else bias.dtype,
                block_ms=(block_m,),
                progress=False,
            )


# ----------------------------------------------------------------------------------------------- humming
def _slot_order(routing) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda out: out[routing.slot_rows.long()]


def _humming(group: MoeGroup, inp: Inputs) -> Prepared:
    from ..dispatch.plan import plan_grouped
    from ..moe import grouped_linear

    if group.part == "layer":
        return _humming_layer(group, inp)
    qws = group.qweights()
    rows, routing, block_m = group.grouped(inp)
    if group.part == "grouped_w13":  # as fused_moe: the tokens read in place through the routing's row index
        kernel = plan_grouped(qws[0], group.act, inp.x, block_m, m_pad=rows.shape[0]).kernel
        call = partial(grouped_linear, inp.x, rows=routing.token_rows(inp.ids.shape[1]))
    else:  # w2's input is already in grouped order (the activation pass writes it so)
        kernel = plan_grouped(qws[0], group.act, rows, block_m).kernel
        call = partial(grouped_linear, rows)
    calls = [partial(call, qweight=qw, expert_ids=routing.expert_ids, block_m=block_m, act=group.act) for qw in qws]
    return Prepared(calls, kernel, _slot_order(routing))


def _humming_layer(group: MoeGroup, inp: Inputs) -> Prepared:
    """``fused_moe`` on each (w13, w2) copy pair, with int32 ids as vLLM and SGLang pass them (one token's
    call then runs without an alignment: :func:`humming.moe.fused.slot_route`); ``kernel``: the kernels its two
    GEMMs run."""
    from ..dispatch.plan import plan_grouped
    from ..moe import fused_moe

    model = group.model
    w13s, w2s = group.qweights("w13"), group.qweights("w2")
    rows, _, block_m = group.grouped(inp)
    hidden = rows.new_empty(rows.shape[0], model.inter)
    # the plans fused_moe makes: w13 on the tokens it gathers into the grouped rows, w2 on the grouped rows
    w13_plan = plan_grouped(w13s[0], group.act, inp.x, block_m, m_pad=rows.shape[0])
    kernels = [w13_plan.kernel, plan_grouped(w2s[0], group.act, hidden, block_m).kernel]
    layer = partial(
        fused_moe,
        activation=model.activation,
        alpha=model.alpha,
        limit=model.limit,
        gate_up_layout=model.gate_up_layout,
        act=group.act,
    )
    pairs = [(w13s[i % len(w13s)], w2s[i % len(w2s)]) for i in range(max(len(w13s), len(w2s)))]
    ids = inp.ids.to(torch.int32)
    calls = [partial(layer, inp.x, w13, w2, inp.weights, ids) for w13, w2 in pairs]
    return Prepared(calls, " + ".join(kernels))


def _grouped_kernel(name: str) -> Callable[[MoeGroup, Inputs], Prepared | str]:
    def prepare(group: MoeGroup, inp: Inputs) -> Prepared | str:
        kernel, qws = GROUPED_KERNELS[name], group.qweights()
        rows, routing, block_m = group.grouped(inp, kernel.backend)
        reason = kernel.unsupported(qws[0], group.act, rows, block_m)
        if reason is not None:
            return reason
        run, gather = partial(kernel.run, rows), {}
        through_index = kernel.gathers(qws[0], group.act, inp.x.shape[0], rows.shape[0])
        if group.part == "grouped_w13" and through_index:  # as humming's row: through the index
            run, gather = partial(kernel.run, inp.x), {"rows": routing.token_rows(inp.ids.shape[1])}
        args = (routing.expert_ids, block_m)
        calls = [partial(run, qw, *args, qw.bias, group.act, group.dtype, None, **gather) for qw in qws]
        return Prepared(calls, name, _slot_order(routing))

    return prepare


# ------------------------------------------------------------------------------------------------- torch
def _unsorted(order: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda out: torch.empty_like(out).index_copy_(0, order, out)


def _sorted_bias(group: MoeGroup, inp: Inputs, order: torch.Tensor) -> torch.Tensor | None:
    """The bias row of each sorted row (``[M * topk, N]``), or ``None``."""
    b = group.bias
    return None if b is None else b[inp.ids.reshape(-1)[order]]


def _plus(out: torch.Tensor, add: torch.Tensor | None) -> torch.Tensor:
    return out if add is None else out.add_(add)


def _torch_grouped(group: MoeGroup, inp: Inputs) -> Prepared:
    rows, order, counts = group.sorted_rows(inp)
    offsets = counts.cumsum(0).to(torch.int32)
    add = _sorted_bias(group, inp, order)

    def call(w):
        return _plus(torch._grouped_mm(rows, w.transpose(-2, -1), offs=offsets), add)

    return Prepared([partial(call, w) for w in weight_copies(group)], "torch._grouped_mm", _unsorted(order))


def scaled_grouped_mm(
    x: torch.Tensor, codes: torch.Tensor, w_scale: torch.Tensor, offsets: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """``torch._scaled_grouped_mm`` of 16-bit rows ``x [R, K]`` sorted by expert (``offsets``: int32 ``[E]``,
    the end row of each expert), quantized to e4m3 per row in the call, with the e4m3 experts ``codes
    [E, N, K]`` scaled per channel (``w_scale`` float32 ``[E, N]``) -> ``[R, N]`` in ``out_dtype``."""
    xq, x_scale = e4m3_rows(x)
    mat_b = codes.transpose(-2, -1)  # [E, K, N], column-major as the op requires
    return torch._scaled_grouped_mm(xq, mat_b, x_scale.reshape(-1), w_scale, offs=offsets, out_dtype=out_dtype)


def _torch_scaled_grouped(group: MoeGroup, inp: Inputs) -> Prepared | str:
    if group.device != "cuda":
        return "torch._scaled_grouped_mm has CUDA kernels only"
    rows, order, counts = group.sorted_rows(inp)
    offsets = counts.cumsum(0).to(torch.int32)
    add = _sorted_bias(group, inp, order)

    def call(codes, scales):
        return _plus(scaled_grouped_mm(rows, codes, scales, offsets, group.dtype), add)

    calls = [partial(call, *w) for w in group.experts.fp8_copies(group.stack)]
    return Prepared(calls, "torch._scaled_grouped_mm", _unsorted(order))


def systems() -> list[System]:
    """The systems of op ``moe``, in the order rows are written."""
    found = [System("humming", "humming", _humming)]
    kernels = [k for k in GROUPED_KERNELS if k != "reference"]
    found += [System(f"humming:{k}", "humming", _grouped_kernel(k), parts=GROUPED) for k in kernels]
    found += [
        System(
            "torch-grouped-mm",
            "torch",
            _torch_grouped,
            shared=True,
            unavailable=missing_torch("_grouped_mm"),
            parts=GROUPED,
        ),
        System(
            "torch-scaled-grouped-mm",
            "torch",
            _torch_scaled_grouped,
            shared=True,
            unavailable=missing_torch("_scaled_grouped_mm"),
            parts=GROUPED,
        ),
        System(PEER, PEER, None, tuple(PEER_CONFIGS), parts=GROUPED),
    ]
    return found
