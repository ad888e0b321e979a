"""bench/tools/triton_gemm_sweep.py (the H200 timing of the Triton GEMMs at M >= 64): its --smoke mode under the
interpreter checks every variant of a scaled-GEMM and a WnA16 case against float64; its variants keep the
promotion step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench" / "tools"))


CASES = ("--cases", "w8a8-fp8-block128,w4a16-int4-g128")


def test_smoke_checks_every_variant(tmp_path):
    out = tmp_path / "sweep.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench/tools/triton_gemm_sweep.py"), "--smoke", "--out", str(out), *CASES],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert {r["case"] for r in rows} == {"w8a8-fp8-block128", "w4a16-int4-g128"}
    assert all("error" not in r and r["rel_err"] <= 1e-2 for r in rows), [r for r in rows if r.get("rel_err", 1) > 1e-2]
    variants = {
        case: {r["variant"] for r in rows if r["case"] == case} for case in ("w8a8-fp8-block128", "w4a16-int4-g128")
    }
    assert {"default", "m128n256w8", "st5", "split*2"} <= variants["w8a8-fp8-block128"], variants
    assert {"default", "dequant-first", "m128n256w8", "st5"} <= variants["w4a16-int4-g128"], variants


def test_variants_keep_the_promotion_step():
    from triton_gemm_sweep import variants

    from humming.triton_kernels.configs import TileConfig

    default = TileConfig(128, 128, 128, num_warps=8, num_stages=4)
    for name, cfg in variants(1024, 8192, 8192, default, 132, 128, False).items():
        assert 128 % cfg.block_k == 0, (name, cfg)
