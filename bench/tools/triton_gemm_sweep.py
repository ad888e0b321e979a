"""Time the Triton GEMMs at M >= 64 (the scaled GEMM and the WnA16 kernel) and their config variants on the
standard shapes, next to torch bf16 and ``torch._scaled_mm`` on pre-quantized fp8: the data behind
``scaled_mm_configs`` / ``wna16_configs`` for sm_90 (issue 26, items 2 and 3).

Every variant is checked once against the float64 product of the dequantized operands (the activations as
quantized, the weight as :func:`humming.dequantize` gives it; WnA16 weights rounded to bf16 as the kernel
takes them) before it is timed (CUDA-graph time over weight copies past the L2,
:func:`humming.timing.time_calls`). The scaled GEMM is timed on pre-quantized activations (the GEMM alone, as
``torch._scaled_mm``). Writes one JSON row per (case, shape, M, variant) and prints, per point, the chooser's
time, the best variant, torch bf16 and torch._scaled_mm.

Usage (GPU machine, repository root, one call of under 4 minutes):
  python bench/tools/triton_gemm_sweep.py --out $OUT/triton_gemm.json --budget-s 200
CPU smoke test (the interpreter, tiny shapes, no timing):
  TRITON_INTERPRET=1 python bench/tools/triton_gemm_sweep.py --smoke --out /tmp/triton_gemm.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from functools import partial
from pathlib import Path

import torch

import humming
from humming.bench.systems import copies as weight_copies
from humming.bench.systems import nbytes
from humming.device import device_limits
from humming.triton_kernels import scaled_mm, wna16
from humming.triton_kernels._scaled_mm_plan import call_config, compute_plan, device_capability
from humming.triton_kernels.configs import TileConfig, choose_split_k

SHAPES = ((28672, 8192), (8192, 8192))
SMOKE_SHAPES = ((96, 256),)
M_VALUES = (64, 256, 1024, 4096)
SMOKE_M = (20,)
#: name -> (quantize arguments, activation scheme; None: the WnA16 kernel on bf16 activations)
CASES = {
    "w8a8-fp8-channel": (dict(weight="e4m3", group_size=-1, scale_dtype=torch.float32), "fp8"),
    "w8a8-fp8-block128": (dict(weight="fp8_block"), "fp8_g128"),
    "w4a8-int4-g128": (dict(weight="int4", group_size=128, scale_dtype=torch.bfloat16), "fp8"),
    "mxfp4-fp8": (dict(weight="mxfp4"), "fp8"),
    "int8-int8": (dict(weight="int8", group_size=-1, scale_dtype=torch.float32), "int8"),
    "w4a16-int4-g128": (dict(weight="int4", group_size=128, scale_dtype=torch.bfloat16), None),
    "mxfp4-bf16": (dict(weight="mxfp4"), None),
}


def _fill(cfg: TileConfig, m: int, n: int, k: int, sm_count: int) -> TileConfig:
    tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
    return cfg.replace(split_k=choose_split_k(tiles, -(-k // cfg.block_k), sm_count))


def variants(m: int, n: int, k: int, default: TileConfig, sm_count: int, k_step: int, wna16_kernel: bool):
    """The chooser's config and its neighbours: other tiles, warps, stages and K splits (``block_k`` always
    divides the promotion step ``k_step``); for WnA16 also the fused kernel where the chooser dequantizes
    first, and dequantize-first where it does not."""
    out = {"default": default}
    base = default.replace(dequant_first=False)
    bk = default.block_k
    for name, (bm, bn, warps) in {
        "m64n128w4": (64, 128, 4),
        "m128n64w4": (128, 64, 4),
        "m128n128w4": (128, 128, 4),
        "m128n128w8": (128, 128, 8),
        "m128n256w8": (128, 256, 8),
        "m256n128w8": (256, 128, 8),
    }.items():
        if (bm, bn, warps) != (base.block_m, base.block_n, base.num_warps):
            out[name] = _fill(base.replace(block_m=bm, block_n=bn, num_warps=warps), m, n, k, sm_count)
    for stages in (2, 3, 4, 5):
        if stages != base.num_stages:
            out[f"st{stages}"] = base.replace(num_stages=stages)
    if not k_step or k_step % (bk * 2) == 0:
        out["k*2"] = _fill(base.replace(block_k=bk * 2), m, n, k, sm_count)
    if bk >= 64:
        out["k/2"] = _fill(base.replace(block_k=bk // 2), m, n, k, sm_count)
    out["group_m16"] = base.replace(group_m=16)
    out["split*2"] = base.replace(split_k=base.split_k * 2)
    if wna16_kernel:
        out["fused" if default.dequant_first else "dequant-first"] = default.replace(
            dequant_first=not default.dequant_first
        )
    return out


def reference(case: str, x: torch.Tensor, qa, qw) -> torch.Tensor:
    """float64 product of what the kernel multiplies."""
    if qa is None:
        return x.double() @ humming.dequantize(qw, x.dtype).double().T
    return humming.dequantize_activation(qa, torch.float64) @ humming.dequantize(qw, torch.float64).T


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    if not torch.isfinite(out).all():
        return math.inf
    return ((out.double() - ref).norm() / ref.norm()).item()


def e4m3_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise e4m3 codes of ``t`` and their fp32 scales ``[R, 1]``, as ``torch._scaled_mm`` takes them."""
    scale = t.abs().amax(-1, keepdim=True).float().clamp_min(1e-12) / 448
    return (t / scale).to(torch.float8_e4m3fn), scale


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--shapes", default=None, help="NxK,... (default: the standard shapes)")
    parser.add_argument("--m", default=None, help="M values, comma separated")
    parser.add_argument("--budget-s", type=float, default=math.inf, help="stop timing new points after this")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, check only (the CPU interpreter)")
    args = parser.parse_args()
    start = time.perf_counter()
    device = torch.device("cpu") if args.smoke else torch.device("cuda", 0)
    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    m_values = [int(v) for v in args.m.split(",")] if args.m else (SMOKE_M if args.smoke else M_VALUES)
    limits = device_limits(device)
    if not args.smoke:
        from humming.timing import time_calls
    rows, summary, skipped = [], [], []
    for n, k in shapes:
        for case in args.cases.split(","):
            qargs, act = CASES[case]
            w = torch.randn(n, k, device=device) / math.sqrt(k)
            copies = weight_copies(device, lambda w=w, q=qargs: humming.quantize(w, **q), nbytes)
            first = copies[0]
            dense = w.to(torch.bfloat16)
            del w
            for m in m_values:
                if time.perf_counter() - start > args.budget_s:
                    skipped.append(f"{case} {n}x{k} M={m}")
                    continue
                x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
                if act is None:
                    qa, k_step = None, 0
                    default = wna16.default_config(first, x)
                    run = lambda qw, cfg, out=None, x=x: wna16.linear(x, qw, None, torch.bfloat16, cfg, out)
                else:
                    scheme = humming.ir.activation.get_act_scheme(act)
                    qa = humming.quantize_activation(x, scheme)
                    plan = compute_plan(
                        first, scheme, scaled_mm.act_group_k(scheme, qa.scales), device_capability(device)
                    )
                    k_step, default = plan.k_step, call_config(plan, first, m, device)
                    run = lambda qw, cfg, out=None, qa=qa: scaled_mm.linear(
                        qa, qw, None, None, torch.bfloat16, cfg, out
                    )
                ref = reference(case, x, qa, first)
                timed = {}
                for name, cfg in variants(m, n, k, default, limits.sm_count, k_step, act is None).items():
                    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device)
                    row = dict(case=case, n=n, k=k, m=m, variant=name, config=cfg.name())
                    try:
                        run(first, cfg, out)
                    except Exception as err:  # a variant the compiler refuses is data, not a failure
                        rows.append({**row, "error": str(err)[-300:]})
                        continue
                    row.update(rel_err=rel_err(out, ref), tuning=dataclasses.asdict(cfg))
                    if row["rel_err"] <= 1e-2 and not args.smoke:
                        row.update(time_calls([lambda qw=qw, c=cfg, run=run: run(qw, c) for qw in copies]))
                        timed[name] = row["graph_us"]
                    rows.append(row)
                torch_us = scaled_us = math.nan
                if not args.smoke:
                    torch_us = time_calls([lambda x=x, d=dense: x @ d.T])["graph_us"]
                    (xq, xs), (wq, ws) = e4m3_rows(x), e4m3_rows(dense)
                    mm = partial(torch._scaled_mm, xq, wq.t(), scale_a=xs, scale_b=ws.T, out_dtype=torch.bfloat16)
                    scaled_us = time_calls([mm])["graph_us"]
                    rows.append(dict(case=case, n=n, k=k, m=m, variant="torch-bf16", graph_us=torch_us))
                    rows.append(dict(case=case, n=n, k=k, m=m, variant="torch-scaled-mm", graph_us=scaled_us))
                if timed:
                    best = min(timed, key=timed.get)
                    summary.append(
                        (case, n, k, m, timed.get("default", math.nan), best, timed[best], torch_us, scaled_us)
                    )
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(dict(device=str(limits), rows=rows), indent=1) + "\n")
            del copies, first, dense
            if not args.smoke:
                torch.cuda.empty_cache()
    print(
        f"{'case':18} {'shape':>11} {'M':>5} {'default':>8} {'best':>8} {'variant':>14} {'bf16':>7} {'_scaled_mm':>10}"
    )
    for case, n, k, m, d, best, b, t, s in summary:
        print(f"{case:18} {n:>5}x{k:<5} {m:>5} {d:8.1f} {b:8.1f} {best:>14} {t:7.1f} {s:10.1f}")
    bad = [r for r in rows if r.get("rel_err", 0.0) > 1e-2 or "error" in r]
    print(f"{len(rows)} rows, {len(bad)} failed their check or did not run, in {time.perf_counter() - start:.0f}s")
    for r in bad[:10]:
        print("FAILED", r["case"], r["n"], r["k"], r["m"], r["variant"], r.get("rel_err"), r.get("error", ""))
    if skipped:
        print("not timed (budget):", ", ".join(skipped[:20]), "..." if len(skipped) > 20 else "")
    return 1 if bad and args.smoke else 0


if __name__ == "__main__":
    sys.exit(main())
