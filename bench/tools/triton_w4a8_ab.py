"""A/B of the Triton scaled GEMM's packed e4m3 decode (W4A8, ``HUMMING_TRITON_PACKED_DECODE`` on against off),
same process, same inputs, the chooser's tile, next to torch bf16 and ``torch._scaled_mm`` on pre-quantized fp8
(issue 26's W4A8 target: at least as fast as torch bf16 from M = 1024).

Each case is quantized twice from one weight into copies past the L2 (a launch is made ready under the flag as
it is at the weight's first call); both decodes are checked against the float64 product of the dequantized
operands before they are timed (CUDA-graph time, :func:`humming.timing.time_calls`, the GEMM alone on
pre-quantized activations). Writes one JSON row per (case, shape, M) and prints a table.

Usage (GPU machine, repository root, about a minute):
  python bench/tools/triton_w4a8_ab.py --out $OUT/triton_w4a8_ab.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from functools import partial
from pathlib import Path

import torch

import humming
from humming.bench.systems import copies as weight_copies
from humming.bench.systems import nbytes
from humming.triton_kernels import scaled_mm

CASES = {
    "int4-g128": dict(weight="int4", group_size=128, scale_dtype=torch.bfloat16),
    "uint4-zp-g128": dict(weight="int4", group_size=128, zero_point=True, scale_dtype=torch.bfloat16),
    "int4-channel": dict(weight="int4", group_size=-1, scale_dtype=torch.float32),
}
FLAG = "HUMMING_TRITON_PACKED_DECODE"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--shapes", default="28672x8192")
    parser.add_argument("--m", default="256,1024,4096")
    args = parser.parse_args()
    from humming.timing import time_calls

    scheme = humming.ACT_SCHEMES["fp8"]
    rows, bad = [], 0
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        w = torch.randn(n, k, device="cuda") / math.sqrt(k)
        dense = w.to(torch.bfloat16)
        wq = (dense.float() / (dense.float().abs().amax(1, keepdim=True) / 448)).to(torch.float8_e4m3fn)
        ws = (dense.float().abs().amax(1, keepdim=True) / 448).T.contiguous()
        for case in args.cases.split(","):
            weights = {}
            for flag in ("0", "1"):
                os.environ[FLAG] = flag
                weights[flag] = weight_copies("cuda", lambda q=CASES[case], w=w: humming.quantize(w, **q), nbytes)
            for m in (int(v) for v in args.m.split(",")):
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                qa = humming.quantize_activation(x, scheme)
                ref = (
                    humming.dequantize_activation(qa, torch.float64)
                    @ humming.dequantize(weights["0"][0], torch.float64).T
                )
                row = dict(case=case, n=n, k=k, m=m)
                for flag, label in (("0", "fp32_decode"), ("1", "packed")):
                    os.environ[FLAG] = flag
                    qws = weights[flag]
                    out = scaled_mm.linear(qa, qws[0], None, None, torch.bfloat16)
                    err = ((out.double() - ref).norm() / ref.norm()).item()
                    row[f"{label}_rel_err"] = err
                    if math.isfinite(err) and err <= 1e-2:
                        calls = [
                            lambda qw=qw, qa=qa: scaled_mm.linear(qa, qw, None, None, torch.bfloat16) for qw in qws
                        ]
                        row[f"{label}_us"] = time_calls(calls)["graph_us"]
                    else:
                        bad += 1
                xq_scale = x.float().abs().amax(1, keepdim=True).clamp_min(1e-12) / 448
                xq = (x.float() / xq_scale).to(torch.float8_e4m3fn)
                mm = partial(torch._scaled_mm, xq, wq.t(), scale_a=xq_scale, scale_b=ws, out_dtype=torch.bfloat16)
                row["torch_scaled_mm_us"] = time_calls([mm])["graph_us"]
                row["torch_bf16_us"] = time_calls([lambda x=x, d=dense: x @ d.T])["graph_us"]
                rows.append(row)
                fmt = lambda key, row=row: f"{row[key]:9.1f}" if key in row else "   failed"
                print(
                    f"{case:14} {n:>5}x{k:<5} {m:>5} {fmt('fp32_decode_us')} {fmt('packed_us')} "
                    f"{fmt('torch_bf16_us')} {fmt('torch_scaled_mm_us')}",
                    flush=True,
                )
            del weights
            torch.cuda.empty_cache()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(dict(device=torch.cuda.get_device_name(), rows=rows), indent=1) + "\n")
    os.environ.pop(FLAG, None)
    print(f"{'case':14} {'shape':>11} {'M':>5} {'fp32':>9} {'packed':>9} {'bf16':>9} {'_scaled_mm':>9}")
    print(f"{len(rows)} rows, {bad} decodes failing their check")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
