"""Cold and warm warmup times of the CUDA kernels for the linear layers of a Llama-3-8B-like block.

Usage: python bench/cuda_warmup.py OUT.json   (run once with an empty $HUMMING_CACHE_DIR: cold, then
again: warm from disk; the second warmup in the same process shows the in-memory cache)
"""

from __future__ import annotations

import json
import sys
import time

import torch

import humming
from humming import cuda_kernels

LAYERS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}


def main() -> None:
    layers = []
    for weight, group in (("int4", 128), ("int8", -1)):
        for n, k in LAYERS.values():
            w = torch.randn(n, k, device="cuda") * 0.02
            layers.append(humming.quantize(w, weight=weight, group_size=group, scale_dtype=torch.bfloat16))
    reports = []
    for attempt in range(2):
        start = time.perf_counter()
        report = cuda_kernels.warmup(layers, m_values=(1, 4, 16, 32, 64), act_dtype=torch.bfloat16)
        print(report.summary())
        reports.append(
            dict(
                attempt=attempt,
                seconds=time.perf_counter() - start,
                kernels=len(report.kernels),
                by_family=report.by_family(),
            )
        )
    with open(sys.argv[1], "w") as f:
        json.dump(reports, f, indent=1)


if __name__ == "__main__":
    main()
