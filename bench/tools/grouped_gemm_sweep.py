"""Time the sm_90a grouped GEMM (``cuda.grouped``) over its tuning space (routing block, token tile, blocks per
SM, stages, persistent grid or one block per tile; for the gathering w13, the producer's arrival lag) on the
MoE presets' prefill sizes: the data behind ``_gemm_sm90.default_grouped_tuning`` and
``humming.moe.default_block_m`` at large M.

Each point is fused_moe's view of one grouped GEMM (w13 reads the tokens through the routing's row index, w2
reads grouped rows), on the MoE sweep's routing (``humming.bench.inputs.routing``); w13 also with the tokens
copied into grouped order first (``copied`` rows: the kernel reading them by TMA; the copy is its own ``copy``
row). Every variant is checked
against the float64 product of the dequantized experts before it is timed (CUDA-graph time over weight copies
past the L2, :func:`humming.timing.time_calls`). Writes one JSON row per (model, stack, M, variant) and prints,
per point, the default's time (fused_moe's routing block, ``default_block_m(..., fitted=True)``, at its default
tuning) and the best variant's. ``--profile``: one call of each routing block at its default tuning and no
timing, for ncu, e.g. ``ncu --set full -k regex:gemm_sm90 -o grouped python bench/tools/grouped_gemm_sweep.py
--models deepseek-v3 --stacks grouped_w2 --m 8192 --block-ms 144,256 --profile --out /tmp/unused.json``.

Usage (GPU machine, repository root): python bench/tools/grouped_gemm_sweep.py --out out/grouped_gemm.json
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import torch

from humming.bench.moe import MoeGroup, grouped_call, grouped_reference, run_sweep, sweep_points
from humming.cuda_kernels import _driver, _gemm_sm90, _wna16
from humming.cuda_kernels import grouped as cuda_grouped
from humming.cuda_kernels._layout import DTYPE_CODE
from humming.cuda_kernels.jit import compile_kernel, device_arch
from humming.device import device_limits
from humming.moe import default_block_m
from humming.moe.grouped import gather_rows
from humming.timing import time_calls

M_VALUES = (1024, 8192)
CASE = {"gpt-oss-120b": "mxfp4-a16"}  # the others: int4 g128
#: (token tile, blocks per SM, stages at most) tried for each routing block the tile divides.
TILES = ((64, 2, 8), (64, 1, 8), (128, 1, 4), (128, 1, 8), (256, 1, 3), (256, 1, 8))


def variants(block_m: int, layout, smem: int, lags: tuple[int, ...]) -> list[_gemm_sm90.GemmTuning]:
    """Each tile of :data:`TILES` that divides ``block_m`` and the tile of ``block_m`` itself (two blocks per SM
    up to 64 tokens), with as many stages as fit (up to its bound), persistent and one block per tile, each
    with every arrival lag of ``lags`` its stages allow (at most stages - 2: the gathering kernel's; ``(0,)`` for
    the others)."""
    out = []
    for bm, blocks, most in (*TILES, (block_m, 2 if block_m <= 64 else 1, 8)):
        if block_m % bm == 0:
            tuning = _gemm_sm90._with_stages(bm, blocks, layout, smem, most)
            for persistent in (True, False):
                for lag in (lag for lag in lags if lag <= tuning.stages - 2):
                    out.append(dataclasses.replace(tuning, persistent=persistent, arrive_lag=lag))
    return list(dict.fromkeys(out))


def point(group: MoeGroup, m: int, block_ms: tuple[int, ...], profile: bool, lags: tuple[int, ...]) -> list[dict]:
    """The variants of each routing block of ``block_ms`` (and of ``default_block_m``'s) at ``m`` tokens."""
    inp = group.inputs(m)
    qws, bias = group.qweights(), group.bias
    n, k, e = qws[0].N, qws[0].K, qws[0].num_experts
    reason = cuda_grouped.grouped_unsupported(qws[0], None, inp.x, max(block_ms))
    if reason is not None:
        print(f"{group.label} M={m}: skipped, {reason}", flush=True)
        return []
    prep = _wna16.prepare(qws[0])
    smem = device_limits(0).smem_per_block
    default_bm = default_block_m(inp.ids.numel(), e, fitted=True)  # fused_moe's, both GEMMs running here
    block_ms = tuple(dict.fromkeys((*block_ms, default_bm)))
    x_code = DTYPE_CODE[inp.x.dtype]
    codes = x_code, x_code, x_code if bias is None else DTYPE_CODE[bias.dtype]
    gather = group.stack == "w13"
    cc = torch.cuda.get_device_capability()
    tunings = {bm: variants(bm, prep.layout, smem, lags if gather else (0,)) for bm in block_ms}
    if profile:
        tunings = {bm: [None] for bm in block_ms}
    # w13 both ways: the tokens gathered by the kernel, and copied into grouped order first (then read by TMA)
    modes = {
        t: ("gather", "copied") if gather and not t.arrive_lag else ("gather",) if gather else ("rows",)
        for ts in tunings.values()
        for t in ts
        if t is not None
    }
    specs = [
        _gemm_sm90.gemm_spec(prep.layout, *codes, t, grouped=True, gather=mode == "gather", tile_group=prep.tile_group)
        for t, ms in modes.items()
        for mode in ms
    ]
    with ThreadPoolExecutor(max_workers=16) as pool:  # compiled in parallel, loaded once
        list(pool.map(lambda spec: _driver.load(compile_kernel(spec, device_arch(spec, cc)), 0), specs))
    results = []
    for block_m, ts in tunings.items():
        x, rows, ids, m_pad, used = grouped_call(inp, group.stack, e, block_m)
        default_tuning = _gemm_sm90.default_grouped_tuning(block_m, m_pad, e, prep.layout, smem)
        base = dict(block_m=block_m, m_pad=m_pad, segments_used=int((ids >= 0).sum()), rows_used=int(used.sum()))
        if profile:
            _gemm_sm90.grouped_launch(prep, m_pad, x.dtype, x.stride(0), None, x.dtype, None, 0, block_m, gather, None)(
                x, None, None, ids, rows=rows
            )
            torch.cuda.synchronize()
            continue
        ref = grouped_reference(x, qws[0], ids, block_m, rows, bias)
        copied = None
        if gather:  # the copy into grouped order, timed on its own
            copied = gather_rows(x, rows)
            copy_time = time_calls([partial(gather_rows, x, rows)])
            results.append(dict(base, variant=f"block_m {block_m} copy into grouped order", mode="copy", **copy_time))
        for tuning in ts:
            for mode in modes[tuning]:
                x_in, rows_in = (copied, None) if mode == "copied" else (x, rows)
                kind = (None if bias is None else bias.dtype, x.dtype, tuning, 0, block_m, mode == "gather", None)
                launches = [
                    _gemm_sm90.grouped_launch(_wna16.prepare(qw), m_pad, x.dtype, x_in.stride(0), *kind) for qw in qws
                ]
                calls = [partial(launch, x_in, bias, None, ids, rows=rows_in) for launch in launches]
                out = calls[0]()
                err = float((out[used].double() - ref[used]).norm() / ref[used].norm())
                if not err < 1e-2:  # NaN fails too
                    raise AssertionError(f"{group.label} M={m} block_m={block_m} {tuning} {mode}: relative error {err}")
                grid = " p" if tuning.persistent else ""
                lag = f" lag{tuning.arrive_lag}" if tuning.arrive_lag else ""
                label = f"block_m {block_m} bm{tuning.bm} x{tuning.blocks} s{tuning.stages}{grid}{lag} {mode}"
                default = tuning == default_tuning and block_m == default_bm and mode != "copied"
                row = dict(base, variant=label, mode=mode, default=default, rel_err=err)
                results.append(dict(row, **dataclasses.asdict(tuning), **time_calls(calls)))
        del ref, copied
    where = dict(model=group.model.name, stack=group.stack, m=m, n=n, k=k)
    return [dict(where, **r) for r in results]


def summarize(got: list[dict]) -> str:
    """One point's line: the default's time, the best variant's, and for w13 the best of the copied rows with
    the copy added."""
    gemm = [r for r in got if r["mode"] != "copy"]
    best = min((r for r in gemm if r["mode"] != "copied"), key=lambda r: r["graph_us"])
    dflt = next((r["graph_us"] for r in gemm if r["default"]), float("nan"))
    line = f"default {dflt:8.1f}  best {best['graph_us']:8.1f} ({best['variant']})"
    copies = {r["block_m"]: r["graph_us"] for r in got if r["mode"] == "copy"}
    copied = [r for r in gemm if r["mode"] == "copied"]
    if copied:
        total = min(copied, key=lambda r: r["graph_us"] + copies[r["block_m"]])
        line += f"  copied {total['graph_us'] + copies[total['block_m']]:8.1f} ({total['variant']} + copy)"
    return line + f"  err {max(r['rel_err'] for r in gemm):.1e}"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--models", default="deepseek-v3,qwen3-30b-a3b,gpt-oss-120b")
    parser.add_argument("--stacks", default="grouped_w13,grouped_w2")
    parser.add_argument("--m", default=",".join(map(str, M_VALUES)))
    parser.add_argument("--block-ms", default="64,128,256")
    parser.add_argument("--budget-s", type=float, default=240.0)
    parser.add_argument(
        "--profile", action="store_true", help="one call of each routing block at its default tuning, no timing (ncu)"
    )
    parser.add_argument("--arrive-lags", default="0,1,2", help="the gathering kernel's arrival lags (w13)")
    args = parser.parse_args()
    block_ms = tuple(map(int, args.block_ms.split(",")))
    models, stacks, m_values = args.models.split(","), args.stacks.split(","), map(int, args.m.split(","))
    lags = tuple(map(int, args.arrive_lags.split(",")))
    points = sweep_points(models, stacks, list(m_values), args.budget_s, CASE)
    measure = lambda group, m: point(group, m, block_ms, args.profile, lags)
    run_sweep(points, measure, summarize, "grouped_gemm", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
