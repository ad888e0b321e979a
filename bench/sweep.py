"""Sweep M for every method of bench/harness.py on a few (N, K) shapes; write one JSON with the roofs.

    python bench/sweep.py --shapes 28672x8192,8192x8192 --out bench/results/h200/sweep.json
    python bench/sweep.py --tune --out bench/results/h200/tune.json   # WnA16 tile candidates per M

Each row: CUDA-graph time and eager time per call (weights rotate through copies totalling > 2.5x L2),
the floor ``max(bytes / measured copy bandwidth, flops / measured bf16 rate)`` with bytes = weights +
activations + output, the ratio time / floor, and the speed relative to torch bf16 at the same point.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from importlib import metadata
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import METHODS, measure_roofs, time_op

from humming.triton_kernels.configs import TileConfig, choose_split_k, wna16_config

DEFAULT_M = [1 << i for i in range(14)]
#: Tile candidates the tuner tries per M (on top of the current default).
TUNE_CANDIDATES = {
    "gemv": [
        TileConfig(1, 32, 256, num_stages=1),
        TileConfig(1, 16, 512, num_warps=8, num_stages=1),
        TileConfig(1, 8, 512, num_stages=1),
        TileConfig(16, 32, 256, num_stages=4),
    ],
    "small": [
        TileConfig(16, 32, 256, num_stages=4),
        TileConfig(16, 64, 256, num_stages=4),
        TileConfig(16, 32, 512, num_stages=3),
        TileConfig(16, 64, 128, num_stages=5),
    ],
    "medium": [
        TileConfig(64, 64, 128, num_stages=4),
        TileConfig(64, 128, 64, num_stages=4),
        TileConfig(128, 128, 64, num_warps=8, num_stages=4),
        TileConfig(64, 256, 64, num_warps=8),
    ],
    "large": [
        TileConfig(128, 256, 64, num_warps=8, num_stages=3),
        TileConfig(128, 128, 64, num_warps=8, num_stages=4),
        TileConfig(128, 256, 64, num_warps=8, num_stages=4),
        TileConfig(256, 128, 64, num_warps=8, num_stages=3),
    ],
}


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("torch", "triton", "gemlite", "numpy"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def _copies(method, n: int, k: int, l2_bytes: int) -> int:
    return max(1, min(8, math.ceil(2.5 * l2_bytes / method.weight_bytes(n, k))))


def _row(method, n, k, m, ops, roofs, note="") -> dict:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    t = time_op(ops, x)
    bytes_moved = method.weight_bytes(n, k) + 2 * m * k + 2 * m * n
    flops = 2 * m * n * k
    floor_us = max(bytes_moved / roofs["copy_bytes_per_s"], flops / roofs["bf16_flops_per_s"]) * 1e6
    return {
        "method": method.name,
        "N": n,
        "K": k,
        "M": m,
        **{key: round(v, 3) for key, v in t.items()},
        "floor_us": round(floor_us, 3),
        "graph_over_floor": round(t["graph_us"] / floor_us, 3),
        "tflops": round(flops / t["graph_us"] / 1e6, 2),
        "gb_per_s": round(bytes_moved / t["graph_us"] / 1e3, 1),
        "note": note or method.note,
    }


def sweep(shapes, ms, methods, roofs, l2_bytes, deadline, log, save) -> list[dict]:
    """Time every method at every (shape, M); ``save(rows)`` runs after each method (partial results)."""
    rows = []
    for n, k in shapes:
        for name in methods:
            method = METHODS[name]
            try:
                ops = [method.build(n, k, "cuda") for _ in range(_copies(method, n, k, l2_bytes))]
            except Exception as err:  # a baseline missing on this machine is recorded, not fatal
                rows.append({"method": name, "N": n, "K": k, "error": f"{type(err).__name__}: {err}"[:300]})
                log(f"{name} {n}x{k}: unavailable: {rows[-1]['error']}")
                continue
            for m in ms:
                if time.time() > deadline:
                    rows.append({"method": name, "N": n, "K": k, "M": m, "error": "skipped: time budget"})
                    continue
                try:
                    rows.append(_row(method, n, k, m, ops, roofs))
                except Exception as err:
                    rows.append({"method": name, "N": n, "K": k, "M": m, "error": f"{type(err).__name__}: {err}"[:300]})
                log(json.dumps(rows[-1]))
            del ops
            torch.cuda.empty_cache()
            save(rows)
    base = {(r["N"], r["K"], r["M"]): r["graph_us"] for r in rows if r["method"] == "torch_bf16" and "graph_us" in r}
    for r in rows:
        if "graph_us" in r and (r["N"], r["K"], r["M"]) in base:
            r["speed_vs_torch_bf16"] = round(base[(r["N"], r["K"], r["M"])] / r["graph_us"], 3)
    return rows


def tune(shape, ms, method_name, roofs, l2_bytes, deadline, log) -> list[dict]:
    """Time each tile candidate (and the default) of a WnA16 method at each M; mark the fastest."""
    n, k = shape
    method = METHODS[method_name]
    rows = []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for m in ms:
        default = wna16_config(m, n, k, 4, sms, group_k=128)  # the tuned method is W4A16 g128
        bucket = "gemv" if m == 1 else "small" if m <= 16 else "medium" if m <= 512 else "large"
        candidates = [default] + [
            c for c in TUNE_CANDIDATES[bucket] if c.replace(split_k=1) != default.replace(split_k=1)
        ]
        results = []
        for cfg in candidates:
            if time.time() > deadline:
                break
            if cfg is not default:
                tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
                waves = 4 if cfg.block_m <= 4 else 2
                cfg = cfg.replace(split_k=choose_split_k(tiles, -(-k // cfg.block_k), sms, waves))
            try:
                ops = [method.build(n, k, "cuda", config=cfg) for _ in range(_copies(method, n, k, l2_bytes))]
                row = _row(method, n, k, m, ops, roofs, note=f"config {cfg.name()}")
            except Exception as err:
                row = {"method": method_name, "M": m, "error": f"{type(err).__name__}: {err}"[:300]}
            row["config"] = cfg.name()
            row["is_default"] = cfg == default
            results.append(row)
            log(json.dumps(row))
        timed = [r for r in results if "graph_us" in r]
        if timed:
            min(timed, key=lambda r: r["graph_us"])["fastest"] = True
        rows += results
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="28672x8192,8192x8192", help="comma-separated NxK")
    parser.add_argument("--m", default=",".join(map(str, DEFAULT_M)), help="comma-separated M values")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, from {list(METHODS)}")
    parser.add_argument("--tune", action="store_true", help="time WnA16 tile candidates instead of the sweep")
    parser.add_argument("--budget-s", type=float, default=240.0, help="stop timing new points after this")
    parser.add_argument("--out", required=True, help="JSON file to write")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("the sweep needs a CUDA GPU")
    deadline = time.time() + args.budget_s
    unknown = set(args.methods.split(",")) - set(METHODS)
    if unknown:
        parser.error(f"unknown methods {sorted(unknown)}; known: {list(METHODS)}")
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    ms = [int(v) for v in args.m.split(",")]
    props = torch.cuda.get_device_properties(0)
    l2_bytes = props.L2_cache_size
    roofs = measure_roofs(torch.device("cuda"))
    log = lambda line: print(line, flush=True)
    log(json.dumps(roofs))
    device = {
        "name": props.name,
        "capability": list(torch.cuda.get_device_capability()),
        "sm_count": props.multi_processor_count,
        "l2_bytes": l2_bytes,
        "memory_bytes": props.total_memory,
    }
    timing = (
        "median per call; graph_us: CUDA-graph replay rotating weight copies (> 2.5x L2); eager_us: Python "
        "launches; floor: max(bytes / copy bandwidth, flops / bf16 matmul rate), bytes = W + x + y"
    )

    def save(rows: list[dict]) -> None:
        result = {"device": device, "versions": _versions(), "roofs": roofs, "timing": timing, "rows": rows}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))

    if args.tune:
        save(tune(shapes[0], ms, "triton_w4a16_g128", roofs, l2_bytes, deadline, log))
    else:
        save(sweep(shapes, ms, args.methods.split(","), roofs, l2_bytes, deadline, log, save))
    return 0


if __name__ == "__main__":
    sys.exit(main())
