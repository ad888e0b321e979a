"""Cold and warm warmup times of the CUDA kernels, per layer family: the dense layers of a Llama-3-8B-like
block (W4A16 / W8A16, and fp8 / int4 / MXFP4 weights with fp8 activations), a DeepSeek-V2-Lite-like MoE
layer (int4 experts, and e4m3 128x128-block experts with 1x128 fp8 activations) and DeepSeek-V3's MoE layer
(w13 and w2 of 256 experts, int4 g128 and FP8 block, random codes).

Usage: python bench/tools/cuda_warmup.py OUT.json   (run once with an empty $HUMMING_CACHE_DIR: cold, then
again in a new process: warm from disk; the second warmup in the same process shows the in-memory cache).
Per family and attempt: ``seconds`` (the whole warmup call: plans, weight repacking, kernel readiness) and
``kernel_seconds`` (compiling or loading the kernels alone).
"""

from __future__ import annotations

import json
import sys
import time

import torch

import humming
from humming.bench.inputs import random_experts

LAYERS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
MOE = {"w13": (64, 2816, 2048), "w2": (64, 2048, 1408)}  # E, N, K
DEEPSEEK_V3 = {"w13": (256, 4096, 7168), "w2": (256, 7168, 2048)}


def _dense(weight: str, group) -> list:
    return [humming.quantize(torch.randn(n, k, device="cuda") * 0.02, weight, group) for n, k in LAYERS.values()]


def _experts(weight: str, **group) -> list:
    return [humming.quantize(torch.randn(e, n, k, device="cuda") * 0.02, weight, **group) for e, n, k in MOE.values()]


def families() -> dict[str, tuple[list, dict]]:
    """name -> (layers, warmup keyword arguments)."""
    return {
        "dense w4a16 / w8a16": (_dense("int4", 128) + _dense("int8", -1), dict(m_values=(1, 4, 16, 32, 64, 256))),
        "dense w8a8 / w4a8 (fp8 act)": (
            _dense("e4m3", -1) + _dense("int4", 128) + _dense("mxfp4", 32),
            dict(m_values=(1, 16, 256), act="fp8"),
        ),
        "moe int4 experts": (_experts("int4", group_size=128), dict(m_values=(1024,), block_ms=(16, 64))),
        "moe fp8 block experts": (_experts("fp8_block"), dict(m_values=(1024,), block_ms=(16, 64), act="fp8_g128")),
        "deepseek-v3 moe int4": (_v3("int4"), dict(m_values=(1024,), block_ms=(16, 64))),
        "deepseek-v3 moe fp8 block": (_v3("e4m3"), dict(m_values=(1024,), block_ms=(16, 64), act="fp8_g128")),
    }


def _v3(fmt: str) -> list:
    return [random_experts(fmt, *shape) for shape in DEEPSEEK_V3.values()]


def main() -> None:
    reports = []
    for name, (layers, kwargs) in families().items():
        for attempt in range(2):
            start = time.perf_counter()
            report = humming.warmup(layers, act_dtype=torch.bfloat16, progress=False, **kwargs)
            seconds = time.perf_counter() - start
            if report is None:  # every planned kernel is a Triton or reference one: nothing to compile
                print(f"{name}, attempt {attempt}: no CUDA kernel ({seconds:.2f}s)")
                reports.append(dict(family=name, attempt=attempt, seconds=seconds, kernels=0, kernel_seconds=0.0))
                continue
            print(f"{name}, attempt {attempt}: {report.summary()}")
            reports.append(
                dict(
                    family=name,
                    attempt=attempt,
                    seconds=seconds,
                    kernels=len(report.kernels),
                    kernel_seconds=report.wall_seconds,
                    by_family=report.by_family(),
                )
            )
    with open(sys.argv[1], "w") as f:
        json.dump(reports, f, indent=1)


if __name__ == "__main__":
    main()
