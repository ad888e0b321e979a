"""Benchmark of the CUDA decode kernel (small-M weight-only GEMM) against the bandwidth floor and torch.

Kernel time is measured by replaying a CUDA graph of many launches that rotate over enough weight copies
to exceed the L2 several times (cold weights), and divided by the number of launches. The floor is the
bytes the call must move (weights, scales, zeros, activations, output) over the copy bandwidth measured
in the same run, and over 4.3 TB/s. The baseline is torch's bf16 matmul on the dequantized weight.

Usage: python bench/cuda_decode.py OUT.json [--sweep] [--shapes NxK,...] [--schemes int4-g128,...] [--m 1,16]
       python bench/cuda_decode.py OUT.json --stream-k   (stream-K vs the tile grid vs torch bf16, a table)
       python bench/cuda_decode.py - --sanitize          (small stream-K calls, for compute-sanitizer)
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
    "int4-g128": dict(weight="int4", group_size=128, zero_point=False, scale_dtype=torch.bfloat16),
    "uint4-g128-zp": dict(weight="uint4", group_size=128, zero_point=True, scale_dtype=torch.bfloat16),
    "int8-channel": dict(weight="int8", group_size=-1, zero_point=False, scale_dtype=torch.bfloat16),
    "mxfp4": dict(weight="mxfp4"),
}
SWEEP = [  # ((token tiles, row tiles per warp), warps, stages, stream-K blocks per SM or 0)
    ((1, 1), 8, 4, 0),
    ((1, 2), 8, 3, 0),
    ((1, 2), 8, 4, 0),
    ((1, 4), 8, 3, 0),
    ((1, 4), 8, 4, 0),
    ((1, 4), 4, 4, 0),
    ((1, 2), 8, 3, 2),
    ((1, 4), 8, 3, 2),
    ((1, 4), 4, 4, 3),
    ((1, 8), 4, 3, 2),
    ((2, 2), 8, 3, 0),
    ((2, 4), 8, 3, 0),
    ((2, 2), 8, 3, 2),
    ((2, 4), 4, 3, 2),
    ((2, 4), 4, 4, 2),
]
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


def rotated_preps(prep, l2: int) -> list:
    """``prep`` and enough copies of it to exceed 3x the L2 (cold weights when the graph rotates them)."""
    copies = max(2, -(-3 * l2 // prep.nbytes))
    return [prep] + [
        dataclasses.replace(
            prep,
            qweight=prep.qweight.clone(),
            scales=prep.scales.clone(),
            zeros=None if prep.zeros is None else prep.zeros.clone(),
        )
        for _ in range(copies - 1)
    ]


def stream_k_table(result: dict, l2: int, bw: float) -> None:
    """Stream-K vs the tile grid (both the heuristic's candidates) vs torch bf16, cold weights."""
    limits = _decode.device_limits(0)
    print(f"{'shape':>12} {'scheme':>13} {'M':>3} {'stream-K us':>11} {'tiles us':>8} {'torch us':>8} {'floor us':>8}")
    for n, k in [(28672, 8192), (8192, 8192)]:
        w = torch.randn(n, k, device="cuda") * 0.02
        w_bf16 = w.to(torch.bfloat16)
        torch_ws = [w_bf16.clone() for _ in range(max(1, -(-3 * l2 // (w_bf16.numel() * 2))))]
        for scheme in ("int4-g128", "int8-channel"):
            qw = humming.quantize(w, **SCHEMES[scheme])
            preps = rotated_preps(prepare_weight(qw), l2)
            w64 = humming.dequantize(qw, torch.float32).double()
            for m in (1, 4, 16, 64):
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                ref = (x.double() @ w64.T).float()
                tiles, stream_k = _decode.candidate_tunings(m, n, k, qw.bits, *limits)
                times, errors = {}, {}
                for label, tuning in (("stream_k", stream_k), ("tiles", tiles)):
                    # graph_time captures on torch's capture stream, which has no workspace of its own yet
                    _decode.reserve_workspace(m, n, tuning, 0)
                    got = _decode.run_decode(preps[0], x, None, torch.bfloat16, tuning)
                    errors[label] = ((got.float() - ref).norm() / ref.norm()).item()
                    calls = [partial(_decode.run_decode, p, x, None, torch.bfloat16, tuning, out) for p in preps * 4]
                    times[label] = graph_time(calls)
                tt = graph_time([partial(torch.matmul, x, wt.T) for wt in torch_ws * 4])
                floor = (preps[0].nbytes + x.numel() * 2 + out.numel() * 2) / bw
                row = dict(n=n, k=k, scheme=scheme, m=m, stream_k_seconds=times["stream_k"])
                row.update(tiles_seconds=times["tiles"], torch_bf16_seconds=tt, floor_seconds=floor)
                row.update(rel_error=errors, stream_k_tuning=stream_k.__dict__, tiles_tuning=tiles.__dict__)
                result["stream_k"].append(row)
                print(
                    f"{n:>6}x{k:<5} {scheme:>13} {m:>3} {times['stream_k'] * 1e6:11.2f} {times['tiles'] * 1e6:8.2f} "
                    f"{tt * 1e6:8.2f} {floor * 1e6:8.2f}  sk/tiles {times['stream_k'] / times['tiles']:.3f} "
                    f"sk/floor {times['stream_k'] / floor:.2f} err {errors['stream_k']:.1e} {errors['tiles']:.1e}"
                )
            del preps
        del torch_ws


def sanitize() -> None:
    """Small stream-K calls that cross tiles and share them between warps (zero points, tile groups of 1
    and 8, more warps than units, MXFP4), and one MXFP4 tile grid, for compute-sanitizer memcheck /
    racecheck."""
    torch.manual_seed(0)
    for weight, group, zp, m, n, k, tuning in [
        ("uint4", 128, True, 3, 608, 1024, _decode.DecodeTuning(1, 2, 8, 3, 1, 2)),
        ("int8", -1, False, 9, 256, 640, _decode.DecodeTuning(2, 4, 8, 3, 1, 1)),
        ("int4", 64, False, 2, 48, 128, _decode.DecodeTuning(1, 1, 8, 3, 1, 2)),
        ("mxfp4", 32, False, 5, 608, 1024, _decode.DecodeTuning(1, 2, 8, 3, 1, 2)),
        ("mxfp4", 32, False, 3, 256, 512, _decode.DecodeTuning(1, 2, 8, 3, 1)),
    ]:
        qw = humming.quantize(torch.randn(n, k, device="cuda"), weight=weight, group_size=group, zero_point=zp)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(n, device="cuda")
        ref = x.float() @ humming.dequantize(qw).T + bias
        for _ in range(2):
            out = _decode.run_decode(prepare_weight(qw), x, bias, torch.bfloat16, tuning)
            torch.cuda.synchronize()
            err = ((out.float() - ref).norm() / ref.norm()).item()
            print(f"stream-K {weight} g{group} zp={zp} M={m} N={n} K={k} {tuning}: rel err {err:.2e}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--sweep", action="store_true", help="also time a grid of tunings")
    parser.add_argument("--stream-k", action="store_true", help="only the stream-K vs tile grid vs torch table")
    parser.add_argument("--sanitize", action="store_true", help="only small stream-K calls (compute-sanitizer)")
    parser.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES), help="NxK,NxK,...")
    parser.add_argument("--schemes", default=",".join(SCHEMES), help=f"comma-separated, of {list(SCHEMES)}")
    parser.add_argument("--m", default=",".join(map(str, M_VALUES)), help="comma-separated token counts")
    args = parser.parse_args()
    shapes = [tuple(int(v) for v in shape.split("x")) for shape in args.shapes.split(",")]
    schemes = {name: SCHEMES[name] for name in args.schemes.split(",")}
    m_values = [int(m) for m in args.m.split(",")]
    if args.sanitize:
        sanitize()
        return
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
        "stream_k": [],
    }
    print(f"{props.name}: copy bandwidth {bw / 1e12:.2f} TB/s, L2 {l2 / 2**20:.0f} MiB")
    if args.stream_k:
        stream_k_table(result, l2, bw)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        return
    print(f"{'shape':>12} {'scheme':>14} {'M':>3} {'us':>8} {'floor us':>8} {'x floor':>7} {'torch us':>8} vs torch")
    for n, k in shapes:
        w = torch.randn(n, k, device="cuda") * 0.02
        w_bf16 = w.to(torch.bfloat16)
        torch_copies = max(1, -(-3 * l2 // (w_bf16.numel() * 2)))
        torch_ws = [w_bf16.clone() for _ in range(torch_copies)]
        for scheme, kwargs in schemes.items():
            qw = humming.quantize(w, **kwargs)
            prep = prepare_weight(qw)
            wbytes = prep.nbytes
            preps = rotated_preps(prep, l2)
            for m in m_values:
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
                if args.sweep and scheme in ("int4-g128", "mxfp4") and m in (1, 16):
                    for mt_r, warps, stages, stream_k in SWEEP:
                        mt, r = mt_r
                        if mt * 8 < m:
                            continue
                        tuning = _decode.DecodeTuning(mt, r, warps, stages, 1, stream_k)
                        _decode.reserve_workspace(m, n, tuning, 0)
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
