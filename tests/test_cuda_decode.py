"""The CUDA decode kernel (small-M weight-only GEMM): layout (CPU) and results against the reference (GPU)."""

from __future__ import annotations

import pytest
import torch

import humming
from humming.cuda_kernels import _decode
from humming.cuda_kernels._layout import PreparedWeight, prepare_weight

HAS_CUDA = torch.cuda.is_available()


def _quantize(n: int, k: int, scheme: str, dtype=torch.bfloat16, device="cpu"):
    weight, group, zero_point = {
        "int4-g128": ("int4", 128, False),
        "int4-g64": ("int4", 64, False),
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
                if bits == 4:  # register a//2 holds nibbles a//2 (low half) and a//2 + 4 (high half)
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


@pytest.mark.parametrize("scheme", ["int4-g128", "uint4-g128-zp", "int8-channel", "uint8-g128-zp"])
@pytest.mark.parametrize("n", [256, 48])  # tile groups of 8 and of 1
def test_prepared_layout_matches_the_fragments(scheme, n, seed):
    qw = _quantize(n, 192, scheme)
    prep = prepare_weight(qw)
    assert prep.tile_group == (8 if n % 128 == 0 else 1)
    codes = humming.ir.unpacked_codes(qw).to(torch.int64)
    if qw.format.signed:
        codes = codes ^ (1 << (qw.bits - 1))
    assert torch.equal(_fragment_codes(prep), codes)

    def untile(t):  # [N/16/TG, G, TG, 8, 2] -> [N, G]
        return t.permute(0, 2, 4, 3, 1).reshape(qw.N, -1)

    assert torch.equal(untile(prep.scales), qw.scales.to(prep.scales.dtype))
    if qw.zeros is not None:
        assert torch.equal(untile(prep.zeros), qw.zeros.to(torch.int16))
        assert prep.layout.zero == -1
    else:
        assert prep.layout.zero == (1 << (qw.bits - 1) if qw.format.signed else 0)


def test_tuning_is_a_pure_function_of_the_problem():
    h200 = (132, 232448)
    t = _decode.choose_decode_tuning(1, 8192, 8192, 4, *h200)
    assert (t.mt, t.splits) == (1, 1)
    assert _decode.choose_decode_tuning(16, 8192, 8192, 4, *h200).mt == 2
    big = _decode.choose_decode_tuning(64, 8192, 8192, 8, *h200)
    assert big.mt == 8 and big.smem_bytes(8) <= h200[1]
    small = _decode.choose_decode_tuning(1, 256, 8192, 4, *h200)
    assert small.splits > 1
    assert _decode.choose_decode_tuning(1, 256, 8192, 4, *h200) == small
    sm86 = _decode.choose_decode_tuning(64, 8192, 8192, 8, 84, 101376)
    assert sm86.smem_bytes(8) <= 101376


def test_unsupported_combinations_say_why():
    x = torch.empty(4, 128, dtype=torch.bfloat16)
    qw = humming.quantize(torch.randn(32, 128), weight="int4", group_size=32)
    assert "64 times a power of two" in _decode.decode_unsupported(qw, x)
    assert "M <= 64" in _decode.decode_unsupported(
        _quantize(32, 128, "int4-g64"), torch.empty(65, 128, dtype=torch.bfloat16)
    )
    assert "float32" in _decode.decode_unsupported(_quantize(32, 128, "int4-g64"), x.float())
    assert "K % 64" in _decode.decode_unsupported(humming.quantize(torch.randn(32, 96), weight="int4"), x)


def _reference(x, qw, bias):
    ref = x.float() @ humming.dequantize(qw, torch.float32).T
    return ref if bias is None else ref + bias.float()


def _check(out, ref, tol=1e-2):
    assert not torch.isnan(out).any(), "NaN in the output: some element was not written"
    err = (out.float() - ref).norm() / ref.norm()
    worst = (out.float() - ref).abs().argmax().item()
    assert err < tol, f"relative error {err:.2e}; worst at {divmod(worst, ref.shape[1])}"


CASES = [
    # (N, K, scheme, M values)
    (4096, 4096, "int4-g128", (1, 7, 16, 33, 64)),
    (4096, 4096, "uint4-g128-zp", (1, 16, 64)),
    (4096, 4096, "int8-channel", (1, 16, 64)),
    (2048, 4096, "uint8-g128-zp", (1, 16)),
    (1040, 320, "int4-g64", (1, 5, 24)),  # odd: N not a multiple of 32, K of 128
    (48, 2048, "int4-channel", (1, 9)),  # few row tiles: split-K with atomics
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
            _decode.run_decode(prep, x, b, act, out=out)
            _check(out, _reference(x, qw, b))


@pytest.mark.gpu
def test_decode_float32_output_and_strided_x(seed):
    qw = _quantize(1024, 1024, "int4-g128", device="cuda")
    prep = prepare_weight(qw)
    x = torch.randn(8, 2048, device="cuda", dtype=torch.bfloat16)[:, 512:1536]
    out = torch.full((8, 1024), float("nan"), device="cuda", dtype=torch.float32)
    _decode.run_decode(prep, x, None, torch.float32, out=out)
    _check(out, _reference(x, qw, None), tol=5e-3)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "tuning", [(1, 1, 4, 8, 1), (1, 1, 16, 2, 1), (2, 2, 8, 4, 1), (1, 1, 8, 4, 3), (1, 2, 8, 4, 1), (1, 4, 8, 3, 1)]
)
def test_tunings_agree(tuning, seed):
    qw = _quantize(2048, 2048, "int4-g128", device="cuda")
    prep = prepare_weight(qw)
    x = torch.randn(8 * tuning[0], 2048, device="cuda", dtype=torch.bfloat16)
    out = _decode.run_decode(prep, x, None, torch.float32, tuning=_decode.DecodeTuning(*tuning))
    _check(out, _reference(x, qw, None), tol=5e-3)


@pytest.mark.gpu
def test_linear_backend_cuda(seed):
    from humming import cuda_kernels

    qw = _quantize(1024, 512, "int4-g128", device="cuda")
    x = torch.randn(2, 3, 512, device="cuda", dtype=torch.bfloat16)
    assert cuda_kernels.supports(qw, None, x.reshape(-1, 512)) is None
    out = humming.linear(x, qw, backend="cuda")
    _check(out.reshape(6, -1), _reference(x.reshape(6, -1), qw, None))
    wide = torch.empty(65, 512, device="cuda", dtype=torch.bfloat16)
    if torch.cuda.get_device_capability() != (9, 0):
        assert "large-M GEMM" in cuda_kernels.supports(qw, None, wide)
    narrow = humming.quantize(torch.randn(48, 512, device="cuda"), weight="int4", group_size=128)
    assert "N % 128" in cuda_kernels.supports(narrow, None, wide)


@pytest.mark.gpu
def test_graph_capture_never_compiles(seed, tmp_path, monkeypatch):
    from humming import cuda_kernels
    from humming.cuda_kernels import jit

    monkeypatch.setenv("HUMMING_CACHE_DIR", str(tmp_path))
    qw = _quantize(512, 1024, "uint4-g128-zp", device="cuda")
    x = torch.randn(3, 1024, device="cuda", dtype=torch.float16)
    prep = cuda_kernels.prepare(qw)
    tuning = _decode.DecodeTuning(1, 1, 4, 3, 1)  # a tuning nothing else uses: not loaded yet
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        graph = torch.cuda.CUDAGraph()
        with pytest.raises(jit.KernelNotReadyError, match="warmup"), torch.cuda.graph(graph, stream=stream):
            _decode.run_decode(prep, x, None, torch.float16, tuning=tuning)
    report = cuda_kernels.warmup([qw], m_values=(3,), act_dtype=torch.float16, progress=False)
    assert len(report.kernels) == 1
    out = torch.full((3, 512), float("nan"), device="cuda", dtype=torch.float16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cuda_kernels.linear(x, qw, None, None, torch.float16)
        _decode.run_decode(prep, x, None, torch.float16, out=out)
    graph.replay()
    torch.cuda.synchronize()
    _check(out, _reference(x, qw, None))
