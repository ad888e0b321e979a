"""Print the short table of a sweep JSON (bench/sweep.py): time, ratio to the floor, speed vs torch.

Usage: python bench/summary.py SWEEP.json [MORE.json ...]
"""

from __future__ import annotations

import json
import sys


def main(paths: list[str]) -> None:
    rows = []
    for path in paths:
        try:
            with open(path) as f:
                rows += json.load(f)["rows"]
        except (OSError, ValueError, KeyError) as err:
            print(f"{path}: unreadable ({err})")
    timed = [r for r in rows if "graph_us" in r]
    base = {(r["N"], r["K"], r["M"], r["method"]): r["graph_us"] for r in timed}
    print(f"{'method':22s} {'N x K':>12s} {'M':>5s} {'graph us':>10s} {'/floor':>7s} {'vs bf16':>8s} {'vs fp8mm':>8s}")
    for r in sorted(timed, key=lambda r: (r["N"], r["method"], r["M"])):
        key = (r["N"], r["K"], r["M"])
        bf16 = base.get((*key, "torch_bf16"))
        fp8 = base.get((*key, "torch_scaled_mm_fp8"))
        vs_bf16 = f"{bf16 / r['graph_us']:8.2f}" if bf16 else f"{'':8s}"
        vs_fp8 = f"{fp8 / r['graph_us']:8.2f}" if fp8 else f"{'':8s}"
        shape = f"{r['N']}x{r['K']}"
        timing = f"{r['graph_us']:10.1f} {r['graph_over_floor']:7.2f}"
        print(f"{r['method']:22s} {shape:>12s} {r['M']:5d} {timing} {vs_bf16} {vs_fp8}")


if __name__ == "__main__":
    main(sys.argv[1:])
