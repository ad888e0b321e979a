"""Time the Hopper GEMMs over their tuning space (token tile, blocks per SM, stages, warpgroups, K splits),
next to the tuning each would run today, on the standard shapes: the data behind the tuning heuristics
(``_gemm_sm90.default_gemm_tuning``, ``_fp8_tuning.choose_tuning``).

Every variant is checked once against the float64 product of the dequantized weight before it is timed
(CUDA-graph time over weight copies past the L2, :func:`humming.timing.time_calls`). Writes one JSON row
per (case, shape, M, kernel, tuning) and prints, per point, the default's time and the best variant's.

Usage (GPU machine, repository root): python bench/tools/tuning_sweep.py --out out/tuning.json [--budget-s 200]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

import humming
from humming.cuda_kernels import _driver, _gemm_sm90, prepare
from humming.cuda_kernels import fp8_gemm as fp8
from humming.cuda_kernels._fp8_launch import call_spec
from humming.cuda_kernels._fp8_tuning import Fp8Tuning, choose_tuning, smem_bytes
from humming.cuda_kernels.jit import compile_kernel, device_arch
from humming.device import device_info
from humming.dispatch.kernels import DENSE_KERNELS
from humming.ir.activation import get_act_scheme
from humming.timing import copies_past_l2, time_calls

SHAPES = ((28672, 8192), (8192, 8192), (7168, 2048), (2048, 7168))
#: The dispatcher's name of each kernel family the sweep times (the rows name the family).
DISPATCH_NAMES = {"gemm_sm90": "cuda.wna16_sm90", "fp8_gemm": "cuda.fp8_gemm"}
#: name -> (quantize arguments, act, kernel, M values)
CASES = {
    "w4a16-int4-g128": (dict(weight="int4", group_size=128), None, "gemm_sm90"),
    "w4a16-uint4-g128-zp": (dict(weight="int4", group_size=128, zero_point=True), None, "gemm_sm90"),
    "w4a16-int4-channel": (dict(weight="int4", group_size=-1), None, "gemm_sm90"),
    "w8a16-int8-channel": (dict(weight="int8", group_size=-1), None, "gemm_sm90"),
    "w4a8-int4-channel-fp8": (dict(weight="int4", group_size=-1), "fp8", "fp8_gemm"),
    "w4a8-int4-g128-fp8": (dict(weight="int4", group_size=128), "fp8", "fp8_gemm"),
    "w4a8-mxfp4-fp8": (dict(weight="mxfp4"), "fp8", "fp8_gemm"),
    "w8a8-fp8-channel": (dict(weight="e4m3", group_size=-1), "fp8", "fp8_gemm"),
}
GEMM_M = (48, 64, 96, 128, 192, 256, 384, 512, 1024)
FP8_M = (1, 16, 64, 128, 256, 1024)


def gemm_tunings(m: int, n: int, k: int, layout, limits) -> list[_gemm_sm90.GemmTuning]:
    """Token tiles of 32 to 256 (two blocks per SM for tiles of up to 64 tokens, also one for 64), each with
    as many stages as shared memory holds (two blocks: half of it each), and 4 stages for 128 and 256; each
    of those whose grid leaves block slots idle also with K in 2, 4 and the splits that fill the slots once
    (16 chunks of K per split at least), and those with more tiles than block slots also persistent."""
    smem = limits.smem_per_block
    out = []
    for bm, blocks in ((32, 2), (64, 2), (64, 1), (128, 1), (256, 1)):
        if bm > 2 * max(m, 32) or (bm < 128 and m > 4 * bm):
            continue
        budget = smem // blocks - 1024 * (blocks - 1)
        stages = 8
        while stages > 2 and _gemm_sm90.GemmTuning(bm, stages, blocks).smem_bytes(layout) > budget:
            stages -= 1
        out.append(_gemm_sm90.GemmTuning(bm, stages, blocks))
        if bm >= 128 and stages > 4:
            out.append(_gemm_sm90.GemmTuning(bm, 4, blocks))
        tiles = (n // 128) * -(-m // bm)
        if tiles > limits.sm_count * blocks:  # more tiles than block slots: a persistent grid walks them
            out.append(_gemm_sm90.GemmTuning(bm, stages, blocks, persistent=True))
        fill = min(limits.sm_count * blocks // tiles, k // 64 // 16)
        for splits in sorted({2, 4, fill} & set(range(2, fill + 1))):
            out.append(_gemm_sm90.GemmTuning(bm, stages, blocks, splits))
    return out


def fp8_tunings(m: int, n: int, k: int, limits, w_format: str, scale_mode: str) -> list[Fp8Tuning]:
    """The default, and each (warpgroups, blocks per SM) with the stages shared memory holds, with one split
    and with the split count that fills one wave; those of one split with more tiles than block slots also on a
    persistent grid; where K blocks may share a promotion, each also with two and four; 4-bit weights' on 128-token
    tiles each also reading codes a K block ahead, and those promoted at every K block also in token halves; each of
    more than one split also read back by its last split."""
    base = choose_tuning(m, n, k, limits, w_format)
    out = [base]
    for wgs, blocks in ((1, 2), (2, 1), (1, 1), (2, 2)):
        budget = min(limits.smem_per_block, limits.smem_per_sm // blocks - 1024)
        stages = 2
        while stages < 16 and smem_bytes(wgs, base.block_m, stages + 1, w_format) <= budget:
            stages += 1
        if smem_bytes(wgs, base.block_m, stages, w_format) > budget:
            continue
        tiles = math.ceil(n / (64 * wgs)) * math.ceil(m / base.block_m)
        fill = max(1, min(limits.sm_count * blocks // tiles, math.ceil(k / 128) // 8))
        for splits in sorted({1, fill}):
            t = Fp8Tuning(wgs, base.block_m, stages, blocks, splits=splits)
            if t not in out:
                out.append(t)
    walks = [
        dataclasses.replace(t, persistent=True)
        for t in out
        if t.splits == 1 and math.ceil(n / t.block_n) * math.ceil(m / t.block_m) > limits.sm_count * t.min_blocks
    ]
    out += walks
    fewer = [dataclasses.replace(t, promote_blocks=p) for p in (2, 4) for t in out]
    out += [t for t in fewer if t.promotes_every(scale_mode) == t.promote_blocks]
    ahead = [dataclasses.replace(t, prefetch_codes=True) for t in out]
    out += [t for t in ahead if t.reads_codes_ahead(w_format)]
    halves = [dataclasses.replace(t, token_halves=True) for t in out]
    out += [t for t in halves if t.issues_token_halves(w_format, scale_mode)]
    return out + [dataclasses.replace(t, read_back=True) for t in out if t.splits > 1]


def fields_apart(a, b) -> int:
    """How many fields two tunings of one dataclass differ in."""
    return sum(getattr(a, f.name) != getattr(b, f.name) for f in dataclasses.fields(a))


def _spec(kernel: str, qw, prep, tuning):
    if kernel == "gemm_sm90":
        return _gemm_sm90.gemm_spec(prep.layout, "bf16", "bf16", "bf16", tuning)
    return call_spec(prep.w_format, prep.scale_mode, None, torch.bfloat16, tuning)


def _compile(specs, cc, device) -> dict:
    """Compile and load ``specs`` in parallel; the ones that do not build (a variant past the register
    budget) -> the first line of their error."""
    specs = list(dict.fromkeys(specs))

    def build(spec):
        try:
            _driver.load(compile_kernel(spec, device_arch(spec, cc)), device)
        except Exception as err:  # a variant the compiler refuses is data, not a failure of the sweep
            return spec, " ".join(str(err).replace("\x00", " ").split())[-200:]
        return spec, None

    with ThreadPoolExecutor(max_workers=16) as pool:
        return {spec: reason for spec, reason in pool.map(build, specs) if reason is not None}


def _check(out: torch.Tensor, x: torch.Tensor, qw, act) -> float:
    xq = x if act is None else humming.dequantize_activation(humming.quantize_activation(x, act))
    ref = xq.double() @ humming.dequantize(qw).double().T
    if not torch.isfinite(out).all():
        return math.inf
    return ((out.double() - ref).norm() / ref.norm()).item()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES))
    parser.add_argument("--m", help="comma-separated M values (default: each kernel family's list)")
    parser.add_argument("--budget-s", type=float, default=math.inf, help="stop timing new points after this")
    parser.add_argument(
        "--max-apart", type=int, help="time only tunings at most this many fields from the default (0: it alone)"
    )
    args = parser.parse_args()
    start = time.perf_counter()
    info = device_info()
    dev, cc = torch.cuda.current_device(), info.capability
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    ms = [int(v) for v in args.m.split(",")] if args.m else None
    rows, summary = [], []
    for case in args.cases.split(","):
        qargs, act_name, kernel = CASES[case]
        act = None if act_name is None else get_act_scheme(act_name)
        runner = DENSE_KERNELS[DISPATCH_NAMES[kernel]]
        for n, k in shapes:
            if time.perf_counter() - start > args.budget_s:
                break
            w = torch.randn(n, k, device="cuda") / math.sqrt(k)
            first = humming.quantize(w, **qargs)
            copies = [first] + [humming.quantize(w, **qargs) for _ in range(copies_past_l2(first.nbytes) - 1)]
            del w
            probe = torch.empty(64, k, device="cuda", dtype=torch.bfloat16)
            reason = runner.unsupported(first, act, probe)
            if reason is not None:
                print(f"skipped {case} {n}x{k}: {reason}")
                continue
            prep = prepare(first) if kernel == "gemm_sm90" else fp8.prepare(first)
            points = []
            for m in ms or (GEMM_M if kernel == "gemm_sm90" else FP8_M):
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                if runner.unsupported(first, act, x) is not None:
                    continue
                default = runner.tuning(first, act, x)
                if kernel == "gemm_sm90":
                    tunings = [default, *gemm_tunings(m, n, k, prep.layout, info.limits)]
                else:
                    default = choose_tuning(m, n, k, info.limits, prep.w_format)
                    tunings = fp8_tunings(m, n, k, info.limits, prep.w_format, prep.scale_mode)
                tunings = list(dict.fromkeys([default, *tunings]))
                if args.max_apart is not None:
                    tunings = [t for t in tunings if fields_apart(t, default) <= args.max_apart]
                points.append((m, x, default, tunings))
            failed = _compile([_spec(kernel, first, prep, t) for *_, ts in points for t in ts], cc, dev)
            points = [
                (m, x, d, [t for t in ts if _spec(kernel, first, prep, t) not in failed]) for m, x, d, ts in points
            ]
            for spec, reason in failed.items():
                print(f"not compiled: {spec.name}: {reason}")
            for m, x, default, tunings in points:
                timed = {}
                for t in tunings:
                    out = runner.run(x, first, None, act, torch.bfloat16, t)
                    err = _check(out, x, first, act)
                    row = dict(case=case, n=n, k=k, m=m, kernel=kernel, tuning=dataclasses.asdict(t), rel_err=err)
                    row["default"] = t == default
                    if err <= 2e-2:
                        row.update(
                            time_calls(
                                [
                                    lambda qw=qw, t=t, x=x, r=runner, a=act: r.run(x, qw, None, a, torch.bfloat16, t)
                                    for qw in copies
                                ]
                            )
                        )
                        timed[t] = row["graph_us"]
                    rows.append(row)
                if timed:
                    best = min(timed, key=timed.get)
                    summary.append((case, n, k, m, timed.get(default, math.nan), timed[best], best))
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(dict(device=info.name, rows=rows), indent=1) + "\n")
            del copies, first, prep
            torch.cuda.empty_cache()
    print(f"{'case':24} {'shape':>11} {'M':>5} {'default':>8} {'best':>8} {'gain':>5}  best tuning")
    for case, n, k, m, d, b, t in summary:
        print(f"{case:24} {n:>5}x{k:<5} {m:>5} {d:8.1f} {b:8.1f} {d / b:5.2f}  {t}")
    bad = [r for r in rows if r["rel_err"] > 2e-2]
    print(f"{len(rows)} variants, {len(bad)} failed their check in {time.perf_counter() - start:.0f}s")
    for r in bad[:10]:
        print("FAILED", r["case"], r["n"], r["k"], r["m"], r["tuning"], r["rel_err"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
