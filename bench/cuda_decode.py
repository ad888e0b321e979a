"""Benchmark of the CUDA decode kernel (small-M weight-only GEMM) against the bandwidth floor and torch.

Kernel time is measured by replaying a CUDA graph of many launches that rotate over enough weight copies
to exceed the L2 several times (cold weights), and divided by the number of launches. The floor is the
bytes the call must move (weights, scales, zeros, activations, output) over the copy bandwidth measured
in the same run, and over 4.3 TB/s. The baseline is torch's bf16 matmul on the dequantized weight.

Usage: python bench/cuda_decode.py OUT.json [--sweep]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import time
from functools import partial

import torch

import humming
from humming.cuda_kernels import _decode, jit
from humming.cuda_kernels._layout import prepare_weight

NOMINAL_BW = 4.3e12
SHAPES = [(8192, 8192), (28672, 8192)]
SCHEMES = {
    "int4-g128": dict(weight="int4", group_size=128, zero_point=False),
    "uint4-g128-zp": dict(weight="uint4", group_size=128, zero_point=True),
    "int8-channel": dict(weight="int8", group_size=-1, zero_point=False),
}
M_VALUES = (1, 4, 16, 32, 64)


def graph_time(fn_list, replays: int = 20) -> float:
    """Median seconds per call of the launches in ``fn_list``, captured once into a CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in fn_list[:2]:
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in fn_list:
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / len(fn_list))
    times.sort()
    return times[len(times) // 2]


def copy_bandwidth() -> float:
    """Bytes read + written per second by an elementwise kernel over 2 GiB (the practical roof)."""
    src = torch.randn(512 * 1024**2, device="cuda")
    dst = torch.empty_like(src)
    t = graph_time([partial(torch.mul, src, 1.0, out=dst)] * 5)
    return 2 * src.numel() * 4 / t


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--sweep", action="store_true", help="also time a grid of tunings")
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(0)
    l2 = props.L2_cache_size
    bw = copy_bandwidth()
    import cuda.core

    result = {
        "device": props.name,
        "sms": props.multi_processor_count,
        "l2_bytes": l2,
        "copy_bandwidth_Bps": bw,
        "nominal_bandwidth_Bps": NOMINAL_BW,
        "versions": {
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "cuda_core": cuda.core.__version__,
            "nvrtc": ".".join(map(str, jit.nvrtc_version())),
            "python": platform.python_version(),
        },
        "rows": [],
        "sweep": [],
    }
    print(f"{props.name}: copy bandwidth {bw / 1e12:.2f} TB/s, L2 {l2 / 2**20:.0f} MiB")
    print(f"{'shape':>12} {'scheme':>14} {'M':>3} {'us':>8} {'floor us':>8} {'x floor':>7} {'torch us':>8} vs torch")
    for n, k in SHAPES:
        w = torch.randn(n, k, device="cuda") * 0.02
        w_bf16 = w.to(torch.bfloat16)
        torch_copies = max(1, -(-3 * l2 // (w_bf16.numel() * 2)))
        torch_ws = [w_bf16.clone() for _ in range(torch_copies)]
        for scheme, kwargs in SCHEMES.items():
            qw = humming.quantize(w, scale_dtype=torch.bfloat16, **kwargs)
            prep = prepare_weight(qw)
            wbytes = prep.nbytes
            copies = max(2, -(-3 * l2 // wbytes))
            preps = [prep] + [
                dataclasses.replace(
                    prep,
                    qweight=prep.qweight.clone(),
                    scales=prep.scales.clone(),
                    zeros=None if prep.zeros is None else prep.zeros.clone(),
                )
                for _ in range(copies - 1)
            ]
            for m in M_VALUES:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                ref = x.float() @ humming.dequantize(qw, torch.float32).T
                got = _decode.run_decode(prep, x, None, torch.bfloat16)
                err = ((got.float() - ref).norm() / ref.norm()).item()
                t = graph_time([partial(_decode.run_decode, p, x, None, torch.bfloat16, out=out) for p in preps * 4])
                moved = wbytes + x.numel() * 2 + out.numel() * 2
                floor = moved / bw
                tt = graph_time([partial(torch.matmul, x, wt.T) for wt in torch_ws * 4])
                row = dict(
                    n=n,
                    k=k,
                    scheme=scheme,
                    m=m,
                    seconds=t,
                    bytes=moved,
                    floor_seconds=floor,
                    ratio_to_floor=t / floor,
                    ratio_to_nominal_floor=t / (moved / NOMINAL_BW),
                    achieved_Bps=moved / t,
                    torch_bf16_seconds=tt,
                    speedup_vs_torch=tt / t,
                    rel_error=err,
                    tuning=_decode.default_tuning(m, n, k, qw.bits, 0).__dict__,
                )
                result["rows"].append(row)
                print(
                    f"{n:>6}x{k:<5} {scheme:>14} {m:>3} {t * 1e6:8.2f} {floor * 1e6:8.2f} {t / floor:7.3f} "
                    f"{tt * 1e6:8.2f} {tt / t:7.2f}x  err {err:.1e}"
                )
                if args.sweep and scheme == "int4-g128" and m in (1, 16):
                    for mt_r, warps, stages in [
                        ((1, 1), 8, 4),
                        ((1, 2), 8, 3),
                        ((1, 2), 8, 4),
                        ((1, 2), 8, 6),
                        ((1, 4), 8, 3),
                        ((1, 4), 8, 4),
                        ((1, 4), 16, 3),
                        ((1, 4), 4, 4),
                        ((2, 2), 8, 3),
                        ((2, 4), 8, 3),
                        ((2, 4), 16, 2),
                    ]:
                        mt, r = mt_r
                        if mt * 8 < m:
                            continue
                        tuning = _decode.DecodeTuning(mt, r, warps, stages, 1)
                        ts = graph_time(
                            [partial(_decode.run_decode, p, x, None, torch.bfloat16, tuning, out) for p in preps * 4]
                        )
                        result["sweep"].append(
                            dict(n=n, k=k, m=m, tuning=tuning.__dict__, seconds=ts, ratio_to_floor=ts / floor)
                        )
                        print(f"    sweep {tuning}: {ts * 1e6:.2f} us ({ts / floor:.3f}x floor)")
            del preps
        del torch_ws
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"bench done in {time.time() - t0:.0f}s")
