"""The Hopper (sm_90a) large-M GEMM: results against the reference on the GPU."""

from __future__ import annotations

import pytest
import torch
from helpers import HAS_SM90, assert_rel_close, backend_unsupported, with_sm_count

import humming
from humming.cuda_kernels import _gemm_sm90
from humming.cuda_kernels._layout import prepare_weight

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.is_available() and not HAS_SM90, reason="needs an sm_90 GPU (H100/H200/H20)"),
]

SCHEMES = {
    "int4-g128": ("int4", 128, False),
    "uint4-g64-zp": ("uint4", 64, True),
    "int8-channel": ("int8", -1, False),
    "uint8-g128-zp": ("uint8", 128, True),
    "mxfp4": ("mxfp4", 32, False),
    "mxfp4-any-scale": ("mxfp4", 32, False),  # some e8m0 codes 0 (2^-127): the kernel's exact scale decode
    "int4-g32": ("int4", 32, False),  # two 16-bit scales per row and 64-column chunk (Kimi-K2's experts)
    "int8-g32": ("int8", 32, False),
}
CASES = [
    # (N, K, scheme, M values): real shapes, M tails (TMA zero fill), K with a partial last group
    (4096, 4096, "int4-g128", (65, 128, 1000)),
    (2048, 1024, "uint4-g64-zp", (100, 256)),
    (1024, 2048, "int8-channel", (77, 384)),
    (1152, 832, "uint8-g128-zp", (129,)),
    (2048, 1024, "mxfp4", (100, 256)),
    (1024, 2048, "mxfp4-any-scale", (77,)),
    # N % 128 != 0: the last 128-row block partly filled, its 16-row tiles copied one by one (gpt-oss's o_proj
    # N = 2880 = 22.5 x 128; N = 1040 leaves one tile of 16 rows)
    (2880, 2880, "mxfp4", (100,)),
    (1040, 1024, "int8-channel", (77, 300)),
    (592, 1472, "uint4-g64-zp", (130,)),
    (2048, 1024, "int4-g32", (100,)),
    (1040, 2048, "int8-g32", (77,)),
]


def _quantize(w: torch.Tensor, scheme: str, act: torch.dtype):
    weight, group, zp = SCHEMES[scheme]
    if weight == "mxfp4":  # e8m0 scales of its own
        qw = humming.quantize(w, weight="mxfp4")
        if scheme == "mxfp4-any-scale":
            qw.scales.view(torch.uint8)[::5, ::3] = 0
        return qw
    return humming.quantize(w, weight=weight, group_size=group, zero_point=zp, scale_dtype=act)


#: (bias?, tuning): every token tile and blocks-per-SM choice default_gemm_tuning makes, with and without bias
TUNINGS = [
    (None, _gemm_sm90.GemmTuning(128, 6)),
    ("bias", _gemm_sm90.GemmTuning(256, 4)),
    ("bias", _gemm_sm90.GemmTuning(32, 8, 2)),
    (None, _gemm_sm90.GemmTuning(64, 8, 2)),
    ("bias", _gemm_sm90.GemmTuning(64, 8, 1)),
    (None, _gemm_sm90.GemmTuning(128, 8, 1)),
    # split-K: K in 2 to 4 blocks summed in the workspace (K = 832 has 13 chunks: splits of 3 and 4 chunks)
    (None, _gemm_sm90.GemmTuning(64, 8, 2, 3)),
    ("bias", _gemm_sm90.GemmTuning(128, 6, 1, 2)),
    ("bias", _gemm_sm90.GemmTuning(256, 4, 1, 4)),
    # persistent grids: each block walks several tiles (the cases' grids exceed 132 block slots at large M)
    (None, _gemm_sm90.GemmTuning(128, 6, persistent=True)),
    ("bias", _gemm_sm90.GemmTuning(32, 8, 2, persistent=True)),
]


@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("n", "k", "scheme", "ms"), CASES)
def test_gemm_matches_reference(n, k, scheme, ms, act, seed, monkeypatch):
    with_sm_count(monkeypatch, _gemm_sm90, 3)  # the persistent grids: 3 or 6 blocks walk every tile
    qw = _quantize(torch.randn(n, k, device="cuda") * 0.05, scheme, act)
    if qw.format.name == "e2m1" and act == torch.float16:
        x = torch.randn(ms[0], k, device="cuda", dtype=act)
        assert "bfloat16 activations" in _gemm_sm90.gemm_unsupported(qw, x, (9, 0))
        return
    prep = prepare_weight(qw)
    if qw.format.name == "e2m1":
        assert prep.layout.scale == ("e8m0_any" if scheme == "mxfp4-any-scale" else "e8m0")
    wref = humming.dequantize(qw, torch.float32)
    bias = torch.randn(n, device="cuda", dtype=act)
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=act)
        for b, tuning in TUNINGS:
            b = None if b is None else bias
            out = torch.full((m, n), float("nan"), device="cuda", dtype=act)
            _gemm_sm90.run_gemm(prep, x, b, act, tuning, out=out)
            ref = x.float() @ wref.T + (0 if b is None else b.float())
            assert_rel_close(out, ref, precision=torch.float32)


def test_gemm_through_linear_and_graph_capture(seed):
    qw = humming.quantize(torch.randn(1024, 1024, device="cuda"), weight="int4", group_size=128)
    x = torch.randn(300, 1024, device="cuda", dtype=torch.bfloat16)
    assert backend_unsupported(qw, None, x, "cuda") is None
    humming.warmup([qw], m_values=(300,), backend="cuda", progress=False)  # the backend the capture asks for
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = humming.linear(x, qw, backend="cuda")
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert_rel_close(out, x.float() @ humming.dequantize(qw).T, precision=torch.float32)


def test_split_k_workspace_is_zero_between_calls_and_in_a_graph(seed):
    """Split-K sums into a workspace that the last block of each tile reads back as zeros: a second call (of
    another M on the same stream), and CUDA graph replays on fresh inputs, see none of the earlier sums."""
    w = torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16) * 0.05
    qw = humming.quantize(w, weight="int4", group_size=128)  # bf16 scales, as the kernel multiplies them
    prep = prepare_weight(qw)
    # the weights as the kernel multiplies them ((code - 8) * scale rounded once to bf16): what is left is the
    # fp32 summation order
    wref = humming.dequantize(qw, torch.bfloat16).float()
    tuning = _gemm_sm90.GemmTuning(64, 8, 2, 4)
    for m in (100, 37, 100):
        x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
        first = _gemm_sm90.run_gemm(prep, x, None, torch.float32, tuning)
        second = _gemm_sm90.run_gemm(prep, x, None, torch.float32, tuning)
        ref = x.float() @ wref.T
        assert_rel_close(first, ref, 1e-3, precision=torch.float32)
        assert (first - second).abs().max() <= 1e-5 * ref.abs().max(), "a second call sees the first's sums"
    x = torch.randn(200, 4096, device="cuda", dtype=torch.bfloat16)
    _gemm_sm90.reserve_gemm_workspace(200, 1024, 4096, tuning, prep.layout, 0)
    out = torch.full((200, 1024), float("nan"), device="cuda", dtype=torch.float32)
    _gemm_sm90.run_gemm(prep, x, None, torch.float32, tuning, out=out)  # loads the kernel before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _gemm_sm90.run_gemm(prep, x, None, torch.float32, tuning, out=out)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert_rel_close(out, x.float() @ wref.T, 1e-3, precision=torch.float32)
