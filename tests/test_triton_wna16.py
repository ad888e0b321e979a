"""The Triton WnA16 GEMM against the reference, from a table of cases (formats x layouts x shapes).

Reference: ``x @ dequantize(qw, x.dtype)^T + bias`` in float64 (the tensor-core path rounds each dequantized
weight once to the activations' dtype, exactly as ``dequantize`` does, then accumulates in fp32; the GEMV
path, M = 1 or configs with block_m <= 4, keeps the fp32 weights: its reference is ``dequantize(qw, fp32)``).
Tolerances (``||out - ref|| / ||ref||``): the fp32 accumulation and output rounding, i.e. 2e-6 for fp32
output, 2e-3 for fp16, 1e-2 for bf16. Against ``humming.linear(backend="reference")`` (fp32 weights) the
weight rounding adds one bf16/fp16 rounding per weight: 1e-2. Outputs are poisoned with NaN before each
call. Without a GPU the kernel runs under Triton's interpreter (tests/conftest.py), on small shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from helpers import rel_err

import humming

wna16 = pytest.importorskip("humming.triton_kernels.wna16")
from humming.triton_kernels.configs import TileConfig  # noqa: E402
from humming.triton_kernels.wna16_configs import TILED_16, smem_estimate, wna16_config  # noqa: E402

TOL = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1e-2}


@dataclass(frozen=True)
class Case:
    weight: str
    group_size: object = 128
    zero_point: object = False
    scale_dtype: torch.dtype | None = None
    act_order: bool = False
    x_dtype: torch.dtype = torch.bfloat16
    out_dtype: torch.dtype | None = None
    bias: bool = True

    def __str__(self) -> str:
        gs = self.group_size if not isinstance(self.group_size, tuple) else "x".join(map(str, self.group_size))
        name = lambda d: "" if d is None else str(d).replace("torch.", "").replace("float", "f")
        parts = [self.weight, f"g{gs}", f"zp={self.zero_point}" if self.zero_point else "", name(self.scale_dtype)]
        parts += ["act-order" if self.act_order else "", f"x={name(self.x_dtype)}", name(self.out_dtype)]
        parts += ["" if self.bias else "nobias"]
        return "-".join(p for p in parts if p)

    def quantize(self, w: torch.Tensor) -> humming.QuantizedWeight:
        kwargs = {"group_size": self.group_size, "zero_point": self.zero_point, "scale_dtype": self.scale_dtype}
        if self.act_order:
            k = w.shape[1]
            kwargs["g_idx"] = torch.randint(0, -(-k // self.group_size), (k,), dtype=torch.int32, device=w.device)
        return humming.quantize(w, self.weight, **kwargs)


CASES = [
    Case("int4"),
    Case("int4", group_size=-1, scale_dtype=torch.bfloat16, out_dtype=torch.float32),
    Case("int8", group_size=-1, x_dtype=torch.float16),
    Case("int8", group_size="tensor", bias=False),
    Case("int2", group_size=16, scale_dtype=torch.float16, x_dtype=torch.float16),
    Case("int3", group_size=32),
    Case("int4", zero_point=True, group_size=64),
    Case("int5", zero_point=True, group_size=32, x_dtype=torch.float16, out_dtype=torch.float32),
    Case("int6", zero_point="float", group_size=64, scale_dtype=torch.bfloat16),
    Case("int7", zero_point=True, group_size=-1),
    Case("int1", zero_point=True, group_size=32),
    Case("int4", group_size=32, act_order=True),
    Case("int4", zero_point=True, group_size=16, act_order=True, x_dtype=torch.float16),
    Case("mxfp4"),
    Case("nvfp4", out_dtype=torch.float32),
    Case("e2m3", group_size=32, scale_dtype=torch.float8_e8m0fnu),
    Case("e3m2", group_size=32, scale_dtype=torch.float8_e4m3fn, x_dtype=torch.float16),
    Case("e4m3", group_size=-1),
    Case("fp8_block", group_size=(16, 64)),
    Case("e5m2", group_size=64, scale_dtype=torch.float16),
    Case("e1m2", group_size=16),
    Case("nf4", group_size=64, scale_dtype=torch.bfloat16),
]
#: (M, N, K): aligned, odd everything (K not a multiple of a word, a group or a tile), M past one tile.
SHAPES = [(1, 64, 256), (5, 40, 200), (33, 48, 136)]


def _kernel_weights(qw, x: torch.Tensor, cfg: TileConfig) -> torch.Tensor:
    """The weights the kernel multiplies, in float64: the fp32 decode on the GEMV path (block_m <= 4); on the
    tensor-core paths each weight rounded once to x's dtype, except a global-scaled weight on the packed decode,
    whose tiles hold ``code * scale`` exactly and whose sums the kernel multiplies by the global scale."""
    from humming.triton_kernels._dequant16 import packed_decode

    if cfg.block_m <= 4 and not cfg.swap:
        return humming.dequantize(qw, torch.float32).double()
    if qw.global_scale is not None and packed_decode(qw, x.dtype, cfg.block_k, x.device, global_scale_after=True):
        return humming.dequantize(qw, torch.float64)
    return humming.dequantize(qw, x.dtype).double()


def _check(case: Case, qw, x, bias, out_dtype, config=None) -> None:
    m, n = x.shape[0], qw.N
    out = torch.full((m, n), float("nan"), dtype=out_dtype, device=x.device)
    result = wna16.linear(x, qw, bias, out_dtype, config=config, out=out)
    assert result.data_ptr() == out.data_ptr()
    assert not torch.isnan(out).any(), f"{int(torch.isnan(out).sum())} outputs not written (NaN poison left)"
    cfg = config or wna16.default_config(qw, x)
    ref = x.double() @ _kernel_weights(qw, x, cfg).T
    if bias is not None:
        ref = ref + bias.double()
    err = rel_err(out, ref)
    worst = tuple(int(i) for i in divmod(int((out.double() - ref).abs().argmax()), n))
    assert err <= TOL[out_dtype], f"rel err {err:.2e} > {TOL[out_dtype]:.0e}; worst at {worst}"


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("case", CASES, ids=str)
def test_wna16_matches_reference(case: Case, shape, seed: int, device: str) -> None:
    m, n, k = shape
    qw = case.quantize(torch.randn(n, k, device=device))
    x = torch.randn(m, k, device=device).to(case.x_dtype)
    bias = torch.randn(n, device=device) if case.bias else None
    _check(case, qw, x, bias, case.out_dtype or case.x_dtype)


@pytest.mark.parametrize("m", [1, 2, 3, 8, 16])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_wna16_few_tokens(case: Case, m: int, seed: int, device: str) -> None:
    """M <= 16, the decode paths the chooser picks (the GEMV kernel at M = 1, the swapped-operand
    tensor-core kernel up to 16), on odd N and K (K neither a multiple of a tile nor of a word)."""
    n, k = 40, 200
    qw = case.quantize(torch.randn(n, k, device=device))
    x = torch.randn(m, k, device=device).to(case.x_dtype)
    cfg = wna16_config(m, n, k, qw.bits, 1)
    assert cfg.block_m == 1 if m == 1 else cfg.swap, cfg
    _check(case, qw, x, torch.randn(n, device=device) if case.bias else None, case.out_dtype or case.x_dtype)


@pytest.mark.parametrize(
    "config",
    [
        TileConfig(16, 32, 64, split_k=2, swap=True),
        TileConfig(1, 64, 64, split_k=3, num_stages=1),
        TileConfig(16, 16, 64, split_k=3),
        TileConfig(32, 32, 32, split_k=2, group_m=1),
        TileConfig(16, 64, 128),
        TileConfig(4, 16, 64, split_k=2),
        TileConfig(2, 32, 128),
        TileConfig(1, 32, 32, split_k=2),
    ],
    ids=lambda c: c.name(),
)
def test_wna16_tile_configs(config: TileConfig, seed: int, device: str) -> None:
    """Split-K (fp32 atomics, bias added after), GEMV (block_m <= 4) and other tiles compute the same function."""
    case = Case("int4", group_size=32)
    qw = case.quantize(torch.randn(40, 200, device=device))
    rows = max(1, config.block_m - 1) if config.block_m <= 4 else 7
    x = torch.randn(rows, 200, device=device).to(torch.bfloat16)
    _check(case, qw, x, torch.randn(40, device=device), torch.bfloat16, config=config)


@pytest.mark.parametrize("waves", [1, 3])
@pytest.mark.parametrize(
    "config",
    [TileConfig(1, 16, 32, num_stages=1), TileConfig(1, 16, 32, num_stages=2), TileConfig(2, 16, 32)],
    ids=lambda c: c.name(),
)
def test_wna16_gemv_stream_k(config: TileConfig, waves: int, seed: int, device: str) -> None:
    """The persistent GEMV deals 5 output tiles' K tiles (N and K ragged; 13 each on the interpreter, 32 on a
    GPU) over its programs (on the interpreter one multiprocessor holding one, so 1 or 3 programs; on a GPU
    the first call runs one per multiprocessor and wave, fewer than the K tiles at one wave, the later ones as
    many as the compiled kernel lets a multiprocessor hold): shares that cover whole output tiles, that end
    inside one, and that run from one tile into the next all write every output once, with the bias once,
    whatever the order in which the parts arrive; loading one K tile ahead (``num_stages=2``) reads nothing past
    a share's last tile into its sums. Called twice: the workspace is left zero."""
    case = Case("int4", group_size=32)
    k = 400 if device == "cpu" else 1000
    qw = case.quantize(torch.randn(72, k, device=device))
    config = config.replace(split_k=waves)
    for _ in range(2):
        x = torch.randn(config.block_m, k, device=device).to(torch.bfloat16)
        _check(case, qw, x, torch.randn(72, device=device), torch.bfloat16, config=config)


#: The formats the GEMV decodes in place, word by word (its packed path): integer fields with and without zero
#: points, 8-bit words, e2m1 by byte table (with e8m0 and e4m3 scales), on ragged K.
_GEMV_PACKED_CASES = [
    Case("int4", group_size=32),
    Case("int4", zero_point=True, group_size=64, x_dtype=torch.float16),
    Case("int8", group_size=-1, scale_dtype=torch.bfloat16, out_dtype=torch.float32),
    Case("mxfp4"),
    Case("nvfp4", out_dtype=torch.float32),
]


@pytest.mark.parametrize("stages", [1, 2])
@pytest.mark.parametrize("case", _GEMV_PACKED_CASES, ids=str)
def test_wna16_gemv_loads_ahead(case: Case, stages: int, seed: int, device: str) -> None:
    """A GEMV tile of more than one stage loads one K tile ahead: each iteration loads the next tile's words and
    activations before decoding its own (in registers; Triton compiles one stage). Same function either way,
    ragged K (the last tile's words partly past K) and N."""
    n, k = 40, 456
    qw = case.quantize(torch.randn(n, k, device=device))
    x = torch.randn(1, k, device=device).to(case.x_dtype)
    config = TileConfig(1, 32, 64, split_k=3, num_stages=stages)  # three shares: two end inside a tile
    _check(case, qw, x, torch.randn(n, device=device), case.out_dtype or case.x_dtype, config=config)


def test_tile_config_refuses_counts_below_one() -> None:
    """A config with no K splits (or no warps, stages, tiles) would launch an empty grid and leave the output
    unwritten: refused where it is made, naming the field."""
    for field in ("split_k", "num_warps", "num_stages", "block_n"):
        with pytest.raises(ValueError, match=f"{field}=0"):
            TileConfig(1, 128, 128).replace(**{field: 0})
    with pytest.raises(ValueError, match=r"split_k=2\.0"):
        TileConfig(1, 128, 128, split_k=2.0)


@pytest.mark.gpu
@pytest.mark.parametrize("bias, out_dtype", [(False, torch.bfloat16), (True, torch.bfloat16), (False, torch.float32)])
def test_warmup_sets_aside_the_gemv_workspace(bias: bool, out_dtype: torch.dtype, monkeypatch) -> None:
    """The GEMV (M = 1) always adds into the split-K workspace, so warmup sets it aside (a CUDA graph capture
    cannot allocate it), as it does for a split tile; a dequantize-first call (M = 4096 without bias, output in
    x's dtype) needs none."""
    from humming.triton_kernels._tiles import split_k_words

    reserved = []
    monkeypatch.setattr(wna16.WORKSPACES, "reserve", lambda words, device: reserved.append(words))
    qw = humming.quantize(torch.randn(4096, 1024, device="cuda"), "int4", 128, scale_dtype=torch.bfloat16)
    options = dict(act_dtype=torch.bfloat16, out_dtype=out_dtype, bias_dtype=torch.bfloat16 if bias else None)
    wna16._warmup_jobs(qw, None, 1, device=0, **options)
    cfg = wna16.default_config(qw, torch.empty(1, 1024, dtype=torch.bfloat16, device="cuda"))
    assert cfg.gemv and reserved == [split_k_words(1, 4096, 4096 // cfg.block_n)]
    reserved.clear()
    wna16._warmup_jobs(qw, None, 4096, device=0, **options)
    large = wna16.default_config(qw, torch.empty(4096, 1024, dtype=torch.bfloat16, device="cuda"))
    runs_dequant_first = large.dequant_first and not bias and out_dtype == torch.bfloat16
    assert (reserved == []) == (runs_dequant_first or large.split_k == 1)


@pytest.mark.parametrize("regs, held", [(124, 4), (168, 3), (249, 2), (80, 6)])
def test_gemv_grid_is_what_the_multiprocessors_hold(regs: int, held: int, monkeypatch) -> None:
    """The persistent GEMV's grid: one program per multiprocessor before its kernel is compiled, then as many
    as an H100's multiprocessor holds of the compiled kernel (4 warps: its registers decide), times the waves,
    capped at one program per K tile; one per multiprocessor still where the compiled kernel reports no
    register count."""
    import types

    from humming.device import DeviceLimits
    from humming.triton_kernels import _wna16_launch

    h100 = types.SimpleNamespace(regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048)
    h100.shared_memory_per_multiprocessor = 233472
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: h100)
    monkeypatch.setattr(_wna16_launch, "device_limits", lambda device: DeviceLimits(132, 232448, 233472))
    kernel = types.SimpleNamespace(n_regs=regs, metadata=types.SimpleNamespace(shared=512))
    cuda = torch.device("cuda", 0)
    for waves in (1, 2):
        first, regrid = _wna16_launch._gemv_grids(cuda, 224 * 64, TileConfig(1, 128, 128, split_k=waves))
        assert first == (132 * waves, 1) and regrid(kernel) == (132 * held * waves, 1)
    assert _wna16_launch._gemv_grids(cuda, 200, TileConfig(1, 128, 128))[1](kernel) == (200, 1)
    unreported = types.SimpleNamespace(n_regs=None, metadata=kernel.metadata)  # a Triton without the count
    assert _wna16_launch._gemv_grids(cuda, 224 * 64, TileConfig(1, 128, 128))[1](unreported) == (132, 1)


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16], ids=str)
def test_wna16_dequant_first(x_dtype: torch.dtype, seed: int, device: str) -> None:
    """The large-M path (dequantize once, one library GEMM) where it applies, the tiled kernel where not."""
    config = TileConfig(16, 32, 64, dequant_first=True)
    case = Case("uint4", group_size=32, zero_point=True, x_dtype=x_dtype)
    qw = case.quantize(torch.randn(48, 200, device=device))
    x = torch.randn(9, 200, device=device).to(x_dtype)
    _check(case, qw, x, None, x_dtype, config=config)  # dequant-first
    _check(case, qw, x, torch.randn(48, device=device), x_dtype, config=config)  # bias: tiled kernel
    _check(case, qw, x, None, torch.float32, config=config)  # other out dtype: tiled kernel


def test_linear_triton_backend(seed: int, device: str) -> None:
    """``humming.linear(..., backend="triton")`` runs this kernel and agrees with the reference backend."""
    qw = humming.quantize(
        torch.randn(48, 96, device=device), "int4", group_size=32, bias=torch.randn(48, device=device)
    )
    x = torch.randn(2, 3, 96, device=device).to(torch.bfloat16)
    out = humming.linear(x, qw, backend="triton", out_dtype=torch.float32)
    ref = humming.linear(x, qw, backend="reference", out_dtype=torch.float32)
    assert out.shape == (2, 3, 48)
    assert rel_err(out, ref.double()) <= 1e-2


def test_empty_m(device: str) -> None:
    qw = humming.quantize(torch.randn(32, 64, device=device), "int4", group_size=32)
    out = wna16.linear(torch.empty(0, 64, dtype=torch.bfloat16, device=device), qw)
    assert out.shape == (0, 32)


def _q(*shape: int) -> humming.QuantizedWeight:
    return humming.quantize(torch.randn(*shape), "int4", group_size=32)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda d: (torch.randn(2, 64, device=d), _q(32, 64)), "float16"),
        (lambda d: (torch.randn(2, 64, device=d).bfloat16(), _q(2, 32, 64)), "expert"),
        (lambda d: (torch.randn(2, 48, device=d).bfloat16(), _q(32, 64)), "K=48"),
    ],
    ids=["fp32-x", "experts", "k-mismatch"],
)
def test_wna16_rejects(make, match: str, device: str) -> None:
    x, qw = make(device)
    with pytest.raises(ValueError, match=match):
        wna16.linear(x, qw.to(device))


@pytest.mark.parametrize("packed", ["", "int", "float"])
def test_small_m_tiles_follow_the_decode(packed: str) -> None:
    """Up to 16 tokens the chooser takes the GEMV kernel at M = 1 (loading one K tile ahead for 4-bit codes
    without zero points) and the swapped kernel with 128-row weight tiles above, except for weights the packed
    16-bit decode reads: integer codes take 64-row swapped tiles, e2m1 codes the tiled kernel's 16-row tile;
    8-bit weights (never packed) swapped K tiles of 64. Above 16 tokens the decode does not change the tiles."""
    pick = lambda m: wna16_config(m, 28672, 8192, 4, 132, 128, 232448, packed=packed)
    one, few = pick(1), pick(8)
    assert one.block_m == 1 and not one.swap and one.num_stages == 2
    if packed == "float":
        assert few.replace(split_k=1) == TILED_16
    else:
        assert few.swap and few.block_n == (64 if packed == "int" else 128)
    assert wna16_config(1, 28672, 8192, 4, 132, 128, 232448, zero_points=True).num_stages == 1
    assert wna16_config(1, 28672, 8192, 8, 132, 0, 232448).num_stages == 1
    if not packed:  # 8-bit weights: the 4-bit tile's weight bytes per K tile
        assert wna16_config(8, 28672, 8192, 8, 132, 0, 232448).block_k == 64
    assert pick(64) == wna16_config(64, 28672, 8192, 4, 132, 128, 232448)
    with pytest.raises(ValueError, match="packed"):
        wna16_config(8, 28672, 8192, 4, 132, 128, 232448, packed="e2m1")


def test_config_override_rejects_unknown_field() -> None:
    with pytest.raises(ValueError, match="unknown field"):
        wna16_config(1, 64, 64, 4, 132).replace(block_q=3)


# ----------------------------------------------------------------------------------------------- GPU, real shapes
GPU_CASES = [
    Case("int4"),
    Case("int8", group_size=-1),
    Case("mxfp4"),
    Case("nvfp4"),
    Case("int4", 128, True, act_order=True),
]


@pytest.mark.gpu
@pytest.mark.heavy_memory  # the 28672 x 8192 weight quantized and dequantized on the GPU: 10-13 GiB
@pytest.mark.parametrize("m", [1, 7, 128, 1024, 8192])
@pytest.mark.parametrize("case", GPU_CASES, ids=str)
def test_wna16_gpu_realistic(case: Case, m: int, seed: int) -> None:
    n, k = (28672, 8192) if case.weight == "int4" and not case.act_order else (8192, 8192)
    qw = case.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16))  # bf16 scales, as real checkpoints
    x = torch.randn(m, k, device="cuda").to(case.x_dtype)
    bias = torch.randn(n, device="cuda")
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    wna16.linear(x, qw, bias, torch.bfloat16, out=out)
    assert not torch.isnan(out).any()
    w = humming.dequantize(qw, torch.bfloat16).float()
    ref = x.float() @ w.T + bias
    err = rel_err(out, ref.double())
    assert err <= TOL[torch.bfloat16], f"rel err {err:.2e}"


@pytest.mark.gpu
@pytest.mark.heavy_memory
@pytest.mark.parametrize("m", [1024, 8192])
def test_wna16_gpu_dequant_first(m: int, seed: int) -> None:
    """Large M without bias: the dequantize-then-GEMM path at a real shape."""
    qw = Case("int4").quantize(torch.randn(28672, 8192, device="cuda", dtype=torch.bfloat16))
    x = torch.randn(m, 8192, device="cuda").to(torch.bfloat16)
    out = torch.full((m, 28672), float("nan"), dtype=torch.bfloat16, device="cuda")
    wna16.linear(x, qw, None, torch.bfloat16, out=out)
    assert not torch.isnan(out).any()
    ref = x.float() @ humming.dequantize(qw, torch.bfloat16).float().T
    assert rel_err(out, ref.double()) <= TOL[torch.bfloat16]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "config",
    [
        TileConfig(16, 128, 128, split_k=2, num_stages=3, swap=True),  # two splits: the sums' order is fixed
        TileConfig(16, 64, 256, split_k=2),
        TileConfig(32, 64, 128),
        TileConfig(64, 128, 64),
        TileConfig(128, 128, 64, num_warps=8),
    ],
    ids=lambda c: c.name(),
)
@pytest.mark.parametrize(
    "case",
    [
        Case("int4", scale_dtype=torch.bfloat16),
        Case("int4", 64, True, torch.float16, x_dtype=torch.float16),
        Case("mxfp4"),
    ],
    ids=str,
)
def test_packed_16_bit_decode_matches_the_fp32_decode(case: Case, config: TileConfig, seed: int, monkeypatch) -> None:
    """The tensor-core kernels with the packed 16-bit decode match the reference, and the fp32 decode rounded to
    the activations' dtype up to the order of the fp32 accumulation: the tiles are bit-equal
    (tests/test_triton_dequant.py), but the compiler may order K differently inside the MMA instructions for
    the two register layouts (the mma.sync tiles do), which moves a sum by far under 2^-16 of its magnitudes
    ``|x| @ |w|^T`` and its rounding by an ulp; one weight in a wrong column moves it by about one product,
    2^-11 of that sum here."""
    from humming.triton_kernels import _wna16_launch

    m = config.block_m if config.swap else 3 * config.block_m // 2
    w = torch.randn(1024, 2048, device="cuda")
    fast, plain = case.quantize(w), case.quantize(w)  # equal weights, launches made ready separately
    monkeypatch.setenv("HUMMING_TRITON_PACKED_DECODE", "1")
    assert _wna16_launch.packed_decode(fast, case.x_dtype, config.block_k, torch.device("cuda"))
    x = torch.randn(m, 2048, device="cuda").to(case.x_dtype)
    bias = torch.randn(1024, device="cuda")
    _check(case, fast, x, bias, case.x_dtype, config)
    out_fast = wna16.linear(x, fast, bias, config=config)
    monkeypatch.setenv("HUMMING_TRITON_PACKED_DECODE", "0")
    out_plain = wna16.linear(x, plain, bias, config=config)
    magnitudes = x.abs().double() @ humming.dequantize(plain, case.x_dtype).abs().double().T
    ulp = torch.finfo(case.x_dtype).eps * torch.maximum(out_fast.abs(), out_plain.abs()).double()
    excess = (out_fast.double() - out_plain.double()).abs() - (2 * ulp + magnitudes * 2**-16)
    worst = divmod(int(excess.argmax()), excess.shape[1])
    assert bool((excess <= 0).all()), (
        f"{worst}: {out_fast[worst].item()} vs {out_plain[worst].item()}, sum of magnitudes {magnitudes[worst].item()}"
    )


@pytest.mark.gpu
@pytest.mark.parametrize(
    "config",
    [
        TileConfig(16, 64, 256, split_k=2),
        TileConfig(16, 64, 128, split_k=2, num_stages=3, swap=True),
        TileConfig(64, 128, 64),
    ],
    ids=lambda c: c.name(),
)
def test_packed_nvfp4_applies_the_global_scale_after_the_dot(config: TileConfig, seed: int) -> None:
    """NVFP4 with the packed decode: the tiles hold ``code * scale`` exactly (no rounding to bf16) and the
    kernel multiplies its fp32 sums by the global scale, so the output is the float64 product of the exact
    weights up to the fp32 accumulation (2^-16 of ``|x| @ |w|^T``, as above) and its own rounding."""
    from humming.triton_kernels import _wna16_launch

    qw = humming.quantize(torch.randn(1024, 2048, device="cuda"), "nvfp4")
    assert qw.global_scale is not None
    assert _wna16_launch.packed_decode(qw, torch.bfloat16, config.block_k, qw.device, global_scale_after=True)
    m = config.block_m if config.swap else 3 * config.block_m // 2
    x = torch.randn(m, 2048, device="cuda").to(torch.bfloat16)
    bias = torch.randn(1024, device="cuda")
    out = torch.full((m, 1024), float("nan"), dtype=torch.bfloat16, device="cuda")
    wna16.linear(x, qw, bias, config=config, out=out)
    assert not torch.isnan(out).any()
    w = humming.dequantize(qw, torch.float64)
    ref = x.double() @ w.T + bias.double()
    bound = 2 * torch.finfo(torch.bfloat16).eps * ref.abs() + (x.double().abs() @ w.abs().T) * 2**-16
    excess = (out.double() - ref).abs() - bound
    worst = divmod(int(excess.argmax()), excess.shape[1])
    assert bool((excess <= 0).all()), f"{worst}: {out[worst].item()} vs {ref[worst].item()}"


def test_wna16_strided_g_idx(seed: int, device: str) -> None:
    """An act-order ``g_idx`` that is a strided view (every other element of a bigger tensor) gives the
    same result as its contiguous copy: the kernel reads ``g_idx[k]`` at ``k``."""
    case = Case("int4", group_size=32, act_order=True)
    n, k = 40, 200
    w = torch.randn(n, k, device=device)
    g_idx = torch.randint(0, -(-k // 32), (k, 2), dtype=torch.int32, device=device)[:, 0]
    assert not g_idx.is_contiguous()
    qw = humming.quantize(w, "int4", group_size=32, g_idx=g_idx)
    x = torch.randn(7, k, device=device).to(torch.bfloat16)
    _check(case, qw, x, None, torch.bfloat16, config=TileConfig(16, 32, 64))  # the tiled kernel
    _check(case, qw, x[:2], None, torch.bfloat16, config=TileConfig(2, 32, 64))  # the GEMV kernel


#: packed kind -> the kernel the chooser picks at M = 1, 8, 256 and 1024 (28672 x 8192 int4 g128 on an H100)
_CHOSEN = {
    "int": ("gemv", "swap-n64", "fused", "dequant-first"),
    "float": ("gemv", "tiled-16", "fused", "dequant-first"),
    "": ("gemv", "swap-n128", "dequant-first", "dequant-first"),
}


def _kernel_of(cfg: TileConfig) -> str:
    if cfg.dequant_first:
        return "dequant-first"
    if cfg.swap:
        return f"swap-n{cfg.block_n}"
    if cfg.block_m <= 4:
        return "gemv"
    return f"tiled-{cfg.block_m}" if cfg.block_m == 16 else "fused"


@pytest.mark.parametrize("packed", list(_CHOSEN))
def test_chooser_buckets_for_the_packed_decode(packed: str) -> None:
    """The kernels :func:`wna16_config` picks by M for weights the packed 16-bit decode reads (``packed``: the kind
    of their codes) and for the others (``""``): e2m1 codes on the 16-row tiled kernel from two tokens, integer
    codes on the 64-row swapped tile up to 16 tokens, packed weights on the fused 128-row tile up to 256 tokens
    where the others dequantize first; each tile within an H100's shared memory."""
    limit, sms = 232448, 132
    chosen = [wna16_config(m, 28672, 8192, 4, sms, 128, limit, packed=packed) for m in (1, 8, 256, 1024)]
    assert tuple(_kernel_of(cfg) for cfg in chosen) == _CHOSEN[packed]
    assert all(smem_estimate(cfg, 4, 128) <= limit for cfg in chosen)
    with pytest.raises(ValueError, match="packed"):
        wna16_config(8, 64, 256, 4, sms, packed="e2m1")
