"""Time the grouped FP8 GEMM (``cuda.grouped`` with fp8 activations, :func:`humming.cuda_kernels.fp8_gemm.
run_grouped`) over its grid and promotion choices on the MoE presets' FP8 cases at prefill sizes: the data
behind ``_fp8_tuning.choose_grouped_tuning``.

Variants of each routing block's default tuning: a persistent grid (blocks walk the worst-case ``M_pad``
tiles and skip those of unused segments) against one block per tile; for 128-token tiles of per-channel
weights, four K blocks per promotion; for 4-bit experts on 128-token tiles, codes read a K block ahead.

Each point is fused_moe's view of one grouped GEMM on the MoE sweep's routing: w2 reads grouped rows, w13's
tokens are copied into grouped order first (the FP8 GEMM reads grouped rows). Every variant is checked on the
routed rows against the float64 product of the dequantized experts and the quantized-then-dequantized
activations before it is timed (CUDA-graph time, :func:`humming.timing.time_calls`; the experts are far past
the L2). Writes one JSON row per (model, stack, M, routing block, variant) and prints, per point, the default's
time and the best variant's.

Usage (GPU machine, repository root): python bench/tools/fp8_grouped_sweep.py --out out/fp8_grouped.json
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


import humming
from humming.bench.moe import MoeGroup, grouped_call, grouped_reference, run_sweep, sweep_points
from humming.cuda_kernels import fp8_gemm
from humming.cuda_kernels import grouped as cuda_grouped
from humming.device import device_limits
from humming.dispatch.tune import CASES
from humming.ir.activation import get_act_scheme
from humming.moe.grouped import gather_rows
from humming.timing import time_calls

M_VALUES = (1024, 4096, 8192)
#: The FP8 case of each model (``--models``): DeepSeek-V3's own FP8 blocks, Qwen3's experts as W4A8 int4,
#: gpt-oss-120b's MXFP4 experts with fp8 activations (scales folded per row where the rows allow it).
FP8_CASES = {
    "deepseek-v3": "w8a8-fp8-block",
    "qwen3-30b-a3b": "w4a8-int4-channel-fp8",
    "gpt-oss-120b": "w4a8-mxfp4-fp8",
}


def variants(default: fp8_gemm.Fp8Tuning, w_format: str, scale_mode: str) -> list[fp8_gemm.Fp8Tuning]:
    """``default`` and its persistent copy; with 128-token tiles, each also with four K blocks per promotion
    (per-channel scales) and with codes read ahead (4-bit experts), and those promoted at every K block in token
    halves."""
    out = [default, dataclasses.replace(default, persistent=True)]
    fewer = [dataclasses.replace(t, promote_blocks=4) for t in out]
    out += [t for t in fewer if t.promotes_every(scale_mode) == 4]
    ahead = [dataclasses.replace(t, prefetch_codes=True) for t in out]
    out += [t for t in ahead if t.reads_codes_ahead(w_format)]
    halves = [dataclasses.replace(t, token_halves=True) for t in out]
    out += [t for t in halves if t.issues_token_halves(w_format, scale_mode)]
    return list(dict.fromkeys(out))


def label(tuning: fp8_gemm.Fp8Tuning) -> str:
    grid = " persistent" if tuning.persistent else ""
    promote = f" promote{tuning.promote_blocks}" if tuning.promote_blocks > 1 else ""
    ahead = " codes-ahead" if tuning.prefetch_codes else ""
    halves = " token-halves" if tuning.token_halves else ""
    return f"w{tuning.wgs} m{tuning.block_m} s{tuning.stages} x{tuning.min_blocks}{grid}{promote}{ahead}{halves}"


def point(group: MoeGroup, m: int, block_ms: tuple[int, ...]) -> list[dict]:
    """The variants of each routing block of ``block_ms`` at ``m`` tokens."""
    inp = group.inputs(m)
    qws, bias = group.qweights(), group.bias
    act = get_act_scheme(CASES[group.case][1])
    n, e = qws[0].N, qws[0].num_experts
    prep = fp8_gemm.prepare(qws[0])
    limits = device_limits(0)
    results = []
    for block_m in block_ms:
        x, rows, ids, m_pad, used = grouped_call(inp, group.stack, e, block_m)
        if rows is not None:  # w13: the tokens copied into grouped order
            x = gather_rows(x, rows)
        reason = cuda_grouped.grouped_unsupported(qws[0], act, x, block_m)
        if reason is not None:
            print(f"{group.label} M={m} block_m={block_m}: skipped, {reason}", flush=True)
            continue
        xq = humming.dequantize_activation(humming.quantize_activation(x, act))
        ref = grouped_reference(xq, qws[0], ids, block_m, None, bias)[used]
        default = fp8_gemm.choose_grouped_tuning(block_m, m_pad, n, e, limits, prep.w_format)
        base = dict(block_m=block_m, m_pad=m_pad, segments_used=int((ids >= 0).sum()), rows_used=int(used.sum()))
        for tuning in variants(default, prep.w_format, prep.scale_mode):
            calls = [
                partial(fp8_gemm.run_grouped, fp8_gemm.prepare(qw), x, act, ids, block_m, bias, x.dtype, tuning)
                for qw in qws
            ]
            out = calls[0]()
            err = float((out[used].double() - ref).norm() / ref.norm())
            if not err < 2e-2:  # NaN fails too
                raise AssertionError(f"{group.label} M={m} block_m={block_m} {tuning}: relative error {err}")
            row = dict(base, variant=f"block_m {block_m} {label(tuning)}", default=tuning == default, rel_err=err)
            results.append(dict(row, **dataclasses.asdict(tuning), **time_calls(calls)))
        del ref, xq
    where = dict(model=group.model.name, stack=group.stack, case=group.case, m=m, n=n, k=qws[0].K)
    return [dict(where, **r) for r in results]


def summarize(got: list[dict]) -> str:
    """One point's line: each routing block's default time and its best variant's."""
    parts = []
    for block_m in dict.fromkeys(r["block_m"] for r in got):
        rows = [r for r in got if r["block_m"] == block_m]
        best = min(rows, key=lambda r: r["graph_us"])
        dflt = next(r["graph_us"] for r in rows if r["default"])
        parts.append(f"block_m {block_m}: default {dflt:8.1f} best {best['graph_us']:8.1f} ({best['variant']})")
    return "  ".join(parts) + f"  err {max(r['rel_err'] for r in got):.1e}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--models", default=",".join(FP8_CASES))
    parser.add_argument("--stacks", default="grouped_w13,grouped_w2")
    parser.add_argument("--m", default=",".join(map(str, M_VALUES)))
    parser.add_argument("--block-ms", default="128,256")
    parser.add_argument("--budget-s", type=float, default=240.0)
    args = parser.parse_args()
    block_ms = tuple(map(int, args.block_ms.split(",")))
    models, stacks, m_values = args.models.split(","), args.stacks.split(","), list(map(int, args.m.split(",")))
    points = sweep_points(models, stacks, m_values, args.budget_s, FP8_CASES)
    run_sweep(points, lambda group, m: point(group, m, block_ms), summarize, "fp8_grouped_gemm", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
