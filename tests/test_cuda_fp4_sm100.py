"""The sm_100a tcgen05 block-scaled FP4 GEMM (humming/cuda_kernels/include/humming/fp4_gemm_sm100.cuh).

No sm_100 GPU (B200 / GB200) has been available: the kernel has NEVER RUN. What is checked here without one:

1. NVRTC compiles every variant for sm_100a; the SASS holds the block-scaled UMMA (``UTCOMMA.4X`` for NVFP4,
   ``UTCOMMA`` for MXFP4), the scale-factor copies into tensor memory (``UTCCP``), TMA loads (``UTMALDG``),
   bulk copies (``UBLKCP``), the commits (``UTCBAR``) and no local memory; ptxas reports no stack or spills.
2. A torch emulation of the kernel (``_emulate``): the .cuh's offsets and index math written again in Python
   (stages, shared-memory regions, tensor-memory columns, scale-factor ids, epilogue lanes), fed with the
   host-built buffers and descriptors (``fp4_gemm.sf_atoms``, ``AB_DESC``, ``SF_DESC``, ``instr_desc``) and
   with models of TMA (128-byte swizzle, zero fill), ``cp.async.bulk``, ``tcgen05.cp 32x128b.warpx4``, the
   block-scaled ``tcgen05.mma`` (which decodes the descriptors' bit fields as the PTX ISA / CUTLASS define them)
   and ``tcgen05.ld 32x32b``. It must reproduce ``x_deq @ w_deq^T`` from ``humming.dequantize``. This proves
   that the layouts and descriptors compose *given* that reading of the ISA; it cannot prove the hardware
   follows it (the scale-factor layout in tensor memory is the least documented part).
3. ``gpu`` tests (never run so far): here, one UMMA (``fp4_mma_probe_sm100.cuh``) on random operands and scales
   against the models above, which isolates the ISA reading (descriptors, swizzle, scale atoms in tensor
   memory, scale-factor ids) from the GEMM's pipeline; run it first on a B200. Then the GEMM tests of
   tests/test_cuda_fp4.py, which run this kernel on an sm_100 device.
"""

from __future__ import annotations

import re
import sys

import pytest
import torch
from helpers import assert_fp4_matches_reference, compile_fresh, cubin_tool, fp4_problem

from humming.cuda_kernels import _fp4_layout, _fp4_tuning, fp4_gemm, jit
from humming.device import DeviceLimits
from humming.ir.formats import get_format
from humming.ir.weight import cdiv

SCHEMES = {16: "nvfp4", 32: "mxfp4"}
#: A B200 (compute capability 10.0): SMs, opt-in shared memory per block (227 KiB) and per SM.
B200 = DeviceLimits(sm_count=148, smem_per_block=232448, smem_per_sm=233472)


def _tuning(vec: int, block_t: int) -> fp4_gemm.Sm100Tuning:
    return fp4_gemm.Sm100Tuning(block_t, _fp4_tuning._sm100_stages(vec, block_t, B200.smem_per_block))


def _specs() -> list[jit.KernelSpec]:
    specs = []
    for vec in SCHEMES:
        specs += [fp4_gemm.sm100_spec(vec, "bf16", "bf16", _tuning(vec, t)) for t in fp4_gemm.SM100_BLOCK_T]
        specs += [fp4_gemm.sm100_spec(vec, out, "f32", _tuning(vec, 128)) for out in ("f16", "f32")]
    return specs


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    if jit.compiler_unavailable_reason() is not None:
        pytest.skip(jit.compiler_unavailable_reason())
    specs = _specs() + [fp4_gemm.sm100_probe_spec(vec) for vec in SCHEMES]
    kernels = compile_fresh([(spec, "sm_100a") for spec in specs], tmp_path_factory.mktemp("cache"))
    return {k.spec.name: k for k in kernels}


def test_every_variant_compiles_for_sm_100a_only(compiled):
    assert len(compiled) == len(_specs()) + len(SCHEMES)
    for spec in _specs() + [fp4_gemm.sm100_probe_spec(vec) for vec in SCHEMES]:
        assert spec.targets() == ("sm_100a",)
        kernel = compiled[spec.name]
        assert kernel.cubin[:4] == b"\x7fELF", spec.name
        assert "warning" not in kernel.log.lower(), kernel.log
        assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in kernel.log, kernel.log


def test_sass_holds_the_tcgen05_pipeline(compiled, tmp_path):
    # ptxas lowers tcgen05.mma kind::mxf4nvf4 scale_vec::4X to UTCOMMA.4X and kind::mxf4 2X to UTCOMMA (read off
    # these cubins with cuobjdump / nvdisasm); one per k64 step of a stage (the step loop is unrolled).
    # tcgen05.cp 32x128b.warpx4 is UTCCP.T.S.4x32dp128bit, one per scale atom of a stage (weights + tokens).
    expected = {16: "UTCOMMA.4X", 32: "UTCOMMA"}
    for spec in _specs():
        vec = 16 if "nvfp4" in spec.name else 32
        block_t = int(re.search(r"_t(\d+)_", spec.name).group(1))
        sass = cubin_tool("cuobjdump", ["-sass"], compiled[spec.name], tmp_path)
        ops = re.findall(r"\b(UTC[A-Z]+[\w.]*|UTMALDG[\w.]*|UBLKCP[\w.]*|LDL|STL)\b", sass)
        mma = [op for op in ops if "MMA" in op]
        assert mma == [expected[vec]] * 4, (spec.name, mma)
        atoms_k, token_atoms = 256 // (4 * vec), cdiv(block_t, 128)
        assert ops.count("UTCCP.T.S.4x32dp128bit") == atoms_k * (1 + token_atoms), (spec.name, ops)
        assert ops.count("UTCBAR") == 2, spec.name  # the stage's commit and the accumulator's
        assert "UTMALDG.2D" in ops and "UBLKCP.S.G" in ops, spec.name
        assert "LDL" not in ops and "STL" not in ops, f"{spec.name} uses local memory"
    for vec in SCHEMES:
        sass = cubin_tool("cuobjdump", ["-sass"], compiled[fp4_gemm.sm100_probe_spec(vec).name], tmp_path)
        ops = re.findall(r"\b(UTC[A-Z]+[\w.]*)\b", sass)
        assert [op for op in ops if "MMA" in op] == [expected[vec]] and ops.count("UTCBAR") == 1, ops
        assert ops.count("UTCCP.T.S.4x32dp128bit") == 2, ops


# ---------------------------------------------------------------------------------------------------------
# Models of the hardware, from the PTX ISA (independent of the kernel and of fp4_gemm.py).
# ---------------------------------------------------------------------------------------------------------

_E2M1 = get_format("e2m1").decode(torch.arange(16, dtype=torch.uint8)).to(torch.float64)


def _sw128(addr: torch.Tensor) -> torch.Tensor:
    """The 128-byte swizzle on shared-memory addresses: bits 4-6 (16-byte chunk) XOR bits 7-9 (row in 8)."""
    return addr ^ (((addr >> 7) & 7) << 4)


def tma_load_2d_sw128(smem, dst: int, tensor: torch.Tensor, c0: int, c1: int, rows: int) -> int:
    """``cp.async.bulk.tensor.2d`` of a box of 128 bytes x ``rows`` at (c0, c1) of a uint8 tensor, 128-byte
    swizzle: box byte (r, b) lands at sw128(dst + 128 r + b); rows past the tensor are zeros. Returns the bytes
    it signals (the full box)."""
    assert dst % 1024 == 0 and c0 + 128 <= tensor.shape[1], "swizzle atoms aligned; boxes inside K"
    box = torch.zeros(rows, 128, dtype=torch.uint8)
    part = tensor[c1 : c1 + rows, c0 : c0 + 128]
    box[: part.shape[0]] = part
    addr = dst + 128 * torch.arange(rows)[:, None] + torch.arange(128)[None, :]
    smem[_sw128(addr)] = box
    return rows * 128


def bulk_copy(smem, dst: int, src: torch.Tensor, offset: int, nbytes: int) -> int:
    """``cp.async.bulk`` of ``nbytes`` contiguous bytes at byte ``offset`` of ``src`` (must be in bounds)."""
    flat = src.reshape(-1)
    assert dst % 16 == 0 and offset % 16 == 0 and nbytes % 16 == 0 and offset + nbytes <= flat.numel(), "bulk copy"
    smem[dst : dst + nbytes] = flat[offset : offset + nbytes]
    return nbytes


def decode_smem_desc(desc: int) -> dict[str, int]:
    """Fields of an sm_100 shared-memory descriptor (PTX ISA "Shared memory descriptor"; CUTLASS
    ``UMMA::SmemDescriptor``)."""
    return {
        "start": (desc & 0x3FFF) << 4,
        "lbo": ((desc >> 16) & 0x3FFF) << 4,
        "sbo": ((desc >> 32) & 0x3FFF) << 4,
        "version": (desc >> 46) & 3,
        "base_offset": (desc >> 49) & 7,
        "lbo_mode": (desc >> 52) & 1,
        "swizzle": (desc >> 61) & 7,
    }


def decode_instr_desc(idesc: int) -> dict[str, int]:
    """Fields of the block-scaled instruction descriptor (CUTLASS ``UMMA::InstrDescriptorBlockScaled``)."""
    bits = lambda lo, n: (idesc >> lo) & ((1 << n) - 1)
    return {
        "sparse": bits(0, 3) | bits(3, 1) << 3,
        "b_sf_id": bits(4, 2),
        "a_format": bits(7, 3),
        "b_format": bits(10, 3),
        "negate": bits(13, 2),
        "a_major": bits(15, 1),
        "b_major": bits(16, 1),
        "n": bits(17, 6) << 3,
        "scale_format": bits(23, 1),
        "m": bits(24, 5) << 4,
        "a_sf_id": bits(29, 2),
        "k_size": bits(31, 1),
    }


class Tmem:
    """Tensor memory of one CTA: 128 lanes x 512 32-bit columns, scale words and fp32 accumulators apart."""

    def __init__(self) -> None:
        self.words = torch.full((128, 512), -1, dtype=torch.int64)  # poisoned: unwritten words are not scales
        self.acc = torch.full((128, 512), float("nan"), dtype=torch.float64)

    @staticmethod
    def split(addr: int) -> tuple[int, int]:
        return addr >> 16, addr & 0xFFFF


def tcgen05_cp_32x128b_warpx4(tmem: Tmem, smem, dst: int, desc: int) -> None:
    """32 rows of 16 bytes described by ``desc`` (no swizzle: row i at start + (i / 8) SBO + 16 (i % 8)) into
    lanes 32 q + i, columns dst..dst+3 (word w = bytes 4w..4w+3 of the row), for each quarter q."""
    d = decode_smem_desc(desc)
    assert d["swizzle"] == 0 and d["version"] == 1 and d["base_offset"] == 0 and d["lbo_mode"] == 0, d
    lane0, col = Tmem.split(dst)
    assert lane0 == 0 and col + 4 <= 512, (lane0, col)
    i = torch.arange(32)
    rows = d["start"] + (i // 8)[:, None] * d["sbo"] + 16 * (i % 8)[:, None] + torch.arange(16)[None, :]
    data = smem[rows].to(torch.int64).reshape(32, 4, 4)
    words = (data << torch.tensor([0, 8, 16, 24])).sum(-1)  # [32 rows, 4 words], little-endian
    for q in range(4):
        tmem.words[32 * q : 32 * q + 32, col : col + 4] = words


def _read_operand(smem, desc: int, rows: int) -> torch.Tensor:
    """A K-major SWIZZLE_128B operand of ``rows`` x 64 e2m1 elements (32 bytes per row) -> float64 values:
    row r, byte b at sw128(start + (r / 8) SBO + 128 (r % 8) + b); element 2b in the low nibble."""
    d = decode_smem_desc(desc)
    assert d["swizzle"] == 2 and d["version"] == 1 and d["base_offset"] == 0 and d["lbo_mode"] == 0, d
    r = torch.arange(rows)[:, None]
    data = smem[_sw128(d["start"] + (r // 8) * d["sbo"] + 128 * (r % 8) + torch.arange(32)[None, :])]
    nibbles = torch.stack([data & 0xF, data >> 4], dim=-1).reshape(rows, 64)
    return _E2M1[nibbles.long()]


def _read_scales(tmem: Tmem, addr: int, rows: int, sf_id: int, count: int, vec: int) -> torch.Tensor:
    """Scale factors of matrix rows 0..rows-1 in tensor memory at ``addr``: row r in lane r % 32 (of every
    quarter), column + r / 32, bytes sf_id .. sf_id + count - 1 -> float64 [rows, count]."""
    lane0, col = Tmem.split(addr)
    assert lane0 == 0
    r = torch.arange(rows)
    words = tmem.words[r % 32, col + r // 32]
    assert (words >= 0).all(), "the MMA reads scale words nobody wrote"
    raw = torch.stack([(words >> (8 * (sf_id + c))) & 0xFF for c in range(count)], dim=1).to(torch.uint8)
    return raw.view(fp4_gemm.SCALE_VECS[vec][0]).to(torch.float64)


def tcgen05_mma_block_scaled(tmem: Tmem, smem, vec: int, d: int, a_desc, b_desc, idesc, sfa, sfb, accumulate):
    """``tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.scale_vec::4X`` (vec 16) / ``kind::mxf4 ... 2X``
    (vec 32): D[M, N] (+)= (A * SFA) (B * SFB)^T over K = 64, with every descriptor field checked."""
    f = decode_instr_desc(idesc)
    assert f["m"] == 128 and f["n"] % 16 == 0 and 16 <= f["n"] <= 256, f  # DeepGEMM's rule at M = 128
    assert f["a_format"] == f["b_format"] == 1, "E2M1 is format 1 of kind::mxf4 / mxf4nvf4"
    assert f["sparse"] == 0 and f["negate"] == 0 and f["a_major"] == f["b_major"] == 0 and f["k_size"] == 0, f
    assert f["scale_format"] == (vec == 32), "UE4M3 (0) with 4X, UE8M0 (1) with mxf4 2X"
    count = 64 // vec
    valid_ids = (0,) if vec == 16 else (0, 2)
    assert f["a_sf_id"] in valid_ids and f["b_sf_id"] in valid_ids, f
    a = _read_operand(smem, a_desc, 128) * _read_scales(tmem, sfa, 128, f["a_sf_id"], count, vec).repeat_interleave(
        vec, 1
    )
    b = _read_operand(smem, b_desc, f["n"]) * _read_scales(
        tmem, sfb, f["n"], f["b_sf_id"], count, vec
    ).repeat_interleave(vec, 1)
    lane0, col = Tmem.split(d)
    assert lane0 == 0
    assert (tmem.words[:, col : col + f["n"]] == -1).all(), "the accumulator overlaps scale columns"
    prev = tmem.acc[:, col : col + f["n"]] if accumulate else 0.0
    tmem.acc[:, col : col + f["n"]] = prev + a @ b.T


def tcgen05_ld_32x32b(tmem: Tmem, warp: int, addr: int, ncols: int) -> torch.Tensor:
    """Thread i of ``warp`` gets lane (addr's lane) + i, columns col..col+ncols-1; a warp reads only the
    quarter warp % 4."""
    lane0, col = Tmem.split(addr)
    assert lane0 == 32 * (warp % 4), (warp, lane0)
    return tmem.acc[lane0 : lane0 + 32, col : col + ncols]


# ---------------------------------------------------------------------------------------------------------
# The kernel, walked block by block with the header's index math (same names as fp4_gemm_sm100.cuh).
# ---------------------------------------------------------------------------------------------------------


def sf_id(j: int, vec: int) -> int:
    """The byte of its scale word where k64 step ``j``'s scales start (``sf_id`` in the header)."""
    return (j * 64 % (4 * vec)) // vec


def _emulate(prep: fp4_gemm.PreparedFp4, qa, bias: torch.Tensor | None, tuning: fp4_gemm.Sm100Tuning):
    vec, kp, block_t = prep.vec, prep.kp, tuning.block_t
    lay = fp4_gemm.Sm100Layout(vec, block_t, tuning.stages)
    off, size = lay.offsets(), lay.region_bytes()
    assert lay.smem_bytes <= 232448 and lay.tmem_cols <= 512
    x_codes, x_sf, x_global = fp4_gemm.sm100_activation_buffers(qa, kp, vec, block_t)
    idesc0 = fp4_gemm.instr_desc(vec, block_t)
    m, n = qa.codes.shape[0], prep.n
    num_kb, atoms_k = kp // 256, kp // (4 * vec)
    glob = (1.0 if x_global is None else float(x_global)) * (
        1.0 if prep.global_scale is None else float(prep.global_scale)
    )
    out = torch.full((m, n), float("nan"), dtype=torch.float64)
    for t_block in range(cdiv(m, block_t)):
        for n_block in range(cdiv(n, 128)):
            n0 = n_block * 128
            smem = torch.full((off["bars"],), 0xAA, dtype=torch.uint8)  # poisoned
            tmem = Tmem()
            for kb in range(num_kb):
                s = kb % tuning.stages
                # TMA warp
                k_atom = kb * lay.atoms_k
                got = tma_load_2d_sw128(smem, off["a"] + s * size["a"], prep.codes, kb * 128, n0, 128)
                got += tma_load_2d_sw128(smem, off["b"] + s * size["b"], x_codes, kb * 128, t_block * block_t, block_t)
                got += bulk_copy(
                    smem,
                    off["sfa"] + s * size["sfa"],
                    prep.scales,
                    (n_block * atoms_k + k_atom) * 512,
                    lay.sf_row_bytes,
                )
                for a in range(lay.token_atoms):
                    row_atom = t_block * lay.token_atoms + a
                    dst = off["sfb"] + s * size["sfb"] + a * lay.sf_row_bytes
                    got += bulk_copy(smem, dst, x_sf, (row_atom * atoms_k + k_atom) * 512, lay.sf_row_bytes)
                assert got == sum(size.values()), "expect_tx bytes == bytes delivered"
                # MMA warp
                for ja in range(lay.atoms_k):
                    sfa_col = lay.sfa_col + (s * lay.atoms_k + ja) * 4
                    src = off["sfa"] + s * size["sfa"] + ja * 512
                    tcgen05_cp_32x128b_warpx4(tmem, smem, sfa_col, fp4_gemm.SF_DESC | (src >> 4))
                    for a in range(lay.token_atoms):
                        sfb_col = lay.sfb_col + ((s * lay.atoms_k + ja) * lay.token_atoms + a) * 4
                        src = off["sfb"] + s * size["sfb"] + a * lay.sf_row_bytes + ja * 512
                        tcgen05_cp_32x128b_warpx4(tmem, smem, sfb_col, fp4_gemm.SF_DESC | (src >> 4))
                for j in range(4):
                    ja = j * 64 // (4 * vec)
                    sid = sf_id(j, vec)
                    idesc = idesc0 | (sid << 29) | (sid << 4)
                    a_desc = fp4_gemm.AB_DESC | ((off["a"] + s * size["a"] + 32 * j) >> 4)
                    b_desc = fp4_gemm.AB_DESC | ((off["b"] + s * size["b"] + 32 * j) >> 4)
                    sfa = lay.sfa_col + (s * lay.atoms_k + ja) * 4
                    sfb = lay.sfb_col + (s * lay.atoms_k + ja) * lay.token_atoms * 4
                    tcgen05_mma_block_scaled(tmem, smem, vec, 0, a_desc, b_desc, idesc, sfa, sfb, (kb | j) != 0)
            # epilogue warpgroup
            for warp in range(2, 6):
                quarter = warp % 4
                channel = n0 + 32 * quarter + torch.arange(32)
                bias_n = 0.0 if bias is None else bias[channel.clamp(max=n - 1)].to(torch.float64)[:, None]
                for c in range(0, block_t, 16):
                    vals = tcgen05_ld_32x32b(tmem, warp, ((32 * quarter) << 16) + c, 16)  # [thread, column]
                    token = t_block * block_t + c + torch.arange(16)
                    keep = (channel < n)[:, None] & (token < m)[None, :]
                    rows, cols = keep.nonzero(as_tuple=True)
                    out[token[cols], channel[rows]] = (vals * glob + bias_n)[rows, cols]
    return out


EMULATION_CASES = [
    # (scheme, M, N, K, bias, block_t): N and K off the tile sizes, M past a token block, K past the ring
    ("nvfp4", 5, 136, 200, True, 32),
    ("mxfp4", 40, 72, 600, False, 64),
    ("nvfp4", 70, 24, 520, False, 32),
    ("nvfp4", 100, 130, 300, True, 128),
    ("mxfp4", 150, 136, 1100, True, 256),
    ("nvfp4", 200, 40, 1100, False, 256),
]


@pytest.mark.parametrize(("scheme", "m", "n", "k", "with_bias", "block_t"), EMULATION_CASES)
def test_emulated_kernel_matches_dequantized_matmul(scheme, m, n, k, with_bias, block_t):
    qw, qa = fp4_problem(scheme, m, n, k, seed=m * 1000 + n + k)
    assert fp4_gemm.weight_unsupported(qw) is None
    bias = torch.randn(n, generator=torch.Generator().manual_seed(k)) if with_bias else None
    got = _emulate(fp4_gemm.prepare(qw, "sm_100a"), qa, bias, _tuning(qw.group_shape[1], block_t))
    assert_fp4_matches_reference(got, qw, qa, bias)


def test_the_ring_wraps_in_the_emulation():
    """The cases above include K past the pipeline ring (stage reuse, tensor-memory scale columns rewritten)."""
    assert any(cdiv(k, 256) > _tuning(16 if s == "nvfp4" else 32, t).stages for s, _, _, k, _, t in EMULATION_CASES)


def test_emulation_catches_a_row_major_scale_atom(monkeypatch):
    """The emulation is sensitive to the scale layout: atoms with row r at byte 4 r (plain row-major, a
    plausible mistake) instead of row 32 j + i at byte 16 i + 4 j break the match."""
    right = fp4_gemm.sf_atoms

    def row_major(raw, vec, block_rows):
        atoms = right(raw, vec, block_rows)  # [A, KA, (i, j, byte)] -> [A, KA, (j, i, byte)]
        return atoms.reshape(*atoms.shape[:2], 32, 4, 4).transpose(2, 3).reshape(atoms.shape).contiguous()

    qw, qa = fp4_problem("nvfp4", 40, 128, 128, seed=5)
    monkeypatch.setattr(_fp4_layout, "sf_atoms", row_major)
    got = _emulate(fp4_gemm.prepare(qw, "sm_100a"), qa, None, _tuning(16, 64))
    with pytest.raises(AssertionError, match="elements off"):
        assert_fp4_matches_reference(got, qw, qa, None)


def test_emulation_catches_a_wrong_mxfp4_scale_id(monkeypatch):
    """MXFP4 packs the scales of two k64 steps in one word; scale-factor ids that stay 0 for the second step
    (instruction descriptor bits 29-30 / 4-5) read the first step's scales."""
    qw, qa = fp4_problem("mxfp4", 8, 128, 256, seed=6)
    prep = fp4_gemm.prepare(qw, "sm_100a")
    monkeypatch.setattr(sys.modules[__name__], "sf_id", lambda j, vec: 0)
    bad = _emulate(prep, qa, None, _tuning(32, 32))
    with pytest.raises(AssertionError, match="elements off"):
        assert_fp4_matches_reference(bad, qw, qa, None)


def test_descriptor_fields():
    """The host-built descriptors, field by field (the emulation decodes them the same way)."""
    ab, sf = decode_smem_desc(fp4_gemm.AB_DESC), decode_smem_desc(fp4_gemm.SF_DESC)
    assert ab == {"start": 0, "lbo": 16, "sbo": 1024, "version": 1, "base_offset": 0, "lbo_mode": 0, "swizzle": 2}
    assert sf == {"start": 0, "lbo": 0, "sbo": 128, "version": 1, "base_offset": 0, "lbo_mode": 0, "swizzle": 0}
    for vec in SCHEMES:
        for block_t in fp4_gemm.SM100_BLOCK_T:
            f = decode_instr_desc(fp4_gemm.instr_desc(vec, block_t))
            assert (f["m"], f["n"], f["a_format"], f["b_format"]) == (128, block_t, 1, 1)
            assert f["scale_format"] == int(vec == 32) and f["a_sf_id"] == f["b_sf_id"] == 0


def test_sf_atoms_layout():
    """Atom a, K atom ka, byte 16 i + 4 j + c = scale (row 128 a + 32 j + i, index 4 ka + c), for weights
    (blocks of 128 rows) and token blocks of 32 (each padded to its own atom) and 256 (two atoms)."""
    gen = torch.Generator().manual_seed(0)
    raw = torch.randint(0, 255, (300, 16), generator=gen, dtype=torch.uint8)
    for block_rows in (32, 128, 256):
        atoms = fp4_gemm.sf_atoms(raw, 16, block_rows)
        per_block = cdiv(block_rows, 128) * 128
        assert atoms.shape == (cdiv(300, block_rows) * per_block // 128, 4, 512)
        for row in (0, 31, 32, 127, 128, 200, 299):
            block, r = divmod(row, block_rows)
            a, rr = divmod(block * per_block + r, 128)
            j, i = divmod(rr, 32)
            for idx in (0, 7, 15):
                ka, c = divmod(idx, 4)
                assert atoms[a, ka, 16 * i + 4 * j + c] == raw[row, idx], (block_rows, row, idx)
    assert fp4_gemm.sf_atoms(raw[:5], 32, 32)[0, 0, 16 * 5] == 0x7F  # padded rows: e8m0 1.0


def test_choose_sm100_tuning():
    sms, smem = B200.sm_count, B200.smem_per_block
    assert fp4_gemm.choose_sm100_tuning(1, 4096, sms, 16, smem).block_t == 32
    assert fp4_gemm.choose_sm100_tuning(33, 4096, sms, 16, smem).block_t == 64
    assert fp4_gemm.choose_sm100_tuning(128, 4096, sms, 16, smem).block_t == 128
    assert fp4_gemm.choose_sm100_tuning(4096, 8192, sms, 16, smem) == fp4_gemm.Sm100Tuning(256, 4)  # 64 x 16 blocks
    assert fp4_gemm.choose_sm100_tuning(512, 4096, sms, 16, smem).block_t == 128  # 32 x 2 blocks of 256 < 148
    for vec in SCHEMES:
        for block_t in fp4_gemm.SM100_BLOCK_T:
            lay = fp4_gemm.Sm100Layout(vec, block_t, _tuning(vec, block_t).stages)
            assert lay.smem_bytes <= smem and lay.tmem_cols <= 512
    # fewer stages in less shared memory, and an error where not even one fits
    assert fp4_gemm.choose_sm100_tuning(4096, 8192, sms, 16, 101376).stages < 4
    with pytest.raises(ValueError, match="smem_per_block=1024: no stage"):
        fp4_gemm.choose_sm100_tuning(1, 4096, sms, 16, 1024)


def test_warmup_jobs_on_sm_100():
    from humming import quantize
    from humming.ir.activation import get_act_scheme

    qw = quantize(torch.randn(4096, 64), "nvfp4")
    jobs = fp4_gemm.warmup_jobs(qw, get_act_scheme("nvfp4"), (1, 16, 64, 4096), torch.bfloat16, None, B200, (10, 0))
    assert {arch for _, arch in jobs} == {"sm_100a"}
    tuning = lambda m: fp4_gemm.choose_sm100_tuning(m, 4096, B200.sm_count, 16, B200.smem_per_block)
    assert [spec.name for spec, _ in jobs] == sorted(
        {fp4_gemm.sm100_spec(16, "bf16", "bf16", tuning(m)).name for m in (1, 16, 64, 4096)}
    )
    assert fp4_gemm.warmup_jobs(qw, get_act_scheme("nvfp4"), (1,), torch.bfloat16, None, B200, (9, 0)) == []


# ---------------------------------------------------------------------------------------------------------
# One UMMA (fp4_mma_probe_sm100.cuh): the models above against the hardware, apart from the GEMM.
# ---------------------------------------------------------------------------------------------------------


def _probe_inputs(vec: int, seed: int):
    """Random codes (any nibble) for A [128, 64] and B [32, 64], and raw scale bytes [rows, 4] (one atom
    along K) of a moderate range: e4m3 0.25 .. 3.75, e8m0 2^-4 .. 2^3."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randint(0, 256, (128, 32), generator=gen).to(torch.uint8)
    b = torch.randint(0, 256, (32, 32), generator=gen).to(torch.uint8)
    lo, hi = (0x28, 0x48) if vec == 16 else (123, 131)
    raw_a = torch.randint(lo, hi, (128, 4), generator=gen).to(torch.uint8)
    raw_b = torch.randint(lo, hi, (32, 4), generator=gen).to(torch.uint8)
    return a, b, raw_a, raw_b


def _probe_model(a, b, sfa, sfb, vec: int, sf_id: int) -> torch.Tensor:
    """What fp4_mma_probe_sm100.cuh computes, through the hardware models: D [128, 32] float64."""
    smem = torch.full((16384 + 4096 + 1024,), 0xAA, dtype=torch.uint8)
    for base, codes in ((0, a), (16384, b)):
        r = torch.arange(codes.shape[0])[:, None]
        smem[_sw128(base + 128 * r + torch.arange(32)[None, :])] = codes
    smem[20480:20992], smem[20992:21504] = sfa, sfb
    tmem = Tmem()
    tcgen05_cp_32x128b_warpx4(tmem, smem, 128, fp4_gemm.SF_DESC | (20480 >> 4))
    tcgen05_cp_32x128b_warpx4(tmem, smem, 132, fp4_gemm.SF_DESC | (20992 >> 4))
    idesc = fp4_gemm.instr_desc(vec, 32) | (sf_id << 29) | (sf_id << 4)
    a_desc, b_desc = fp4_gemm.AB_DESC, fp4_gemm.AB_DESC | (16384 >> 4)
    tcgen05_mma_block_scaled(tmem, smem, vec, 0, a_desc, b_desc, idesc, 128, 132, False)
    return tmem.acc[:, :32].clone()


PROBE_CASES = [(16, 0), (32, 0), (32, 2)]


@pytest.mark.parametrize(("vec", "sf_id"), PROBE_CASES)
def test_probe_model_is_the_block_scaled_product(vec, sf_id):
    """The probe's inputs through the models give (A * scale_A) (B * scale_B)^T with the scales of bytes
    sf_id .. of each row's word (so the GPU test below compares the hardware with the dequantized product)."""
    a, b, raw_a, raw_b = _probe_inputs(vec, seed=vec + sf_id)
    got = _probe_model(
        a, b, fp4_gemm.sf_atoms(raw_a, vec, 128)[0, 0], fp4_gemm.sf_atoms(raw_b, vec, 128)[0, 0], vec, sf_id
    )

    def values(codes, raw):
        nib = torch.stack([codes & 0xF, codes >> 4], dim=-1).reshape(codes.shape[0], 64)
        scales = raw[:, sf_id : sf_id + 64 // vec].view(fp4_gemm.SCALE_VECS[vec][0]).to(torch.float64)
        return _E2M1[nib.long()] * scales.repeat_interleave(vec, 1)

    assert torch.equal(got, values(a, raw_a) @ values(b, raw_b).T)


def _sm100() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (10, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not _sm100(), reason="needs an sm_100 GPU (B200 / GB200); never run so far")
@pytest.mark.parametrize(("vec", "sf_id"), PROBE_CASES)
def test_gpu_umma_follows_the_models(vec, sf_id):
    """Run this first on a B200: one UMMA against the models the GEMM's emulation is built on."""
    for seed in range(4):
        a, b, raw_a, raw_b = _probe_inputs(vec, seed)
        sfa, sfb = fp4_gemm.sf_atoms(raw_a, vec, 128)[0, 0], fp4_gemm.sf_atoms(raw_b, vec, 128)[0, 0]
        got = fp4_gemm.sm100_mma_probe(*(t.cuda() for t in (a, b, sfa, sfb)), vec, sf_id).cpu().to(torch.float64)
        ref = _probe_model(a, b, sfa, sfb, vec, sf_id)
        # exact products, fp32 sums of 64 terms below ~1e3: a wrong layout is off by units to hundreds; NaN fails
        assert torch.allclose(got, ref, rtol=1e-5, atol=1e-2), (seed, (got - ref).abs().max().item())
