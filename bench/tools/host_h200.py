"""Host time of a humming call on the GPU (issue 25, item 5): for every format of the issue's table and for
fused_moe at three MoE shapes, at M = 1, 16, 100 and 256, the CUDA-graph time, the eager time and the time
of the same call compiled by ``torch.compile`` (fullgraph, dynamic M, inductor, no graph), with torch's
matmul and ``torch._scaled_mm`` as reference rows measured in the same run. Writes
``bench/results/h200/host.json`` (``--out``).

Per row, microseconds per call:

- ``graph_us``: ``--graph-calls`` calls captured in one CUDA graph, replays timed with CUDA events (GPU time);
- ``eager_us`` / ``compiled_us``: wall time of ``--iters`` back-to-back calls and a final synchronisation
  (what a serving loop sees: the larger of the host's and the GPU's time);
- ``eager_host_us`` / ``compiled_host_us``: the host time of issuing those calls (``perf_counter`` around the
  loop, before the synchronisation); ``--iters`` stays far below the launch queue's depth, so the host never
  waits on the GPU inside the loop;
- ``eager_minus_graph_us``: the issue's target (``<= 10`` per linear call, ``<= 40`` per fused_moe call).

A compiled function pays dynamo's own cost per call (its frame evaluation and guards) once, whatever it
holds; the torch rows are compiled the same way to show that share. So that a compiled call's own cost
shows apart from it, the ``chain`` rows time ``--chain`` linears of the format (each its own weight, ``N = K``)
called one after the other in one function, eager and compiled: ``eager_us`` / ``compiled_us`` per linear,
``compiled_minus_eager_us`` the issue's per-call compiled target (``<= 2``); torch's matmul the same way.

The fastest of ``--rounds`` rounds is kept (other processes only add time). Small shapes (``--n`` /
``--k``, default 1024) so that the host time shows; the MoE shapes are the models' own (one layer, random
codes). ``--dry-run`` runs every code path on the CPU at tiny shapes (the reference backend, no graph,
``torch.compile`` with the eager backend) so that a CPU test covers it.

On the H200: ``python bench/tools/host_h200.py`` (about 5 minutes) from the repository root.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

import humming
from humming.ir.weight import QuantizedWeight

ROOT = Path(__file__).resolve().parents[2]

#: The formats of the issue's table: (name, quantize arguments, activation scheme).
FORMATS = (
    ("int4 g128", dict(weight="int4", group_size=128), None),
    ("uint4 + zero points g128", dict(weight="int4", group_size=128, zero_point=True), None),
    ("int8 per-channel", dict(weight="int8", group_size=-1), None),
    ("mxfp4", dict(weight="mxfp4"), None),
    ("nvfp4, 16-bit activations", dict(weight="nvfp4"), None),
    ("e4m3 per-channel x fp8", dict(weight="e4m3", group_size=-1), "fp8"),
    ("fp8 128x128 blocks x fp8_g128", dict(weight="e4m3", group_size=(128, 128)), "fp8_g128"),
    ("int4 x fp8", dict(weight="int4", group_size=128), "fp8"),
    ("mxfp4 x fp8", dict(weight="mxfp4"), "fp8"),
    ("nvfp4 x nvfp4", dict(weight="nvfp4"), "nvfp4"),
    ("int8 x int8", dict(weight="int8", group_size=-1), "int8"),
)
#: The MoE shapes: (preset of humming.bench.moe.MODELS, weight format of the experts).
MOE = (
    ("qwen3-30b-a3b", "int4 g128"),
    ("deepseek-v3", "int4 g128"),
    ("deepseek-v3", "fp8 128x128 blocks x fp8_g128"),
    ("gpt-oss-120b", "mxfp4"),
)
#: The activation scheme of each expert format (16-bit where absent).
_MOE_ACTS = {"fp8 128x128 blocks x fp8_g128": "fp8_g128"}


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def host_and_wall(call, iters: int, rounds: int, device) -> tuple[float, float]:
    """``(host us, wall us)`` per call: the fastest round of ``iters`` calls, host time before the final sync."""
    call()
    _sync(device)
    host = wall = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(iters):
            call()
        issued = time.perf_counter()
        _sync(device)
        done = time.perf_counter()
        host, wall = min(host, (issued - start) / iters * 1e6), min(wall, (done - start) / iters * 1e6)
    return host, wall


def graph_us(call, calls: int, rounds: int, device) -> float | None:
    """GPU microseconds per call, ``calls`` calls replayed from one CUDA graph (None off CUDA)."""
    if device.type != "cuda":
        return None
    from humming.timing import capture_graph

    graph = capture_graph(lambda: [call() for _ in range(calls)])
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(rounds):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / calls)
    del graph
    return best


def compiled(fn, args):
    """``fn`` compiled as the issue measures it: fullgraph, dynamic M, inductor, no CUDA graph (dynamo's
    caches reset first: every row's function is one code object, whose recompiles per weight would count
    against dynamo's limit); ``None`` with ``--eager-only``."""
    if args.eager_only:
        return None
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, dynamic=True, backend="eager" if args.dry_run else "inductor")


def bound(fn, *args):
    """``functools.partial(fn, *args)``, or ``None`` for no ``fn`` (no compiled function)."""
    return None if fn is None else functools.partial(fn, *args)


def measure(name: str, kind: str, m: int, call, compiled_call, args, device) -> dict:
    row = {"name": name, "kind": kind, "m": m}
    row["graph_us"] = graph_us(call, args.graph_calls, args.rounds, device)
    row["eager_host_us"], row["eager_us"] = host_and_wall(call, args.iters, args.rounds, device)
    if compiled_call is not None:
        row["compiled_host_us"], row["compiled_us"] = host_and_wall(compiled_call, args.iters, args.rounds, device)
    if row["graph_us"] is not None:
        row["eager_minus_graph_us"] = row["eager_us"] - row["graph_us"]
        if compiled_call is not None:
            row["compiled_minus_eager_us"] = row["compiled_us"] - row["eager_us"]
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}


def selected(name: str, args) -> bool:
    """Whether row ``name`` is measured: ``--only`` is a comma-separated list of substrings, one must match."""
    return not args.only or any(part in name for part in args.only.split(","))


def linear_rows(args, device) -> list[dict]:
    rows = []
    w = torch.randn(args.n, args.k, device=device) * 0.05
    for name, qargs, act in FORMATS:
        if not selected(name, args):
            continue
        qw = humming.quantize(w, **qargs)
        step = lambda x, qw, act=act: humming.linear(x, qw, act=act)
        rows += timed_rows(name, "humming.linear", functools.partial(step, qw=qw), args, device)
        if args.chain:
            square = lambda: torch.randn(args.k, args.k, device=device) * 0.05
            weights = [humming.quantize(square(), **qargs) for _ in range(args.chain)]
            rows += chain_rows(name, step, weights, args, device)
    rows += reference_rows(args, device)
    return rows


def recorded(name: str, kind: str, m: int, measured, *measured_args) -> dict:
    """``measured(*measured_args)``'s row, or the error that stopped it (a format this device cannot run is
    recorded, not fatal); printed as it comes."""
    try:
        row = measured(*measured_args)
    except Exception as err:
        row = {"name": name, "kind": kind, "m": m, "error": f"{type(err).__name__}: {err}"}
    print(json.dumps(row), flush=True)
    return row


def timed_rows(name: str, kind: str, fn, args, device, dtype=torch.bfloat16) -> list[dict]:
    """A row per M for ``fn(x)``, ``x [M, K]`` of ``dtype``: graph, eager and compiled."""
    fn_compiled = compiled(fn, args)
    rows = []
    for m in args.m:
        x = torch.randn(m, args.k, device=device).to(dtype)
        call, compiled_call = functools.partial(fn, x), bound(fn_compiled, x)
        rows.append(recorded(name, kind, m, measure, name, kind, m, call, compiled_call, args, device))
    return rows


def chain_rows(name: str, step, weights: list, args, device) -> list[dict]:
    """A row per M for ``x = step(x, w)`` over ``weights`` in one function, eager and compiled, per step."""

    def chain(x):
        for weight in weights:
            x = step(x, weight)
        return x

    chain_compiled = compiled(chain, args)
    rows = []
    for m in args.m:
        x = torch.randn(m, args.k, dtype=torch.bfloat16, device=device)
        calls = functools.partial(chain, x), bound(chain_compiled, x)
        rows.append(recorded(name, "chain", m, measure_chain, name, m, len(weights), *calls, args, device))
    return rows


def measure_chain(name: str, m: int, steps: int, call, compiled_call, args, device) -> dict:
    row = {"name": name, "kind": "chain", "m": m, "linears": steps}
    row["eager_host_us"], row["eager_us"] = (v / steps for v in host_and_wall(call, args.iters, args.rounds, device))
    if compiled_call is not None:
        done = host_and_wall(compiled_call, args.iters, args.rounds, device)
        row["compiled_host_us"], row["compiled_us"] = (v / steps for v in done)
        row["compiled_minus_eager_us"] = row["compiled_us"] - row["eager_us"]
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}


def reference_rows(args, device) -> list[dict]:
    """torch's bf16 matmul and ``torch._scaled_mm`` (e4m3 activations and weights, per-tensor scales) on the
    same shape, compiled as the humming rows; torch's matmul also as a chain."""
    w = torch.randn(args.n, args.k, dtype=torch.bfloat16, device=device)
    rows = timed_rows("torch matmul bf16", "reference", lambda x: torch.matmul(x, w.T), args, device)
    if device.type == "cuda":
        w8, one = w.to(torch.float8_e4m3fn), torch.ones((), device=device)
        scaled_mm = lambda x8: torch._scaled_mm(x8, w8.T, one, one, out_dtype=torch.bfloat16)
        rows += timed_rows("torch._scaled_mm e4m3", "reference", scaled_mm, args, device, torch.float8_e4m3fn)
    if args.chain:
        weights = [torch.randn(args.k, args.k, dtype=torch.bfloat16, device=device) for _ in range(args.chain)]
        rows += chain_rows("torch matmul bf16", lambda x, weight: torch.matmul(x, weight.T), weights, args, device)
    return rows


def _experts(fmt: str, e: int, n: int, k: int, device, bias: bool) -> QuantizedWeight:
    """Random codes with plausible scales, ``[e, n, k]`` (the values never matter for time)."""
    b = torch.randn(e, n, dtype=torch.bfloat16, device=device) if bias else None
    if fmt.startswith("fp8 128x128"):  # e4m3 bytes with bits 3 and 7 clear: finite (no 0x7f / 0xff)
        codes = torch.randint(0, 2**31 - 1, (e, n, k // 4), dtype=torch.int32, device=device) & 0x77777777
        scales = torch.rand(e, n // 128, k // 128, device=device) * 0.01
        return QuantizedWeight((e, n, k), "e4m3", codes, scales, (128, 128), bias=b)
    codes = torch.randint(-(2**31), 2**31 - 1, (e, n, k // 8), dtype=torch.int32, device=device)
    if fmt == "mxfp4":
        scales = torch.full((e, n, k // 32), 120, dtype=torch.uint8, device=device).view(torch.float8_e8m0fnu)
        return QuantizedWeight((e, n, k), "e2m1", codes, scales, (1, 32), bias=b)
    scales = (torch.rand(e, n, k // 128, device=device) + 0.5).to(torch.bfloat16) * 0.01
    return QuantizedWeight((e, n, k), "int4", codes, scales, (1, 128), bias=b)


def moe_rows(args, device) -> list[dict]:
    from humming.bench.moe import MODELS

    rows = []
    for preset, fmt in MOE:
        model = MODELS[preset]
        name = f"fused_moe {preset} {fmt}"
        if not selected(name, args):
            continue
        experts, hidden, inter = (4, 256, 128) if args.dry_run else (model.experts, model.hidden, model.inter)
        topk = min(model.topk, experts)
        w13 = _experts(fmt, experts, 2 * inter, hidden, device, model.bias)
        w2 = _experts(fmt, experts, hidden, inter, device, model.bias)
        options = dict(activation=model.activation, gate_up_layout=model.gate_up_layout, act=_MOE_ACTS.get(fmt))
        if model.alpha is not None:
            options.update(alpha=model.alpha, limit=model.limit)
        fn = lambda x, weights, ids, w13=w13, w2=w2, options=options: humming.moe.fused_moe(
            x, w13, w2, weights, ids, **options
        )
        fn_compiled = compiled(fn, args)
        for m in args.m:
            x = torch.randn(m, hidden, dtype=torch.bfloat16, device=device)
            ids = torch.stack([torch.randperm(experts, device=device)[:topk] for _ in range(m)]).to(torch.int32)
            weights = torch.rand(m, topk, device=device)
            calls = functools.partial(fn, x, weights, ids), bound(fn_compiled, x, weights, ids)
            rows.append(recorded(name, "fused_moe", m, measure, name, "fused_moe", m, *calls, args, device))
        del w13, w2
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--k", type=int, default=1024)
    parser.add_argument("--m", default="1,16,100,256", help="token counts, comma-separated")
    parser.add_argument("--iters", type=int, default=200, help="calls per timed round (far below the queue depth)")
    parser.add_argument("--graph-calls", type=int, default=20, help="calls captured in one CUDA graph")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", metavar="NAMES", help="the rows whose name holds one of these (comma-separated)")
    parser.add_argument("--no-moe", action="store_true", help="the linear rows only")
    parser.add_argument("--chain", type=int, default=8, help="linears per chain row (0: no chain rows)")
    parser.add_argument("--out", default=str(ROOT / "bench/results/h200/host.json"))
    parser.add_argument("--eager-only", action="store_true", help="no compiled timings (graph and eager only)")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes: every code path, no GPU")
    args = parser.parse_args(argv)
    args.m = [int(v) for v in args.m.split(",")]
    if args.dry_run:
        args.n, args.k, args.iters, args.rounds, args.m = 256, 256, 2, 1, args.m[:2]
    elif not torch.cuda.is_available():
        parser.error("no CUDA device: run with --dry-run")
    device = torch.device("cpu" if args.dry_run else "cuda")
    torch.manual_seed(0)
    rows = linear_rows(args, device) + ([] if args.no_moe else moe_rows(args, device))
    meta = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry run)",
        "torch": torch.__version__,
        "humming": humming.__version__,
        "python": platform.python_version(),
        "shape": {"n": args.n, "k": args.k},
        "iters": args.iters,
        "graph_calls": args.graph_calls,
        "rounds": args.rounds,
    }
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        pass
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.out} ({len(rows)} rows)")


if __name__ == "__main__":
    main()
