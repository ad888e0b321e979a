"""The sm_120a block-scaled FP4 GEMM (humming/cuda_kernels/include/humming/fp4_gemm_sm120.cuh).

No sm_120 GPU has been available: the kernel has NEVER RUN. What is checked here without one:

1. NVRTC compiles every variant for sm_120a; the SASS holds the block-scaled tensor-core instruction and no
   local memory; ptxas reports no stack and no spills.
2. A torch emulation of the kernel (``_emulate``): the same index math as the .cuh, written as Python
   functions (swizzled shared-memory tiles, ldmatrix lane addresses, scale lanes, accumulator -> output
   coordinates), feeding an independent model of the MMA built from the PTX ISA's fragment and
   block-scaling tables (``_mma_reference``). It must reproduce ``x_deq @ w_deq^T`` computed from
   ``humming.dequantize`` / ``dequantize_activation``. This proves the data movement and layouts compose
   correctly *given* the PTX ISA tables; it cannot prove the hardware follows them.
3. ``gpu`` tests (they have never run): on sm_120, first one MMA on random registers
   (``fp4_mma_probe_sm120.cuh``) against the same ISA model, which isolates the model from the GEMM's data
   movement; then, on sm_120 or sm_100, the GEMM (whichever kernel the device gets) against a float64
   reference. The sm_100a kernel's compile and emulation tests are in tests/test_cuda_fp4_sm100.py.
"""

from __future__ import annotations

import re

import pytest
import torch
from helpers import (
    assert_fp4_matches_reference,
    backend_unsupported,
    compile_fresh,
    cubin_tool,
    fp4_problem,
    fp4_reference,
    needs_nvrtc,
)

from humming import dequantize, quantize
from humming.cuda_kernels import fp4_gemm, jit
from humming.device import DeviceLimits
from humming.ir.activation import dequantize_activation, get_act_scheme, quantize_activation
from humming.ir.formats import get_format

SCHEMES = {16: "nvfp4", 32: "mxfp4"}
BK, ROW_BYTES = 128, 64  # kBK and kRowBytes in the header


def _specs() -> list[jit.KernelSpec]:
    specs = []
    for vec in SCHEMES:
        specs += [fp4_gemm.fp4_spec(vec, "bf16", "bf16", tuning) for tuning in fp4_gemm.TUNINGS]
        specs += [fp4_gemm.fp4_spec(vec, out, "f32", fp4_gemm.LARGE_M[0]) for out in ("f16", "f32")]
        specs.append(fp4_gemm.probe_spec(vec))
    return specs


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    kernels = compile_fresh([(spec, "sm_120a") for spec in _specs()], tmp_path_factory.mktemp("cache"))
    return {k.spec.name: k for k in kernels}


@needs_nvrtc
def test_every_variant_compiles_for_sm_120a(compiled):
    assert len(compiled) == len(_specs())
    for spec in _specs():
        assert spec.targets() == ("sm_120a",)
        kernel = compiled[spec.name]
        assert kernel.cubin[:4] == b"\x7fELF", spec.name
        assert "warning" not in kernel.log.lower(), kernel.log
        assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in kernel.log, kernel.log


@needs_nvrtc
def test_sass_uses_block_scaled_omma_and_no_local_memory(compiled, tmp_path):
    # ptxas lowers mma.sync m16n8k64 kind::mxf4nvf4 scale_vec::4X ue4m3 to
    # "OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X" and kind::mxf4 scale_vec::2X ue8m0 to
    # "OMMA.SF.16864.F32.E2M1.E2M1.E8" (OMMA: the 4-bit MMA; .SF: with scale-factor operands). Each k64 step
    # issues one per (m16, n8) tile pair; the operands come in through ldmatrix (LDSM) from tiles filled by
    # cp.async (LDGSTS).
    expected = {16: "OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X", 32: "OMMA.SF.16864.F32.E2M1.E2M1.E8"}
    for vec in SCHEMES:
        for tuning in fp4_gemm.TUNINGS:
            spec = fp4_gemm.fp4_spec(vec, "bf16", "bf16", tuning)
            sass = cubin_tool("cuobjdump", ["-sass"], compiled[spec.name], tmp_path)
            omma = re.findall(r"OMMA\.\S+", sass)
            assert set(omma) == {expected[vec]}, (spec.name, set(omma))
            assert len(omma) == 2 * tuning.m_tiles * tuning.n_tiles, spec.name  # unrolled: 2 k64 steps a stage
            assert "LDSM" in sass and "LDGSTS" in sass, spec.name
            assert "LDL" not in sass and "STL" not in sass, f"{spec.name} uses local memory"
        probe = cubin_tool("cuobjdump", ["-sass"], compiled[fp4_gemm.probe_spec(vec).name], tmp_path)
        assert re.findall(r"OMMA\.\S+", probe) == [expected[vec]]


@needs_nvrtc
def test_resource_usage_no_stack_no_local(compiled, tmp_path):
    for name, kernel in compiled.items():
        report = cubin_tool("cuobjdump", ["-res-usage"], kernel, tmp_path)
        usage = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", report)
        assert usage, report
        assert usage.group(2) == "0" and usage.group(3) == "0", f"{name}: {usage.group(0)}"


# ---------------------------------------------------------------------------------------------------------
# Emulation. The functions below mirror the .cuh line by line (same names where the header has one).
# ---------------------------------------------------------------------------------------------------------


def tile_offset(row, chunk):
    """``tile_offset`` in the header: chunk XOR-swizzled by bits 1-2 of the row."""
    return row * ROW_BYTES + ((chunk ^ ((row >> 1) & 3)) << 4)


def _load_stage(src: torch.Tensor, src_sf: torch.Tensor, r0: int, rows: int, kb: int, sf_bytes: int):
    """``load_stage`` for one operand: ``rows`` tile rows starting at global row ``r0`` of stage ``kb``;
    rows past the tensor are zero-filled. Returns (tile bytes, scale bytes) as shared memory holds them."""
    tile = torch.full((rows * ROW_BYTES,), 0xAA, dtype=torch.uint8)  # poisoned: every byte must be written
    sf = torch.full((rows * sf_bytes,), 0xAA, dtype=torch.uint8)
    for row in range(rows):
        g = r0 + row
        valid = g < src.shape[0]
        for chunk in range(4):
            data = src[g, kb * ROW_BYTES + chunk * 16 :][:16] if valid else torch.zeros(16, dtype=torch.uint8)
            off = tile_offset(row, chunk)
            tile[off : off + 16] = data
        data = src_sf[g, kb * sf_bytes :][:sf_bytes] if valid else torch.zeros(sf_bytes, dtype=torch.uint8)
        sf[row * sf_bytes : (row + 1) * sf_bytes] = data
    return tile, sf


def _u32(smem: torch.Tensor, off: int, nbytes: int = 4) -> int:
    return int.from_bytes(bytes(smem[off : off + nbytes].tolist()), "little")


def ldmatrix_x4(smem: torch.Tensor, lane_addr: list[int]) -> list[list[int]]:
    """PTX ldmatrix .x4 .b16: lanes 8i..8i+7 give the row addresses of matrix i (8 rows of 16 bytes);
    lane l receives, of each matrix, row l / 4, bytes 4 (l % 4) .. +3, as one little-endian word."""
    return [[_u32(smem, lane_addr[8 * i + lane // 4] + 4 * (lane % 4)) for i in range(4)] for lane in range(32)]


def a_ldmatrix_addr(lane: int, a_row0: int, i: int, ks: int) -> int:
    row = a_row0 + 16 * i + (lane % 8) + 8 * ((lane // 8) % 2)
    return tile_offset(row, 2 * ks + lane // 16)


def b_ldmatrix_addr(lane: int, b_row0: int, j: int, ks: int) -> int:
    row = b_row0 + 8 * j + (lane % 8) + 8 * (lane // 16)
    return tile_offset(row, 2 * ks + (lane // 8) % 2)


def sfa_row(lane: int, a_row0: int, i: int) -> int:
    return a_row0 + 16 * i + lane // 4 + 8 * (lane % 2)


def sfb_row(lane: int, b_row0: int, j: int) -> int:
    return b_row0 + 8 * j + lane // 4


def load_scales(smem_sf: torch.Tensor, row: int, sf_bytes: int, ks: int, vec: int) -> int:
    per_step = 64 // vec
    return _u32(smem_sf, row * sf_bytes + per_step * ks, per_step)


def out_coord(lane: int, e: int, a_row0: int, b_row0: int, i: int, j: int) -> tuple[int, int]:
    """Block-relative (m, n) of accumulator element e of tile (i, j) in ``lane`` (the epilogue)."""
    return a_row0 + 16 * i + lane // 4 + 8 * (e // 2), b_row0 + 8 * j + 2 * (lane % 4) + e % 2


# The MMA as the PTX ISA defines it (independent of the kernel): fragments of mma.m16n8k64 with 4-bit
# elements, nibble v of a register = element v of its 8 consecutive K; block scaling with selectors
# {byte-id, thread-id} = {0, 0}: A row m's scales in lane 4 (m % 8) + m / 8, B column n's in lane 4 n,
# byte c of the register = K chunk c of the scale block size.

_E2M1 = get_format("e2m1").decode(torch.arange(16, dtype=torch.uint8)).to(torch.float64)


def _nibbles(word: int) -> list[int]:
    return [(word >> (4 * v)) & 0xF for v in range(8)]


def _scale_values(word: int, vec: int) -> torch.Tensor:
    raw = torch.tensor([(word >> (8 * c)) & 0xFF for c in range(64 // vec)], dtype=torch.uint8)
    return raw.view(fp4_gemm.SCALE_VECS[vec][0]).to(torch.float64)


def _mma_reference(a, b, sfa, sfb, vec: int) -> list[list[float]]:
    """D (16 x 8, float64) = (A * scale_A) (B * scale_B) from per-lane registers; returned per lane as
    c0..c3 = D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1]."""
    A = torch.zeros(16, 64, dtype=torch.float64)
    B = torch.zeros(64, 8, dtype=torch.float64)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for r in range(4):
            A[g + 8 * (r % 2), 32 * (r // 2) + 8 * t : 32 * (r // 2) + 8 * t + 8] = _E2M1[_nibbles(a[lane][r])]
        for r in range(2):
            B[32 * r + 8 * t : 32 * r + 8 * t + 8, g] = _E2M1[_nibbles(b[lane][r])]
    sa = torch.stack([_scale_values(sfa[4 * (m % 8) + m // 8], vec) for m in range(16)])  # [16, 64 / vec]
    sb = torch.stack([_scale_values(sfb[4 * n], vec) for n in range(8)])  # [8, 64 / vec]
    D = (A * sa.repeat_interleave(vec, 1)) @ (B * sb.T.repeat_interleave(vec, 0))
    return [[float(D[lane // 4 + 8 * (e // 2), 2 * (lane % 4) + e % 2]) for e in range(4)] for lane in range(32)]


def _emulate(prep: fp4_gemm.PreparedFp4, qa, bias: torch.Tensor | None, tuning) -> torch.Tensor:
    """The kernel's result (fp32 accumulators modelled in float64) with ``tuning``, by walking its grid."""
    vec, kp = prep.vec, prep.kp
    x_codes, x_scales, x_global = fp4_gemm.activation_buffers(qa, kp, vec)
    m, n = qa.codes.shape[0], prep.n
    sf_bytes = BK // vec
    out = torch.full((m, n), float("nan"), dtype=torch.float64)
    glob = (1.0 if x_global is None else float(x_global)) * (
        1.0 if prep.global_scale is None else float(prep.global_scale)
    )
    for by in range(-(-m // tuning.block_m)):
        for bx in range(-(-n // tuning.block_n)):
            m0, n0 = by * tuning.block_m, bx * tuning.block_n
            accs = {}
            for kb in range(kp // BK):
                s_x, s_xs = _load_stage(x_codes, x_scales, m0, tuning.block_m, kb, sf_bytes)
                s_w, s_ws = _load_stage(prep.codes, prep.scales, n0, tuning.block_n, kb, sf_bytes)
                for warp in range(tuning.warps_m * tuning.warps_n):
                    warp_m, warp_n = warp // tuning.warps_n, warp % tuning.warps_n
                    a_row0, b_row0 = warp_m * tuning.m_tiles * 16, warp_n * tuning.n_tiles * 8
                    for ks in range(BK // 64):
                        a = [
                            ldmatrix_x4(s_x, [a_ldmatrix_addr(ln, a_row0, i, ks) for ln in range(32)])
                            for i in range(tuning.m_tiles)
                        ]
                        sfa = [
                            [load_scales(s_xs, sfa_row(ln, a_row0, i), sf_bytes, ks, vec) for ln in range(32)]
                            for i in range(tuning.m_tiles)
                        ]
                        b = {}
                        for j in range(0, tuning.n_tiles, 2):
                            regs = ldmatrix_x4(s_w, [b_ldmatrix_addr(ln, b_row0, j, ks) for ln in range(32)])
                            b[j] = [r[0:2] for r in regs]
                            b[j + 1] = [r[2:4] for r in regs]
                        sfb = [
                            [load_scales(s_ws, sfb_row(ln, b_row0, j), sf_bytes, ks, vec) for ln in range(32)]
                            for j in range(tuning.n_tiles)
                        ]
                        for i in range(tuning.m_tiles):
                            for j in range(tuning.n_tiles):
                                d = _mma_reference(a[i], b[j], sfa[i], sfb[j], vec)
                                acc = accs.setdefault((warp, i, j), [[0.0] * 4 for _ in range(32)])
                                for lane in range(32):
                                    for e in range(4):
                                        acc[lane][e] += d[lane][e]
            for (warp, i, j), acc in accs.items():
                warp_m, warp_n = warp // tuning.warps_n, warp % tuning.warps_n
                a_row0, b_row0 = warp_m * tuning.m_tiles * 16, warp_n * tuning.n_tiles * 8
                for lane in range(32):
                    for e in range(4):
                        r, c = out_coord(lane, e, a_row0, b_row0, i, j)
                        if m0 + r < m and n0 + c < n:
                            v = acc[lane][e] * glob
                            if bias is not None:
                                v += float(bias[n0 + c])
                            out[m0 + r, n0 + c] = v
    return out


EMULATION_CASES = [
    # (scheme, M, N, K, bias), each run with every tuning of its M range: N and K off the tile sizes, M past a block
    ("nvfp4", 5, 136, 200, True),
    ("mxfp4", 3, 72, 256, False),
    ("nvfp4", 70, 24, 128, False),
    ("mxfp4", 33, 136, 96, True),
]


@pytest.mark.parametrize(
    ("scheme", "m", "n", "k", "with_bias", "tuning"),
    [
        (*case, tuning)
        for case in EMULATION_CASES
        for tuning in (fp4_gemm.SMALL_M if case[1] <= 16 else fp4_gemm.LARGE_M)
    ],
    ids=lambda v: f"{v.block_m}x{v.block_n}w{v.threads // 32}" if isinstance(v, fp4_gemm.Fp4Tuning) else None,
)
def test_emulated_kernel_matches_dequantized_matmul(scheme, m, n, k, with_bias, tuning):
    qw, qa = fp4_problem(scheme, m, n, k, seed=m * 1000 + n + k)
    assert fp4_gemm.weight_unsupported(qw) is None
    bias = torch.randn(n, generator=torch.Generator().manual_seed(k)) if with_bias else None
    got = _emulate(fp4_gemm.prepare(qw, "sm_120a"), qa, bias, tuning)
    assert_fp4_matches_reference(got, qw, qa, bias)


def test_emulated_mma_catches_a_wrong_scale_lane():
    """The emulation is sensitive to the layouts: moving the A scales to the accumulator's row lanes (a
    plausible mistake) breaks the match."""
    qw, qa = fp4_problem("nvfp4", 16, 8, 64, seed=1)
    prep = fp4_gemm.prepare(qw, "sm_120a")
    x_codes, x_scales, _ = fp4_gemm.activation_buffers(qa, prep.kp, 16)
    s_x, s_xs = _load_stage(x_codes, x_scales, 0, 16, 0, 8)
    s_w, s_ws = _load_stage(prep.codes, prep.scales, 0, 8, 0, 8)
    a = ldmatrix_x4(s_x, [a_ldmatrix_addr(ln, 0, 0, 0) for ln in range(32)])
    b = [r[0:2] for r in ldmatrix_x4(s_w, [b_ldmatrix_addr(ln, 0, 0, 0) for ln in range(32)])]
    sfb = [load_scales(s_ws, sfb_row(ln, 0, 0), 8, 0, 16) for ln in range(32)]
    right = [load_scales(s_xs, sfa_row(ln, 0, 0), 8, 0, 16) for ln in range(32)]
    wrong = [load_scales(s_xs, ln // 4 + 8 * ((ln % 4) // 2), 8, 0, 16) for ln in range(32)]
    assert _mma_reference(a, b, right, sfb, 16) != _mma_reference(a, b, wrong, sfb, 16)


def test_pack_codes_is_canonical_packing():
    """Activation codes are packed exactly as humming packs weights (docs/ir.md), so both operands share
    one nibble order."""
    _, qa = fp4_problem("nvfp4", 4, 4, 96, seed=3)
    qw_act = quantize(dequantize_activation(qa), "nvfp4")
    from humming.ir.quantize import unpacked_codes

    packed = fp4_gemm.pack_codes(unpacked_codes(qw_act), 128)
    assert torch.equal(packed, fp4_gemm.prepare(qw_act, "sm_120a").codes)


@pytest.mark.parametrize(
    ("weight", "act", "fragment"),
    [
        ("nvfp4", "mxfp4", "need act='nvfp4'"),
        ("mxfp4", "nvfp4", "need act='mxfp4'"),
        ("int4", "nvfp4", "takes e2m1 weights"),
    ],
)
def test_unsupported_names_the_reason(weight, act, fragment):
    qw = quantize(torch.randn(16, 64), weight)
    reason = fp4_gemm.unsupported(qw, get_act_scheme(act), torch.empty(2, 64))
    assert reason is not None and fragment in reason, reason


def test_choose_tuning_fills_the_sms_then_takes_the_most_blocks():
    assert fp4_gemm.choose_tuning(1, 28672, 170) == fp4_gemm.SMALL_M[0]  # 224 blocks of 128 channels
    assert fp4_gemm.choose_tuning(1, 12288, 170) == fp4_gemm.SMALL_M[1]  # 96 blocks of 128 < 170 <= 192 of 64
    assert fp4_gemm.choose_tuning(16, 8192, 170) == fp4_gemm.SMALL_M[2]  # 128 blocks of 64 < 170: 32 channels
    assert fp4_gemm.choose_tuning(1, 1024, 170) == fp4_gemm.SMALL_M[2]  # never enough: the most blocks
    assert fp4_gemm.choose_tuning(4096, 8192, 170) == fp4_gemm.LARGE_M[0]
    assert fp4_gemm.choose_tuning(64, 4096, 170) == fp4_gemm.LARGE_M[1]


def test_warmup_jobs_follow_choose_tuning():
    qw = quantize(torch.randn(4096, 64), "mxfp4")
    limits = DeviceLimits(sm_count=64, smem_per_block=101376, smem_per_sm=102400)  # an sm_120 GPU of 64 SMs
    jobs = fp4_gemm.warmup_jobs(qw, get_act_scheme("mxfp4"), (1, 16, 64, 512), torch.bfloat16, None, limits, (12, 0))
    assert all(arch == "sm_120a" for _, arch in jobs)
    expected = {fp4_gemm.choose_tuning(m, 4096, 64) for m in (1, 16, 64, 512)}
    assert [spec.name for spec, _ in jobs] == sorted(fp4_gemm.fp4_spec(32, "bf16", "bf16", t).name for t in expected)
    assert fp4_gemm.warmup_jobs(qw, get_act_scheme("nvfp4"), (1,), torch.bfloat16, None, limits, (12, 0)) == []


def test_unsupported_names_the_blackwell_architectures(fake_cuda_device):
    """Off Blackwell (here: an H200, compute capability 9.0) the reason says which architectures it needs."""
    qw = quantize(torch.randn(16, 64), "nvfp4")
    act = get_act_scheme("nvfp4")
    assert "not a CUDA device" in fp4_gemm.unsupported(qw, act, torch.empty(2, 64))

    class OnCuda:
        device = torch.device("cuda", 0)

    fake_cuda_device((9, 0))
    reason = fp4_gemm.unsupported(qw, act, OnCuda())
    assert "sm_100a" in reason and "sm_120a" in reason and "not (9, 0)" in reason, reason
    with pytest.raises(ValueError, match="sm_100a"):
        fp4_gemm.linear(OnCuda(), qw, None, act, torch.bfloat16)


# ---------------------------------------------------------------------------------------------------------
# On a Blackwell GPU. NEVER RUN: no such device has been available; these document what to run first.
# ---------------------------------------------------------------------------------------------------------


def _sm120() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (12, 0)


def _blackwell() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() in fp4_gemm.ARCHS


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or _blackwell(), reason="needs a CUDA GPU other than sm_100 / sm_120")
def test_gpu_elsewhere_the_reason_names_sm_100a():
    """On any other GPU (the H200 here) the FP4 GEMM declines with the architectures it needs, and warmup skips it."""
    from humming.device import device_limits

    qw = quantize(torch.randn(256, 256, device="cuda"), "nvfp4")
    x = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
    act = get_act_scheme("nvfp4")
    reason = fp4_gemm.unsupported(qw, act, x)
    assert reason is not None and "sm_100a" in reason and "sm_120a" in reason, reason
    assert reason in backend_unsupported(qw, act, x, "cuda")
    assert fp4_gemm.warmup_jobs(qw, act, (1, 16), torch.bfloat16, None, device_limits()) == []


GPU_CASES = [
    (scheme, m, n, k, out_dtype)
    for scheme in SCHEMES.values()
    for m, n, k in ((1, 4096, 4096), (16, 1000, 200), (37, 136, 96), (512, 2048, 1024), (1024, 8192, 8192))
    for out_dtype in (torch.bfloat16, torch.float32)
]


@pytest.mark.gpu
@pytest.mark.skipif(not _blackwell(), reason="needs an sm_100 (B200) or sm_120 (RTX 50xx) GPU; never run so far")
@pytest.mark.parametrize(("scheme", "m", "n", "k", "out_dtype"), GPU_CASES)
def test_gpu_matches_float64_reference(scheme, m, n, k, out_dtype):
    torch.manual_seed(m + n + k)
    qw = quantize(torch.randn(n, k, device="cuda"), scheme)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    qa = quantize_activation(x, scheme)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    got = fp4_gemm.linear(qa, qw, bias, get_act_scheme(scheme), out_dtype)
    ref = fp4_reference(qw, qa, bias)
    magnitude = dequantize_activation(qa, torch.float64).abs() @ dequantize(qw, torch.float64).abs().T
    err = (got.to(torch.float64) - ref).abs()
    tol = 1e-5 * magnitude + (8e-3 if out_dtype == torch.bfloat16 else 0.0) * ref.abs()  # fp32 sums, bf16 out
    bad = ~(err <= tol)  # NaN is bad
    assert not bad.any(), f"{int(bad.sum())} bad; worst {err.max().item():.3e} at {divmod(int(err.argmax()), n)}"


def _random_registers(vec: int, seed: int) -> torch.Tensor:
    """Random per-lane MMA registers: any e2m1 nibbles; finite positive scales of a moderate range."""
    gen = torch.Generator().manual_seed(seed)
    regs = torch.randint(0, 2**32, (32, 8), generator=gen, dtype=torch.int64)
    lo, hi = (0x28, 0x48) if vec == 16 else (123, 131)  # e4m3 0.25 .. 3.75; e8m0 2^-4 .. 2^3
    for col in (6, 7):
        raw = torch.randint(lo, hi, (32, 4), generator=gen, dtype=torch.int64)
        regs[:, col] = (raw << torch.tensor([0, 8, 16, 24])).sum(1)
    return regs


@pytest.mark.parametrize("vec", SCHEMES)
def test_random_registers_exercise_every_scale(vec):
    """The probe inputs below give every scale byte the MMA reads a distinct-enough value to matter."""
    regs = _random_registers(vec, seed=vec)
    sfa = [int(w) for w in regs[:, 6]]
    assert len({_scale_values(sfa[4 * (m % 8) + m // 8], vec)[0].item() for m in range(16)}) > 4


@pytest.mark.gpu
@pytest.mark.skipif(not _sm120(), reason="needs an sm_120 GPU (RTX 50xx / RTX PRO 6000); never run so far")
@pytest.mark.parametrize("vec", SCHEMES)
def test_gpu_mma_follows_the_ptx_isa_tables(vec):
    """Run this first on new hardware: it isolates the ISA model (fragments, scale lanes and bytes) from the
    GEMM's data movement."""
    for seed in range(4):
        regs = _random_registers(vec, seed)
        words = torch.where(regs >= 2**31, regs - 2**32, regs).to(torch.int32)
        got = fp4_gemm.mma_probe(words.to("cuda"), vec).cpu().to(torch.float64)
        ref = torch.tensor(_mma_reference(*_split_registers(regs), vec), dtype=torch.float64)
        # exact products, fp32 sums of 64 terms below ~1e3: a wrong mapping is off by units to hundreds
        assert torch.allclose(got, ref, rtol=1e-5, atol=1e-2), (seed, (got - ref).abs().max().item())


def _split_registers(regs: torch.Tensor):
    words = [[int(w) for w in row] for row in regs]
    return [w[0:4] for w in words], [w[4:6] for w in words], [w[6] for w in words], [w[7] for w in words]


@pytest.mark.gpu
@pytest.mark.skipif(not _blackwell(), reason="needs an sm_100 (B200) or sm_120 (RTX 50xx) GPU; never run so far")
def test_gpu_triton_activation_pass_matches_reference_quantizer():
    qw = quantize(torch.randn(256, 512, device="cuda"), "nvfp4")
    x = torch.randn(20, 512, device="cuda", dtype=torch.bfloat16)
    got = fp4_gemm.linear(x, qw, None, get_act_scheme("nvfp4"), torch.float32)
    ref = fp4_gemm.linear(quantize_activation(x, "nvfp4"), qw, None, get_act_scheme("nvfp4"), torch.float32)
    assert torch.equal(got, ref)
