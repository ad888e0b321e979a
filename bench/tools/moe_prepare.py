"""Preparation time and GPU memory of a MoE layer (issue 24's target: DeepSeek-V3's layer prepared with at
most 10% extra GPU memory in under 2 s, int4 g128 and FP8 blocks).

For each case and each ``keep_codes`` (``True``: the weights keep their IR codes beside the kernels' layouts;
``False``: the codes a prepared layout holds are freed, as an engine that serves the layer would ask), two
layers with the same weights' shapes are built one after the other; each is made ready with
``humming.warmup([layer], m_values, keep_codes=...)`` (what an engine runs at load: the kernels' layouts,
plans, launches and compiled kernels for those token counts). The first layer's warmup also compiles or
loads the kernels; the second's finds them in memory, so its wall time is the preparation itself. Per row:
``prepare_s`` (the second warmup's wall time), ``first_s`` (the first's), the weights' bytes, and the GPU
memory the second warmup left allocated (``extra_bytes``, negative where freed codes outweigh the layouts)
and its peak above the start (``peak_extra_bytes``), each also over the weights' bytes.

Usage (GPU machine, repository root, about a minute): python bench/tools/moe_prepare.py --out $OUT/moe_prepare.json
``--experts 8`` makes the layers small (a quick check of the tool).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
import time
from pathlib import Path

import torch

import humming
from humming.bench.moe import MODELS, Experts
from humming.moe import MoeCall

CASES = ("w4a16-int4-g128", "w8a8-fp8-block")
ACTS = {"w8a8-fp8-block": "fp8_g128"}
M_VALUES = (1, 16, 256, 4096)


def layer(model, case: str) -> MoeCall:
    experts = Experts(model, case, torch.bfloat16, "cuda")
    w13, w2 = experts.quantize("w13"), experts.quantize("w2")
    options = dict(activation=model.activation, gate_up_layout=model.gate_up_layout)
    return MoeCall(w13, w2, model.topk, act=ACTS.get(case), **options)


def timed_warmup(call: MoeCall, m_values, keep_codes: bool) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    humming.warmup([call], list(m_values), progress=False, keep_codes=keep_codes)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def measure(model, case: str, m_values, keep_codes: bool) -> dict:
    first = layer(model, case)
    first_s = timed_warmup(first, m_values, keep_codes)
    del first  # its kernels stay loaded
    gc.collect()
    torch.cuda.empty_cache()
    second = layer(model, case)
    weight_bytes = second.w13.nbytes + second.w2.nbytes
    gc.collect()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    prepare_s = timed_warmup(second, m_values, keep_codes)
    extra = torch.cuda.memory_allocated() - before
    peak = torch.cuda.max_memory_allocated() - before
    row = dict(model=model.name, case=case, keep_codes=keep_codes, experts=model.experts, m_values=list(m_values))
    row.update(weight_bytes=weight_bytes, first_s=round(first_s, 3), prepare_s=round(prepare_s, 3))
    row.update(extra_bytes=extra, extra_ratio=round(extra / weight_bytes, 4))
    row.update(peak_extra_bytes=peak, peak_extra_ratio=round(peak / weight_bytes, 4))
    row.update(codes_released=[w.released_codes is not None for w in (second.w13, second.w2)])
    del second
    gc.collect()
    torch.cuda.empty_cache()
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--model", default="deepseek-v3")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--m", default=",".join(map(str, M_VALUES)), help="token counts the warmup makes ready")
    parser.add_argument("--experts", type=int, default=None, help="fewer experts (a quick check of the tool)")
    args = parser.parse_args()
    model = MODELS[args.model]
    if args.experts is not None:
        model = dataclasses.replace(model, experts=args.experts, topk=min(model.topk, args.experts))
    m_values = [int(m) for m in args.m.split(",")]
    rows = []
    for case in args.cases.split(","):
        for keep_codes in (True, False):
            rows.append(measure(model, case, m_values, keep_codes))
            r = rows[-1]
            print(
                f"{r['model']} {case} keep_codes={keep_codes}: prepared in {r['prepare_s']:.2f} s (first "
                f"{r['first_s']:.2f} s), {r['extra_bytes'] / 2**30:+.2f} GiB ({r['extra_ratio']:+.1%} of "
                f"{r['weight_bytes'] / 2**30:.2f} GiB of weights), peak {r['peak_extra_ratio']:.1%}, codes "
                f"released (w13, w2): {r['codes_released']}",
                flush=True,
            )
    args.out.write_text(json.dumps(dict(device=torch.cuda.get_device_name(), rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
