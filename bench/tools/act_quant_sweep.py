"""Time the Triton activation-quantization pass (``humming.triton_kernels.act_quant``) on its own: the pass in
front of every quantized-activation GEMM (W8A8, W4A8, MXFP4 x fp8, ...), over schemes, M, K and the
per-token tile (rows per program, columns per step, warps), against the byte floor (x read, codes and
scales written, at the device's copy bandwidth) and against torch's eager per-token fp8 quantization.

Every variant's codes and scales are first checked bit-exact against :func:`humming.quantize_activation`
on fresh random rows of different magnitudes; a variant that differs is reported and not timed.
CUDA-graph time over input copies past the L2 (:func:`humming.timing.time_calls`).

Usage (GPU machine, repository root):
  python bench/tools/act_quant_sweep.py --out out/act_quant.json
  PYTHONPATH=old python bench/tools/act_quant_sweep.py --label old --out out/act_quant_old.json
(the second line times another checkout's pass, the same way, for a same-run comparison)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

import humming
from humming.timing import copies_past_l2, copy_bandwidth, time_calls
from humming.triton_kernels import _act_quant_pass

#: Per-token tiles tried besides the pass's own: (rows per program, columns per step, warps).
TILES = ((4, 1024, 4), (1, 8192, 16), (1, 8192, 8), (2, 4096, 8), (8, 1024, 8))


def inputs(m: int, k: int, copies: int) -> list[torch.Tensor]:
    """``copies`` bf16 [m, k] inputs, rows of different magnitudes."""
    out = []
    for _ in range(copies):
        x = torch.randn(m, k, device="cuda") * 10.0 ** torch.randint(-2, 3, (m, 1), device="cuda")
        out.append(x.to(torch.bfloat16))
    return out


def with_tile(quant, tile):
    """The pass ``quant`` with its per-token tile replaced by ``tile``."""
    rows, cols, warps = tile
    quant.constexprs["BLOCK_M"], quant.constexprs["BLOCK_K"] = rows, cols
    quant.num_warps = warps
    quant.grid = (-(-quant.m // rows), 1, 1)
    return quant


def exact(quant, x: torch.Tensor, act: str) -> str | None:
    """``None`` if ``quant`` matches the reference on ``x``, else what differs."""
    codes, scales, _ = quant(x)
    ref = humming.quantize_activation(x, act)
    ref_scales = ref.scales.view(torch.uint8) if ref.scales.dtype != torch.float32 else ref.scales
    if not torch.equal(scales.view(ref_scales.shape), ref_scales):
        return "scales differ"
    if not torch.equal(codes, ref.codes):
        return f"{int((codes != ref.codes).sum())} codes differ"
    return None


def torch_fp8_per_token(x: torch.Tensor):
    """torch's eager per-token e4m3 quantization (the usual engine fallback), for scale."""
    s = x.abs().amax(dim=1, keepdim=True).float() / 448.0
    return (x.float() / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), s


def point(act: str, m: int, k: int, bandwidth: float, label: str) -> list[dict]:
    scheme = humming.ACT_SCHEMES[act]
    per_token = scheme.group_shape == (1, -1)
    xs = inputs(m, k, copies_past_l2(m * k * 2))
    spans = 1 if scheme.group_shape[1] == -1 else -(-k // scheme.group_shape[1])
    floor_us = (m * k * 3 + m * spans * 4) / bandwidth * 1e6
    variants = [("default", _act_quant_pass._Pass(xs[0], scheme, False, None, 0, False))]
    if per_token:
        variants += [
            ("x".join(map(str, tile)), with_tile(_act_quant_pass._Pass(xs[0], scheme, False, None, 0, False), tile))
            for tile in TILES
        ]
    rows = []
    for name, quant in variants:
        row = dict(label=label, act=act, m=m, k=k, variant=name, floor_us=floor_us)
        if name == "default":
            row["tile"] = [quant.constexprs["BLOCK_M"], quant.constexprs["BLOCK_K"], quant.num_warps]
        wrong = exact(quant, xs[0], act)
        if wrong:
            rows.append(dict(row, error=wrong))
            continue
        row.update(time_calls([lambda x=x, q=quant: q(x) for x in xs]))
        rows.append(row)
    if act == "fp8":
        row = dict(label=label, act=act, m=m, k=k, variant="torch-eager", floor_us=floor_us)
        row.update(time_calls([lambda x=x: torch_fp8_per_token(x) for x in xs]))
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--acts", default="fp8,int8,fp8_g128,mxfp8")
    parser.add_argument("--m", default="1,16,256,1024,4096")
    parser.add_argument("--k", default="8192,2048")
    parser.add_argument("--label", default="humming")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    acts = [a for a in args.acts.split(",") if a in humming.ACT_SCHEMES]
    bandwidth = copy_bandwidth()
    rows = []
    for act in acts:
        for k in map(int, args.k.split(",")):
            for m in map(int, args.m.split(",")):
                point_rows = point(act, m, k, bandwidth, args.label)
                rows += point_rows
                args.out.parent.mkdir(parents=True, exist_ok=True)
                report = dict(gpu=torch.cuda.get_device_name(), bandwidth=bandwidth, rows=rows)
                args.out.write_text(json.dumps(report, indent=1))  # after every point: a cut-off run keeps its rows
                for row in point_rows:
                    if row["variant"] in ("default", "torch-eager") or "error" in row:
                        time = (
                            row.get("error")
                            or f"{row['graph_us']:8.1f} us  {row['graph_us'] / row['floor_us']:5.2f}x floor"
                        )
                        print(f"{args.label:8} {act:9} M={m:5} K={k:5} {row['variant']:12} {time}", flush=True)
    best = {}
    for row in rows:
        if "graph_us" in row and row["variant"] != "torch-eager":
            key = (row["act"], row["m"], row["k"])
            if key not in best or row["graph_us"] < best[key]["graph_us"]:
                best[key] = row
    for (act, m, k), row in best.items():
        print(f"{args.label:8} best {act:9} M={m:5} K={k:5} {row['variant']:12} {row['graph_us']:8.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
