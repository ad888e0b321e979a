"""Time the grouped decode kernel (``cuda.grouped_decode``) over its tuning space (row tiles per warp, warps,
stages) next to the sm_90a grouped GEMM (``cuda.grouped``) on the MoE presets' decode sizes: the data behind
``grouped_decode.grouped_decode_tuning``.

Each point is fused_moe's view of one grouped GEMM: w13 reads the tokens through the routing's row index,
w2 reads the grouped rows; the routing is the MoE sweep's (``humming.bench.inputs.routing``) aligned with
``default_block_m``. Every variant is checked against the float64 product of the dequantized experts before
it is timed (CUDA-graph time over weight copies past the L2, :func:`humming.timing.time_calls`). Writes one
JSON row per (model, stack, M, variant) and prints, per point, the default's time, the best variant's and the
sm_90a GEMM's.

Usage (GPU machine, repository root): python bench/tools/grouped_decode_sweep.py --out out/grouped_decode.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import torch

from humming.bench.moe import MoeGroup, grouped_call, grouped_reference, sweep_points
from humming.cuda_kernels import _driver, _wna16, grouped_decode
from humming.cuda_kernels import grouped as cuda_grouped
from humming.cuda_kernels._decode_launch import decode_spec
from humming.cuda_kernels._decode_tuning import DecodeTuning
from humming.cuda_kernels._layout import DTYPE_CODE
from humming.cuda_kernels.jit import compile_kernel, device_arch
from humming.moe import default_block_m
from humming.timing import time_calls

M_VALUES = (1, 4, 16, 64, 256)
CASE = {"gpt-oss-120b": "mxfp4-a16"}  # the others: int4 g128


def variants(block_m: int, n: int, k: int) -> list[DecodeTuning]:
    """Row tiles 2 and 4 per warp (where N allows, else 1), 2 or 4 warps, 3 or 4 stages, one token tile per
    routing block."""
    out = []
    for r in [r for r in (2, 4) if n % (16 * r) == 0] or [1]:
        for warps in (2, 4):
            for stages in (3, 4):
                out.append(DecodeTuning(block_m // 8, r, warps, stages, 1))
    return out


def point(group: MoeGroup, m: int, block_ms: tuple[int, ...]) -> list[dict]:
    """The variants of each routing block in ``block_ms`` and the sm_90a GEMM at ``default_block_m``'s."""
    inp = group.inputs(m)
    qws, bias = group.qweights(), group.bias
    n, k, e = qws[0].N, qws[0].K, qws[0].num_experts
    x_code = DTYPE_CODE[inp.x.dtype]
    codes = x_code, x_code, x_code if bias is None else DTYPE_CODE[bias.dtype]
    layout = _wna16.prepare(qws[0]).layout
    cc = torch.cuda.get_device_capability()
    specs = [decode_spec(layout, *codes, t, True) for bm in block_ms for t in variants(bm, n, k)]
    with ThreadPoolExecutor(max_workers=16) as pool:  # compiled in parallel, loaded once
        list(pool.map(lambda spec: _driver.load(compile_kernel(spec, device_arch(spec, cc)), 0), specs))
    sm90_block_m = default_block_m(inp.ids.numel(), e)
    results = []
    for block_m in dict.fromkeys((*block_ms, sm90_block_m)):
        tunings = variants(block_m, n, k) if block_m in block_ms else []
        results += routing_block(group, inp, block_m, tunings, sm90=block_m == sm90_block_m and cc == (9, 0))
    where = dict(model=group.model.name, stack=group.stack, m=m, n=n, k=k)
    return [dict(where, **r) for r in results]


def routing_block(group: MoeGroup, inp, block_m: int, tunings: list[DecodeTuning], sm90: bool) -> list[dict]:
    """The rows of one routing block: each decode tuning, and the sm_90a GEMM where ``sm90``."""
    qws, bias = group.qweights(), group.bias
    n, k, e = qws[0].N, qws[0].K, qws[0].num_experts
    x, rows, ids, m_pad, used = grouped_call(inp, group.stack, e, block_m)
    ref = grouped_reference(x, qws[0], ids, block_m, rows, bias)
    base = dict(block_m=block_m, m_pad=m_pad, segments_used=int((ids >= 0).sum()))
    base["grid_segments"] = grouped_decode.segment_grid(m_pad, block_m, e)

    def check(out):
        return float((out[used].double() - ref[used]).norm() / ref[used].norm())

    def timed(calls) -> tuple[float, dict]:
        return check(calls[0]()), time_calls(calls)

    default = grouped_decode.grouped_decode_tuning(
        block_m, n, k, base["grid_segments"], torch.cuda.get_device_properties(0).multi_processor_count
    )
    results = []
    bias_dtype = None if bias is None else bias.dtype
    for tuning in tunings:
        launches = [
            grouped_decode.GroupedDecodeLaunch(
                _wna16.prepare(qw),
                m_pad,
                x.dtype,
                x.stride(0),
                bias_dtype,
                x.dtype,
                tuning,
                0,
                block_m,
                rows is not None,
            )
            for qw in qws
        ]
        err, times = timed([partial(launch, x, bias, ids, rows) for launch in launches])
        label = f"decode bm{block_m} r{tuning.r} w{tuning.warps} s{tuning.stages}"
        fields = dataclasses.asdict(tuning)
        results.append(dict(base, variant=label, default=tuning == default, rel_err=err, **fields, **times))
    if sm90 and cuda_grouped.grouped_unsupported(qws[0], None, x, block_m) is None:
        run = cuda_grouped.grouped_linear
        err, times = timed([partial(run, x, qw, ids, block_m, bias, None, x.dtype, rows) for qw in qws])
        results.append(dict(base, variant="cuda.grouped", default=False, rel_err=err, **times))
    return results


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--models", default="deepseek-v3,qwen3-30b-a3b,gpt-oss-120b")
    parser.add_argument("--m", default=",".join(map(str, M_VALUES)))
    parser.add_argument("--block-ms", default="8,16")
    parser.add_argument("--budget-s", type=float, default=240.0)
    args = parser.parse_args()
    block_ms = tuple(map(int, args.block_ms.split(",")))
    rows, summary = [], []
    models, m_values = args.models.split(","), [int(m) for m in args.m.split(",")]
    for name, stack, group, m in sweep_points(models, ("grouped_w13", "grouped_w2"), m_values, args.budget_s, CASE):
        got = point(group, m, block_ms)
        rows += got
        decode = [r for r in got if r["variant"] != "cuda.grouped"]
        best = min(decode, key=lambda r: r["graph_us"])
        dflt = {r["block_m"]: r["graph_us"] for r in decode if r["default"]}
        sm90 = next((r["graph_us"] for r in got if r["variant"] == "cuda.grouped"), float("nan"))
        worst_err = max(r["rel_err"] for r in got)
        defaults = "  ".join(f"bm{bm} {us:7.1f}" for bm, us in dflt.items())
        summary.append(
            f"{name:14} {stack:11} M={m:<4} default {defaults}  best {best['graph_us']:7.1f} "
            f"({best['variant']})  sm90 {sm90:7.1f}  err {worst_err:.1e}"
        )
        print(summary[-1], flush=True)
    Path(args.out).write_text(json.dumps(dict(device=torch.cuda.get_device_name(), rows=rows), indent=1))
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
