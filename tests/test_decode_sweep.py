"""bench/tools/decode_sweep.py (the GPU timing of the dense decode kernel's tuning space): its variants start
with the tuning the kernel runs today, fit the device's shared memory, take row tiles that divide N, and run
stream-K only where the tile grid does not split K (``--compile-only`` builds their kernels on the CPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from humming.cuda_kernels._decode_tuning import choose_decode_tuning

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench" / "tools"))


@pytest.mark.parametrize("m", [1, 16, 32])
@pytest.mark.parametrize(("n", "k"), [(28672, 8192), (2048, 7168), (2880, 2880)])
def test_variants_of_a_point(m, n, k):
    from decode_sweep import H200_LIMITS, variants

    tunings = variants(m, n, k, 4, H200_LIMITS)
    assert tunings[0] == choose_decode_tuning(m, n, k, 4, *H200_LIMITS)
    assert len(set(tunings)) == len(tunings) > 6
    assert all(t.smem_bytes(4) <= H200_LIMITS[1] and n % (16 * t.r) == 0 for t in tunings)
    assert all(t.splits == 1 for t in tunings if t.stream_k)
    assert {t.mt for t in tunings} == {tunings[0].mt}
    assert any(t.stream_k for t in tunings) == (tunings[0].splits == 1)
