"""Time the Triton WnA16 decode paths (M <= 16) and their config variants on the standard shapes, next to
the tiled kernel's former 16-row tile and torch bf16: the data behind ``wna16_configs`` at small M (issue 26).

Kernels: the GEMV kernel (M = 1; M <= 4 as a variant), the swapped-operand tensor-core kernel (M = 2..16),
and the tiled kernel with its 16-row tile (the path M = 2..16 took before the swapped kernel). Every variant
is checked once against the float64 product of the dequantized weight (fp32 weights for the GEMV kernel,
weights rounded to bf16 for the tensor-core ones) before it is timed (CUDA-graph time over weight copies
past the L2, :func:`humming.timing.time_calls`). Writes one JSON row per (case, shape, M, variant) and
prints, per point, the byte floor (weight, scale and zero bytes at 4.3 TB/s), the chooser's time, the best
variant and torch bf16.

Usage (GPU machine, repository root, one call of about 4 minutes):
  python bench/tools/triton_decode_sweep.py --out $OUT/triton_decode.json --budget-s 210
CPU smoke test (the interpreter, tiny shapes, no timing):
  TRITON_INTERPRET=1 python bench/tools/triton_decode_sweep.py --smoke --out /tmp/triton_decode.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import torch

import humming
from humming.bench.systems import copies as weight_copies
from humming.bench.systems import nbytes
from humming.device import device_limits
from humming.triton_kernels import wna16
from humming.triton_kernels.configs import TileConfig, choose_split_k
from humming.triton_kernels.wna16_configs import TILED_16

SHAPES = ((28672, 8192), (8192, 8192), (2048, 7168))
SMOKE_SHAPES = ((96, 256),)
M_VALUES = (1, 2, 4, 8, 16)
#: name -> quantize arguments (bf16 scales, as real checkpoints)
CASES = {
    "int4-g128": dict(weight="int4", group_size=128, scale_dtype=torch.bfloat16),
    "uint4-zp-g128": dict(weight="int4", group_size=128, zero_point=True, scale_dtype=torch.bfloat16),
    "mxfp4": dict(weight="mxfp4"),
    "nvfp4": dict(weight="nvfp4"),
    "int8-channel": dict(weight="int8", group_size=-1, scale_dtype=torch.bfloat16),
}
#: The copy roof the floors are read against (bytes / s).
ROOF = 4.3e12


def variants(m: int, n: int, k: int, qw, default: TileConfig, sm_count: int) -> dict[str, TileConfig]:
    """The chooser's config and its neighbours: other tiles, warps, stages and K splits of the same kernel,
    the other decode kernel where it takes M, and the tiled kernel's 16-row tile."""
    out = {"default": default}
    fill = lambda cfg, waves: cfg.replace(
        split_k=choose_split_k(-(-m // cfg.block_m) * -(-n // cfg.block_n), -(-k // cfg.block_k), sm_count, waves)
    )
    if default.block_m <= 4 and not default.swap:  # the persistent GEMV: split_k is its waves
        for bn in (64, 256):
            out[f"gemv-n{bn}"] = default.replace(block_n=bn)
        out["gemv-w8"] = default.replace(num_warps=8)
        for waves in (2, 4):
            out[f"gemv-waves{waves}"] = default.replace(split_k=waves)
        out["gemv-k*2"] = default.replace(block_k=default.block_k * 2)  # twice the words in flight per thread
    if default.swap:
        for bn, bk in ((64, 128), (128, 64), (64, 256)):
            out[f"swap-n{bn}k{bk}"] = fill(default.replace(block_n=bn, block_k=bk), 2)
        out["swap-st2"] = default.replace(num_stages=2)
        out["swap-st4"] = default.replace(num_stages=4)
        out["swap-w8"] = default.replace(num_warps=8)
        out["swap-split*2"] = default.replace(split_k=default.split_k * 2)
    if m <= 4:
        gemv = wna16.wna16_config(1, n, k, qw.bits, sm_count, max(qw.group_shape[1], 0))
        out["gemv"] = gemv = gemv.replace(block_m=1 if m == 1 else 4, block_n=gemv.block_n // (1 if m == 1 else 4))
        if m == 1:  # the packed path (one token) loads the next K tile's words and activations while this one decodes
            out["gemv-st2"] = gemv.replace(num_stages=2)
            out["gemv-st2-n64"] = gemv.replace(num_stages=2, block_n=gemv.block_n // 2)
            out["gemv-st2-w8"] = gemv.replace(num_stages=2, num_warps=8)
            out["gemv-st2-waves2"] = gemv.replace(num_stages=2, split_k=2)
    if m > 1:
        out["swap-waves4"] = fill(wna16.wna16_config(16, n, k, qw.bits, sm_count), 4)
    out["tiled-16"] = fill(TILED_16, 2)  # the tiled kernel's 16-row tile (M = 2..16 before the swapped kernel)
    out["default-again"] = default  # timed last: the spread of one config's time within the run
    return out


def check(out: torch.Tensor, x: torch.Tensor, qw, cfg: TileConfig) -> float:
    """Relative error against float64 (the kernel's weights: fp32 for the GEMV kernel, else rounded to x's)."""
    gemv = cfg.block_m <= 4 and not cfg.swap
    ref = x.double() @ humming.dequantize(qw, torch.float32 if gemv else x.dtype).double().T
    if not torch.isfinite(out).all():
        return math.inf
    return ((out.double() - ref).norm() / ref.norm()).item()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--shapes", default=None, help="NxK,... (default: the standard shapes)")
    parser.add_argument("--m", default=",".join(map(str, M_VALUES)))
    parser.add_argument("--budget-s", type=float, default=math.inf, help="stop timing new shapes after this")
    parser.add_argument("--variants", default=None, help="only these variants (comma-separated names)")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, check only (the CPU interpreter)")
    args = parser.parse_args()
    start = time.perf_counter()
    device = "cpu" if args.smoke else "cuda"
    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    m_values = [int(v) for v in args.m.split(",")]
    limits = device_limits(torch.device(device, 0) if device == "cuda" else torch.device(device))
    if not args.smoke:
        from humming.timing import time_calls
    rows, summary, skipped = [], [], []
    for n, k in shapes:  # shapes outer: a budget cut drops the smaller shapes and the larger M, never a format
        for case in args.cases.split(","):
            if time.perf_counter() - start > args.budget_s:
                skipped.append(f"{case} {n}x{k}")
                continue
            w = torch.randn(n, k, device=device) / math.sqrt(k)
            copies = weight_copies(device, lambda w=w, q=CASES[case]: humming.quantize(w, **q), nbytes)
            first = copies[0]
            floor_us = first.nbytes / ROOF * 1e6
            dense = w.to(torch.bfloat16)
            del w
            for m in m_values:
                if time.perf_counter() - start > args.budget_s:
                    skipped.append(f"{case} {n}x{k} M={m}")
                    continue
                x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
                default = wna16.default_config(first, x)
                if not args.smoke:  # a point's first timing runs slow (bench/results/h100/gemv_2026-12-07/): dropped
                    time_calls(
                        [
                            lambda qw=qw, c=default, x=x: wna16.linear(x, qw, None, torch.bfloat16, config=c)
                            for qw in copies
                        ]
                    )
                timed = {}
                chosen = variants(m, n, k, first, default, limits.sm_count)
                if args.variants:
                    chosen = {name: cfg for name, cfg in chosen.items() if name in args.variants.split(",")}
                for name, cfg in chosen.items():
                    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device)
                    try:
                        wna16.linear(x, first, None, torch.bfloat16, config=cfg, out=out)
                    except Exception as err:  # a variant the compiler refuses is data, not a failure
                        rows.append(
                            dict(case=case, n=n, k=k, m=m, variant=name, config=cfg.name(), error=str(err)[-300:])
                        )
                        continue
                    err = check(out, x, first, cfg)
                    row = dict(case=case, n=n, k=k, m=m, variant=name, config=cfg.name(), rel_err=err)
                    row.update(tuning=dataclasses.asdict(cfg), floor_us=floor_us)
                    if err <= 1e-2 and not args.smoke:
                        calls = [
                            lambda qw=qw, c=cfg, x=x: wna16.linear(x, qw, None, torch.bfloat16, config=c)
                            for qw in copies
                        ]
                        row.update(time_calls(calls))
                        timed[name] = row["graph_us"]
                    rows.append(row)
                torch_us = math.nan
                if not args.smoke:
                    torch_us = time_calls([lambda x=x, d=dense: x @ d.T])["graph_us"]
                    rows.append(dict(case=case, n=n, k=k, m=m, variant="torch-bf16", graph_us=torch_us))
                if timed:
                    best = min(timed, key=timed.get)
                    summary.append(
                        (case, n, k, m, floor_us, timed.get("default", math.nan), best, timed[best], torch_us)
                    )
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(dict(device=str(limits), rows=rows), indent=1) + "\n")
            del copies, first, dense
            if not args.smoke:
                torch.cuda.empty_cache()
    head = f"{'case':14} {'shape':>11} {'M':>3} {'floor':>6} {'default':>8} {'x floor':>7} {'best':>8}"
    print(f"{head} {'variant':>14} {'torch':>7}")
    for case, n, k, m, floor_us, d, best, b, t in summary:
        print(
            f"{case:14} {n:>5}x{k:<5} {m:>3} {floor_us:6.1f} {d:8.1f} {d / floor_us:7.2f} {b:8.1f} {best:>14} {t:7.1f}"
        )
    bad = [r for r in rows if r.get("rel_err", 0.0) > 1e-2 or "error" in r]
    print(f"{len(rows)} rows, {len(bad)} failed their check or did not run, in {time.perf_counter() - start:.0f}s")
    for r in bad[:10]:
        print("FAILED", r["case"], r["n"], r["k"], r["m"], r["variant"], r.get("rel_err"), r.get("error", ""))
    if skipped:
        print("not timed (budget):", ", ".join(skipped))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
