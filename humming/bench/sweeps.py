"""The sweeps of ``python -m humming bench`` and their command line:

    python -m humming bench linear --out bench/results/h200/linear.json   # the standard dense sweep
    python -m humming bench moe --models deepseek-v3 --m 1,16,256 --budget-s 120 --out moe.json
    python -m humming bench linear --shapes 64x64 --m 1,5 --check-only  # CPU: every system's result

For every case (``humming.dispatch.tune.CASES``), shape, 16-bit dtype and M, each system of
:func:`registry` (:mod:`humming.bench.systems`, :mod:`humming.bench.moe`) that runs the call gets one row:
its CUDA-graph and eager time per call (:mod:`humming.timing`, weights rotated past the L2) and the floor,
the bytes the call must move over the device's copy bandwidth. ``humming`` rows name the kernel the
dispatcher picked; one ``humming:<kernel>`` row per kernel that supports the call shows the best single
route beside it. ``check_only`` (any device, no GPU needed) computes each system's output once and records
its relative error against the float32 product of the unquantized weight instead of timing it.

Op ``moe`` (:mod:`humming.bench.moe`) sweeps models (``--models``, presets of real serving shapes, or
``--shapes``) in their formats, and for each M (in :func:`~humming.bench.moe.coarse_to_fine` order) the
parts of the layer (the two grouped GEMMs and the whole ``fused_moe``) under two routings (uniformly random
and skewed); each (model, case, dtype) gets an equal share of the budget left, so that a sweep cut short
still covers every model. The JSON holds a header (device, roofs, package versions, date, systems skipped
and why) and the rows; ``bench/report.py`` turns it into tables and plots.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from functools import partial
from importlib import metadata
from pathlib import Path

import torch
from tqdm import tqdm

from .._cli import Formatter, print_json, print_table
from ..dispatch.tune import CASES
from . import peer
from .inputs import ROUTINGS, rel_err
from .moe import MODELS, PARTS, Experts, MoeGroup, MoeModel, coarse_to_fine, systems, warm
from .systems import OPS, PEER, Group, Inputs, Shape, System, linear_systems

__all__ = [
    "CHECK_TOLERANCE",
    "COPY_BYTES_PER_S",
    "DEFAULTS",
    "ROUNDS",
    "add_arguments",
    "copy_roof",
    "main",
    "parse_shapes",
    "registry",
    "run",
    "sweep",
]

#: Device name -> its measured device-to-device copy bandwidth (bytes read + written per second): the roof of
#: the floor (:func:`copy_roof`; a device without an entry has its own measured when a sweep starts).
COPY_BYTES_PER_S = {"NVIDIA H200": 4.3e12}
#: The device whose roof a check-only run without a GPU counts the floor against (it times nothing).
_REFERENCE_DEVICE = "NVIDIA H200"
#: Relative error (against the unquantized float32 product) above which check_only reports a failure:
#: round-to-nearest 4-bit weights stay near 0.1-0.2 on these Gaussian inputs; a wrong layout gives ~1.4.
CHECK_TOLERANCE = 0.35

#: op -> the standard sweep (CLI defaults): cases, shapes (op moe: models, each in its own cases), M values.
DEFAULTS = {
    "linear": dict(
        cases="w4a16-int4-g128,mxfp4-a16,w8a8-fp8-channel,w4a8-int4-g128-fp8,w8a8-fp8-block",
        shapes="28672x8192,8192x8192,7168x2048,2048x7168",
        m=",".join(str(1 << i) for i in range(14)),
    ),
    "moe": dict(
        models=",".join(MODELS),
        cases="w4a16-int4-g128,w8a8-fp8-block",  # of --shapes
        m=",".join(str(1 << i) for i in range(14)),
    ),
}
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: Interleaved timing rounds per point (see ``_Run.local_rows``; ``--rounds``).
ROUNDS = 3


def registry(op: str) -> dict[str, System]:
    """The systems of ``op`` (one of :data:`OPS`) by name, in the order rows are written."""
    if op not in OPS:
        raise ValueError(f"op: expected one of {OPS}, got {op!r}")
    return {s.name: s for s in (linear_systems() if op == "linear" else systems())}


def parse_shapes(op: str, text: str) -> list[Shape]:
    """``NxK[,...]`` (op ``linear``) or ``ExNxK/TOPK[,...]`` (op ``moe``)."""
    expected = "NxK[,NxK...]" if op == "linear" else "ExNxK/TOPK[,...]"
    try:
        shapes = []
        for item in text.split(","):
            dims, _, topk = item.partition("/")
            values = [int(v) for v in dims.lower().split("x")]
            if op == "linear" and len(values) == 2 and not topk:
                shapes.append(Shape(*values))
            elif op == "moe" and len(values) == 3 and topk:
                shapes.append(Shape(values[1], values[2], values[0], int(topk)))
            else:
                raise ValueError(item)
    except ValueError as err:
        raise ValueError(f"shapes: expected {expected} for op {op!r}, got {text!r}") from err
    return shapes


def sweep(
    op: str,
    cases: Sequence[str],
    shapes: Sequence[Shape],
    m_values: Sequence[int],
    dtypes: Sequence[torch.dtype] = (torch.bfloat16,),
    systems: Sequence[str] | None = None,
    budget_s: float = math.inf,
    *,
    models: Sequence[MoeModel] = (),
    routings: Sequence[str] = ROUTINGS,
    parts: Sequence[str] = PARTS,
    out: str | os.PathLike | None = None,
    check_only: bool = False,
    peer_site: str | None = None,
    copy_bytes_per_s: float | None = None,
    command: str = "",
    progress: bool = True,
    rounds: int = ROUNDS,
) -> dict:
    """Measure (or with ``check_only``, check) every system named in ``systems`` (default: all of
    ``registry(op)``) on every case, shape, dtype and M; returns ``{"header", "rows"}`` and writes it to
    ``out`` after each (case, shape, dtype) (op ``moe``: after each M) and at the end. Points past
    ``budget_s`` seconds are counted in ``header["not_measured"]``, not timed. Timing needs a CUDA GPU;
    ``check_only`` runs anywhere.

    Op ``moe``: ``models`` (:data:`MODELS` presets, each in its own cases, or ``cases`` when given) and
    the ``shapes`` (``w13`` shapes of SwiGLU layers, in ``cases``), each part of ``parts`` under each
    routing of ``routings``."""
    known = registry(op)
    unknown = [c for c in cases if c not in CASES] + [c for m in models for c in m.cases if c not in CASES]
    if unknown:
        raise ValueError(f"cases: unknown {unknown}; known: {sorted(CASES)}")
    names = list(known) if systems is None else list(systems)
    unknown = [s for s in names if s not in known]
    if unknown:
        raise ValueError(f"systems: unknown {unknown} for op {op!r}; known: {list(known)}")
    if not m_values or not all(isinstance(m, int) and m > 0 for m in m_values):
        raise ValueError(f"m_values: expected positive token counts, got {list(m_values)!r}")
    if any((s.experts is None) != (op == "linear") for s in shapes):
        raise ValueError(f"shapes: op {op!r} expects {'N x K' if op == 'linear' else 'E x N x K / topk'} shapes")
    if op == "linear" and models:
        raise ValueError("models: MoE models are for op 'moe'")
    if not set(routings) <= set(ROUTINGS) or not routings:
        raise ValueError(f"routings: expected some of {ROUTINGS}, got {list(routings)}")
    if not set(parts) <= set(PARTS) or not parts:
        raise ValueError(f"parts: expected some of {PARTS}, got {list(parts)}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if not check_only and device != "cuda":
        raise ValueError("check_only: timing needs a CUDA GPU (none is visible); --check-only runs anywhere")

    roof = copy_roof(device) if copy_bytes_per_s is None else (copy_bytes_per_s, "given (--copy-bw)")
    header = _header(op, device, check_only, budget_s, roof, command)
    doc = {"header": header, "rows": []}
    chosen: list[System] = []
    worker = None
    for name in names:
        system = known[name]
        reason = system.unavailable()
        if system.prepare is None and reason is None:  # humming-kernels, in its own process
            found = peer.find_site(peer_site)
            reason = found if isinstance(found, str) else None if device == "cuda" else "needs a CUDA GPU"
            if reason is None:
                worker = peer.Worker(found[0])
                header["versions"][PEER] = found[1]
        if reason is None:
            chosen.append(system)
        else:
            header["skipped"][name] = reason

    save = (lambda: None) if out is None else partial(_write, out, doc)
    run = _Run(doc, device, check_only, time.time() + budget_s, roof[0], worker, rounds, save)
    if op == "linear":
        jobs = [(case, shape, dtype) for case in cases for shape in shapes for dtype in dtypes]
        points = len(jobs) * len(chosen) * len(m_values)
    else:
        models = list(models) + [MoeModel.from_shape(s, cases or DEFAULTS["moe"]["cases"].split(",")) for s in shapes]
        jobs = [(model, case, dtype) for model in models for case in (cases or model.cases) for dtype in dtypes]
        points = len(jobs) * len(chosen) * len(m_values) * len(parts) * len(routings)
    bar = tqdm(total=points, desc=f"humming bench {op}", unit="point", file=sys.stderr, disable=not progress)
    try:
        for i, job in enumerate(jobs):
            if op == "linear":
                run.linear_job(*job, chosen, m_values, bar)
            else:
                run.deadline = min(run.final, time.time() + (run.final - time.time()) / (len(jobs) - i))
                run.moe_job(*job, chosen, m_values, routings, parts, bar)
            if device == "cuda":
                torch.cuda.empty_cache()
            save()
    finally:
        bar.close()
        if worker is not None:
            worker.close()
    save()
    return doc


class _Run:
    """What one sweep shares across groups: the rows' device and roof, the deadlines (the sweep's ``final`` one
    and the current job's), the torch baselines measured so far (they do not depend on the case) and the
    humming-kernels worker; ``save()`` writes the sweep's document so far."""

    def __init__(self, doc, device, check_only, deadline, roof, worker, rounds: int, save):
        self.header, self.device, self.check_only = doc["header"], device, check_only
        self.rows = doc["rows"]
        self.final = self.deadline = deadline
        self.roof, self.worker, self.rounds, self.save = roof, worker, rounds, save
        self.shared: dict = {}

    def _runs(self, systems: list[System], case: str, part: str | None = None) -> list[System]:
        """The systems that run ``case`` (and ``part``); a system left out for its case is noted in the header."""
        runs = []
        for s in systems:
            if part is not None and s.parts is not None and part not in s.parts:
                continue
            if s.cases is not None and case not in s.cases:
                self.header["unsupported"][f"{s.name} {case}"] = f"not supported by {s.package}"
                continue
            runs.append(s)
        return runs

    def linear_job(self, case: str, shape: Shape, dtype: torch.dtype, systems: list[System], m_values, bar) -> None:
        group = Group("linear", case, shape, dtype, self.device)
        bar.set_postfix_str(f"{case} {shape} {_dtype_name(dtype)}")
        if self.device == "cuda" and not self.check_only and time.time() < self.deadline:
            _warm(group, m_values)
        runs = self._runs(systems, case)
        bar.update((len(systems) - len(runs)) * len(m_values))
        self.rows += self.local_rows(group, [s for s in runs if s.prepare is not None], m_values, bar)
        for system in runs:
            if system.prepare is None:
                self.rows += self.peer_rows(group, system, m_values, bar)

    def moe_job(self, model: MoeModel, case: str, dtype, systems: list[System], m_values, routings, parts, bar):
        """Every part and routing of one (model, case, dtype) at each M, M by M (:func:`coarse_to_fine`)."""
        experts = Experts(model, case, dtype, self.device)
        groups = [MoeGroup(experts, part, routing) for part in parts for routing in routings]
        bar.set_postfix_str(f"{model.name} {case} {_dtype_name(dtype)}")
        if self.device == "cuda" and not self.check_only and time.time() < self.deadline:
            try:
                warm(experts, m_values, groups[0].act)
            except Exception as err:  # the timed calls compile what is missing (or record why they cannot)
                tqdm.write(f"humming bench: warmup of {model.name} {case}: {type(err).__name__}: {err}", sys.stderr)
        runs = {g.part: self._runs(systems, case, g.part) for g in groups}
        for m in coarse_to_fine(m_values):
            for group in groups:
                part_runs = runs[group.part]
                bar.update(len(systems) - len(part_runs))
                self.rows += self.local_rows(group, [s for s in part_runs if s.prepare is not None], [m], bar)
                for system in part_runs:
                    if system.prepare is None:
                        self.rows += self.peer_rows(group, system, [m], bar)
                group.release(m)
            self.save()

    def row(self, group: Group, system: System, inp: Inputs, kernel, result: dict) -> dict:
        from ..dispatch.plan import act_key, weight_key

        row = dict(
            op=group.op,
            **group.fields(),
            case=group.case,
            weight=weight_key(group.qweights()[0]),
            act=act_key(group.act),
            n=group.shape.n,
            k=group.shape.k,
        )
        if group.op == "moe":
            row.update(experts=group.shape.experts, topk=group.shape.topk)
        row.update(m=inp.m, dtype=_dtype_name(group.dtype), system=system.name, kernel=kernel)
        row.update({key: round(v, 4) if isinstance(v, float) else v for key, v in result.items()})
        row["floor_us"] = round(group.floor_bytes(inp) / self.roof * 1e6, 4)
        row["device"] = self.header["device"]["name"]
        row["versions"] = {system.package: self.header["versions"].get(system.package)}
        return row

    def local_rows(self, group: Group, systems: list[System], m_values, bar) -> list[dict]:
        """Rows of the in-process ``systems`` at every M. At one M, every system is prepared first and then
        timed in ``rounds`` interleaved rounds, each keeping its fastest round: a clock or thermal drift
        during the sweep shifts all systems of a point alike, so two routes that run the same kernel (the
        ``humming`` row and its ``humming:<kernel>`` route) agree to within the timing noise. The first
        point's first system is timed once more beforehand and that timing dropped: the first CUDA graph timed
        after a group's weights are made can replay slower than the same kernel timed next (bench/results/h200/
        NOTES.md has the measurement). An error of that timing is kept in the header's
        ``dropped_timing_errors`` (a lasting one is also the kept timing's row)."""
        rows = []
        for index, m in enumerate(m_values):
            bar.update(len(systems))
            if time.time() > self.deadline:
                self.header["not_measured"] += len(systems)
                continue
            inp = group.inputs(m)
            done: dict[str, tuple] = {}  # system name -> (kernel, result)
            pending: dict[str, tuple] = {}  # system name -> (kernel, Prepared)
            for system in systems:
                if system.m_values is not None and m not in system.m_values:
                    continue
                key = (system.name, group.label, m, group.dtype)
                if key in self.shared:
                    done[system.name] = self.shared[key]
                    continue
                try:
                    prepared = system.prepare(group, inp)
                except Exception as err:  # recorded in the row; the sweep goes on
                    done[system.name] = (None, _error(err))
                    continue
                if isinstance(prepared, str):  # this system does not run this call: why, once per case and place
                    self.header["unsupported"].setdefault(f"{system.name} {group.case} {group.where}", prepared)
                else:
                    pending[system.name] = (prepared.kernel, prepared)
            if index == 0 and pending and not self.check_only:
                name, (_, first) = next(iter(pending.items()))
                try:
                    self._measure(group, inp, first)
                except Exception as err:  # a lasting error is the kept timing's row; a passing one is noted
                    self.header.setdefault("dropped_timing_errors", {})[f"{name} {group.label} M={m}"] = _error(err)
            for name, (kernel, result) in self._measure_all(group, inp, pending).items():
                done[name] = (kernel, result)
            for system in systems:
                if system.name not in done:
                    continue
                if system.shared:
                    self.shared[(system.name, group.label, m, group.dtype)] = done[system.name]
                rows.append(self.row(group, system, inp, *done[system.name]))
        return rows

    def _measure_all(self, group: Group, inp: Inputs, pending: dict[str, tuple]) -> dict[str, tuple]:
        """``{name: (kernel, result)}`` for the prepared systems; timing keeps each one's fastest round."""
        results: dict[str, dict] = {}
        rounds = 1 if self.check_only else self.rounds
        for r in range(rounds):
            names = list(pending)
            names = names[r % len(names) :] + names[: r % len(names)] if names else names  # rotate the order
            for name in names:
                if "error" in results.get(name, {}):
                    continue
                prepared = pending[name][1]
                try:
                    result = self._measure(group, inp, prepared)
                except Exception as err:
                    results[name] = _error(err)
                    continue
                best = results.get(name)
                if best is None:
                    results[name] = result
                else:
                    results[name] = {key: min(best[key], value) for key, value in result.items()}
        return {name: (pending[name][0], results[name]) for name in pending}

    def _measure(self, group: Group, inp: Inputs, prepared) -> dict:
        if self.check_only:
            out = prepared.canonical(prepared.calls[0]())
            return {"rel_err": rel_err(out, group.reference(inp))}
        from ..timing import time_calls

        timed = time_calls(prepared.calls)
        return {key: value / prepared.ops_per_call for key, value in timed.items()}

    def peer_rows(self, group: Group, system: System, m_values, bar) -> list[dict]:
        request = dict(
            case=group.case,
            n=group.shape.n,
            k=group.shape.k,
            experts=group.shape.experts,
            topk=group.shape.topk,
            dtype=_dtype_name(group.dtype, torch_name=True),
            m_values=list(m_values),
            deadline=self.deadline,
            check_only=self.check_only,
            **(group.peer_fields() if isinstance(group, MoeGroup) else {}),
        )
        rows, answered = [], set()
        for answer in self.worker.measure(request):
            if "m" not in answer:  # the layer did not build: every M gets the error
                pending = [m for m in m_values if m not in answered]
                rows += [self.row(group, system, group.inputs(m), None, answer) for m in pending]
                answered.update(pending)
                continue
            m = answer.pop("m")
            answered.add(m)
            if "skipped" in answer:
                self.header["not_measured"] += 1
            else:
                rows.append(self.row(group, system, group.inputs(m), None, answer))
        bar.update(len(m_values))
        return rows


def _error(err: Exception) -> dict:
    return {"error": f"{type(err).__name__}: {err}"[:500]}


def _warm(group: Group, m_values) -> None:
    """Compile, in parallel, the CUDA kernels the ``humming`` system will run (the first call of each
    other route compiles its own, outside the timed region)."""
    import humming

    try:
        humming.warmup(group.qweights()[:1], list(m_values), group.act, act_dtype=group.dtype, progress=False)
    except Exception as err:  # the timed calls compile what is missing (or record why they cannot)
        tqdm.write(f"humming bench: warmup of {group.case} {group.shape}: {type(err).__name__}: {err}", sys.stderr)


def _dtype_name(dtype: torch.dtype, torch_name: bool = False) -> str:
    name = str(dtype).removeprefix("torch.")
    return name if torch_name else {"bfloat16": "bf16", "float16": "fp16"}.get(name, name)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _header(op, device, check_only, budget_s, roof, command) -> dict:
    import humming

    if device == "cuda":
        from ..device import device_info

        info = device_info()
        described = dict(
            name=info.name, capability=list(info.capability), sm_count=info.sm_count, l2_bytes=info.l2_bytes
        )
    else:
        described = dict(name=platform.processor() or platform.machine() or "cpu")
    versions = dict(humming=humming.__version__, torch=torch.__version__, cuda=torch.version.cuda)
    versions.update({dist: _version(dist) for dist in ("triton", "gemlite")})
    versions["python"] = platform.python_version()
    timing = (
        "check only: rel_err = ||out - ref|| / ||ref||, ref = the float32 product of the unquantized weight"
        if check_only
        else "humming.timing.time_calls: median us per call over weight copies that exceed twice the L2 (cold "
        "weights); graph_us = CUDA-graph replay, eager_us = the same calls launched from Python"
    )
    if op == "linear":
        floor = "humming's quantized weight + activations read + output written"
        shared = "torch baselines do not depend on the case: measured once per shape, M and dtype"
    else:
        floor = "humming's quantized weights of the distinct experts the routing hits (layer: of w13 and w2)"
        shared = "torch baselines do not depend on the case: measured once per model, part, routing, M and dtype"
    moe = dict(
        parts="grouped_w13: x [M, H] routed to w13 [E, 2I, H]; grouped_w2: one hidden row [I] per routed slot "
        "to w2 [E, H, I]; layer: humming.moe.fused_moe from top-k ids and weights to the combined [M, H]",
        routings="random: torch.cuda.manual_seed(M); torch.randn(M, E, device='cuda').topk(topk).indices; skewed: "
        "the same scores plus a fixed N(0, 1) offset per expert (a few hot experts take most slots)",
        order="M values in coarse-to-fine order; each (model, case, dtype) gets an equal share of the budget left",
    )
    return dict(
        op=op,
        device=described,
        roofs=dict(copy_bytes_per_s=roof[0], source=roof[1]),
        floor=f"floor_us = bytes / copy_bytes_per_s; bytes = {floor}",
        timing=timing,
        shared=shared,
        **(moe if op == "moe" else {}),
        versions=versions,
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        command=command,
        budget_s=None if math.isinf(budget_s) else budget_s,
        not_measured=0,
        skipped={},
        unsupported={},
    )


def copy_roof(device: str) -> tuple[float, str]:
    """``(bytes per second, where it comes from)``: the roof of the floor on ``device`` (``"cuda"``: the current
    GPU, ``"cpu"``: none). A GPU named in :data:`COPY_BYTES_PER_S` takes its measured bandwidth, another one
    has its copy bandwidth measured now (:func:`humming.timing.copy_bandwidth`); without a GPU (check only,
    nothing timed) the floor counts bytes against the reference device's roof."""
    if device != "cuda":
        return COPY_BYTES_PER_S[_REFERENCE_DEVICE], f"no GPU (check only): the {_REFERENCE_DEVICE}'s roof"
    from ..device import device_info
    from ..timing import copy_bandwidth

    name = device_info().name
    if name in COPY_BYTES_PER_S:
        return COPY_BYTES_PER_S[name], f"the {name}'s measured device-to-device copy bandwidth"
    return copy_bandwidth(), f"the {name}'s device-to-device copy bandwidth, measured as the sweep started"


def _write(path, doc: dict) -> None:
    """Write atomically (a killed sweep leaves the last complete file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)


def _ints(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",")]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}") from err


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="humming bench", description=__doc__, formatter_class=Formatter)
    add_arguments(parser)
    return run(parser.parse_args(argv), parser)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``python -m humming bench``'s options."""
    parser.add_argument("op", choices=OPS, help="what to time: dense linears or MoE layers")
    parser.add_argument(
        "--cases", help="comma-separated, of humming.dispatch.tune.CASES (default: the standard set; moe: each model's)"
    )
    parser.add_argument("--shapes", help="linear: NxK,... (default: the standard set); moe: ExNxK/TOPK,... of w13")
    models_help = f"moe: comma-separated, of {', '.join(MODELS)} (default: all, unless --shapes)"
    parser.add_argument("--models", help=models_help)
    parser.add_argument("--routings", default=",".join(ROUTINGS), help="moe: comma-separated, of random, skewed")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"moe: comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--m", type=_ints, help="comma-separated M values (moe: tokens)")
    parser.add_argument("--dtypes", default="bf16", help="comma-separated, of bf16, fp16")
    parser.add_argument("--systems", help="comma-separated system names (default: all of the op)")
    parser.add_argument("--budget-s", type=float, default=math.inf, help="stop timing new points after this")
    parser.add_argument("--out", type=Path, help="JSON file to write (required unless --check-only)")
    parser.add_argument("--check-only", action="store_true", help="compute each result once, check it, no timing")
    parser.add_argument("--peer-site", help="directory holding humming-kernels (default: $HUMMING_KERNELS_SITE)")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="interleaved timing rounds per point")
    parser.add_argument(
        "--copy-bw", type=float, default=None, help="roof of the floor, bytes/s (default: the device's, copy_roof)"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run the sweep ``args`` describes; exit status 1 when a check fails (``--check-only``)."""
    defaults = DEFAULTS[args.op]
    if args.out is None and not args.check_only:
        parser.error("--out: expected a JSON path to write (or --check-only)")
    unknown = [d for d in args.dtypes.split(",") if d not in _DTYPES]
    if unknown:
        parser.error(f"--dtypes: expected some of {list(_DTYPES)}, got {unknown}")
    if args.op == "linear" and args.models:
        parser.error("--models: MoE models are for op moe")
    models = args.models or (defaults["models"] if args.op == "moe" and not args.shapes else "")
    unknown = [name for name in models.split(",") if name and name not in MODELS]
    if unknown:
        parser.error(f"--models: expected some of {list(MODELS)}, got {unknown}")
    cases = args.cases or (defaults["cases"] if args.op == "linear" else "")
    shapes = args.shapes or (defaults["shapes"] if args.op == "linear" else "")
    try:
        doc = sweep(
            args.op,
            cases.split(",") if cases else [],
            parse_shapes(args.op, shapes) if shapes else [],
            args.m or _ints(defaults["m"]),
            [_DTYPES[d] for d in args.dtypes.split(",")],
            args.systems.split(",") if args.systems else None,
            args.budget_s,
            models=[MODELS[name] for name in models.split(",") if name],
            routings=args.routings.split(","),
            parts=args.parts.split(","),
            out=args.out,
            check_only=args.check_only,
            peer_site=args.peer_site,
            copy_bytes_per_s=args.copy_bw,
            rounds=args.rounds,
            command="python -m humming bench " + " ".join(sys.argv[2:]),
        )
    except ValueError as err:
        parser.error(str(err))
    return _summarize(doc, args.out, args.check_only, args.json)


def _summarize(doc: dict, out, check_only: bool, as_json: bool = False) -> int:
    """Print what was measured and skipped (with check_only, each row's error against the float32 product)
    as a table or JSON; exit status 1 if a check failed or a system raised."""
    header, rows = doc["header"], doc["rows"]
    errors = [r for r in rows if "error" in r]
    failed = [r for r in rows if check_only and not r.get("rel_err", math.inf) < CHECK_TOLERANCE and "error" not in r]
    keys = ("system", "case", "model", "part", "routing", "n", "k", "m", "dtype", "kernel")
    summary = dict(
        rows=len(rows),
        errors=[{k: r[k] for k in (*keys, "error") if k in r} for r in errors],
        failed=[{k: r[k] for k in (*keys, "rel_err") if k in r} for r in failed],
        skipped=header["skipped"],
        not_measured=header["not_measured"],
        out=None if out is None else str(out),
    )
    if check_only:
        summary["checks"] = [{k: r[k] for k in (*keys, "rel_err") if k in r} for r in rows if "rel_err" in r]
    if as_json:
        print_json(summary)
        return 1 if check_only and (errors or failed) else 0
    for name, reason in header["skipped"].items():
        print(f"skipped {name}: {reason}")
    if check_only:
        columns = ("system", "case", *[k for k in ("model", "part", "routing") if any(k in r for r in rows)])
        table_rows = [[*(r.get(c) for c in columns), f"{r['n']}x{r['k']}", r["m"], r["dtype"], _check(r)] for r in rows]
        print_table([*columns, "shape", "M", "dtype", "rel_err"], table_rows, right=("M", "rel_err"))
    for r in errors:
        where = "".join(f"{r[key]} " for key in ("model", "part", "routing") if key in r)
        print(
            f"{r['system']} {r['case']} {where}{r['n']}x{r['k']} M={r['m']} {r['dtype']}: {r['error']}", file=sys.stderr
        )
    where = f", wrote {out}" if out else ""
    print(
        f"{len(rows)} rows ({len(errors)} errors, {len(failed)} failed checks), "
        f"{header['not_measured']} points not measured{where}"
    )
    return 1 if check_only and (errors or failed) else 0


def _check(row: dict) -> str:
    if "error" in row:
        return "error"
    ok = row["rel_err"] < CHECK_TOLERANCE
    return f"{row['rel_err']:.3g}" + ("" if ok else f" >= {CHECK_TOLERANCE} FAILED")
