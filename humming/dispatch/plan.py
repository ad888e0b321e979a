"""The one decision: which kernel (and tuning) runs a call. ``linear``, ``grouped_linear``, ``fused_moe``,
``prepare``, ``warmup`` and ``explain`` all ask :func:`plan_linear` / :func:`plan_grouped`.

Order of precedence:

1. ``backend=`` (or ``HUMMING_BACKEND`` in place of ``"auto"``) narrows the candidates to one backend.
2. On a CUDA device whose capability and multiprocessor count match a table (``humming/dispatch/tables/``,
   or ``HUMMING_TABLES_DIR``; written by ``python -m humming tune``), the table's kernel order
   for the weight format, activation scheme, nearest measured shape and M bucket comes first. A table
   covers the M range it measured: an M above its largest bucket falls back to the heuristic, never to a
   small-M entry. A table recorded on a GPU of the device's own name comes first for the (weight, activation)
   pairs and M it holds; another table of its capability and SM count serves the rest.
3. Otherwise the heuristic order (:func:`heuristic_order`), from what was measured on Hopper.
4. The first candidate whose ``unsupported`` returns ``None`` wins; every other candidate's reason is
   kept in ``Plan.rejected`` (``humming.explain`` prints them). CPU tensors run the reference under
   ``"auto"``.

A decision is cached per weight object and call shape (everything the kernels' checks read: activation
scheme, dtype, device, M, row alignment, block_m), so an eager decode call pays one dictionary lookup.
``HUMMING_LOG_DISPATCH=1`` logs each new decision once (logger ``humming.dispatch``).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import warnings
import weakref
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from .._env import env
from ..deterministic import is_deterministic
from ..ir.dtypes import FLOAT_DTYPES
from .kernels import BACKENDS, DENSE_KERNELS, GROUPED_KERNELS, Kernel, backend_module

__all__ = [
    "Plan",
    "Table",
    "candidate_order",
    "explain",
    "grouped_heuristic_order",
    "heuristic_order",
    "load_tables",
    "plan_grouped",
    "plan_linear",
    "requested_backend",
]

log = logging.getLogger("humming.dispatch")

TABLES_DIR = Path(__file__).parent / "tables"


@dataclass(frozen=True)
class Plan:
    """How one call runs: the kernel, its tuning (``None``: chosen by the kernel at launch), the prepared
    weight layout it reads, where the decision came from, and why each other candidate was not taken."""

    kernel: str
    backend: str
    layout: str
    tuning: object
    source: str
    rejected: tuple[tuple[str, str], ...] = field(default=())

    def describe(self) -> str:
        lines = [f"{self.kernel} (backend {self.backend}, layout {self.layout}) chosen by {self.source}"]
        if self.tuning is not None:
            lines.append(f"  tuning: {self.tuning}")
        lines += [f"  not {name}: {reason}" for name, reason in self.rejected]
        return "\n".join(lines)

    __str__ = describe


# ---------------------------------------------------------------------------------------------- tables
@dataclass(frozen=True)
class Table:
    """Kernel orders measured on one device kind: ``entries[(weight, act)][(N, K)]`` is a tuple of
    ``(largest M, kernel order)`` sorted by M, for each measured shape."""

    path: str
    capability: tuple[int, int]
    sm_count: int
    entries: dict
    device: str = ""  # the GPU's name, as torch reports it (``humming tune`` records it)
    #: The table of the same device kind that serves what this one did not measure: a GPU's own table may
    #: hold only the cases (and M) tuned on it.
    fallback: Table | None = None

    def lookup(self, weight: str, act: str, m: int, n: int, k: int) -> tuple[tuple[str, ...] | None, Table | None]:
        """``(order, table it came from)``: the order measured for the nearest shape (in log N + log K: the
        grid a kernel sees scales with N, its work per tile with K) up to the largest M measured there, from
        this table or else its fallback; ``(None, None)`` past it or unmeasured."""
        shapes = self.entries.get((weight, act))
        if shapes:
            near = min(shapes, key=lambda s: (abs(math.log(s[0] / n)) + abs(math.log(s[1] / k)), s))
            for bound, order in shapes[near]:
                if m <= bound:
                    return order, self
        return self.fallback.lookup(weight, act, m, n, k) if self.fallback is not None else (None, None)

    def order(self, weight: str, act: str, m: int, n: int, k: int) -> tuple[str, ...] | None:
        """The order of :meth:`lookup`, or ``None``."""
        return self.lookup(weight, act, m, n, k)[0]


@functools.cache
def load_tables(directory: str = str(TABLES_DIR)) -> tuple[Table, ...]:
    """Every table of ``directory``; a malformed table or an unknown kernel name is an error."""
    tables = []
    for path in sorted(Path(directory).glob("*.json")):
        data = json.loads(path.read_text())
        entries: dict = {}
        for row in data["entries"]:
            unknown = [k for k in row["order"] if k not in DENSE_KERNELS]
            if unknown:
                raise ValueError(f"{path}: unknown kernel(s) {unknown}; known: {sorted(DENSE_KERNELS)}")
            try:
                shape, m_max = (int(row["n"]), int(row["k"])), int(row["m_max"])
                shapes = entries.setdefault((row["weight"], row["act"]), {})
            except KeyError as err:
                raise ValueError(f"{path}: a table entry lacks the field {err}: {row}") from None
            shapes.setdefault(shape, []).append((m_max, tuple(row["order"])))
        entries = {key: {s: tuple(sorted(r)) for s, r in shapes.items()} for key, shapes in entries.items()}
        kind = (tuple(data["capability"]), int(data["sm_count"]))
        tables.append(Table(str(path), *kind, entries, data.get("device", "")))
    return tuple(tables)


def _table_for(device: torch.device) -> Table | None:
    """The table for this device kind, from ``HUMMING_TABLES_DIR`` if set (a user's own ``humming tune``
    output), else the committed ones: one measured on a GPU of this name, else one of the same compute
    capability and SM count (an H100 SXM and an H200 share those, not their memory bandwidth). A table of
    the GPU's own name serves the cases it holds; the first other table of its kind serves the rest."""
    from ..device import device_info

    info = device_info(device)
    tables = load_tables(str(env("HUMMING_TABLES_DIR") or TABLES_DIR))
    same_kind = [t for t in tables if (t.capability, t.sm_count) == (info.capability, info.sm_count)]
    own = next((t for t in same_kind if t.device == info.name), None)
    others = [t for t in same_kind if t is not own]
    if own is None:
        return others[0] if others else None
    return replace(own, fallback=others[0]) if others else own


#: From this M, e4m3 weights with 8-bit activations run first on ``cuda.scaled_mm`` (the vendor fp8 GEMM).
VENDOR_FP8_MIN_M = 256

_SCALE_TAGS = {torch.float8_e8m0fnu: "+e8m0", torch.float8_e4m3fn: "+e4m3scales"}


def weight_key(qweight) -> str:
    """How tables name a weight: its element format, then what changes which kernels run it and how fast:
    8-bit float scales (``+e8m0``: MXFP4; ``+e4m3scales``: NVFP4), the scale layout (``+group``,
    ``+channel``, ``+block``, ``+tensor``: a per-channel int4 weight takes another route than a grouped
    one), zero points (``+zp``), act-order (``+actorder``)."""
    scales = qweight.scales.dtype if qweight.scales is not None else None
    return (
        qweight.format.name
        + _SCALE_TAGS.get(scales, "")
        + f"+{qweight.layout}"
        + ("+zp" if qweight.zeros is not None else "")
        + ("+actorder" if qweight.g_idx is not None else "")
    )


def act_key(act) -> str:
    return "none" if act is None else act.name


# ------------------------------------------------------------------------------------------- heuristic
def heuristic_order(qweight, act, m: int) -> tuple[str, ...]:
    """The kernel order where no table decides. On the H200 (bench/results/h200/linear.json): the WnA16
    decode kernel serves 16-bit activations up to M = 64 and the sm_90a GEMM above M = 32; integer and MXFP4
    weights with per-token / per-tensor e4m3 activations run on the decode kernel's fp8-values route up to M = 16,
    where it beats the FP8 GEMM on most shapes (one 4-bit weight read, no int4 -> e4m3 conversion), and on the FP8
    GEMM above (it wins at M = 32 on three of the four standard shapes: bench/results/h100/fp8_prefetch_2026-12-06);
    e4m3 weights with per-tensor / per-channel scales from M = 256 on torch's fp8 GEMM
    (``cuda.scaled_mm``, faster than the FP8 GEMM's tiles there); Triton is the portable fallback, the
    reference the last resort."""
    if act is None:
        return ("cuda.wna16_sm90", "cuda.wna16_decode", "triton.wna16", "reference")
    if act.format == "e2m1":
        return ("cuda.fp4_gemm", "triton.scaled_mm", "reference")
    if m <= 16:
        return ("cuda.wna16_decode", "cuda.fp8_gemm", "cuda.wna16_sm90", "triton.scaled_mm", "reference")
    if m >= VENDOR_FP8_MIN_M and qweight.format.name == "e4m3":
        return ("cuda.scaled_mm", "cuda.fp8_gemm", "triton.scaled_mm", "reference")
    return ("cuda.fp8_gemm", "cuda.wna16_sm90", "cuda.wna16_decode", "triton.scaled_mm", "reference")


def grouped_heuristic_order(qweight, act) -> tuple[str, ...]:
    """The grouped kernel order: e4m3 experts with e4m3 activations in K groups (DeepSeek-V3's fp8 blocks)
    on the Triton grouped GEMM first, which measured faster than the CUDA FP8 grouped GEMM on the H200
    through the decode and prefill sizes of both projections (bench/results/h200/moe.json); every other
    format on the CUDA kernels first: for 16-bit activations the grouped decode kernel where it runs (routing
    blocks of 8 and 16 rows), then the grouped sm_90a GEMMs."""
    if qweight.format.name == "e4m3" and act is not None and act.format == "e4m3" and isinstance(act.group, int):
        return ("triton.grouped", "cuda.grouped", "reference")
    if act is not None:
        return ("cuda.grouped", "triton.grouped", "reference")
    return ("cuda.grouped_decode", "cuda.grouped", "triton.grouped", "reference")


# ------------------------------------------------------------------------------------------- decisions
_plans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # weight -> {call key: Plan}
_warned: set = set()


def requested_backend(backend: str) -> str:
    """The backend a call asks for: ``backend``, with ``HUMMING_BACKEND`` in place of ``"auto"`` when set."""
    if backend == "auto":
        backend = env("HUMMING_BACKEND")
    if backend != "auto" and backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {['auto', *BACKENDS]}, got {backend!r}")
    return backend


def plan_linear(qweight, act, x, backend: str = "auto") -> Plan:
    """The plan of ``humming.linear(x, qweight, act=act, backend=backend)``; ``x`` is the 2-D activation
    ``[M, K]`` (a QuantizedActivation's codes for pre-quantized input). Raises ``ValueError`` when the
    requested backend cannot run the call (naming why each of its kernels cannot)."""
    requested = requested_backend(backend)
    key = _call_key(act, x, requested, None)
    plans = _plans.get(qweight)
    plan = None if plans is None else plans.get(key)
    return plan if plan is not None else _cached(qweight, key, lambda: _decide(qweight, act, x, requested, None))


def plan_grouped(qweight, act, x, block_m: int, backend: str = "auto", m_pad: int | None = None) -> Plan:
    """The plan of ``humming.moe.grouped_linear(x, qweight, ..., block_m, act=act, backend=backend)``;
    ``m_pad``: the grouped rows of a call that gathers them from ``x`` (``rows=``), else ``x``'s rows."""
    requested = requested_backend(backend)
    key = _call_key(act, x, requested, block_m, m_pad)
    return _cached(qweight, key, lambda: _decide(qweight, act, x, requested, block_m))


def _call_key(act, x, requested: str, block_m: int | None, m: int | None = None) -> tuple:
    """What a plan depends on besides the weight (``block_m`` None: a dense call; ``m``: the rows of the call,
    when they are not ``x``'s)."""
    aligned = x.dim() == 2 and x.stride(0) % 8 == 0 and x.data_ptr() % 16 == 0
    kind = "dense" if block_m is None else "grouped"
    m = x.shape[0] if m is None else m
    return (kind, requested, act, x.dtype, x.device, m, aligned, block_m, is_deterministic())


def unwarmed_error(
    err: Exception, qweight, act, x, backend: str, block_m: int | None = None, m_pad: int | None = None
) -> RuntimeError:
    """``err`` (a kernel that could not load during a CUDA graph capture) with the warmup call that readies
    this call's kernels (``m_pad``: as :func:`plan_grouped`'s)."""
    key = _call_key(act, x, requested_backend(backend), block_m, m_pad)
    return type(err)(f"{err}. {_unwarmed(qweight, key)}")


def _cached(qweight, key, decide) -> Plan:
    plans = _plans.get(qweight)
    if plans is None:
        plans = _plans[qweight] = {}
    plan = plans.get(key)
    if plan is None:
        # A call first seen inside a CUDA graph capture is refused, whatever its backend: its kernel may need
        # compiling (NVRTC or Triton), the reference synchronises, and a weight prepared for it inside the
        # capture would hold its values only once the graph replays. Whether another call loaded the same
        # kernel earlier in this process does not change the answer.
        if key[4].type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(_unwarmed(qweight, key))
        plan = decide()
        plans[key] = plan
        if env("HUMMING_LOG_DISPATCH"):
            log.warning("humming dispatch: %s %s act=%s M=%d -> %s", qweight.describe(), key[0], key[2], key[5], plan)
    return plan


def _unwarmed(qweight, key) -> str:
    """Why a call cannot be captured: no plan was made for it before, so its kernel may not be compiled
    (CUDA kernels compile through NVRTC, Triton ones on their first launch: neither can happen in a capture)."""
    kind, backend, act, dtype, _, m, aligned, block_m = key[:8]
    entry = "humming.linear" if kind == "dense" else f"humming.moe.grouped_linear (block_m={block_m})"
    blocks = "" if kind == "dense" else f", block_ms=[{block_m}]"
    return (
        f"{entry}: a CUDA graph is being captured, but this call was never run nor warmed: weight "
        f"{qweight.describe()} {qweight.shape}, M={m}, act={act_key(act)}, x dtype {dtype}, backend {backend!r}"
        f"{'' if aligned else ', x not 16-byte aligned'}. Run it once before capture, or call "
        f"humming.warmup([weight], m_values=[{m}], act={None if act is None else repr(act.name)}, act_dtype={dtype}"
        f"{blocks}, backend={backend!r})"
    )


def candidate_order(
    qweight, act, m: int, *, requested: str, on_cuda: bool, grouped: bool, deterministic: bool, table: Table | None
) -> tuple[tuple[str, ...], str]:
    """The kernels to try, in order, and where the order comes from (a pure function of the call)."""
    kernels = GROUPED_KERNELS if grouped else DENSE_KERNELS
    if requested != "auto":
        if deterministic and not grouped:
            return tuple(k for k in _DETERMINISTIC_ORDER if kernels.backend(k) == requested), "deterministic mode"
        return tuple(k for k in kernels if kernels.backend(k) == requested), f"backend={requested!r}"
    if not on_cuda:
        return ("reference",), "CPU tensors (reference; backend='triton' runs the interpreter)"
    if grouped:
        return grouped_heuristic_order(qweight, act), "heuristic"
    if deterministic:
        return _DETERMINISTIC_ORDER, "deterministic mode (one kernel and tuning for every M)"
    heuristic = heuristic_order(qweight, act, m)
    order, source = table.lookup(weight_key(qweight), act_key(act), m, qweight.N, qweight.K) if table else (None, None)
    if order is None:
        return heuristic, "heuristic"
    return order + tuple(k for k in heuristic if k not in order), f"table {Path(source.path).name}"


def _decide(qweight, act, x, requested: str, block_m: int | None) -> Plan:
    grouped = block_m is not None
    kernels = GROUPED_KERNELS if grouped else DENSE_KERNELS
    on_cuda = x.device.type == "cuda"
    order, source = candidate_order(
        qweight,
        act,
        x.shape[0],
        requested=requested,
        on_cuda=on_cuda,
        grouped=grouped,
        deterministic=is_deterministic(),
        table=_table_for(x.device) if on_cuda and not grouped else None,
    )
    if not order:
        raise ValueError(f"backend {requested!r} has no batch-invariant kernel: use backend='triton' or 'auto'")
    rejected = []
    for name in order:
        kernel = kernels[name]
        reason = kernel.unsupported(qweight, act, x, block_m) if grouped else kernel.unsupported(qweight, act, x)
        if reason is None:
            tuning = _tuning(kernel, qweight, act, x, grouped)
            if name == "reference" and requested == "auto" and x.device.type == "cuda":
                _warn_fallback(qweight, act, x, block_m, rejected)
            return Plan(name, kernel.backend, kernel.layout, tuning, source, tuple(rejected))
        rejected.append((name, reason))
    why = "; ".join(f"{n}: {r}" for n, r in rejected)
    raise ValueError(f"backend {requested!r} cannot run this call: {why}")


def _tuning(kernel: Kernel, qweight, act, x, grouped: bool):
    if grouped:
        return None
    if is_deterministic():
        return kernel.deterministic_tuning(qweight, act, x)
    return kernel.tuning(qweight, act, x)


#: Deterministic mode: kernels whose result for a row does not depend on M (one tuning, no split-K, no
#: atomics; each has a ``deterministic_tuning``), in order; the reference is batch-invariant too (float32,
#: each dot product summed in one fixed order).
_DETERMINISTIC_ORDER = ("triton.wna16", "triton.scaled_mm", "reference")


def _warn_fallback(qweight, act, x, block_m, rejected) -> None:
    key = (qweight.describe(), getattr(act, "name", None), x.dtype, block_m)
    if key in _warned:
        return
    _warned.add(key)
    entry = "humming.linear" if block_m is None else "humming.moe.grouped_linear"
    why = "; ".join(f"{n}: {r}" for n, r in rejected)
    warnings.warn(f"{entry}: no fast kernel for {key}, running the reference ({why})", stacklevel=5)


# --------------------------------------------------------------------------------------------- explain
def explain(qweight, m: int, act=None, *, dtype: torch.dtype = torch.bfloat16, backend: str = "auto") -> Plan:
    """The plan ``humming.linear`` (``humming.moe.grouped_linear`` for an expert-stacked weight, with routing
    blocks of ``min(m, 64)`` rows rounded to 16) would follow for ``m`` tokens of ``dtype`` on the weight's
    device. ``print(humming.explain(qw, 16, act="fp8"))`` shows the kernel, its tuning, where the choice
    came from and why every other kernel was not taken."""
    from ..ir._checks import as_index
    from ..ir.activation import get_act_scheme
    from ..ir.weight import QuantizedWeight

    if not isinstance(qweight, QuantizedWeight):
        raise TypeError(f"qweight: expected a humming.QuantizedWeight, got {type(qweight).__name__}")
    act = None if act is None else get_act_scheme(act)
    m = as_index("m", m)
    largest = (2**63 - 1) // (qweight.K + 64)  # an [m, K] tensor's element count (grouped: m rounded up) fits
    if not 1 <= m <= largest:
        raise ValueError(f"m: expected a positive number of tokens up to {largest}, got {m!r}")
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"dtype: expected torch.float16, torch.bfloat16 or torch.float32, got {dtype!r}")
    # One row of memory seen as m rows (stride 0): a plan reads the activations' shape, dtype, device and
    # alignment, never their values, and m may be far more tokens than fit in memory.
    row = torch.empty(1, qweight.K, dtype=dtype, device=qweight.device)
    if qweight.num_experts is not None:
        block_m = 16 * max(1, min(m, 64) // 16)
        return plan_grouped(qweight, act, row.expand(-(-m // block_m) * block_m, -1), block_m, backend)
    return plan_linear(qweight, act, row.expand(m, -1), backend)


def prepare(qweight, backend: str = "cuda", act=None):
    """Repack ``qweight`` now into the layout ``backend`` runs it in with activation scheme ``act`` (cached
    per weight object), so that the first call does not; returns that backend's prepared form, or
    ``qweight`` itself for backends that read the IR in place (Triton, reference)."""
    from ..ir.weight import QuantizedWeight

    if not isinstance(qweight, QuantizedWeight):
        raise ValueError(f"qweight: expected a humming.QuantizedWeight, got {type(qweight).__name__}")
    module = backend_module(backend)
    return module.prepare(qweight, act) if hasattr(module, "prepare") else qweight
