"""Time humming.moe (fused_moe, grouped_linear of w13) against a per-expert bf16 torch loop; one JSON.

    python bench/moe.py --out bench/results/h200/moe.json          # DeepSeek-V2-Lite-like layer
    python bench/moe.py --experts 8 --inter 14336 --k 4096 --topk 2  # Mixtral-like

CUDA-graph time and eager time per call (bench/harness.py ``time_op``); the experts' weights (int4 g128 for
humming, bf16 for torch) exceed the L2 at these shapes, so one copy is timed. Routing is random (softmax
top-k of Gaussian logits) and fixed per token count; the torch loop resolves it on the host beforehand.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from importlib import metadata
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import MOE_METHODS, MoeProblem, time_op


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--k", type=int, default=2048)
    parser.add_argument("--inter", type=int, default=1408)
    parser.add_argument("--topk", type=int, default=6)
    parser.add_argument("--tokens", default="1,16,256,4096")
    parser.add_argument("--methods", default=",".join(MOE_METHODS))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    problem = MoeProblem(args.experts, args.k, args.inter, args.topk)
    rows = []
    for t in (int(v) for v in args.tokens.split(",")):
        torch.manual_seed(t)
        x = torch.randn(t, args.k, device="cuda", dtype=torch.bfloat16)
        for name in args.methods.split(","):
            op = MOE_METHODS[name](problem, t, "cuda")
            row = {"method": name, "tokens": t, **time_op([op], x)}
            rows.append(row)
            print(json.dumps(row), flush=True)
            del op
            torch.cuda.empty_cache()
    result = {
        "problem": problem.__dict__,
        "device": torch.cuda.get_device_name(),
        "versions": {
            "torch": torch.__version__,
            "triton": metadata.version("triton"),
            "python": platform.python_version(),
        },
        "rows": rows,
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
