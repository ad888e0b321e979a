"""Time the dense decode kernel (``cuda.wna16_decode``) over its tuning space (row tiles per warp, warps,
stages, tile grid or stream-K) on the standard shapes at small M: the data behind
``_decode_tuning.choose_decode_tuning`` (issue 23's M <= 16 rows).

Every variant is checked once against the float64 product of the dequantized weight before it is timed
(CUDA-graph time over weight copies past the L2, :func:`humming.timing.time_calls`; a point's first variant is
timed twice and the first timing dropped, as in the bench sweeps). Writes one JSON row per (case, shape, M,
variant) and prints, per point, the default's time and the best variant's.

Usage (GPU machine, repository root, about 2 minutes):
  python bench/tools/decode_sweep.py --out $OUT/decode.json --budget-s 150
CPU check (NVRTC compiles every variant for sm_90; nothing runs):
  python bench/tools/decode_sweep.py --compile-only --out /tmp/decode_specs.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import torch

import humming
from humming.cuda_kernels import _driver, _wna16
from humming.cuda_kernels._decode_launch import DecodeLaunch, decode_spec, reserve_workspace
from humming.cuda_kernels._decode_tuning import DecodeTuning, candidate_tunings, choose_decode_tuning
from humming.cuda_kernels._layout import DTYPE_CODE, weight_layout
from humming.cuda_kernels.jit import compile_kernel, device_arch
from humming.timing import copies_past_l2, time_calls

CASES = {"int4-g128": dict(weight="int4", group_size=128), "mxfp4": dict(weight="mxfp4")}
SHAPES = ((28672, 8192), (8192, 8192), (7168, 2048), (2048, 7168))
M_VALUES = (1, 8, 16, 32)
#: The H200's limits (132 SMs, shared memory per block opt-in and per SM), for the CPU compile check.
H200_LIMITS = (132, 232448, 233472)


def variants(m: int, n: int, k: int, bits: int, limits: tuple[int, int, int]) -> list[DecodeTuning]:
    """The default tuning, then each of 1 / 2 / 4 row tiles per warp (those dividing N / 16), 4 / 8 warps and
    2-4 stages that fits shared memory, as the tile grid (split-K where the default splits; with several token
    tiles also read back) and as stream-K."""
    tiles, _ = candidate_tunings(m, n, k, bits, *limits)
    out = [choose_decode_tuning(m, n, k, bits, *limits)]
    for r in (1, 2, 4):
        if n % (16 * r):
            continue
        for warps in (4, 8):
            for stages in (2, 3, 4):
                grid = DecodeTuning(tiles.mt, r, warps, stages, tiles.splits)
                if grid.smem_bytes(bits) > limits[1]:
                    continue
                out.append(grid)
                if grid.splits > 1 and grid.mt > 1:  # the read-back that one token tile takes by default
                    out.append(dataclasses.replace(grid, read_back=True))
                blocks_per_sm = max(1, min(2, limits[2] // (grid.smem_bytes(bits) + 1024), 64 // warps))
                if tiles.splits == 1 and 8 % r == 0:
                    out.append(dataclasses.replace(grid, stream_k=blocks_per_sm))
    return list(dict.fromkeys(out))


def specs_of(qw, m: int, limits) -> list:
    layout, code = weight_layout(qw), DTYPE_CODE[torch.bfloat16]
    return [decode_spec(layout, code, code, code, t) for t in variants(m, qw.N, qw.K, layout.bits, limits)]


def point(case: str, qws: list, m: int) -> list[dict]:
    """Every variant of one (case, shape, M): checked, then timed."""
    qw = qws[0]
    n, k = qw.N, qw.K
    props = torch.cuda.get_device_properties(0)
    limits = (props.multi_processor_count, props.shared_memory_per_block_optin, props.shared_memory_per_multiprocessor)
    bits = weight_layout(qw).bits
    tunings = variants(m, n, k, bits, limits)
    cc = torch.cuda.get_device_capability()
    specs = specs_of(qw, m, limits)
    with ThreadPoolExecutor(max_workers=16) as pool:  # compiled in parallel, loaded once
        list(pool.map(lambda spec: _driver.load(compile_kernel(spec, device_arch(spec, cc)), 0), specs))
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    ref = x.double() @ humming.dequantize(qw, torch.float64).T
    rows = []
    for tuning in tunings:
        reserve_workspace(m, n, tuning, 0)
        launches = [DecodeLaunch(_wna16.prepare(w), m, x.dtype, x.stride(0), None, x.dtype, tuning, 0) for w in qws]
        out = launches[0](x, None)
        err = float((out.double() - ref).norm() / ref.norm())
        if not math.isfinite(err) or err > 1e-2:
            raise AssertionError(f"{case} {n}x{k} M={m} {tuning}: relative error {err}")
        calls = [partial(launch, x, None) for launch in launches]
        if not rows:  # the first graph timed after the weights are made can replay slower: time it twice
            time_calls(calls)
        times = time_calls(calls)
        label = f"r{tuning.r} w{tuning.warps} s{tuning.stages}" + (f" sk{tuning.stream_k}" if tuning.stream_k else "")
        label += f" split{tuning.splits}" if tuning.splits > 1 else ""
        rows.append(
            dict(case=case, n=n, k=k, m=m, variant=label, default=tuning == tunings[0], rel_err=err)
            | dataclasses.asdict(tuning)
            | times
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--cases", default="int4-g128")
    parser.add_argument("--m", default=",".join(map(str, M_VALUES)))
    parser.add_argument("--budget-s", type=float, default=math.inf, help="stop timing new shapes after this")
    parser.add_argument("--compile-only", action="store_true", help="compile every variant for sm_90 (CPU)")
    args = parser.parse_args()
    cases, m_values = args.cases.split(","), [int(m) for m in args.m.split(",")]
    if args.compile_only:
        names = []
        for case in cases:
            for n, k in SHAPES:
                qw = humming.quantize(torch.randn(n, k) / math.sqrt(k), **CASES[case])
                for m in m_values:
                    specs = specs_of(qw, m, H200_LIMITS)
                    with ThreadPoolExecutor(max_workers=4) as pool:
                        list(pool.map(lambda spec: compile_kernel(spec, device_arch(spec, (9, 0))), specs))
                    names += [spec.name for spec in specs]
                    print(f"{case} {n}x{k} M={m}: {len(specs)} variants compiled", flush=True)
        args.out.write_text(json.dumps(dict(specs=sorted(set(names))), indent=1))
        return 0
    start, rows, summary = time.time(), [], []
    for case in cases:
        for n, k in SHAPES:
            if time.time() - start > args.budget_s:
                print(f"budget spent: {case} {n}x{k} and later not timed", flush=True)
                break
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / math.sqrt(k)
            first = humming.quantize(w, **CASES[case])
            qws = [first] + [humming.quantize(w, **CASES[case]) for _ in range(copies_past_l2(first.nbytes) - 1)]
            for m in m_values:
                got = point(case, qws, m)
                rows += got
                best = min(got, key=lambda r: r["graph_us"])
                dflt = next(r for r in got if r["default"])
                summary.append(
                    f"{case:9} {n:5}x{k:<5} M={m:<3} default {dflt['graph_us']:7.1f} ({dflt['variant']})  "
                    f"best {best['graph_us']:7.1f} ({best['variant']})  {len(got)} variants"
                )
                print(summary[-1], flush=True)
            del qws, first, w
            torch.cuda.empty_cache()
    args.out.write_text(json.dumps(dict(device=torch.cuda.get_device_name(), rows=rows), indent=1))
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
