"""Every tile the Triton choosers return fits the device's shared memory (a Triton ``OutOfResources`` at
launch otherwise: a GPTQ 3-bit act-order checkpoint at M = 200 on the H200 asked for 278528 bytes).

Two checks, for sm_90 (H100 / H200: 232448 bytes per block) and sm_80 (A100: 166912):

- every plan, on CPU: for weights of 1..8 bits (what decides the tile: ``int1..int8``, ``uint`` with zero
  points, ``e2m1``, ``e4m3`` and ``nf4`` reach the chooser as their bit width) x scale groups 32 / 64 /
  128 / per channel / act-order x M buckets 1, 16, 32, 64, 128, 200, 512, 4096 (and the grouped MoE
  tiles, and the scaled GEMM's operand widths, promotion steps and folds), the chosen tile's
  :func:`~humming.triton_kernels.wna16_configs.smem_estimate` is within the limit;
- the estimate is an upper bound, from compiled kernels: the worst cases of every M bucket compile ahead of
  time (in a subprocess with ``TRITON_INTERPRET`` unset, as tests/test_compile_triton.py) and
  ``compiled.metadata.shared`` is at most the estimate and the limit. The worst cases: 3-bit fields that
  straddle words (two int32 tiles per stage) with act-order ``g_idx`` and zero points in fp16, and 8-bit
  weights (the widest whole words) with 32-wide groups (the most scale tiles) in bf16; for the scaled GEMM,
  3-bit codes with int8 MMA and NVFP4 x NVFP4 (folded scale tiles). 5/6/7-bit fields load the same two
  words as 3-bit ones, narrower whole-word formats load fewer bytes, and zero points, act-order gathers and
  the activation dtype did not change ``metadata.shared`` in the calibration; the buckets 200 and 512 share
  a tile; a tile chosen for both architectures compiles for sm_90 only (see :func:`_jobs`): about 25
  compiles, few enough for CI's 2 cores.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import pytest
import torch

#: Shared memory per block (the opt-in maximum) of the architectures checked.
LIMITS = {90: 232448, 80: 166912}
#: The plans are checked against every capability the Triton path serves (sm_86 / sm_89: 101376 bytes).
PLAN_LIMITS = {**LIMITS, 86: 101376, 89: 101376}
M_BUCKETS = (1, 16, 32, 64, 128, 200, 512, 4096)
PLAN_M = (1, 2, 8, *M_BUCKETS[1:])
GROUPS = {"g32": 32, "g64": 64, "g128": 128, "channel": 0, "act-order": 0}  # act-order: no fixed K group
N, K, SMS = 28672, 8192, 132


def _wna16_cases():
    """(label, weight, x dtype, the chooser's ``group_k``) of the compiled WnA16 worst cases."""
    from humming.ir.quantize import quantize

    w = torch.ones(256, 512)
    return (
        ("int3-zp-actorder", quantize(w, "int3", 64, True, g_idx=torch.arange(512) % 8), torch.float16, 0),
        ("int8-g32", quantize(w, "int8", 32, scale_dtype=torch.bfloat16), torch.bfloat16, 32),
    )


def _scaled_cases():
    """(label, weight, activation scheme) of the compiled scaled-GEMM worst cases."""
    from humming.ir.quantize import quantize

    w = torch.ones(256, 512)
    return (("int3-g128-int8", quantize(w, "int3", 128), "int8"), ("nvfp4-nvfp4", quantize(w, "nvfp4"), "nvfp4"))


def _decoding_cases():
    """(label, weight) of the W4A8 weights whose chosen sm_90 tiles must not spill: integer codes of lean decode
    (one warpgroup at M > 64), with zero points (two at M <= 64) and with fields straddling words (K tiles
    of 64); :data:`~humming.triton_kernels.scaled_mm_configs.DECODES`."""
    from humming.ir.quantize import quantize

    w = torch.ones(256, 512)
    cases = (("int4-g128-fp8", "int4", False), ("uint4-zp-g128-fp8", "int4", True), ("int3-g128-fp8", "int3", False))
    return tuple((label, quantize(w, fmt, 128, zero_point)) for label, fmt, zero_point in cases)


def _jobs() -> list[tuple[int, object, int, bool]]:
    """(arch, compile spec, estimate, whether its spills are counted) of the worst cases' chosen tiles, every M
    bucket, and of the W4A8 decoding tiles on sm_90 (:func:`_decoding_cases`). A tile that is also chosen
    for sm_90 is compiled for sm_90 only: the same tile never needed more on sm_80 (mma.sync, no wgmma
    operand staging) in the calibration; split-K changes only the epilogue, so one split is enough."""
    from humming.ir.activation import get_act_scheme
    from humming.ir.quantize import quantize
    from humming.triton_kernels import scaled_mm, wna16
    from humming.triton_kernels._scaled_mm_plan import plan_config
    from humming.triton_kernels.configs import CAPABILITY_LIMITS
    from humming.triton_kernels.scaled_mm_configs import scaled_mm_config
    from humming.triton_kernels.scaled_mm_configs import smem_estimate as scaled_estimate
    from humming.triton_kernels.wna16_configs import grouped_config, smem_estimate, wna16_config

    jobs = {}
    for arch, limit in LIMITS.items():
        for label, qw, dtype, group_k in _wna16_cases():
            act_order = qw.g_idx is not None
            for m in M_BUCKETS:
                cfg = wna16_config(m, N, K, qw.bits, SMS, group_k, limit, act_order).replace(dequant_first=False)
                spec = wna16.kernel_spec(label, qw, dtype, cfg)
                estimate = smem_estimate(cfg, qw.bits, group_k, act_order)
                jobs.setdefault((label, cfg.replace(split_k=1)), (arch, spec, estimate, False))
        for label, qw, act in _scaled_cases():
            scheme = get_act_scheme(act)
            plan = scaled_mm.compute_plan(qw, scheme, scaled_mm.act_group_k(scheme), (arch // 10, arch % 10))
            for m in M_BUCKETS:
                cfg = scaled_mm_config(m, N, K, plan.operand_bits, plan.k_step, qw.bits, SMS, limit, plan.folds)
                spec = scaled_mm.kernel_spec(label, qw, scheme, plan, torch.bfloat16, cfg)
                estimate = scaled_estimate(cfg, plan.operand_bits, qw.bits, plan.folds)
                jobs.setdefault((label, plan.mma, cfg.replace(split_k=1)), (arch, spec, estimate, False))
    zero_points = quantize(torch.ones(256, 512), "int4", 128, True, scale_dtype=torch.bfloat16)
    for arch, limit in LIMITS.items():  # the fused WnA16 tiles of a weight with zero points (not dequant-first)
        for m in M_BUCKETS:
            cfg = wna16_config(m, N, K, 4, SMS, 128, limit, False, True).replace(split_k=1)
            if not cfg.dequant_first:
                spec = wna16.kernel_spec("uint4-zp-g128", zero_points, torch.bfloat16, cfg)
                jobs[("uint4-zp-g128", arch, cfg)] = (arch, spec, smem_estimate(cfg, 4, 128, False), True)
    mxfp4 = quantize(torch.ones(2, 256, 512), "mxfp4")  # the grouped kernel's e2m1 tiles, gathering token rows
    for arch, limit in LIMITS.items():
        for block_m in (16, 32, 64):
            cfg = grouped_config(8192, 5760, 2880, 4, block_m, SMS, limit, 32, e2m1=True).replace(split_k=1)
            spec = wna16.kernel_spec("grouped-mxfp4", mxfp4, torch.bfloat16, cfg, gather=True)
            jobs[("grouped-mxfp4", arch, cfg)] = (arch, spec, smem_estimate(cfg, 4, 32, False), True)
    scheme = get_act_scheme("fp8")
    for label, qw in _decoding_cases():
        plan = scaled_mm.compute_plan(qw, scheme, scaled_mm.act_group_k(scheme), (9, 0))
        for m in M_BUCKETS:
            cfg = plan_config(plan, qw, m, (9, 0), CAPABILITY_LIMITS[(9, 0)], (N, K)).replace(split_k=1)
            spec = scaled_mm.kernel_spec(label, qw, scheme, plan, torch.bfloat16, cfg)
            estimate = scaled_estimate(cfg, plan.operand_bits, qw.bits, plan.folds)
            jobs[(label, plan.mma, cfg)] = (90, spec, estimate, True)
    return list(jobs.values())


def _compile(worker: int, workers: int) -> list[dict]:
    """Compile this worker's share of :func:`_jobs`: name, arch, shared bytes, estimate, problem."""
    from humming.triton_kernels import registry

    results = []
    for arch, spec, estimate, local_memory in _jobs()[worker::workers]:
        r = registry.compile_spec(spec, arch, local_memory)
        results.append({**r, "shared": r.get("shared_bytes"), "estimate": estimate})
    return results


@pytest.fixture(scope="module")
def compiled() -> dict:
    """The jobs compiled by one subprocess per core (two on CI), grouped by architecture."""
    pytest.importorskip("humming.triton_kernels.registry")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    workers = max(2, min(os.cpu_count() or 1, 8))
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, str(i), str(workers)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(workers)
    ]
    out = {arch: [] for arch in LIMITS}
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=600)
        if not stdout.strip():
            raise AssertionError(f"a compile subprocess printed nothing; stderr:\n{stderr[-4000:]}")
        for r in json.loads(stdout):
            out[r["arch"]].append(r)
    return out


@pytest.mark.parametrize("arch", list(LIMITS), ids=lambda a: f"sm_{a}")
def test_chosen_tiles_compile_within_the_limit(arch: int, compiled: dict) -> None:
    results = compiled[arch]
    assert len(results) == sum(job[0] == arch for job in _jobs()), [r["name"] for r in results]
    failed = [f"{r['name']}: {r['problem']}" for r in results if r["shared"] is None]
    assert not failed, "\n".join(failed)
    over = [f"{r['name']}: {r['shared']} > limit {LIMITS[arch]}" for r in results if r["shared"] > LIMITS[arch]]
    assert not over, "\n".join(over)
    under = [f"{r['name']}: compiled {r['shared']} > estimate {r['estimate']}" for r in results]
    under = [u for r, u in zip(results, under, strict=True) if r["shared"] > r["estimate"]]
    assert not under, "the estimate must be an upper bound:\n" + "\n".join(under)


def test_decoding_tiles_do_not_spill(compiled: dict) -> None:
    """The W4A8 tiles chosen on sm_90 hold their accumulators and decode in registers at every M bucket: a lean
    decode on one warpgroup from M = 128 (two blocks per multiprocessor), the zero-point decode on two."""
    counted = {r["name"]: r for r in compiled[90] if "local_memory_instructions" in r}
    names = sorted(counted)
    assert any(n.startswith("scaled_mm-int4-g128-fp8") and n.endswith("m128n64k128s1g8w4st4") for n in names), names
    zero_points = [n for n in names if n.startswith("scaled_mm-uint4-zp-g128-fp8")]
    assert zero_points and all("w8st" in n for n in zero_points), names
    spilled = {n: r["local_memory_instructions"] for n, r in counted.items() if r["local_memory_instructions"]}
    assert not spilled, spilled


@pytest.mark.parametrize("arch", list(LIMITS), ids=lambda a: f"sm_{a}")
def test_zero_point_wna16_tiles_do_not_spill(arch: int, compiled: dict) -> None:
    """The fused WnA16 tiles chosen for int4 weights with zero points hold their zero tiles in registers."""
    counted = [r for r in compiled[arch] if r["name"].startswith("wna16-uint4-zp-g128")]
    assert any("m64n64k64s1g8w8" in r["name"] for r in counted), [r["name"] for r in counted]
    spilled = {r["name"]: r["local_memory_instructions"] for r in counted if r["local_memory_instructions"]}
    assert not spilled, spilled


@pytest.mark.parametrize("arch", list(LIMITS), ids=lambda a: f"sm_{a}")
def test_grouped_e2m1_tiles_do_not_spill(arch: int, compiled: dict) -> None:
    """The grouped kernel's MXFP4 tiles up to 64 rows (K tiles of 64; 8 warps at 64 rows) hold their decoded
    weights in registers; the dense heuristic's K tiles of 128 and 256 spilled there."""
    counted = [r for r in compiled[arch] if r["name"].startswith("wna16-grouped-mxfp4")]
    names = sorted(r["name"] for r in counted)
    assert len(names) == 3 and all("k64" in n for n in names), names
    assert any("m64n64k64s1g8w8" in n for n in names) and any("m16n64k64s1g8w4" in n for n in names), names
    spilled = {r["name"]: r["local_memory_instructions"] for r in counted if r["local_memory_instructions"]}
    assert not spilled, spilled


@pytest.mark.parametrize("arch", list(PLAN_LIMITS), ids=lambda a: f"sm_{a}")
def test_every_wna16_plan_fits(arch: int) -> None:
    from humming.triton_kernels import wna16
    from humming.triton_kernels.wna16_configs import smem_estimate, wna16_config

    limit, over = PLAN_LIMITS[arch], []
    for bits in range(1, 9):
        for group, group_k in GROUPS.items():
            act_order = group == "act-order"
            for m in PLAN_M:
                cfg = wna16_config(m, N, K, bits, SMS, group_k, limit, act_order)
                if smem_estimate(cfg, bits, group_k, act_order) > limit:
                    over.append(f"{bits}-bit {group} M={m}: {cfg.name()}")
                # expert-stacked (MoE) weights: the grouped kernel's tile for every routing block_m
                for block_m in (16, 32, 64, 128):
                    cfg = wna16.grouped_config(m * 8, N, K, bits, block_m, SMS, limit, group_k, act_order)
                    if smem_estimate(cfg, bits, group_k, act_order) > limit:
                        over.append(f"grouped {bits}-bit {group} M={m} block_m={block_m}: {cfg.name()}")
    assert not over, "\n".join(over)


@pytest.mark.parametrize("arch", list(PLAN_LIMITS), ids=lambda a: f"sm_{a}")
def test_every_scaled_mm_plan_fits(arch: int) -> None:
    """Every scaled-GEMM tile of each capability's table fits its shared memory and its register budget (the
    accumulator words per thread of :data:`~humming.triton_kernels.scaled_mm_configs.ACC_WORDS`)."""
    from humming.triton_kernels.scaled_mm_configs import ACC_WORDS, DECODES, scaled_mm_config, smem_estimate

    capability = (arch // 10, arch % 10)
    limit, over = PLAN_LIMITS[arch], []
    family = "sm90" if arch == 90 else "mma"
    for operand_bits in (8, 16):
        for weight_bits in range(1, 9):
            for k_step in (0, 16, 32, 128):
                for fold in (False, True):
                    for accumulators, decode in itertools.product((1, 2), DECODES):
                        per_tile, total = ACC_WORDS[family][decode]
                        for m in M_BUCKETS:
                            args = (m, N, K, operand_bits, k_step, weight_bits, SMS, limit, fold, capability)
                            cfg = scaled_mm_config(*args, accumulators, decode)
                            words = cfg.block_m * cfg.block_n // (32 * cfg.num_warps)
                            if smem_estimate(cfg, operand_bits, weight_bits, fold) > limit:
                                over.append(f"{operand_bits}-bit MMA {weight_bits}-bit w step {k_step} M={m}: {cfg}")
                            if cfg.block_m >= 64 and (words > per_tile or words * accumulators > total):
                                over.append(f"registers: {accumulators} x {words} words, M={m}: {cfg}")
    assert not over, "\n".join(over)


def test_limit_shrinks_the_tile() -> None:
    """The tile of the issue (3-bit, M = 200) shrinks to fit; without a limit (the interpreter) it does not."""
    from humming.triton_kernels.wna16_configs import smem_estimate, wna16_config

    free = wna16_config(200, N, K, 3, SMS, 0, 0, True)
    fitted = wna16_config(200, N, K, 3, SMS, 0, LIMITS[90], True)
    assert smem_estimate(free, 3, 0, True) > LIMITS[90] >= smem_estimate(fitted, 3, 0, True)
    assert (fitted.block_m, fitted.block_n) == (free.block_m, free.block_n) and fitted.num_stages < free.num_stages


def test_launch_reads_the_device_limit(fake_cuda_device, monkeypatch) -> None:
    """``device_limits`` reads ``device_info(...).limits``, and the WnA16 and scaled callers pass its
    shared memory to the chooser (CPU tensors stand in for CUDA ones through a patched ``device_limits``)."""
    from humming.device import device_limits
    from humming.ir.activation import get_act_scheme
    from humming.ir.quantize import quantize
    from humming.triton_kernels import _scaled_mm_plan, scaled_mm, wna16, wna16_configs
    from humming.triton_kernels.scaled_mm_configs import smem_estimate as scaled_estimate

    qw = quantize(torch.ones(256, 512), "int3", 64, True, g_idx=torch.arange(512) % 8)
    w3 = quantize(torch.ones(256, 512), "int3", 128)
    x = torch.empty(200, 512, dtype=torch.float16)
    plan = scaled_mm.compute_plan(w3, get_act_scheme("int8"), 0, (9, 0))
    for smem in (232448, 166912, 101376):
        fake_cuda_device(sm_count=100, smem_per_block=smem)
        limits = device_limits(torch.device("cuda", 0))
        assert (limits.sm_count, limits.smem_per_block) == (100, smem)
        for module in (wna16, _scaled_mm_plan):  # the modules that choose tiles
            monkeypatch.setattr(module, "device_limits", lambda device, lim=limits: lim)
        for cfg in (wna16.default_config(qw, x), wna16.deterministic_config(qw, x)):
            assert wna16_configs.smem_estimate(cfg, 3, 0, True) <= smem, (smem, cfg)
        cfg = scaled_mm.deterministic_config(w3, "int8", x)
        assert scaled_estimate(cfg, plan.operand_bits, 3, plan.folds) <= smem, (smem, cfg)


if __name__ == "__main__":  # a compile subprocess (TRITON_INTERPRET unset): worker index, worker count
    json.dump(_compile(int(sys.argv[1]), int(sys.argv[2])), sys.stdout)
