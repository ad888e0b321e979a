"""A GPU probe of the grouped Triton tiles and the ragged-N sm_90a GEMM (prints JSON rows, then a table):

- the Triton grouped WnA16 kernel's tiles: ``grouped_config``'s (what ``grouped_linear`` runs) against the
  same tiles with K tiles of 64 (32 for 128 x 128) on 8 warps from 64 rows or 128 columns, which compile
  without local memory (bench/results/cpu-sass/triton_grouped_spills.md), on routed MoE shapes, results
  compared with each other;
- the sm_90a dense GEMM on N % 128 != 0 (16-row tiles copied one by one) against N % 128 == 0 of the same
  size, over token tiles, blocks per SM and splits, next to the Triton kernel (weights in L2: a comparison of
  the kernels' tiles, not of the memory system).

Usage (GPU): python3 bench/tools/ragged_and_grouped_tiles.py --out probe.json
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import torch

import humming
from humming.cuda_kernels import _gemm_sm90
from humming.cuda_kernels._layout import prepare_weight
from humming.device import device_limits
from humming.timing import time_calls
from humming.triton_kernels import wna16
from humming.triton_kernels.wna16_configs import grouped_config

MOE = {  # name: (experts, topk, N, K, quantize arguments)
    "qwen3-int4": (128, 8, 1536, 2048, dict(weight="int4", group_size=128)),
    "gptq-uint4-zp": (64, 8, 2816, 2048, dict(weight="uint4", group_size=128, zero_point=True)),
    "gpt-oss-mxfp4": (32, 4, 5760, 2880, dict(weight="mxfp4")),
}
TOKENS = {16: 16, 256: 64, 2048: 128, 8192: 256}  # tokens: routing block_m


def capped(tile):
    """``tile`` with K tiles of 64 (32 for 128 x 128), on 8 warps from 64 rows or 128 columns."""
    large = tile.block_m * tile.block_n >= 128 * 128
    warps = 8 if tile.block_m >= 64 or tile.block_n >= 128 else 4
    return tile.replace(block_k=32 if large else min(tile.block_k, 64), num_warps=warps)


def grouped_rows(budget_end: float) -> list[dict]:
    rows, limits = [], device_limits(torch.device("cuda"))
    for name, (e, topk, n, k, qargs) in MOE.items():
        qw = humming.quantize(torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16) * 0.02, **qargs)
        for t, block_m in TOKENS.items():
            if time.time() > budget_end:
                return rows
            gen = torch.Generator(device="cuda").manual_seed(t)
            ids = torch.randn(t, e, device="cuda", generator=gen).topk(topk, dim=-1).indices
            routing = humming.moe.moe_align(ids, e, block_m)
            rows_idx, expert_ids = routing.token_rows(topk), routing.expert_ids
            x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
            m_pad = rows_idx.shape[0]
            gk = max(qw.group_shape[1], 0)
            chosen = grouped_config(
                m_pad,
                n,
                k,
                qw.bits,
                block_m,
                limits.sm_count,
                limits.smem_per_block,
                gk,
                False,
                qw.zeros is not None,
                qw.format.name == "e2m1",
            )
            outs = {}
            for label, cfg in (("chosen", chosen), ("capped", capped(chosen))):
                run = functools.partial(wna16.grouped_linear, x, qw, expert_ids, block_m, config=cfg, rows=rows_idx)
                outs[label] = run()
                r = time_calls([run])
                rows.append(
                    dict(
                        part="triton_grouped", model=name, tokens=t, block_m=block_m, tile=label, config=cfg.name(), **r
                    )
                )
                print(json.dumps(rows[-1]), flush=True)
            used = rows_idx >= 0
            a, b = outs["chosen"][used].float(), outs["capped"][used].float()
            rows[-1]["rel_diff"] = float((a - b).norm() / a.norm())
    return rows


def dense_rows(budget_end: float) -> list[dict]:
    rows = []
    T = _gemm_sm90.GemmTuning
    tunings = [None, T(32, 8, 2), T(64, 8, 2), T(64, 8, 1), T(128, 8, 1), T(64, 8, 2, 2), T(128, 8, 1, 2)]
    for n, k in ((2880, 2880), (2816, 2880), (2880, 4096)):
        qw = humming.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02, weight="mxfp4")
        prep = prepare_weight(qw)
        copies = [
            humming.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), weight="mxfp4") for _ in range(1)
        ]
        del copies
        for m in (64, 256, 512):
            if time.time() > budget_end:
                return rows
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = x.float() @ humming.dequantize(qw, torch.float32).T
            for tuning in tunings:
                run = functools.partial(_gemm_sm90.run_gemm, prep, x, None, torch.bfloat16, tuning)
                err = float((run().float() - ref).norm() / ref.norm())
                r = time_calls([run])
                rows.append(
                    dict(
                        part="sm90_dense",
                        n=n,
                        k=k,
                        m=m,
                        tile_group=prep.tile_group,
                        tuning=str(
                            tuning
                            or _gemm_sm90.default_gemm_tuning(m, n, k, prep.layout, device_limits(torch.device("cuda")))
                        )
                        + (" (default)" if tuning is None else ""),
                        rel_err=err,
                        **r,
                    )
                )
                print(json.dumps(rows[-1]), flush=True)
            run = functools.partial(wna16.linear, x, qw)
            rows.append(dict(part="triton_dense", n=n, k=k, m=m, **time_calls([run])))
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--budget-s", type=float, default=150.0)
    args = parser.parse_args()
    end = time.time() + args.budget_s
    rows = grouped_rows(end - args.budget_s / 2) + dense_rows(end)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    for r in rows:
        key = r.get("model") or f"{r['n']}x{r['k']}"
        what = r.get("config") or r.get("tuning") or "triton"
        extra = (
            f" diff {r['rel_diff']:.1e}" if "rel_diff" in r else f" err {r['rel_err']:.1e}" if "rel_err" in r else ""
        )
        print(f"{r['part']:15s} {key:14s} {r.get('tokens', r.get('m')):5} {what:48s} {r['graph_us']:9.1f}{extra}")


if __name__ == "__main__":
    main()
