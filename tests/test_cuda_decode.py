"""The CUDA decode kernel (small-M weight-only GEMM): layout (CPU) and results against the reference (GPU)."""

from __future__ import annotations

import re

import pytest
import torch
from helpers import assert_rel_close, backend_unsupported, capture, compile_fresh, cubin_tool

import humming
from humming import workspaces
from humming.cuda_kernels import _decode_launch, _gemm_sm90, jit, wna16_decode
from humming.cuda_kernels._layout import E2M1_BITS, PreparedWeight, WeightLayout, prepare_weight, weight_layout
from humming.device import device_limits

HAS_CUDA = torch.cuda.is_available()


def _quantize(n: int, k: int, scheme: str, dtype=torch.bfloat16, device="cpu"):
    if scheme == "mxfp4":  # e2m1 codes, e8m0 scales per 32 (the scale dtype is the format's)
        return humming.quantize(torch.randn(n, k, device=device) * 0.05, weight="mxfp4")
    weight, group, zero_point = {
        "int4-g128": ("int4", 128, False),
        "int4-g64": ("int4", 64, False),
        "int4-g32": ("int4", 32, False),
        "int8-g32": ("int8", 32, False),
        "int4-channel": ("int4", -1, False),
        "uint4-g128-zp": ("uint4", 128, True),
        "int8-channel": ("int8", -1, False),
        "uint8-g128-zp": ("uint8", 128, True),
    }[scheme]
    w = torch.randn(n, k, device=device) * 0.05
    return humming.quantize(w, weight=weight, group_size=group, zero_point=zero_point, scale_dtype=dtype)


def _fragment_codes(prep: PreparedWeight) -> torch.Tensor:
    """Read the prepared weights back as m16n8k16 A fragments (see _layout.py), as codes [N, K]."""
    n, k, bits = prep.n, prep.k, prep.layout.bits
    out = torch.full((n, k), -1, dtype=torch.int64)
    words = prep.qweight.to(torch.int64) & 0xFFFFFFFF
    tiles = torch.arange(n // 16)
    for lane in range(32):
        g, c = lane // 4, lane % 4
        for j in range(4):
            for a in range(8):  # PTX's m16n8k16 A fragment element a of lane (g, c)
                row = g + 8 * ((a // 2) % 2)
                col = 16 * j + 8 * (a // 4) + 2 * c + a % 2
                if prep.layout.codes == "e2m1":  # register a//2, half a%2, bits at E2M1_BITS
                    word = words[:, :, :, lane, j]
                    code = sum(((word >> (pos + 16 * (a % 2))) & 1) << b for b, pos in enumerate(E2M1_BITS[a // 2]))
                elif bits == 4:  # register a//2 holds nibbles a//2 (low half) and a//2 + 4 (high half)
                    word = words[:, :, :, lane, j]
                    code = (word >> (4 * (a // 2 + 4 * (a % 2)))) & 0xF
                else:  # words 2j (a0..a3) and 2j + 1 (a4..a7), one byte each
                    word = words[:, :, :, j // 2, lane, (j % 2) * 2 + a // 4]
                    code = (word >> (8 * (a % 4))) & 0xFF
                code = code.permute(0, 2, 1).reshape(n // 16, k // 64)  # [tile, chunk]
                rows = (tiles * 16 + row).view(-1, 1)
                cols = (torch.arange(0, k, 64) + col).view(1, -1)
                out[rows, cols] = code
    return out


@pytest.mark.parametrize(
    "scheme", ["int4-g128", "uint4-g128-zp", "int8-channel", "uint8-g128-zp", "mxfp4", "int4-g32", "int8-g32"]
)
@pytest.mark.parametrize("n", [256, 48])  # tile groups of 8 and of 1
def test_prepared_layout_matches_the_fragments(scheme, n, seed):
    qw = _quantize(n, 192, scheme)
    prep = prepare_weight(qw)
    assert prep.layout == weight_layout(qw)  # what warmup compiles for without preparing
    assert prep.tile_group == (8 if n % 128 == 0 else 1)
    codes = humming.ir.unpacked_codes(qw).to(torch.int64)
    if qw.format.signed and qw.format.kind == "int":
        codes = codes ^ (1 << (qw.bits - 1))
    assert torch.equal(_fragment_codes(prep), codes)
    if scheme == "mxfp4" or scheme.endswith("-g32"):  # [N/16/TG, K/64, TG, 8, half, row pair] -> [N, K/32]
        halves = WeightLayout(qw.bits, 1 << (qw.bits - 1), "bf16_halves")  # signed codes: a constant zero
        want = WeightLayout(4, 0, "e8m0", "e2m1") if scheme == "mxfp4" else halves
        assert (prep.layout, prep.groups, prep.chunks_per_group) == (want, 3, 1)
        untiled = prep.scales.permute(0, 2, 5, 3, 1, 4).reshape(qw.N, -1)
        assert torch.equal(untiled, qw.scales.view(torch.uint8) if scheme == "mxfp4" else qw.scales)
        return

    def untile(t):  # [N/16/TG, G, TG, 8, 2] -> [N, G]
        return t.permute(0, 2, 4, 3, 1).reshape(qw.N, -1)

    assert torch.equal(untile(prep.scales), qw.scales.to(prep.scales.dtype))
    if qw.zeros is not None:
        assert torch.equal(untile(prep.zeros), qw.zeros.to(torch.int16))
        assert prep.layout.zero == -1
    else:
        assert prep.layout.zero == (1 << (qw.bits - 1) if qw.format.signed else 0)


def _dequant_e2m1_model(w: torch.Tensor, dtype: torch.dtype) -> list[torch.Tensor]:
    """dequant_e2m1 (dequant.cuh) on the host, the same shifts and masks on int64 words: the four
    registers' 16-bit pairs [..., 2] (low half first) as ``dtype``."""
    mag, sign = 0x01C001C0, 0x80008000
    regs = [
        w & (mag | sign),
        (w << 3) & (mag | sign),
        (w << 6) & (mag | sign),
        ((w << 1) & sign) | ((w >> 5) & 0x01000100) | ((w >> 4) & 0x00C000C0),
    ]
    unit = torch.tensor(2.0 ** (126 if dtype == torch.bfloat16 else 14), dtype=dtype)
    out = []
    for v in regs:
        if dtype == torch.float16:
            v = ((v << 3) & (mag << 3)) | (v & sign)
        halves = torch.stack([v & 0xFFFF, (v >> 16) & 0xFFFF], dim=-1)
        out.append((halves - ((halves >= 2**15).to(torch.int64) << 16)).to(torch.int16).view(dtype) * unit)
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_e2m1_word_layout_dequantizes_exactly(dtype, seed):
    """Words built from E2M1_BITS (as _pack_4bit does) through the kernel's shifts and masks give every
    pair of e2m1 codes in every register bit for bit (-0.0 and the subnormal-looking 0.5 included)."""
    lo, hi = torch.meshgrid(torch.arange(16), torch.arange(16), indexing="ij")
    lo, hi = lo.flatten(), hi.flatten()
    codes = torch.stack([lo, hi, lo.roll(7), hi.roll(3), hi, lo, lo.roll(11), hi.roll(5)], dim=-1)  # [256, 4 x 2]
    word = torch.zeros(256, dtype=torch.int64)
    for i, bits in enumerate(E2M1_BITS):
        for half in range(2):
            code = codes[:, 2 * i + half]
            word |= sum(((code >> b) & 1) << (pos + 16 * half) for b, pos in enumerate(bits))
    decode = humming.ir.get_format("e2m1").decode
    for i, reg in enumerate(_dequant_e2m1_model(word, dtype)):
        want = decode(codes[:, 2 * i : 2 * i + 2].to(torch.uint8)).to(dtype)
        assert torch.equal(reg.view(torch.int16), want.view(torch.int16)), f"register {i}"


def test_tuning_is_a_pure_function_of_the_problem():
    h200 = (132, 232448, 233472)
    t = wna16_decode.choose_decode_tuning(1, 8192, 8192, 4, *h200)
    assert (t.mt, t.splits) == (1, 1)
    assert wna16_decode.choose_decode_tuning(16, 8192, 8192, 4, *h200).mt == 2
    big = wna16_decode.choose_decode_tuning(64, 8192, 8192, 8, *h200)
    assert big.mt == 8 and big.smem_bytes(8) <= h200[1]
    small = wna16_decode.choose_decode_tuning(1, 256, 8192, 4, *h200)
    assert small.splits > 1
    assert wna16_decode.choose_decode_tuning(1, 256, 8192, 4, *h200) == small
    sm86 = wna16_decode.choose_decode_tuning(64, 8192, 8192, 8, 84, 101376, 102400)
    assert sm86.smem_bytes(8) <= 101376


@pytest.mark.parametrize(
    "m,n,bits,stream_k",
    [
        (1, 28672, 4, False),  # one token tile: the tile grid
        (16, 28672, 4, False),  # two token tiles: the tile grid's small blocks
        (16, 28672, 8, False),
        (32, 28672, 4, False),
        (64, 8192, 4, False),  # eight token tiles in one wave: the tile grid
        (64, 28672, 4, True),  # eight token tiles, 3.4 waves: stream-K
        (16, 256, 4, False),  # split-K tile grid
    ],
)
def test_heuristic_chooses_between_stream_k_and_the_tile_grid(m, n, bits, stream_k):
    """The choice between stream-K and the tile grid for each kind of problem on the H200's limits (the
    rule and its reasons: :func:`~humming.cuda_kernels.wna16_decode.choose_decode_tuning`)."""
    assert bool(wna16_decode.choose_decode_tuning(m, n, 8192, bits, *H200).stream_k) == stream_k


def test_unsupported_combinations_say_why():
    x = torch.empty(4, 128, dtype=torch.bfloat16)
    qw = humming.quantize(torch.randn(32, 128), weight="int4", group_size=32)  # float32 scales
    assert "groups of 32 with 16-bit scales" in wna16_decode.decode_unsupported(qw, x)
    qw = humming.quantize(torch.randn(32, 192), weight="int4", group_size=96)
    assert "64 times a power of two" in wna16_decode.decode_unsupported(qw, x)
    g32 = humming.quantize(torch.randn(128, 128, dtype=torch.bfloat16), weight="int4", group_size=32)
    assert wna16_decode.decode_unsupported(g32, x) is None
    assert _gemm_sm90.gemm_unsupported(g32, x, (9, 0)) is None  # two 16-bit scales per row and chunk
    assert "M <= 64" in wna16_decode.decode_unsupported(
        _quantize(32, 128, "int4-g64"), torch.empty(65, 128, dtype=torch.bfloat16)
    )
    assert "float32" in wna16_decode.decode_unsupported(_quantize(32, 128, "int4-g64"), x.float())
    assert "K % 64" in wna16_decode.decode_unsupported(humming.quantize(torch.randn(32, 96), weight="int4"), x)
    nvfp4 = humming.quantize(torch.randn(32, 128), weight="nvfp4")
    assert "MXFP4 (e8m0 scales per 32)" in wna16_decode.decode_unsupported(nvfp4, x)
    assert wna16_decode.decode_unsupported(humming.quantize(torch.randn(32, 128), weight="mxfp4"), x) is None


def _reference(x, qw, bias):
    ref = x.float() @ humming.dequantize(qw, torch.float32).T
    return ref if bias is None else ref + bias.float()


CASES = [
    # (N, K, scheme, M values)
    (4096, 4096, "int4-g128", (1, 7, 16, 33, 64)),
    (4096, 4096, "uint4-g128-zp", (1, 16, 64)),
    (4096, 4096, "int8-channel", (1, 16, 64)),
    (2048, 4096, "uint8-g128-zp", (1, 16)),
    (1040, 320, "int4-g64", (1, 5, 24)),  # odd: N not a multiple of 32, K of 128
    (4096, 4096, "int4-g32", (1, 16, 64)),  # two 16-bit scales per chunk
    (1040, 320, "int8-g32", (1, 24)),
    (48, 2048, "int4-channel", (1, 9)),  # few row tiles: split-K with atomics
    (4096, 4096, "mxfp4", (1, 7, 16, 64)),
    (1040, 320, "mxfp4", (1, 24)),
    (48, 2048, "mxfp4", (1, 9)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("n", "k", "scheme", "ms"), CASES)
def test_decode_matches_reference(n, k, scheme, ms, act, seed):
    qw = _quantize(n, k, scheme, dtype=act, device="cuda")
    prep = prepare_weight(qw)
    bias = torch.randn(n, device="cuda", dtype=act)
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=act)
        for b in (None, bias):
            out = torch.full((m, n), float("nan"), device="cuda", dtype=act)
            wna16_decode.run_decode(prep, x, b, act, out=out)
            assert_rel_close(out, _reference(x, qw, b), precision=torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("special", [None, 0, 255])
def test_mxfp4_scales_far_apart_and_special_codes(act, special, seed):
    """Each 32-column half of a chunk gets its own scale: e8m0 codes drawn from 2^-20 .. 2^12 per group
    (a scale applied to the wrong half is off by up to 2^32). Code 0 (2^-127, all of row 37) switches the
    weight to the exact decode (scale "e8m0_any"); code 255 (NaN) is refused by the IR, so no kernel sees it."""
    n, k = 256, 512
    qw = _quantize(n, k, "mxfp4", device="cuda")
    codes = torch.randint(107, 140, (n, k // 32), device="cuda", dtype=torch.uint8)
    if special == 0:
        codes[37] = 0
    elif special == 255:
        codes[37, 5] = 255
        with pytest.raises(ValueError, match=r"scales: expected finite values, got nan at index \[37, 5\]"):
            qw.replace(scales=codes.view(torch.float8_e8m0fnu))
        return
    qw = qw.replace(scales=codes.view(torch.float8_e8m0fnu))
    prep = prepare_weight(qw)
    assert prep.layout.scale == ("e8m0" if special is None else "e8m0_any")
    # the decode kernel (5 tokens), and on sm_90 with bf16 the GEMM (65 tokens, each half's scale in bf16)
    runs = [(5, lambda x, out: wna16_decode.run_decode(prep, x, None, torch.float32, out=out))]
    if torch.cuda.get_device_capability() == (9, 0) and act == torch.bfloat16:
        runs.append((65, lambda x, out: _gemm_sm90.run_gemm(prep, x, None, torch.float32, out=out)))
    for m, run in runs:
        x = torch.randn(m, k, device="cuda", dtype=act) * (2.0**-8 if act == torch.float16 else 1.0)
        out = torch.full((m, n), float("inf"), device="cuda", dtype=torch.float32)
        run(x, out)
        ref = x.double() @ humming.dequantize(qw, torch.float64).T
        keep = torch.arange(n, device="cuda") != 37
        assert_rel_close(out[:, keep], ref[:, keep].float(), 5e-3, precision=torch.float32)
        # special 0: 2^-127 scales (an fp32 subnormal), outputs near 1e-37, checked scaled up (norms underflow)
        up = 2.0**120 if special == 0 else 1.0
        assert_rel_close(out[:, 37:38] * up, (ref[:, 37:38] * up).float(), 5e-3, precision=torch.float32)


@pytest.mark.gpu
def test_decode_float32_output_and_strided_x(seed):
    qw = _quantize(1024, 1024, "int4-g128", device="cuda")
    prep = prepare_weight(qw)
    x = torch.randn(8, 2048, device="cuda", dtype=torch.bfloat16)[:, 512:1536]
    out = torch.full((8, 1024), float("nan"), device="cuda", dtype=torch.float32)
    wna16_decode.run_decode(prep, x, None, torch.float32, out=out)
    assert_rel_close(out, _reference(x, qw, None), 5e-3, precision=torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "tuning",
    [
        (1, 1, 4, 8, 1),
        (1, 1, 16, 2, 1),
        (2, 2, 8, 4, 1),
        (1, 1, 8, 4, 3),
        (2, 1, 8, 3, 4),
        (1, 2, 8, 4, 1),
        (1, 4, 8, 3, 1),
    ],
)
def test_tunings_agree(tuning, seed):
    qw = _quantize(2048, 2048, "int4-g128", device="cuda")
    prep = prepare_weight(qw)
    x = torch.randn(8 * tuning[0], 2048, device="cuda", dtype=torch.bfloat16)
    out = wna16_decode.run_decode(prep, x, None, torch.float32, tuning=wna16_decode.DecodeTuning(*tuning))
    assert_rel_close(out, _reference(x, qw, None), 5e-3, precision=torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "tuning", [(1, 1, 4, 4, 5), (1, 2, 4, 4, 3), (2, 1, 4, 3, 5), (4, 1, 4, 2, 2), (2, 1, 4, 3, 5, 0, True)]
)
def test_split_k_repeated_calls(tuning, seed):
    """Split-K with one token tile (the tile's last block reads the fp32 workspace back and leaves it zero),
    with more (an fp32 output rounded by a copy) and with more read back: 16-bit outputs over repeated calls,
    poisoned first."""
    tuning = wna16_decode.DecodeTuning(*tuning)
    qw = _quantize(512, 64 * 45, "int4-g64", device="cuda")
    prep = prepare_weight(qw)
    for m in (1, 8 * tuning.mt - 3):
        for _ in range(2):
            x = torch.randn(m, 64 * 45, device="cuda", dtype=torch.bfloat16)
            out = torch.full((m, 512), float("nan"), device="cuda", dtype=torch.bfloat16)
            wna16_decode.run_decode(prep, x, None, torch.bfloat16, tuning, out)
            assert_rel_close(out, _reference(x, qw, None), precision=torch.bfloat16)
    if tuning.reads_back:  # the tile's last block left the workspace at zero for the next call
        stream = (torch.cuda.current_device(), torch.cuda.current_stream().cuda_stream)
        assert int(_decode_launch.WORKSPACES.by_stream[stream].count_nonzero()) == 0


@pytest.mark.gpu
@pytest.mark.parametrize(
    "tuning",
    [(1, 1, 4, 4, 5), (2, 1, 4, 3, 5), (2, 1, 4, 3, 5, 0, True)],
    ids=["read-back", "fp32-output", "two-tiles-read-back"],
)
def test_split_k_in_a_cuda_graph(tuning, seed, tmp_path, monkeypatch):
    """Split-K warmed and captured on the default capture stream, replayed on fresh inputs: the read-back
    variant's workspace (reserved by warmup) stays zero between replays; the fp32 output's memset and rounding
    copy are graph nodes."""
    monkeypatch.setenv("HUMMING_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_decode_launch, "WORKSPACES", workspaces.Workspaces())
    tuning = wna16_decode.DecodeTuning(*tuning)
    n, k, m = 512, 64 * 45, 8 * tuning.mt - 3
    qw = _quantize(n, k, "int4-g64", device="cuda")
    w64 = humming.dequantize(qw, torch.float32).double()
    monkeypatch.setattr(wna16_decode, "default_tuning", lambda *args: tuning)
    humming.warmup([qw], m_values=(m,), backend="cuda", progress=False)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = humming.linear(x, qw, backend="cuda")
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_rel_close(out, (x.double() @ w64.T).float(), precision=torch.bfloat16)
    for workspace in _decode_launch.WORKSPACES.captured:
        assert int(workspace.count_nonzero()) == 0


@pytest.mark.gpu
def test_linear_backend_cuda(seed):
    qw = _quantize(1024, 512, "int4-g128", device="cuda")
    x = torch.randn(2, 3, 512, device="cuda", dtype=torch.bfloat16)
    assert backend_unsupported(qw, None, x.reshape(-1, 512), "cuda") is None
    out = humming.linear(x, qw, backend="cuda")
    assert_rel_close(out.reshape(6, -1), _reference(x.reshape(6, -1), qw, None), precision=torch.float32)
    wide = torch.empty(65, 512, device="cuda", dtype=torch.bfloat16)
    if torch.cuda.get_device_capability() != (9, 0):
        assert "large-M GEMM" in backend_unsupported(qw, None, wide, "cuda")
    if torch.cuda.get_device_capability() == (9, 0):  # N % 128 != 0: the GEMM's 16-row tiles by TMA boxes
        narrow = humming.quantize(torch.randn(48, 512, device="cuda"), weight="int4", group_size=128)
        xn = torch.randn(65, 512, device="cuda", dtype=torch.bfloat16)
        assert backend_unsupported(narrow, None, xn, "cuda") is None
        out = humming.linear(xn, narrow, backend="cuda")
        assert_rel_close(out, _reference(xn, narrow, None), precision=torch.float32)
    mx = _quantize(1024, 512, "mxfp4", device="cuda")
    assert_rel_close(
        humming.linear(x, mx, backend="cuda").reshape(6, -1),
        _reference(x.reshape(6, -1), mx, None),
        precision=torch.float32,
    )
    if torch.cuda.get_device_capability() == (9, 0):  # M > 64: the sm_90a GEMM, bf16 activations only
        xw = torch.randn(65, 512, device="cuda", dtype=torch.bfloat16)
        assert backend_unsupported(mx, None, xw, "cuda") is None
        assert_rel_close(humming.linear(xw, mx, backend="cuda"), _reference(xw, mx, None), precision=torch.float32)
        assert "bfloat16 activations" in backend_unsupported(mx, None, wide.half(), "cuda")


@pytest.mark.gpu
def test_graph_capture_never_compiles(seed, tmp_path, monkeypatch):
    from humming import cuda_kernels
    from humming.cuda_kernels import jit

    monkeypatch.setenv("HUMMING_CACHE_DIR", str(tmp_path))
    qw = _quantize(512, 1024, "uint4-g128-zp", device="cuda")
    x = torch.randn(3, 1024, device="cuda", dtype=torch.float16)
    prep = cuda_kernels.prepare(qw)
    tuning = wna16_decode.DecodeTuning(1, 1, 4, 3, 1)  # a tuning nothing else uses: not loaded yet
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        graph = torch.cuda.CUDAGraph()
        with pytest.raises(jit.KernelNotReadyError, match="warmup"), torch.cuda.graph(graph, stream=stream):
            wna16_decode.run_decode(prep, x, None, torch.float16, tuning=tuning)
    report = humming.warmup([qw], m_values=(3,), act_dtype=torch.float16, backend="cuda", progress=False)
    assert len(report.kernels) == 1
    out = torch.full((3, 512), float("nan"), device="cuda", dtype=torch.float16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        humming.linear(x, qw, out_dtype=torch.float16, backend="cuda")
        wna16_decode.run_decode(prep, x, None, torch.float16, out=out)
    graph.replay()
    torch.cuda.synchronize()
    assert_rel_close(out, _reference(x, qw, None), precision=torch.float32)


# --- stream-K ---------------------------------------------------------------------------------------------

H200 = (132, 232448, 233472)  # SMs, opt-in shared memory per block, shared memory per SM


def _warp_walk(u_begin: int, count: int, chunks: int) -> tuple[list, list, list]:
    """decode.cuh's run_stream_k loops, transcribed: the units the copy side issues, the units the compute
    side consumes, and the (tile, units) of each finish_tile call."""
    (copy_tile, copy_chunk), copy_left = divmod(u_begin, chunks), count
    issued = []
    while copy_left > 0:
        issued.append(copy_tile * chunks + copy_chunk)
        copy_left -= 1
        if copy_left > 0:
            copy_chunk += 1
            if copy_chunk == chunks:
                copy_chunk = 0
                copy_tile += 1
    tile, chunk = divmod(u_begin, chunks)
    share_begin, consumed, finishes = chunk, [], []
    for left in range(count, 0, -1):
        consumed.append(tile * chunks + chunk)
        chunk += 1
        if chunk == chunks or left == 1:
            finishes.append((tile, chunk - share_begin))
            chunk = share_begin = 0
            tile += 1
    return issued, consumed, finishes


@pytest.mark.parametrize(
    ("tiles", "chunks"), [(1, 1), (3, 2), (7, 5), (1, 449), (48, 64), (113, 131), (257, 3), (896, 12)]
)
def test_stream_k_partition_model(tiles, chunks, seed):
    """Every unit is computed exactly once, in order, with the copy cursors on the same units; per tile the
    contributors' unit counts add up to the chunks (so the arrival that reaches it is the last, whatever
    the order); a tile has one finish per warp whose range meets it, and a warp crosses few tiles."""
    rng = torch.Generator().manual_seed(seed)
    units = tiles * chunks
    for warps in sorted({1, 3, 8, 7 * 32, 132 * 8, 2 * 132 * 8, units, units + 5}):
        seen = [0] * units
        per_tile: dict[int, list[int]] = {}
        meets = [0] * tiles  # warps whose range meets each tile, from the ranges alone
        for gw in range(warps):
            u_begin, u_end = gw * units // warps, (gw + 1) * units // warps
            if u_begin == u_end:
                continue
            for tile in range(u_begin // chunks, (u_end - 1) // chunks + 1):
                meets[tile] += 1
            issued, consumed, finishes = _warp_walk(u_begin, u_end - u_begin, chunks)
            assert issued == consumed == list(range(u_begin, u_end))
            assert len(finishes) == (u_end - 1) // chunks - u_begin // chunks + 1
            assert len(finishes) <= -(-(u_end - u_begin) // chunks) + 1  # tile boundaries crossed, + 1
            for u in issued:
                seen[u] += 1
            for tile, n in finishes:
                per_tile.setdefault(tile, []).append(n)
        assert set(seen) == {1}, f"units covered {sorted(set(seen))} times, W={warps}"
        assert sorted(per_tile) == list(range(tiles))
        for tile, shares in per_tile.items():
            assert len(shares) == meets[tile] and sum(shares) == chunks and min(shares) >= 1
            if len(shares) == 1:
                continue  # written directly, no counter
            counter, last = 0, []
            for i in torch.randperm(len(shares), generator=rng).tolist():
                counter += shares[i]
                last.append(counter == chunks)
            assert last == [False] * (len(shares) - 1) + [True]
        if warps <= units:  # ranges of at least floor(U / W) units: at most this many warps share a tile
            assert max(meets) <= -(-chunks // (units // warps)) + 1


def _seek(tile0: int, r: int, chunk: int, tg: int, chunks: int, groups: int) -> tuple[int, int]:
    """Pipeline::seek's offsets of row tile tile0 + r at `chunk`: (weight slice, scale pair of group 0),
    in units of one lane's chunk slice and one (g, g + 8) pair."""
    blk, t = divmod(tile0 + r, tg)
    return (blk * chunks + chunk) * tg + t, blk * groups * tg + t


def _next_tile(tile0: int, r: int, tg: int, chunks: int, groups: int) -> tuple[int, int]:
    """Pipeline::next_tile's increments to row tiles tile0 .. tile0 + r - 1 (units of _seek), transcribed."""
    if tile0 & (tg - 1):  # the same block of tg row tiles
        return r - chunks * tg, r
    blocks = r if tg == 1 else 1  # the next block(s)
    return (blocks - 1) * chunks * tg + r - blocks * tg, blocks * (groups - 1) * tg + r


@pytest.mark.parametrize("tg", [1, 8])
@pytest.mark.parametrize("r", [1, 2, 4, 8])
def test_stream_k_cursor_increments_match_seek(tg, r):
    """The copy cursors cross tile boundaries by increments only (decode.cuh Pipeline::next_tile): after
    the chunk increments of a tile, one increment reaches exactly where seek() of the next tile points."""
    for chunks in (1, 2, 3, 16, 129):
        for groups in {1, chunks, max(1, chunks // 2)}:
            for tile in range(24 // r):
                tile0, tile0_next = tile * r, (tile + 1) * r
                w_delta, pair_delta = _next_tile(tile0_next, r, tg, chunks, groups)
                for i in range(r):
                    w, pair = _seek(tile0, i, 0, tg, chunks, groups)
                    w += chunks * tg  # the per-chunk increments (w_step) over the whole tile
                    assert (w + w_delta, pair + pair_delta) == _seek(tile0_next, i, 0, tg, chunks, groups)


def _stream_k_jobs() -> list[tuple]:
    """(spec, arch): the heuristic's stream-K kernels with the most registers per launch bound, for every
    decode arch, and the 8-token-tile one (one block per SM) for sm_90."""
    L, T = WeightLayout, wna16_decode.DecodeTuning
    every_arch = [
        wna16_decode.decode_spec(L(4, 8, "bf16"), "bf16", "bf16", "bf16", T(1, 2, 8, 3, 1, 2)),
        wna16_decode.decode_spec(L(4, -1, "f16"), "f16", "f16", "f16", T(2, 2, 8, 3, 1, 2)),
    ]
    big = wna16_decode.decode_spec(L(8, 128, "f32"), "bf16", "f32", "bf16", T(8, 1, 8, 2, 1, 1))
    return [(spec, arch) for spec in every_arch for arch in spec.targets()] + [(big, "sm_90")]


@pytest.fixture(scope="module")
def stream_k_kernels(tmp_path_factory):
    if jit.compiler_unavailable_reason() is not None:
        pytest.skip(jit.compiler_unavailable_reason())
    return compile_fresh(_stream_k_jobs(), tmp_path_factory.mktemp("cache"))


def test_stream_k_compiles_for_every_arch_without_local_memory(stream_k_kernels, tmp_path):
    assert {(k.spec.name, k.arch) for k in stream_k_kernels} == {(s.name, a) for s, a in _stream_k_jobs()}
    assert {k.arch for k in stream_k_kernels} == {f"sm_{a}{b}" for a, b in wna16_decode.DECODE_CCS}
    for kernel in stream_k_kernels:
        name = f"{kernel.spec.name} {kernel.arch}"
        assert "_sk" in kernel.spec.name and "Schedule::stream_k" in kernel.spec.entry
        assert "warning" not in kernel.log.lower(), f"{name}:\n{kernel.log}"
        usage = re.search(
            r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", cubin_tool("cuobjdump", ["-res-usage"], kernel, tmp_path)
        )
        assert usage and usage.group(2) == usage.group(3) == "0", f"{name}: {usage and usage.group(0)}"
        assert int(usage.group(1)) * kernel.spec.threads * kernel.spec.min_blocks <= 65536, f"{name}: {usage.group(0)}"
        if kernel.arch == "sm_90":
            sass = cubin_tool("cuobjdump", ["-sass"], kernel, tmp_path)
            assert "HMMA.16816.F32" in sass and "LDGSTS.E.BYPASS.128" in sass, name
            assert "LDL" not in sass and "STL" not in sass, f"{name} uses local memory"
            assert "REDG.E.ADD.F32" in sass, f"{name}: partial sums are not added with red.global"
            assert "ATOMG.E.EXCH" in sass, f"{name}: the last warp does not read back and zero the sums"


def test_stream_k_tuning_is_the_tile_tuning_on_a_persistent_grid():
    tiles, stream_k = wna16_decode.candidate_tunings(1, 28672, 8192, 4, *H200)
    assert wna16_decode.choose_decode_tuning(1, 28672, 8192, 4, *H200) == tiles  # one token tile: the tile grid
    assert (tiles.stream_k, stream_k.stream_k, stream_k.splits) == (0, 2, 1)
    assert (tiles.mt, tiles.r, tiles.warps, tiles.stages) == (stream_k.mt, stream_k.r, stream_k.warps, stream_k.stages)
    assert wna16_decode.stream_k_grid(28672, 8192, stream_k, 132) == (264, 264 * stream_k.warps)
    assert wna16_decode.stream_k_grid(48, 128, stream_k, 132) == (1, stream_k.warps)  # 3 tiles x 2 chunks: one block
    big = wna16_decode.candidate_tunings(64, 8192, 8192, 8, *H200)[1]
    assert big.stream_k == 2  # 8 token tiles of two row tiles: two blocks per SM fit in shared memory
    assert wna16_decode.candidate_tunings(256 // 16, 256, 4096, 4, *H200)[0].splits > 1
    assert wna16_decode.candidate_tunings(256 // 16, 256, 4096, 4, *H200)[1].splits == 1
    assert "_sk2" in wna16_decode.decode_spec(WeightLayout(4, 8, "bf16"), "bf16", "bf16", "bf16", stream_k).name
    with pytest.raises(ValueError, match="stream_k"):
        wna16_decode.DecodeTuning(1, 1, 8, 3, 4, stream_k=2)
    with pytest.raises(ValueError, match="stream_k"):
        wna16_decode.DecodeTuning(1, 3, 8, 3, 1, stream_k=2)


def _stream_k_tuning(m: int, n: int, k: int, bits: int) -> wna16_decode.DecodeTuning:
    return wna16_decode.candidate_tunings(m, n, k, bits, *device_limits(torch.cuda.current_device()))[1]


STREAM_K_CASES = [  # short shapes first
    # (N, K, scheme, M values)
    (48, 128, "int4-g64", (1, 3)),  # 3 tiles x 2 chunks on 8 warps: more warps than units
    (16 * 37, 64 * 23, "int4-channel", (1, 3, 16)),  # odd: N = 16 * odd (tile groups of 1), K = 64 * odd
    (16 * 37, 64 * 23, "int8-channel", (3, 64)),
    (4096, 4096, "int4-g128", (1, 3, 16, 64)),
    (4096, 4096, "uint4-g128-zp", (1, 3, 16, 64)),
    (4096, 4096, "int8-channel", (1, 3, 16, 64)),
    (4096, 4096, "uint8-g128-zp", (1, 16)),
    pytest.param(
        *(28672, 8192, "int4-g128", (1, 16)), marks=pytest.mark.heavy_memory
    ),  # float64 reference of 235M weights
    pytest.param(
        *(8192, 28672, "int4-g128", (1, 64)), marks=pytest.mark.heavy_memory
    ),  # float64 reference of 235M weights
    pytest.param(*(28672, 8192, "mxfp4", (1, 16)), marks=pytest.mark.heavy_memory),  # float64 reference of 235M weights
    (16 * 37, 64 * 23, "mxfp4", (3, 16, 64)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("n", "k", "scheme", "ms"), STREAM_K_CASES)
def test_stream_k_matches_reference(n, k, scheme, ms, act, seed):
    """Stream-K against humming.dequantize + a float64 matmul, poisoned outputs, with and without bias;
    the workspace is all zero after every call (the invariant that makes the next call correct)."""
    qw = _quantize(n, k, scheme, dtype=act, device="cuda")
    prep = prepare_weight(qw)
    w64 = humming.dequantize(qw, torch.float32).double()
    bias = torch.randn(n, device="cuda", dtype=act)
    for m in ms:
        tuning = _stream_k_tuning(m, n, k, qw.bits)
        x = torch.randn(m, k, device="cuda", dtype=act)
        for b in (None, bias):
            ref = x.double() @ w64.T + (0 if b is None else b.double())
            out = torch.full((m, n), float("nan"), device="cuda", dtype=act)
            wna16_decode.run_decode(prep, x, b, act, tuning, out)
            assert_rel_close(out, ref.float(), precision=torch.float32)
    stream = (torch.cuda.current_device(), torch.cuda.current_stream().cuda_stream)
    workspace = _decode_launch.WORKSPACES.by_stream[stream]
    assert int(workspace.count_nonzero()) == 0


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("n", "tuning"),
    [
        (608, (1, 2, 8, 3, 1, 2)),  # tile groups of 1, two row tiles per warp
        (768, (1, 4, 8, 3, 1, 1)),  # tile groups of 8, four row tiles
        (1024, (2, 8, 4, 2, 1, 2)),  # a whole tile group per warp, 4 warps per block
        (608, (4, 1, 8, 4, 1, 1)),
    ],
)
def test_stream_k_tunings_agree(n, tuning, seed):
    k = 64 * 45
    qw = _quantize(n, k, "int4-g64", device="cuda")
    prep = prepare_weight(qw)
    x = torch.randn(5, k, device="cuda", dtype=torch.bfloat16)
    out = torch.full((5, n), float("nan"), device="cuda", dtype=torch.float32)
    wna16_decode.run_decode(prep, x, None, torch.float32, wna16_decode.DecodeTuning(*tuning), out)
    assert_rel_close(
        out, (x.double() @ humming.dequantize(qw, torch.float32).double().T).float(), 5e-3, precision=torch.float32
    )


@pytest.mark.gpu
def test_stream_k_repeated_calls_and_cuda_graph(seed, tmp_path, monkeypatch):
    """The zero invariant across calls (float32 output: two calls agree to fp32 summation order), and
    warmup + CUDA graph capture on the default capture stream, replayed 3 times on fresh inputs."""
    from humming import cuda_kernels

    monkeypatch.setenv("HUMMING_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_decode_launch, "WORKSPACES", workspaces.Workspaces())
    n, k, m = 1024, 2048, 3
    qw = _quantize(n, k, "uint4-g128-zp", device="cuda")
    w64 = humming.dequantize(qw, torch.float32).double()
    prep = cuda_kernels.prepare(qw)
    tuning = _stream_k_tuning(m, n, k, 4)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    first = wna16_decode.run_decode(prep, x, None, torch.float32, tuning)
    second = torch.full((m, n), float("nan"), device="cuda")
    wna16_decode.run_decode(prep, x, None, torch.float32, tuning, second)
    ref = (x.double() @ w64.T).float()
    assert_rel_close(first, ref, 5e-3, precision=torch.float32)
    assert (first - second).abs().max() <= 1e-5 * ref.abs().max(), "a second call sees the first's sums"

    monkeypatch.setattr(wna16_decode, "default_tuning", lambda *args: tuning)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    humming.warmup([qw], m_values=(m,), bias_dtype=torch.bfloat16, backend="cuda", progress=False)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = humming.linear(x, qw, bias, out_dtype=torch.bfloat16, backend="cuda")
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_rel_close(out, (x.double() @ w64.T + bias.double()).float(), precision=torch.float32)
    for workspace in _decode_launch.WORKSPACES.captured:
        assert int(workspace.count_nonzero()) == 0


@pytest.mark.gpu
def test_stream_k_capture_without_reserved_workspace_replays_correctly(seed, monkeypatch):
    """torch's recipe (an eager call on a side stream, then capture on another) with no warmup: the capture
    takes a temporary workspace whose zero fill is captured, so every replay starts from zeros."""
    monkeypatch.setattr(_decode_launch, "WORKSPACES", workspaces.Workspaces())
    qw = _quantize(256, 512, "int4-g128", device="cuda")
    prep = prepare_weight(qw)
    x = torch.randn(2, 512, device="cuda", dtype=torch.bfloat16)
    tuning = _stream_k_tuning(2, 256, 512, 4)
    # the side-stream call compiles and loads the kernel and takes the side stream's workspace
    graph, out = capture(lambda: wna16_decode.run_decode(prep, x, None, torch.bfloat16, tuning))
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_rel_close(out, _reference(x, qw, None), precision=torch.float32)
