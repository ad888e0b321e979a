"""A/B of programmatic dependent launch (``HUMMING_PDL``): the same calls with their kernels launched
programmatically and not, in one process, on the same weights' values (two sets of weights: launchers are made
per weight, each set's under its own setting), timed in alternating rounds. Checks first that both give the
same bits.

- dense: ``humming.linear`` with fp8 activations (the GEMM behind the CUDA activation pass), weight copies past
  the L2, one row per (case, shape, M);
- ``--moe``: ``humming.moe.fused_moe`` layers (the grouped GEMMs and the combine, each behind the kernel before
  it), one row per (model, M).

Writes the rows with both times (CUDA-graph and eager us) and prints a table.

Usage (GPU machine, repository root): python bench/tools/pdl_ab.py --out out/pdl.json [--rounds 3] [--moe]
"""

from __future__ import annotations

import argparse
import json
import os
from functools import partial
from pathlib import Path

import torch

import humming
from humming.timing import copies_past_l2, time_calls

CASES = {
    "w4a8-int4-channel-fp8": dict(weight="int4", group_size=-1),
    "w4a8-int4-g128-fp8": dict(weight="int4", group_size=128),
    "w4a8-mxfp4-fp8": dict(weight="mxfp4"),
    "w8a8-fp8-channel": dict(weight="e4m3", group_size=-1),
}
SHAPES = ((28672, 8192), (8192, 8192), (2048, 7168))
M_VALUES = (1, 16, 64, 256, 1024)
#: model -> (quantize arguments, experts, top-k, hidden, intermediate)
MOE_MODELS = {
    "qwen3-30b-a3b": (dict(weight="int4", group_size=128), 128, 8, 2048, 768),
    "gpt-oss-120b": (dict(weight="mxfp4"), 128, 4, 2880, 2880),
}
MOE_M = (1, 4, 16, 64, 256)


def _with_pdl(on: bool, fn):
    """``fn()`` with ``HUMMING_PDL`` set to ``on`` (the launchers ``fn`` makes keep that setting)."""
    before = os.environ.get("HUMMING_PDL")
    os.environ["HUMMING_PDL"] = "1" if on else "0"
    try:
        return fn()
    finally:
        if before is None:
            del os.environ["HUMMING_PDL"]
        else:
            os.environ["HUMMING_PDL"] = before


def _timed_pair(calls: dict, rounds: int) -> dict:
    """Median graph / eager us of ``calls[True]`` and ``calls[False]`` (lists of calls), in alternating rounds."""
    times = {True: [], False: []}
    for _ in range(rounds):
        for on in (True, False):
            times[on].append(time_calls(calls[on]))
    row = {}
    for on, name in ((True, "pdl"), (False, "no_pdl")):
        for key in ("graph_us", "eager_us"):
            row[f"{name}_{key}"] = sorted(t[key] for t in times[on])[len(times[on]) // 2]
    return row


def moe_rows(rounds: int, m_values) -> list[dict]:
    from humming import moe

    rows = []
    for model, (qargs, e, topk, hidden, inter) in MOE_MODELS.items():
        w13 = torch.randn(e, 2 * inter, hidden, dtype=torch.bfloat16, device="cuda") * 0.02
        w2 = torch.randn(e, hidden, inter, dtype=torch.bfloat16, device="cuda") * 0.02
        experts = {on: (humming.quantize(w13, **qargs), humming.quantize(w2, **qargs)) for on in (True, False)}
        del w13, w2
        for m in m_values:
            x = torch.randn(m, hidden, dtype=torch.bfloat16, device="cuda")
            weights = torch.softmax(torch.randn(m, topk, device="cuda"), -1)
            ids = torch.randn(m, e, device="cuda").topk(topk).indices.to(torch.int32)
            layer = {on: partial(moe.fused_moe, x, *ws, weights, ids) for on, ws in experts.items()}
            outs = {on: _with_pdl(on, call) for on, call in layer.items()}
            torch.cuda.synchronize()
            row = dict(model=model, m=m, bit_equal=torch.equal(outs[True], outs[False]))
            row["finite"] = bool(torch.isfinite(outs[True].float()).all())
            calls = {on: [call] for on, call in layer.items()}
            row.update(_timed_pair(calls, rounds))
            rows.append(row)
            print(
                f"{model:24} M={m:<5} graph {row['no_pdl_graph_us']:8.1f} -> {row['pdl_graph_us']:8.1f}  eager "
                f"{row['no_pdl_eager_us']:8.1f} -> {row['pdl_eager_us']:8.1f}  bits "
                f"{'equal' if row['bit_equal'] else 'DIFFER'}",
                flush=True,
            )
        del experts
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--m", default=None, help="M values (default: the dense or MoE ones)")
    parser.add_argument("--moe", action="store_true", help="time fused_moe layers instead of dense calls")
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    if args.moe:
        rows = moe_rows(args.rounds, [int(v) for v in (args.m or ",".join(map(str, MOE_M))).split(",")])
        args.cases = ""
    for case in filter(None, args.cases.split(",")):
        for n, k in SHAPES:
            w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
            first = humming.quantize(w, **CASES[case])
            count = copies_past_l2(first.nbytes)
            sets = {True: [first] + [humming.quantize(w, **CASES[case]) for _ in range(count - 1)]}
            sets[False] = [humming.quantize(w, **CASES[case]) for _ in range(count)]
            for m in map(int, (args.m or ",".join(map(str, M_VALUES))).split(",")):
                x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
                outs = {}
                for on, qws in sets.items():
                    outs[on] = _with_pdl(on, lambda qws=qws, x=x: [humming.linear(x, qw, act="fp8") for qw in qws])
                torch.cuda.synchronize()
                same = all(torch.equal(a, b) for a, b in zip(outs[True], outs[False], strict=True))
                finite = bool(torch.isfinite(outs[True][0].float()).all())
                kernel = humming.explain(first, m, "fp8", dtype=torch.bfloat16).kernel
                calls = {
                    on: [lambda qw=qw, x=x: humming.linear(x, qw, act="fp8") for qw in qws] for on, qws in sets.items()
                }
                row = dict(case=case, n=n, k=k, m=m, kernel=kernel, bit_equal=same, finite=finite)
                row.update(_timed_pair(calls, args.rounds))
                rows.append(row)
                print(
                    f"{case:24} {n:5}x{k:<5} M={m:<5} {kernel:18} graph {row['no_pdl_graph_us']:8.1f} -> "
                    f"{row['pdl_graph_us']:8.1f}  eager {row['no_pdl_eager_us']:8.1f} -> {row['pdl_eager_us']:8.1f}"
                    f"  bits {'equal' if same else 'DIFFER'}",
                    flush=True,
                )
            del sets
            torch.cuda.empty_cache()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    header = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, humming=humming.__version__)
    args.out.write_text(json.dumps(dict(header=header, rows=rows), indent=1))
    bad = [r for r in rows if not (r["bit_equal"] and r["finite"])]
    print(f"{len(rows)} points, {len(bad)} with differing bits or non-finite outputs; wrote {args.out}")


if __name__ == "__main__":
    main()
