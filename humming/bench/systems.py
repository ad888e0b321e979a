"""The systems ``python -m humming bench`` and bench/test_bench.py compare, on the same inputs.

A :class:`Group` is one (op, case, shape, dtype): the seeded 16-bit weight every system starts from
(:mod:`humming.bench.inputs`) and what systems build from it (cached for the group's M values). A
:class:`System` turns a group and one M's :class:`Inputs` into a :class:`Prepared`: one call per weight
copy (the copies together exceed the L2, so timed calls read cold weights), the kernel that runs, and
how to put the output in the order the float32 reference has. A system that cannot run a call returns
the reason instead. Packages other than torch and humming are imported on first use.

Systems, op ``linear`` (``x [M, K] @ W^T``):

- ``humming``: ``humming.linear(x, qw, act=act)`` (``kernel``: what the dispatcher picked);
- ``humming-compiled``: the same under ``torch.compile(fullgraph=True)`` with a dynamic M (the custom op's
  cost), at M = 1, 16 and 256;
- ``humming:<kernel>``: every kernel of ``humming.dispatch.kernels.DENSE_KERNELS`` but the reference,
  run with its own tuning where it supports the call (the best single route at each M);
- ``torch-bf16``: ``torch.nn.functional.linear`` on the unquantized weight, in the run's 16-bit dtype;
- ``torch-scaled-mm``: ``torch._scaled_mm`` on e4m3 weights (per-channel scales) and e4m3 activations
  quantized beforehand (per-token scales); ``torch-scaled-mm+quant`` quantizes the activations in the call;
- ``gemlite``: gemlite's layers (W4A16 int4 g128 from humming's codes, W8A16 int8, MXFP4 x 16-bit);
- ``humming-kernels``: upstream Humming (:mod:`humming.bench.peer`), its own quantizer and configs.

Op ``moe``: :mod:`humming.bench.moe` (model presets, the parts of their MoE layers, the systems).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch

from ..dispatch.kernels import DENSE_KERNELS
from ..dispatch.tune import CASES
from ..ir.activation import get_act_scheme
from . import inputs
from .peer import CONFIGS as PEER_CONFIGS

__all__ = [
    "OPS",
    "PEER",
    "Group",
    "Inputs",
    "Prepared",
    "Shape",
    "System",
    "copies",
    "e4m3_rows",
    "linear_systems",
    "missing_torch",
    "nbytes",
    "weight_copies",
]

OPS = ("linear", "moe")
PEER = "humming-kernels"


@dataclass(frozen=True)
class Shape:
    """``N x K``, and for op ``moe`` the experts and the experts per token."""

    n: int
    k: int
    experts: int | None = None
    topk: int | None = None

    def __str__(self) -> str:
        return f"{self.n}x{self.k}" if self.experts is None else f"{self.experts}x{self.n}x{self.k}/{self.topk}"


@dataclass(frozen=True)
class Inputs:
    """One M's inputs: activations ``x [M, K]`` and, for op ``moe``, expert ids ``[M, topk]`` and the
    layer's combine weights ``[M, topk]``. ``x`` may have a row per routed slot instead (``[M * topk, K]``,
    ``ids`` then ``[M * topk, 1]``: the input of a MoE layer's second GEMM); ``m`` counts tokens."""

    m: int
    x: torch.Tensor
    ids: torch.Tensor | None = None
    weights: torch.Tensor | None = None


@dataclass(frozen=True)
class Prepared:
    """What a system runs for one M: one call per weight copy, the kernel, and ``canonical(out)``: the
    first call's output in the reference's row order (op ``moe``: slot ``t * topk + j``)."""

    calls: list[Callable[[], torch.Tensor]]
    kernel: str | None
    canonical: Callable[[torch.Tensor], torch.Tensor] = field(default=lambda out: out)
    #: op calls one of ``calls`` makes (its time is divided by this): a compiled function runs every copy
    ops_per_call: int = 1


class Group:
    """One (op, case, shape, dtype) on one device; see the module doc (op ``moe``: its subclass
    :class:`humming.bench.moe.MoeGroup`)."""

    def __init__(self, op: str, case: str, shape: Shape, dtype: torch.dtype, device: str):
        qargs, act = CASES[case]
        self.op, self.case, self.shape, self.dtype, self.device = op, case, shape, dtype, device
        self.qargs = qargs
        self.act = None if act is None else get_act_scheme(act)
        self._cache: dict = {}

    @property
    def w(self) -> torch.Tensor:
        """The unquantized 16-bit weight every system starts from (drawn on first use)."""
        shape = self.shape
        return self.cached("w", lambda: inputs.weight(shape.n, shape.k, shape.experts, self.dtype, self.device))

    def cached(self, key, build: Callable[[], object]):
        """``build()``, once per ``key``: a name, or ``(name, M)`` for what belongs to one M (see :meth:`release`)."""
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def release(self, m: int) -> None:
        """Forget what was cached for M = ``m``: a sweep holds one M's inputs and grouped rows at a time."""
        self._cache = {key: v for key, v in self._cache.items() if not (isinstance(key, tuple) and key[1:] == (m,))}

    @property
    def label(self) -> str:
        """Names the group's shape (what the torch baselines' rows are shared by) in rows and messages."""
        return str(self.shape)

    @property
    def where(self) -> str:
        """Names where the group's calls come from, in the sweep's ``unsupported`` notes."""
        return self.label

    def fields(self) -> dict:
        """Row fields beyond the case, shape, M, dtype and system (op ``moe``: model, routing, part)."""
        return {}

    def copies(self, build: Callable[[], object], size: Callable[[object], int], first=None) -> list:
        return copies(self.device, build, size, first)

    def qweights(self) -> list:
        """humming's quantized weights (copies), shared by the ``humming`` systems."""
        import humming

        return self.cached("qweights", lambda: self.copies(lambda: humming.quantize(self.w, **self.qargs), nbytes))

    def inputs(self, m: int) -> Inputs:
        x = lambda: inputs.activations(m, self.shape.k, self.dtype, self.device)
        return self.cached(("inputs", m), lambda: Inputs(m, x()))

    def reference(self, inp: Inputs) -> torch.Tensor:
        """float32 ``x @ W^T`` of the unquantized weight."""
        return inp.x.float() @ self.w.float().T

    def floor_bytes(self, inp: Inputs) -> int:
        """Bytes a call must move: humming's quantized weight, the activations read and the output written."""
        return nbytes(self.qweights()[0]) + inp.m * (self.shape.k + self.shape.n) * self.dtype.itemsize


def copies(device: str, build: Callable[[], object], size: Callable[[object], int], first=None) -> list:
    """``build()`` as many times as it takes to exceed the L2 twice (once on the CPU); ``size(copy)``: its
    bytes; ``first``: an existing first copy (then only the others are built)."""
    first = build() if first is None else first
    if device != "cuda":
        return [first]
    from ..timing import copies_past_l2

    return [first] + [build() for _ in range(copies_past_l2(size(first)) - 1)]


def nbytes(t) -> int:
    """Bytes of a tensor or a QuantizedWeight (both have ``nbytes``)."""
    return t.nbytes


@dataclass(frozen=True)
class System:
    """A way to compute one op. ``prepare`` is ``None`` for the humming-kernels system (its worker measures
    it); ``cases``: the cases it runs (``None``: all); ``m_values``: the M it runs (``None``: all);
    ``shared``: its rows do not depend on the case (a torch baseline, measured once per shape, M and dtype);
    ``unavailable()``: ``None``, or why it cannot run in this process (a package that is not installed);
    ``parts``: op ``moe``, the parts of the layer it runs (``None``: all)."""

    name: str
    package: str
    prepare: Callable[[Group, Inputs], Prepared | str] | None
    cases: tuple[str, ...] | None = None
    shared: bool = False
    unavailable: Callable[[], str | None] = lambda: None
    m_values: tuple[int, ...] | None = None
    parts: tuple[str, ...] | None = None


# ---------------------------------------------------------------------------------------------- humming
def _humming_linear(group: Group, inp: Inputs) -> Prepared:
    import humming

    qws = group.qweights()
    kernel = humming.explain(qws[0], inp.m, group.act, dtype=group.dtype).kernel
    return Prepared([partial(humming.linear, inp.x, qw, act=group.act) for qw in qws], kernel)


#: M values of the ``humming-compiled`` rows: the compiled-vs-eager comparison of the engines' regime
COMPILED_M = (1, 16, 256)


def _humming_compiled(group: Group, inp: Inputs) -> Prepared:
    """One ``torch.compile(fullgraph=True)`` function per group that calls ``humming.linear`` on every weight
    copy (one compile for all M: the token dimension is unbacked); its time is per ``linear`` call."""
    import humming

    qws = group.qweights()

    def build():
        # One lambda's code serves every group: forget the previous groups' graphs (measured already), or
        # dynamo's recompile limit for that code is reached after a few groups.
        torch._dynamo.reset()
        return torch.compile(lambda x: [humming.linear(x, qw, act=group.act) for qw in qws], fullgraph=True)

    compiled = group.cached("compiled", build)
    x = inp.x.clone()
    torch._dynamo.decorators.mark_unbacked(x, 0)
    kernel = humming.explain(qws[0], inp.m, group.act, dtype=group.dtype).kernel
    return Prepared([partial(compiled, x)], kernel, lambda outs: outs[0], ops_per_call=len(qws))


def _dense_kernel(name: str) -> Callable[[Group, Inputs], Prepared | str]:
    def prepare(group: Group, inp: Inputs) -> Prepared | str:
        kernel, qws = DENSE_KERNELS[name], group.qweights()
        reason = kernel.unsupported(qws[0], group.act, inp.x)
        if reason is not None:
            return reason
        tuning = kernel.tuning(qws[0], group.act, inp.x)
        return Prepared([partial(kernel.run, inp.x, qw, None, group.act, group.dtype, tuning) for qw in qws], name)

    return prepare


# ------------------------------------------------------------------------------------------------ torch
def weight_copies(group: Group) -> list[torch.Tensor]:
    """``group.w`` and as many clones as it takes to exceed the L2 twice (none for a large weight)."""

    return group.cached("w copies", lambda: group.copies(group.w.clone, nbytes, first=group.w))


def _torch_linear(group: Group, inp: Inputs) -> Prepared:
    calls = [partial(torch.nn.functional.linear, inp.x, w) for w in weight_copies(group)]
    return Prepared(calls, "torch.nn.functional.linear")


def e4m3_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise e4m3 codes of ``t [R, C]`` and their float32 scales ``[R, 1]`` (absmax / 448)."""
    scale = t.abs().amax(-1, keepdim=True).float().clamp_min(1e-12) / 448
    return (t / scale).to(torch.float8_e4m3fn), scale


def _quantized_mm(x: torch.Tensor, wq: torch.Tensor, w_scale: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    xq, x_scale = e4m3_rows(x)
    return torch._scaled_mm(xq, wq.t(), scale_a=x_scale, scale_b=w_scale, out_dtype=out_dtype)


def _fp8_weights(group: Group) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """e4m3 weight copies with per-channel scales ``[1, N]`` (the row-wise layout ``_scaled_mm`` takes)."""

    def build():
        codes, scale = e4m3_rows(group.w)
        return codes, scale.T.contiguous()

    return group.cached("fp8", lambda: group.copies(build, lambda c: c[0].nbytes))


def _torch_scaled_mm(group: Group, inp: Inputs) -> Prepared:
    xq, x_scale = group.cached(("xq", inp.m), lambda: e4m3_rows(inp.x))
    mm = partial(torch._scaled_mm, xq, scale_a=x_scale, out_dtype=group.dtype)
    return Prepared([partial(mm, wq.t(), scale_b=s) for wq, s in _fp8_weights(group)], "torch._scaled_mm")


def _torch_scaled_mm_quant(group: Group, inp: Inputs) -> Prepared:
    calls = [partial(_quantized_mm, inp.x, wq, s, group.dtype) for wq, s in _fp8_weights(group)]
    return Prepared(calls, "torch._scaled_mm")


def missing_torch(name: str) -> Callable[[], str | None]:
    return lambda: None if hasattr(torch, name) else f"torch {torch.__version__} has no torch.{name}"


# ---------------------------------------------------------------------------------------------- gemlite
GEMLITE_CASES = ("w4a16-int4-g128", "w8a16-int8-channel", "mxfp4-a16")


def _gemlite_layer(group: Group):
    from gemlite import helper

    kwargs = dict(device=group.device, dtype=group.dtype)
    if group.case == "w4a16-int4-g128":  # humming's own codes and scales: (u - 8) * s = the int4 value * s
        from ..ir.quantize import unpacked_codes

        qw = group.qweights()[0]
        codes = (qw.format.decode(unpacked_codes(qw)) + 8).to(torch.uint8)
        zeros = torch.full_like(qw.scales, 8)
        return helper.A16W4_HQQ_INT(**kwargs).from_weights(W_q=codes, scales=qw.scales, zeros=zeros)
    if group.case == "w8a16-int8-channel":
        return helper.A16W8_INT8(**kwargs).from_weights(group.w)
    linear = torch.nn.Linear(group.shape.k, group.shape.n, bias=False, device=group.device, dtype=group.dtype)
    linear.weight.data.copy_(group.w)
    return helper.A16W4_MXFP(**kwargs).from_linear(linear)


def _gemlite(group: Group, inp: Inputs) -> Prepared:
    layers = group.cached("gemlite", lambda: group.copies(lambda: _gemlite_layer(group), _module_bytes))
    return Prepared([partial(layer, inp.x) for layer in layers], None)


def _module_bytes(module: torch.nn.Module) -> int:
    return sum(t.nbytes for t in module.state_dict().values())


def _not_installed(module: str, package: str) -> Callable[[], str | None]:
    return lambda: None if importlib.util.find_spec(module) else f"{package} is not installed"


# ------------------------------------------------------------------------------------------------ systems
def linear_systems() -> list[System]:
    """The systems of the ``linear`` op, in the order rows are written (``moe``'s: :mod:`humming.bench.moe`)."""
    found = [System("humming", "humming", _humming_linear)]
    found.append(System("humming-compiled", "humming", _humming_compiled, m_values=COMPILED_M))
    found += [System(f"humming:{k}", "humming", _dense_kernel(k)) for k in DENSE_KERNELS if k != "reference"]
    found += [
        System("torch-bf16", "torch", _torch_linear, shared=True),
        System("torch-scaled-mm", "torch", _torch_scaled_mm, shared=True, unavailable=missing_torch("_scaled_mm")),
        System(
            "torch-scaled-mm+quant",
            "torch",
            _torch_scaled_mm_quant,
            shared=True,
            unavailable=missing_torch("_scaled_mm"),
        ),
        System("gemlite", "gemlite", _gemlite, GEMLITE_CASES, unavailable=_not_installed("gemlite", "gemlite")),
    ]
    found.append(System(PEER, PEER, None, tuple(PEER_CONFIGS)))
    return found
