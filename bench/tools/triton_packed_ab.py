"""A/B of the Triton WnA16 kernels' packed 16-bit decode (``HUMMING_TRITON_PACKED_DECODE`` on against off), same
process, same inputs: the data behind turning it on by default (issue 26).

For each case, shape and M it times the chooser's config (with the packed decode on, the default) and the tiles
beside it (the swapped-operand kernel, the tiled kernel's 16-, 32- and 64-row tiles; above 128 tokens its 128-row
tiles against the dequantize-first GEMM), each with the fp32 decode and with the packed one, on separate weight
copies past the L2 (a launch is made ready once per weight, under the flag as it was then). Every variant is
checked against the float64 product of the dequantized weight before it is timed (CUDA-graph time,
:func:`humming.timing.time_calls`); torch bf16 and the byte floor sit beside. Writes one JSON row per
(case, shape, M, variant) and prints a table.

Usage (GPU machine, repository root, about 3 minutes):
  python bench/tools/triton_packed_ab.py --out $OUT/triton_packed_ab.json --budget-s 150
"""

from __future__ import annotations

import argparse
import json
import math
import os
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

#: name -> quantize arguments (16-bit scales, as real checkpoints)
CASES = {
    "int4-g128": dict(weight="int4", group_size=128, scale_dtype=torch.bfloat16),
    "mxfp4": dict(weight="mxfp4"),
    "uint4-zp-g128": dict(weight="int4", group_size=128, zero_point=True, scale_dtype=torch.bfloat16),
    "nvfp4": dict(weight="nvfp4"),
}
SHAPES = ((28672, 8192), (8192, 8192))
M_VALUES = (16, 1, 4, 64, 256, 1024)
#: The copy roof the floors are read against (bytes / s).
ROOF = 4.3e12
FLAG = "HUMMING_TRITON_PACKED_DECODE"


def variants(m: int, n: int, k: int, default: TileConfig, sm_count: int) -> dict[str, TileConfig]:
    """The chooser's config and the decode-size tiles beside it, split along K to fill the GPU."""

    def fill(cfg: TileConfig, waves: int) -> TileConfig:
        tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
        return cfg.replace(split_k=choose_split_k(tiles, -(-k // cfg.block_k), sm_count, waves))

    out = {"default": default}
    if m <= 16:
        out["swap"] = fill(TileConfig(16, 128, 128, num_warps=4, num_stages=3, swap=True), 4)
        out["tiled-16"] = fill(TileConfig(16, 64, 256, num_warps=4, num_stages=4), 2)
        out["tiled-32"] = fill(TileConfig(32, 64, 128, num_warps=4, num_stages=4), 2)
    elif m <= 128:
        out["tiled-64"] = fill(TileConfig(64, 128, 64, num_warps=4, num_stages=4), 2)
    else:  # the tiled kernel against the dequantize-first GEMM the chooser takes above 128 tokens
        out["tiled-128"] = fill(TileConfig(128, 128, 64, num_warps=8, num_stages=4), 2)
        out["tiled-128x256"] = fill(TileConfig(128, 256, 64, num_warps=8, num_stages=3), 2)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES))
    parser.add_argument("--m", default=",".join(map(str, M_VALUES)))
    parser.add_argument("--budget-s", type=float, default=math.inf, help="stop timing new points after this")
    args = parser.parse_args()
    from humming.timing import time_calls

    start = time.perf_counter()
    sm_count = device_limits(torch.device("cuda", 0)).sm_count
    rows, lines = [], []
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        for case in args.cases.split(","):
            w = torch.randn(n, k, device="cuda") / math.sqrt(k)
            dense = w.to(torch.bfloat16)
            weights = {}
            for flag in ("0", "1"):  # a launch is made ready under the flag as it is at the weight's first call
                os.environ[FLAG] = flag
                weights[flag] = weight_copies("cuda", lambda q=CASES[case], w=w: humming.quantize(w, **q), nbytes)
            floor_us = weights["0"][0].nbytes / ROOF * 1e6
            for m in (int(v) for v in args.m.split(",")):
                if time.perf_counter() - start > args.budget_s:
                    break
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                torch_us = time_calls([lambda x=x, d=dense: x @ d.T])["graph_us"]
                os.environ[FLAG] = "1"  # the chooser's config with the packed decode on, its default
                default = wna16.default_config(weights["1"][0], x)
                for name, cfg in variants(m, n, k, default, sm_count).items():
                    row = dict(case=case, n=n, k=k, m=m, variant=name, config=cfg.name(), torch_us=torch_us)
                    row["floor_us"] = floor_us
                    gemv = cfg.block_m <= 4 and not cfg.swap
                    for flag, label in (("0", "fp32_decode"), ("1", "packed")):
                        os.environ[FLAG] = flag
                        qws = weights[flag]
                        out = wna16.linear(x, qws[0], None, torch.bfloat16, config=cfg)
                        ref = x.double() @ humming.dequantize(qws[0], torch.float32 if gemv else x.dtype).double().T
                        err = ((out.double() - ref).norm() / ref.norm()).item()
                        row[f"{label}_rel_err"] = err
                        if math.isfinite(err) and err <= 1e-2:
                            calls = [
                                lambda qw=qw, c=cfg, x=x: wna16.linear(x, qw, None, torch.bfloat16, config=c)
                                for qw in qws
                            ]
                            row[f"{label}_us"] = time_calls(calls)["graph_us"]
                    rows.append(row)
                    fmt = lambda key, row=row: f"{row[key]:8.1f}" if key in row else "  failed"
                    lines.append(
                        f"{case:14} {n:>5}x{k:<5} {m:>4} {name:9} {cfg.name():32} {fmt('fp32_decode_us')} "
                        f"{fmt('packed_us')} {torch_us:8.1f} {floor_us:6.1f}"
                    )
                    print(lines[-1], flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(dict(device=torch.cuda.get_device_name(), rows=rows), indent=1) + "\n")
            del weights, dense, w
            torch.cuda.empty_cache()
    os.environ.pop(FLAG, None)
    head = f"{'case':14} {'shape':>11} {'M':>4} {'variant':9} {'config':32}"
    print(f"{head} {'fp32':>8} {'packed':>8} {'torch':>8} floor")
    print("\n".join(lines))
    bad = [r for r in rows if not (r.get("packed_rel_err", math.inf) <= 1e-2)]
    print(f"{len(rows)} rows, {len(bad)} with the packed decode failing its check")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
