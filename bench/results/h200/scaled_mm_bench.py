"""Timing of the Triton scaled GEMM against ``torch._scaled_mm`` (the script behind scaled_mm_h200.json).

``python bench/results/h200/scaled_mm_bench.py OUT.json [--m 1 16 ...] [--sweep]``. CUDA-graph kernel time (a
graph of ``REPS`` calls, replayed; the median of 5 replays), weights cycled over copies exceeding the L2 4x.
Cases, on N x K = 28672 x 8192 and 8192 x 8192, M = 1 .. 4096:
- ``fp8``: W8A8 e4m3 per-channel weights x e4m3 per-token activations, quantized beforehand (GEMM only);
- ``fp8+quant``: the same with the activation quantization kernel in the timed graph;
- ``w4a8``: int4 g128 (bf16 scales) weights x e4m3 per-token activations (GEMM only);
- ``torch._scaled_mm``: the fp8 case through cuBLASLt (row-wise scales), the baseline.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics

import torch
import triton

import humming
from humming.triton_kernels import act_quant, scaled_mm
from humming.triton_kernels.scaled_mm_configs import ScaledMMConfig

REPS = 20
L2_BYTES = 60 * 2**20
HBM_BYTES_PER_S = 4.3e12


def _graph_time(fns) -> float:
    """Seconds per call: a CUDA graph of REPS calls cycling over ``fns``, replayed 5 times."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(REPS):
            fns[i % len(fns)]()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / REPS)
    return statistics.median(times)


def _row(case, m, n, k, seconds, weight_bytes, baseline=None):
    floor = (weight_bytes + m * k + m * n * 2) / HBM_BYTES_PER_S
    row = {
        "case": case,
        "M": m,
        "N": n,
        "K": k,
        "us": round(seconds * 1e6, 2),
        "tflops": round(2 * m * n * k / seconds / 1e12, 1),
        "floor_us": round(floor * 1e6, 2),
        "x_floor": round(seconds / floor, 2),
    }
    if baseline:
        row["speed_vs_scaled_mm"] = round(baseline / seconds, 2)
    print(json.dumps(row), flush=True)
    return row


def _copies(qw: humming.QuantizedWeight) -> list[humming.QuantizedWeight]:
    """The weight and clones of its codes: together more than 4x the L2."""
    extra = math.ceil(4 * L2_BYTES / qw.nbytes) - 1
    return [qw] + [qw.replace(qweight=qw.qweight.clone()) for _ in range(extra)]


def _shape_rows(m, n, k, copies8, copies4, device) -> list[dict]:
    fp8 = humming.ACT_SCHEMES["fp8"]
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    qa = act_quant.quantize_activation(x, fp8)
    out = torch.empty(m, n, device=device, dtype=torch.bfloat16)
    scale_b = copies8[0].scales.reshape(1, n).contiguous()
    weight8, weight4 = copies8[0].nbytes, copies4[0].nbytes

    def cublas(q):
        return lambda: torch._scaled_mm(
            qa.data(), q.qweight.view(torch.float8_e4m3fn).t(), qa.scales, scale_b, out_dtype=torch.bfloat16
        )

    def ours(q, a, act):
        return lambda: scaled_mm.linear(a, q, None, act, torch.bfloat16, out=out)

    rows = []
    try:
        t_ref = _graph_time([cublas(q) for q in copies8])
        rows.append(_row("torch._scaled_mm", m, n, k, t_ref, weight8))
    except RuntimeError as err:
        t_ref = None
        rows.append({"case": "torch._scaled_mm", "M": m, "N": n, "K": k, "error": str(err)[:200]})
    rows.append(_row("fp8", m, n, k, _graph_time([ours(q, qa, None) for q in copies8]), weight8, t_ref))
    rows.append(_row("fp8+quant", m, n, k, _graph_time([ours(q, x, fp8) for q in copies8]), weight8, t_ref))
    rows.append(_row("w4a8", m, n, k, _graph_time([ours(q, qa, None) for q in copies4]), weight4, t_ref))
    return rows


#: Candidate tiles for --sweep (M <= 16 and large M); the winners go to scaled_mm_configs.py.
_SWEEP = {
    "small": (
        ScaledMMConfig(16, 64, 128, num_warps=4, num_stages=4),
        ScaledMMConfig(16, 64, 256, num_warps=4, num_stages=4),
        ScaledMMConfig(16, 128, 128, num_warps=4, num_stages=5),
        ScaledMMConfig(16, 32, 256, num_warps=4, num_stages=6),
    ),
    "large": (
        ScaledMMConfig(128, 256, 128, num_warps=8, num_stages=3),
        ScaledMMConfig(128, 128, 128, num_warps=8, num_stages=4),
        ScaledMMConfig(128, 256, 64, num_warps=8, num_stages=4),
    ),
}


def _sweep_rows(m, n, k, copies8, copies4, device) -> list[dict]:
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    qa = act_quant.quantize_activation(x, humming.ACT_SCHEMES["fp8"])
    out = torch.empty(m, n, device=device, dtype=torch.bfloat16)
    rows = []
    for cfg in _SWEEP["small" if m <= 16 else "large"]:
        for case, copies in (("fp8", copies8), ("w4a8", copies4)):
            if case == "w4a8":  # block_k divides the g128 promotion step
                cfg = cfg.replace(block_k=min(cfg.block_k, 128))
            fns = [
                lambda q=q, c=cfg: scaled_mm.linear(qa, q, None, None, torch.bfloat16, config=c, out=out)
                for q in copies
            ]
            rows.append(_row(f"{case} {cfg.name()}", m, n, k, _graph_time(fns), copies[0].nbytes))
    return rows


def main(path: str, ms: tuple[int, ...], sweep: bool, device: str = "cuda") -> None:
    rows = []
    for n, k in ((28672, 8192), (8192, 8192)):
        w = torch.randn(n, k, device=device)
        copies8 = _copies(humming.quantize(w, "e4m3", group_size=-1, scale_dtype=torch.float32))
        copies4 = _copies(humming.quantize(w, "int4", group_size=128, scale_dtype=torch.bfloat16))
        del w
        for m in ms:
            rows += _shape_rows(m, n, k, copies8, copies4, device)
            if sweep and n == 28672:
                rows += _sweep_rows(m, n, k, copies8, copies4, device)
    meta = {
        "device": torch.cuda.get_device_name() if device == "cuda" else device,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "hbm_roof_bytes_per_s": HBM_BYTES_PER_S,
        "timing": f"CUDA graph of {REPS} calls, median of 5 replays; weights cycled over > 4x L2 of copies",
    }
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="JSON file to write")
    parser.add_argument("--m", type=int, nargs="+", default=[1, 16, 128, 1024, 4096], help="values of M")
    parser.add_argument("--sweep", action="store_true", help="also time candidate tiles on 28672 x 8192")
    args = parser.parse_args()
    main(args.out, tuple(args.m), args.sweep)
