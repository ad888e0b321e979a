"""``humming.moe.grouped_linear`` on grouped rows: the reference backend (the definition) against each expert's
``humming.linear``, the Triton kernels against ``humming.dequantize`` of each expert in float64 (rows of
blocks whose expert is -1 are not compared: they are unspecified, and the Triton outputs are poisoned with
NaN first: skipped blocks keep it), the dispatch; GPU runs at real MoE shapes."""

from __future__ import annotations

import pytest
import torch
from helpers import rel_err
from moe_cases import GPU_WEIGHTS, TOL, grouped_input, grouped_ref, quantize_experts

import humming
from humming import moe

wna16 = pytest.importorskip("humming.triton_kernels.wna16")
from humming.ir.activation import get_act_scheme  # noqa: E402
from humming.triton_kernels import scaled_mm  # noqa: E402
from humming.triton_kernels.configs import TileConfig  # noqa: E402


@pytest.mark.parametrize(
    ("name", "act"),
    [
        ("int4-g32", None),
        ("uint4-zp-g128", "int8"),
        ("int8-channel", "fp8"),
        ("e4m3-channel", "fp8_g128"),
        ("mxfp4", "mxfp4"),
        ("nvfp4", "fp8"),
        ("int4-g32", "int4"),
        ("int3-g64-float-zp", "fp8_e5m2"),
    ],
)
def test_grouped_reference_matches_per_expert_linear(name: str, act, seed: int, device: str) -> None:
    """The reference grouped GEMM = humming.linear of each block's rows with that block's expert."""
    e, n, k, block_m = 4, 40, 256, 16
    qw = quantize_experts(name, e, n, k, device, bias=True)
    x, expert_ids = grouped_input(9, 2, e, k, block_m, torch.bfloat16, device)
    out = moe.grouped_linear(x, qw, expert_ids, block_m, act=act, out_dtype=torch.float32, backend="reference")
    for b, expert in enumerate(expert_ids.tolist()):
        if expert < 0:
            continue
        rows = slice(b * block_m, (b + 1) * block_m)
        ref = humming.linear(
            x[rows], moe.expert_weight(qw, expert), act=act, out_dtype=torch.float32, backend="reference"
        )
        assert rel_err(out[rows], ref.double()) <= 1e-6, f"block {b} (expert {expert})"


@pytest.mark.parametrize(
    ("name", "act"), [("int8-channel", "int8_tensor"), ("e4m3-channel", "fp8_tensor"), ("nvfp4", "nvfp4")]
)
def test_grouped_reference_per_tensor_scale_spans_all_blocks(name: str, act: str, seed: int, device: str) -> None:
    """A dynamic per-tensor activation scale (nvfp4's global scale too) is one for every row in use: with
    two blocks of one expert, the result is humming.linear of those rows."""
    qw = quantize_experts(name, 3, 32, 128, device)
    x = torch.randn(48, 128, device=device).bfloat16()
    expert_ids = torch.tensor([1, 1, -1], dtype=torch.int32, device=device)
    out = moe.grouped_linear(x, qw, expert_ids, 16, act=act, backend="reference", out_dtype=torch.float32)
    ref = humming.linear(x[:32], moe.expert_weight(qw, 1), act=act, backend="reference", out_dtype=torch.float32)
    assert rel_err(out[:32], ref.double()) <= 1e-6


# ------------------------------------------------------------------------------------------ Triton grouped
@pytest.mark.parametrize(
    ("name", "shape", "x_dtype", "out_dtype", "act_order", "bias"),
    [
        ("uint4-zp-g128", (4, 48, 256), torch.bfloat16, None, False, True),
        ("uint4-zp-g128", (4, 48, 256), torch.bfloat16, None, False, False),
        ("int8-channel", (4, 40, 200), torch.float16, None, False, True),
        ("e4m3-channel", (3, 64, 128), torch.bfloat16, torch.float32, False, False),
        ("mxfp4", (4, 48, 256), torch.bfloat16, None, False, True),
        ("nvfp4", (2, 32, 128), torch.float16, torch.float32, False, True),
        ("int4-g32", (3, 40, 200), torch.bfloat16, None, True, True),
        ("int3-g64-float-zp", (2, 32, 192), torch.float16, None, False, False),
    ],
    ids=lambda v: v if isinstance(v, str) else str(v),
)
def test_triton_grouped_matches_reference(name, shape, x_dtype, out_dtype, act_order, bias, seed, device) -> None:
    e, n, k = shape
    block_m = 16
    qw = quantize_experts(name, e, n, k, device, act_order=act_order)
    b = torch.randn(e, n, device=device) if bias else None
    x, expert_ids = grouped_input(11, 2, e, k, block_m, x_dtype, device)
    out_dtype = out_dtype or x_dtype
    out = torch.full((x.shape[0], n), float("nan"), dtype=out_dtype, device=device)
    result = wna16.grouped_linear(x, qw, expert_ids, block_m, b, out_dtype, out=out)
    assert result.data_ptr() == out.data_ptr()
    ref, used = grouped_ref(x, qw, expert_ids, block_m, b, x_dtype)
    assert torch.isnan(out[~used]).all(), "a block of expert -1 was written"
    err = rel_err(out[used], ref[used])
    assert err <= TOL[out_dtype], f"rel err {err:.2e} > {TOL[out_dtype]:.0e}"


@pytest.mark.parametrize(
    ("config", "block_m"),
    [(TileConfig(16, 16, 64, split_k=3), 16), (TileConfig(32, 32, 32, group_m=1), 64), (None, 48), (None, 128)],
    ids=["split-k", "tile-32-of-64", "auto-48", "auto-128"],
)
def test_triton_grouped_tiles(config, block_m: int, seed: int, device: str) -> None:
    """Split-K (per-expert bias added by the first K slice), tiles smaller than the routing block."""
    qw = quantize_experts("int4-g32", 3, 40, 200, device)
    b = torch.randn(3, 40, device=device)
    x, expert_ids = grouped_input(9, 2, 3, 200, block_m, torch.bfloat16, device, empty=0)
    out = torch.full((x.shape[0], 40), float("nan"), dtype=torch.bfloat16, device=device)
    wna16.grouped_linear(x, qw, expert_ids, block_m, b, torch.bfloat16, config=config, out=out)
    ref, used = grouped_ref(x, qw, expert_ids, block_m, b, torch.bfloat16)
    assert torch.isnan(out[~used]).all()
    assert rel_err(out[used], ref[used]) <= TOL[torch.bfloat16]


SPLIT = TileConfig(16, 32, 128, split_k=2)
SCALED_CASES = [  # weight, act, config: W8A8 fp8, DeepSeek blocks, W4A8 (int4, MXFP4), W8A8 int8, W4A4
    ("e4m3-channel", "fp8", None),
    ("fp8-block", "fp8_g128", SPLIT),
    ("int4-g128", "fp8", None),
    ("mxfp4", "fp8", None),
    ("uint4-zp-g128", "int8", SPLIT),
    ("mxfp4", "mxfp4", None),
    ("nvfp4", "fp8", None),  # per-expert global scales
]


@pytest.mark.parametrize(("name", "act", "config"), SCALED_CASES, ids=lambda v: getattr(v, "name", lambda: v)())
def test_triton_grouped_scaled_matches_reference(name: str, act: str, config, seed: int, device: str) -> None:
    """The grouped scaled GEMM (quantized activations; split-K where a config is given) against float64 of
    the quantized activations and weights."""
    e, n, k, block_m = 3, 32, 256, 16
    qw = quantize_experts(name, e, n, k, device)
    b = torch.randn(e, n, device=device)
    x, expert_ids = grouped_input(7, 2, e, k, block_m, torch.bfloat16, device)
    out = torch.full((x.shape[0], n), float("nan"), dtype=torch.bfloat16, device=device)
    scaled_mm.grouped_linear(x, qw, expert_ids, block_m, b, get_act_scheme(act), torch.bfloat16, config, out)
    xq = humming.dequantize_activation(humming.quantize_activation(x, act))
    ref, used = grouped_ref(xq, qw, expert_ids, block_m, b, torch.float32)
    assert torch.isnan(out[~used]).all(), "a block of expert -1 was written"
    assert rel_err(out[used], ref[used]) <= TOL[torch.bfloat16]


def test_triton_grouped_config_divides_block_m() -> None:
    for block_m in (16, 32, 48, 64, 96, 128, 256):
        cfg = wna16.grouped_config(4096, 2816, 2048, 4, block_m, 132, group_k=128)
        assert block_m % cfg.block_m == 0 and cfg.block_m >= 16 and not cfg.dequant_first


def test_grouped_linear_dispatch(seed: int, device: str) -> None:
    """``backend="triton"`` runs the kernel; "auto" and the reference agree with it; bias defaults to qw's."""
    qw = quantize_experts("uint4-zp-g128", 4, 48, 128, device, bias=True)
    x, expert_ids = grouped_input(6, 2, 4, 128, 32, torch.bfloat16, device)
    ref, used = grouped_ref(x, qw, expert_ids, 32, qw.bias, torch.bfloat16)
    for backend in ("triton", "auto", "reference"):
        out = moe.grouped_linear(x, qw, expert_ids, 32, backend=backend)
        assert out.shape == (x.shape[0], 48) and out.dtype == torch.bfloat16
        assert rel_err(out[used], ref[used]) <= 1e-2, backend


def test_dispatch_backend_that_cannot_run_the_grouped_call() -> None:
    """backend="cuda" on CPU tensors is refused, naming each CUDA grouped kernel and why."""
    qw = quantize_experts("int4-g32", 2, 32, 64, "cpu")
    with pytest.raises(
        ValueError, match=r"backend 'cuda' cannot run this call: cuda\.grouped_decode: .*; cuda\.grouped: "
    ):
        moe.grouped_linear(torch.randn(16, 64).bfloat16(), qw, torch.zeros(1, dtype=torch.int32), 16, backend="cuda")


# ------------------------------------------------------------------------------------ GPU, real MoE shapes


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 16, 256])
@pytest.mark.parametrize(("e", "topk"), [(8, 2), pytest.param(64, 8, marks=pytest.mark.heavy_memory)])
@pytest.mark.parametrize("name", GPU_WEIGHTS)
def test_triton_grouped_gpu_realistic(name: str, e: int, topk: int, t: int, seed: int) -> None:
    """A Qwen-MoE-like w13 (N = 2 * 1408, K = 2048), bf16, every block size the heuristic picks."""
    n, k = 2 * 1408, 2048
    block_m = moe.default_block_m(t * topk, e)
    qw = quantize_experts(name, e, n, k, "cuda")
    x, expert_ids = grouped_input(t, topk, e, k, block_m, torch.bfloat16, "cuda", empty=0)
    bias = torch.randn(e, n, device="cuda")
    out = torch.full((x.shape[0], n), float("nan"), dtype=torch.bfloat16, device="cuda")
    wna16.grouped_linear(x, qw, expert_ids, block_m, bias, torch.bfloat16, out=out)
    ref, used = grouped_ref(x, qw, expert_ids, block_m, bias, torch.bfloat16)
    assert torch.isnan(out[~used]).all()
    assert rel_err(out[used], ref[used]) <= TOL[torch.bfloat16]


@pytest.mark.gpu
@pytest.mark.heavy_memory
@pytest.mark.parametrize("t", [1, 16, 256])
@pytest.mark.parametrize(("name", "act"), [("e4m3-channel", "fp8"), ("fp8-block", "fp8_g128"), ("int4-g128", "fp8")])
def test_triton_grouped_scaled_gpu_realistic(name: str, act: str, t: int, seed: int) -> None:
    """The grouped scaled GEMM at E=64, topk=8, N = 2 * 1408, K = 2048, bf16 out."""
    e, topk, n, k = 64, 8, 2 * 1408, 2048
    block_m = moe.default_block_m(t * topk, e)
    qw = quantize_experts(name, e, n, k, "cuda")
    x, expert_ids = grouped_input(t, topk, e, k, block_m, torch.bfloat16, "cuda", empty=0)
    bias = torch.randn(e, n, device="cuda")
    out = torch.full((x.shape[0], n), float("nan"), dtype=torch.bfloat16, device="cuda")
    scaled_mm.grouped_linear(x, qw, expert_ids, block_m, bias, get_act_scheme(act), torch.bfloat16, None, out)
    xq = humming.dequantize_activation(humming.quantize_activation(x, act))
    ref, used = grouped_ref(xq, qw, expert_ids, block_m, bias, torch.float32)
    assert torch.isnan(out[~used]).all()
    assert rel_err(out[used], ref[used]) <= TOL[torch.bfloat16]
