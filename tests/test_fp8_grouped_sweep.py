"""bench/tools/fp8_grouped_sweep.py (the GPU timing of the grouped FP8 GEMM's grid and promotion choices): its
variants start with the tuning the kernel runs today, and every one of them builds as a grouped kernel (NVRTC,
on the CPU) with no serialised wgmma and no spill, for the FP8 experts of the MoE presets."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from helpers import needs_nvrtc

from humming.cuda_kernels import fp8_gemm
from humming.cuda_kernels.jit import compile_kernel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench" / "tools"))
H200 = fp8_gemm.DeviceLimits(sm_count=132, smem_per_block=232448, smem_per_sm=233472)


@pytest.mark.parametrize(
    "w_format, scale_mode", [("e4m3", "block128"), ("int4", "rowcol"), ("int4", "group"), ("mxfp4", "group")]
)
@pytest.mark.parametrize("block_m", [64, 128, 256])
def test_variants_of_a_point(w_format, scale_mode, block_m):
    from fp8_grouped_sweep import variants

    default = fp8_gemm.choose_grouped_tuning(block_m, 8192 * 8 + 256 * (block_m - 1), 7168, 256, H200, w_format)
    tunings = variants(default, w_format, scale_mode)
    assert tunings[0] == default and len(set(tunings)) == len(tunings)
    assert {t.persistent for t in tunings} == {False, True}
    assert any(t.promote_blocks == 4 for t in tunings) == (default.block_m == 128 and scale_mode == "rowcol")
    assert any(t.prefetch_codes for t in tunings) == (default.block_m == 128 and w_format != "e4m3")
    halves = default.block_m == 128 and any(t.promotes_every(scale_mode) == 1 for t in tunings)
    assert any(t.token_halves for t in tunings) == halves


@needs_nvrtc
@pytest.mark.parametrize(
    "w_format, scale_mode", [("e4m3", "block128"), ("int4", "rowcol"), ("int4", "group"), ("mxfp4", "group")]
)
def test_every_variant_builds_as_a_grouped_kernel(w_format, scale_mode):
    from fp8_grouped_sweep import variants

    default = fp8_gemm.choose_grouped_tuning(256, 8192 * 8 + 256 * 255, 7168, 256, H200, w_format)
    for tuning in variants(default, w_format, scale_mode):
        spec = fp8_gemm.fp8_spec(w_format, scale_mode, "bf16", "bf16", tuning, grouped=True)
        log = compile_kernel(spec, "sm_90a").log
        assert not re.search(r"C751\d", log), f"{spec.name}: wgmmas serialised\n{log}"
        assert "0 bytes spill stores" in log, f"{spec.name}\n{log}"
