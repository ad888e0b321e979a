"""Block-scaled FP4 GEMMs for Blackwell: e2m1 activations x e2m1 weights (W4A4), NVFP4 (ue4m3 scales per 16 +
fp32 global scales) or MXFP4 (ue8m0 per 32), one kernel per tensor-core family:

- sm_100a (B200, GB200; ``include/humming/fp4_gemm_sm100.cuh``): tcgen05 UMMA with the accumulator in tensor
  memory, TMA + mbarrier ring, scale factors copied into tensor memory, warp-specialised;
- sm_120a (RTX 50xx, RTX PRO 6000; ``include/humming/fp4_gemm_sm120.cuh``): block-scaled ``mma.sync``.

NEITHER HAS RUN ON HARDWARE: no Blackwell GPU has been available. CI compiles every variant for its
architecture and checks its SASS; ``tests/test_cuda_fp4.py`` mirrors each kernel's layouts (and, for sm_100a,
the descriptors built here) in torch and checks that they reproduce the ``humming.dequantize``-based matmul.
The ``gpu`` tests there have never run.

``out[M, N] = x[M, K] @ dequantize(W)^T + bias`` with ``x`` quantized by ``act`` (``"nvfp4"`` or
``"mxfp4"``, the scheme that matches the weight's scales) through the Triton activation pass, or given as a
``QuantizedActivation``.

- layout (:class:`PreparedFp4`, per architecture): weight codes ``uint8 [N, Kp/2]`` (two per byte, K
  zero-padded to the kernel's K step), scale bytes (sm_120a: ``[N, Kp/vec]``; sm_100a: :func:`sf_atoms`),
  the fp32 global scale; built once per ``QuantizedWeight`` and architecture;
- compute: the tensor core applies both operands' block scales and accumulates in fp32; the global scales
  multiply the result in the epilogue;
- tuning (:class:`Fp4Tuning`, :class:`Sm100Tuning`): tiles per block and pipeline stages, pure functions of
  M, N and the SM count. A tuning change never changes results beyond fp32 summation order.
"""

from __future__ import annotations

import ctypes
import weakref
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..device import device_index, device_info
from ..ir.weight import cdiv
from ._layout import CPP_DTYPE, DTYPE_CODE
from ._support import device_unsupported
from .jit import KernelSpec

__all__ = [
    "AB_DESC",
    "ARCHS",
    "FP4_CCS",
    "LARGE_M",
    "SCALE_VECS",
    "SF_DESC",
    "SM100_BLOCK_T",
    "SMALL_M",
    "TUNINGS",
    "Fp4Tuning",
    "PreparedFp4",
    "Sm100Layout",
    "Sm100Tuning",
    "activation_buffers",
    "choose_sm100_tuning",
    "choose_tuning",
    "fp4_spec",
    "instr_desc",
    "linear",
    "mma_probe",
    "pack_codes",
    "prepare",
    "probe_spec",
    "run",
    "sf_atoms",
    "sm100_activation_buffers",
    "sm100_mma_probe",
    "sm100_probe_spec",
    "sm100_spec",
    "smem_desc",
    "supports",
    "warmup_jobs",
    "weight_unsupported",
]

#: Compute capability -> the architecture its FP4 kernel is built for: tcgen05 block-scaled UMMA (sm_100a) or
#: block-scaled mma.sync (sm_120a). The two instruction families exist on one architecture each (BLACKWELL.md).
ARCHS = {(10, 0): "sm_100a", (12, 0): "sm_120a"}
FP4_CCS = tuple(ARCHS)
#: Scale block along K -> (scale dtype, whether a global scale may come with it, activation scheme).
SCALE_VECS = {
    16: (torch.float8_e4m3fn, True, "nvfp4"),
    32: (torch.float8_e8m0fnu, False, "mxfp4"),
}
_BK = {"sm_120a": 128, "sm_100a": 256}  # K per pipeline stage (kBK in each header)
_SCALE_PAD = {16: 0x00, 32: 0x7F}  # e4m3 0.0 / e8m0 1.0 past K: finite, and the padded codes are zero
_prepared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Fp4Tuning:
    """Speed-only knobs: warps along M and N, m16 / n8 tiles per warp, cp.async pipeline stages."""

    warps_m: int
    warps_n: int
    m_tiles: int
    n_tiles: int
    stages: int

    @property
    def block_m(self) -> int:
        return 16 * self.m_tiles * self.warps_m

    @property
    def block_n(self) -> int:
        return 8 * self.n_tiles * self.warps_n

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n


#: Candidate tunings per token range, largest block first: up to 16 tokens one m16 tile per block (the
#: weight stream is the cost, so blocks narrow along N until every SM has one), else 64-token blocks.
SMALL_M = (Fp4Tuning(1, 4, 1, 4, 3), Fp4Tuning(1, 4, 1, 2, 3), Fp4Tuning(1, 2, 1, 2, 4))
LARGE_M = (Fp4Tuning(2, 2, 2, 8, 3), Fp4Tuning(2, 2, 2, 4, 3))
TUNINGS = SMALL_M + LARGE_M


def choose_tuning(m: int, n: int, sm_count: int) -> Fp4Tuning:
    """Tuning for ``out[m, n]`` on a device with ``sm_count`` SMs (pure function): the largest candidate block
    for this M that still gives every SM a block, else the candidate with the most blocks."""
    candidates = SMALL_M if m <= 16 else LARGE_M
    for tuning in candidates:
        if cdiv(m, tuning.block_m) * cdiv(n, tuning.block_n) >= sm_count:
            return tuning
    return candidates[-1]


def fp4_spec(vec: int, out: str, bias: str, tuning: Fp4Tuning) -> KernelSpec:
    """The kernel spec for a scale block (16: NVFP4, 32: MXFP4), output / bias dtype codes and a tuning."""
    t = tuning
    name = (
        f"humming_fp4_gemm_sm120_{SCALE_VECS[vec][2]}_o{out}_b{bias}"
        f"_wm{t.warps_m}_wn{t.warps_n}_mt{t.m_tiles}_nt{t.n_tiles}_s{t.stages}"
    )
    args = (vec, t.warps_m, t.warps_n, t.m_tiles, t.n_tiles, t.stages, CPP_DTYPE[out], CPP_DTYPE[bias])
    return KernelSpec(
        family="fp4_gemm_sm120",
        name=name,
        header="humming/fp4_gemm_sm120.cuh",
        entry=f"humming::fp4_sm120::run<{', '.join(map(str, args))}>",
        params="humming::fp4_sm120::Params",
        threads=t.threads,
        ccs=((12, 0),),
        arch_specific=True,
    )


# ---- sm_100a: tcgen05 ----------------------------------------------------------------------------------------

#: Token block sizes of the sm_100a kernel (the UMMA's N; the weights fill its M = 128).
SM100_BLOCK_T = (32, 64, 128, 256)
_SM100_SMEM = 232448  # shared memory per block on compute capability 10.0 (227 KiB)
_SM100_MAX_STAGES = 8


@dataclass(frozen=True)
class Sm100Layout:
    """Shared- and tensor-memory layout of ``fp4_sm100::Layout<kVec, kBlockT, kStages>`` (same names)."""

    vec: int
    block_t: int
    stages: int

    @property
    def atoms_k(self) -> int:
        return 256 // (4 * self.vec)

    @property
    def token_atoms(self) -> int:
        return cdiv(self.block_t, 128)

    @property
    def sf_row_bytes(self) -> int:
        return self.atoms_k * 512

    def region_bytes(self) -> dict[str, int]:
        """Bytes per stage of the A (weights), B (tokens), SFA and SFB regions, in shared-memory order."""
        sf = self.sf_row_bytes
        return {"a": 128 * 128, "b": self.block_t * 128, "sfa": sf, "sfb": self.token_atoms * sf}

    def offsets(self) -> dict[str, int]:
        """Offset of each region (its stage 0) and of the barriers and the tensor-memory address slot."""
        out, off = {}, 0
        for name, size in self.region_bytes().items():
            out[name], off = off, off + self.stages * size
        out["bars"] = off
        out["tmem_slot"] = off + 8 * (2 * self.stages + 1)
        return out

    @property
    def smem_bytes(self) -> int:
        return self.offsets()["tmem_slot"] + 4 + 1024

    @property
    def sfa_col(self) -> int:
        return self.block_t

    @property
    def sfb_col(self) -> int:
        return self.sfa_col + self.stages * self.atoms_k * 4

    @property
    def tmem_cols(self) -> int:
        return self.sfb_col + self.stages * self.atoms_k * self.token_atoms * 4


@dataclass(frozen=True)
class Sm100Tuning:
    """Speed-only knobs of the sm_100a kernel: tokens per block and pipeline stages."""

    block_t: int
    stages: int


def _sm100_stages(vec: int, block_t: int) -> int:
    """The most stages (up to 8) whose shared memory fits a block."""
    for stages in range(_SM100_MAX_STAGES, 0, -1):
        if Sm100Layout(vec, block_t, stages).smem_bytes <= _SM100_SMEM:
            return stages
    raise AssertionError(f"no stage fits for block_t={block_t}")


def choose_sm100_tuning(m: int, n: int, sm_count: int, vec: int) -> Sm100Tuning:
    """Tuning for ``out[m, n]`` (pure function): up to 128 tokens, the smallest token block that holds them;
    above, 256-token blocks when they still give every SM one, else 128."""
    if m <= 128:
        block_t = next(t for t in SM100_BLOCK_T if t >= m)
    else:
        block_t = 256 if cdiv(n, 128) * cdiv(m, 256) >= sm_count else 128
    return Sm100Tuning(block_t, _sm100_stages(vec, block_t))


def smem_desc(lbo: int, sbo: int, swizzle: int) -> int:
    """The fields of an sm_100 shared-memory matrix descriptor other than its start address (PTX ISA, "Shared
    memory descriptor"): leading / stride byte offsets >> 4 in bits 16-29 / 32-45, version 1 in bits 46-47,
    base offset 0 (bits 49-51: tiles are 1024-byte aligned), swizzle mode in bits 61-63 (0 none, 2 128-byte)."""
    return ((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (1 << 46) | (swizzle << 61)


#: A / B tiles: K-major, 128-byte swizzle, 8-row atoms of 1024 bytes (the leading offset is unused there).
AB_DESC = smem_desc(16, 1024, 2)
#: tcgen05.cp 32x128b source: 32 rows of 16 bytes, contiguous (8-row core matrices 128 bytes apart).
SF_DESC = smem_desc(0, 128, 0)


def instr_desc(vec: int, block_t: int) -> int:
    """The instruction descriptor of the block-scaled UMMA, scale-factor ids 0 (the kernel ORs them in): A and B
    E2M1 (format 1 of kind::mxf4 / mxf4nvf4, bits 7-9 / 10-12), both K-major (bits 15, 16 clear), N >> 3 in
    bits 17-22, scale format in bit 23 (UE4M3 0 for NVFP4, UE8M0 1 for MXFP4), M >> 4 = 8 in bits 24-28,
    dense K = 64 (bit 31 clear)."""
    return (1 << 7) | (1 << 10) | ((block_t >> 3) << 17) | (int(vec == 32) << 23) | ((128 >> 4) << 24)


def sf_atoms(raw: torch.Tensor, vec: int, block_rows: int) -> torch.Tensor:
    """Scale bytes ``uint8 [R, kp / vec]`` -> the sm_100a kernel's atoms ``uint8 [A, kp / (4 vec), 512]``.

    Rows are cut into blocks of ``block_rows`` (the kernel's block: 128 channels, or the token block), each
    padded to a multiple of 128 rows; atom ``a`` holds 128 rows x 4 scale bytes, row ``32 j + i`` at byte
    ``16 i + 4 j`` (the layout tcgen05.cp 32x128b.warpx4 turns into the MMA's scale-factor columns)."""
    r, cols = raw.shape
    blocks, padded_rows = cdiv(r, block_rows), cdiv(block_rows, 128) * 128
    x = F.pad(raw, (0, 0, 0, blocks * block_rows - r), value=_SCALE_PAD[vec]).reshape(blocks, block_rows, cols)
    x = F.pad(x, (0, 0, 0, padded_rows - block_rows), value=_SCALE_PAD[vec])
    x = x.reshape(blocks * padded_rows // 128, 4, 32, cols // 4, 4)  # [atom, j, i, k atom, byte]
    return x.permute(0, 3, 2, 1, 4).reshape(-1, cols // 4, 512).contiguous()


def sm100_spec(vec: int, out: str, bias: str, tuning: Sm100Tuning) -> KernelSpec:
    """The sm_100a kernel spec for a scale block (16: NVFP4, 32: MXFP4), output / bias dtype codes, a tuning."""
    t = tuning
    args = (vec, t.block_t, t.stages, CPP_DTYPE[out], CPP_DTYPE[bias])
    return KernelSpec(
        family="fp4_gemm_sm100",
        name=f"humming_fp4_gemm_sm100_{SCALE_VECS[vec][2]}_o{out}_b{bias}_t{t.block_t}_s{t.stages}",
        header="humming/fp4_gemm_sm100.cuh",
        entry=f"humming::fp4_sm100::run<{', '.join(map(str, args))}>",
        params="humming::fp4_sm100::Params",
        threads=192,
        ccs=((10, 0),),
        arch_specific=True,
    )


class _ProbeParams(ctypes.Structure):
    """Mirror of ``humming::fp4_sm120::ProbeParams``."""

    _fields_ = (("regs", ctypes.c_void_p), ("d", ctypes.c_void_p))


def probe_spec(vec: int) -> KernelSpec:
    """One block-scaled MMA on registers given per lane (``include/humming/fp4_mma_probe_sm120.cuh``)."""
    return KernelSpec(
        family="fp4_mma_probe_sm120",
        name=f"humming_fp4_mma_probe_sm120_{SCALE_VECS[vec][2]}",
        header="humming/fp4_mma_probe_sm120.cuh",
        entry=f"humming::fp4_sm120::mma_probe<{vec}>",
        params="humming::fp4_sm120::ProbeParams",
        threads=32,
        ccs=((12, 0),),
        arch_specific=True,
    )


def mma_probe(regs: torch.Tensor, vec: int) -> torch.Tensor:
    """Run one m16n8k64 block-scaled MMA: ``regs`` int32 ``[32, 8]`` on an sm_120 device (lane l: a0..a3,
    b0, b1, scale-A word, scale-B word) -> fp32 ``[32, 4]`` (lane l: c0..c3). Checks the hardware against the
    PTX ISA fragment and scale tables (tests/test_cuda_fp4.py)."""
    from ._driver import get_kernel

    device_index = regs.device.index if regs.device.index is not None else torch.cuda.current_device()
    regs = regs.to(torch.int32).contiguous()
    d = torch.full((32, 4), float("nan"), dtype=torch.float32, device=regs.device)
    params = _ProbeParams(regs.data_ptr(), d.data_ptr())
    kernel = get_kernel(probe_spec(vec), device_index)
    kernel.launch((1, 1, 1), 0, params, torch.cuda.current_stream(device_index).cuda_stream)
    return d


class _Sm100ProbeParams(ctypes.Structure):
    """Mirror of ``humming::fp4_sm100::ProbeParams``."""

    _fields_ = (
        ("a", ctypes.c_void_p),
        ("b", ctypes.c_void_p),
        ("sfa", ctypes.c_void_p),
        ("sfb", ctypes.c_void_p),
        ("d", ctypes.c_void_p),
        ("ab_desc", ctypes.c_uint64),
        ("sf_desc", ctypes.c_uint64),
        ("idesc", ctypes.c_uint32),
        ("sf_id", ctypes.c_uint32),
    )


def sm100_probe_spec(vec: int) -> KernelSpec:
    """One block-scaled tcgen05 UMMA, 128 x 32 x 64 (``include/humming/fp4_mma_probe_sm100.cuh``)."""
    return KernelSpec(
        family="fp4_mma_probe_sm100",
        name=f"humming_fp4_mma_probe_sm100_{SCALE_VECS[vec][2]}",
        header="humming/fp4_mma_probe_sm100.cuh",
        entry=f"humming::fp4_sm100::mma_probe<{vec}>",
        params="humming::fp4_sm100::ProbeParams",
        threads=128,
        ccs=((10, 0),),
        arch_specific=True,
    )


def sm100_mma_probe(a, b, sfa, sfb, vec: int, sf_id: int) -> torch.Tensor:
    """Run one block-scaled UMMA on an sm_100 device: e2m1 codes ``a`` uint8 ``[128, 32]`` and ``b`` ``[32, 32]``
    (64 elements a row), one scale atom each (uint8 ``[512]``, :func:`sf_atoms` layout), scale-factor id
    ``sf_id`` -> fp32 D ``[128, 32]``. Checks the hardware against the descriptors and layouts the sm_100a
    GEMM uses (tests/test_cuda_fp4_sm100.py)."""
    from ._driver import get_kernel

    device_index = a.device.index if a.device.index is not None else torch.cuda.current_device()
    a, b, sfa, sfb = (t.to(torch.uint8).contiguous() for t in (a, b, sfa, sfb))
    d = torch.full((128, 32), float("nan"), dtype=torch.float32, device=a.device)
    params = _Sm100ProbeParams(a.data_ptr(), b.data_ptr(), sfa.data_ptr(), sfb.data_ptr(), d.data_ptr())
    params.ab_desc, params.sf_desc, params.idesc, params.sf_id = AB_DESC, SF_DESC, instr_desc(vec, 32), sf_id
    kernel = get_kernel(sm100_probe_spec(vec), device_index)
    kernel.launch((1, 1, 1), 0, params, torch.cuda.current_stream(device_index).cuda_stream)
    return d


def pack_codes(codes: torch.Tensor, kp: int) -> torch.Tensor:
    """e2m1 codes ``uint8 [R, K]`` (one per byte) -> ``uint8 [R, kp / 2]``, element 2i in the low nibble of
    byte i (humming's canonical packing), zero-padded to ``kp`` elements."""
    codes = F.pad(codes, (0, kp - codes.shape[1])).reshape(codes.shape[0], kp // 2, 2)
    return (codes[..., 0] | (codes[..., 1] << 4)).contiguous()


def _scale_bytes(scales: torch.Tensor, vec: int, kp: int) -> torch.Tensor:
    """Scales ``[R, ceil(K / vec)]`` (e4m3 / e8m0) -> their bytes ``uint8 [R, kp / vec]``, padded past K."""
    raw = scales.contiguous().view(torch.uint8)
    return F.pad(raw, (0, kp // vec - raw.shape[1]), value=_SCALE_PAD[vec]).contiguous()


def activation_buffers(qa, kp: int, vec: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """What the kernel reads of a ``QuantizedActivation``: codes ``uint8 [M, kp / 2]``, scale bytes
    ``uint8 [M, kp / vec]`` and the fp32 global scale ``[1]`` (or ``None``)."""
    gscale = None if qa.global_scale is None else qa.global_scale.to(torch.float32).reshape(1).contiguous()
    return pack_codes(qa.codes, kp), _scale_bytes(qa.scales, vec, kp), gscale


@dataclass(frozen=True, eq=False)
class PreparedFp4:
    """Weights as one architecture's kernel reads them; built once per QuantizedWeight and arch (:func:`prepare`)."""

    arch: str  # "sm_100a" or "sm_120a"
    n: int
    k: int
    kp: int  # K padded to the kernel's K step (sm_100a: 256, sm_120a: 128)
    vec: int  # 16 (NVFP4) or 32 (MXFP4)
    codes: torch.Tensor  # uint8 [N, kp / 2]
    scales: torch.Tensor  # e4m3 or e8m0 bytes; sm_120a: uint8 [N, kp / vec]; sm_100a: sf_atoms(.., 128)
    global_scale: torch.Tensor | None  # fp32 [1]
    maps: dict = field(default_factory=dict)  # sm_100a: the weights' TMA descriptor, made on first use


def weight_unsupported(qw) -> str | None:
    """``None`` when the kernel takes this weight, else why not."""
    if qw.format.name != "e2m1":
        return f"the FP4 GEMM takes e2m1 weights, not {qw.format.name}"
    if qw.num_experts is not None:
        return "the FP4 GEMM takes 2-D weights, not expert-stacked ones"
    if qw.zeros is not None or qw.g_idx is not None:
        return "the FP4 GEMM takes symmetric weights without act-order"
    vec = qw.group_shape[1] if qw.group_shape[0] == 1 else None
    if vec not in SCALE_VECS or qw.scales is None or qw.scales.dtype != SCALE_VECS[vec][0]:
        return f"the FP4 GEMM takes NVFP4 (e4m3 scales per 16) or MXFP4 (e8m0 per 32) weights, not {qw.describe()}"
    if qw.global_scale is not None and not SCALE_VECS[vec][1]:
        return "MXFP4 weights carry no global scale"
    return None


def _act_unsupported(qw, act) -> str | None:
    if act is None or act.format != "e2m1":
        return "the FP4 GEMM needs e2m1 activations (act='nvfp4' or 'mxfp4')"
    vec = qw.group_shape[1]
    dtype, _, scheme = SCALE_VECS[vec]
    if act.group != vec or act.scale_dtype != dtype:
        return f"{scheme} weights need act={scheme!r}, not act={act.name}"
    return None


def supports(qweight, act, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> str | None:
    """``None`` when the FP4 kernel runs ``linear(x, qweight, act=act)``, else the reason it does not.

    ``x`` is the 2-D activation ``[M, K]`` (a float tensor, or the uint8 codes of a pre-quantized one).
    """
    return (
        weight_unsupported(qweight)
        or _act_unsupported(qweight, act)
        or device_unsupported("FP4 GEMM", x, FP4_CCS, "sm_100a / sm_120a", out_dtype)
    )


def prepare(qw, arch: str) -> PreparedFp4:
    """The ``arch`` kernel's view of an NVFP4 / MXFP4 ``QuantizedWeight`` (see :func:`weight_unsupported`);
    cached per weight and architecture."""
    if arch not in _BK:
        raise ValueError(f"arch: expected one of {tuple(_BK)}, got {arch!r}")
    per_arch = _prepared.setdefault(qw, {})
    prep = per_arch.get(arch)
    if prep is not None:
        return prep
    n, k, vec = qw.N, qw.K, qw.group_shape[1]
    kp = cdiv(max(k, 1), _BK[arch]) * _BK[arch]
    packed = qw.qweight.contiguous().view(torch.uint8)[:, : cdiv(k, 2)]  # little-endian words: byte i = 2i, 2i+1
    codes = F.pad(packed, (0, kp // 2 - packed.shape[1])).contiguous()
    gscale = None if qw.global_scale is None else qw.global_scale.to(torch.float32).reshape(1).contiguous()
    scales = _scale_bytes(qw.scales, vec, kp)
    if arch == "sm_100a":
        scales = sf_atoms(scales, vec, 128)
    prep = per_arch[arch] = PreparedFp4(arch, n, k, kp, vec, codes, scales, gscale)
    return prep


class _Params(ctypes.Structure):
    """Mirror of ``humming::fp4_sm120::Params`` (80 bytes)."""

    _fields_ = (
        ("x", ctypes.c_void_p),
        ("w", ctypes.c_void_p),
        ("x_scale", ctypes.c_void_p),
        ("w_scale", ctypes.c_void_p),
        ("x_global", ctypes.c_void_p),
        ("w_global", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("M", ctypes.c_int),
        ("N", ctypes.c_int),
        ("Kp", ctypes.c_int),
        ("out_stride", ctypes.c_int),
    )


class _Sm100Params(ctypes.Structure):
    """Mirror of ``humming::fp4_sm100::Params`` (384 bytes: two 64-byte aligned TMA descriptors first)."""

    _fields_ = (
        ("w_map", ctypes.c_uint8 * 128),
        ("x_map", ctypes.c_uint8 * 128),
        ("w_sf", ctypes.c_void_p),
        ("x_sf", ctypes.c_void_p),
        ("x_global", ctypes.c_void_p),
        ("w_global", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("ab_desc", ctypes.c_uint64),
        ("sf_desc", ctypes.c_uint64),
        ("idesc", ctypes.c_uint32),
        ("M", ctypes.c_int),
        ("N", ctypes.c_int),
        ("Kp", ctypes.c_int),
        ("out_stride", ctypes.c_int),
        ("_tail", ctypes.c_uint8 * 44),  # sizeof rounds up to the 64-byte alignment
    )


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _launch_sm120(prep, qa, bias, out, sm_count: int, out_code: str, bias_code: str, device_index: int) -> None:
    from ._driver import get_kernel

    m = out.shape[0]
    tuning = choose_tuning(m, prep.n, sm_count)
    kernel = get_kernel(fp4_spec(prep.vec, out_code, bias_code, tuning), device_index)
    x_codes, x_scales, x_global = activation_buffers(qa, prep.kp, prep.vec)
    params = _Params()
    params.x, params.w = x_codes.data_ptr(), prep.codes.data_ptr()
    params.x_scale, params.w_scale = x_scales.data_ptr(), prep.scales.data_ptr()
    params.x_global, params.w_global = _ptr(x_global), _ptr(prep.global_scale)
    params.bias, params.out = _ptr(bias), out.data_ptr()
    params.M, params.N, params.Kp, params.out_stride = m, prep.n, prep.kp, out.stride(0)
    grid = (cdiv(prep.n, tuning.block_n), cdiv(m, tuning.block_m), 1)
    kernel.launch(grid, 0, params, torch.cuda.current_stream(device_index).cuda_stream)


def _launch_sm100(prep, qa, bias, out, sm_count: int, out_code: str, bias_code: str, device_index: int) -> None:
    from ._driver import get_kernel, tensor_map_2d

    m = out.shape[0]
    tuning = choose_sm100_tuning(m, prep.n, sm_count, prep.vec)
    kernel = get_kernel(sm100_spec(prep.vec, out_code, bias_code, tuning), device_index)
    x_codes, x_sf, x_global = sm100_activation_buffers(qa, prep.kp, prep.vec, tuning.block_t)
    if "w" not in prep.maps:
        prep.maps["w"] = tensor_map_2d(prep.codes, 128, 128)
    params = _Sm100Params()
    params.w_map[:] = prep.maps["w"]
    params.x_map[:] = tensor_map_2d(x_codes, 128, tuning.block_t)
    params.w_sf, params.x_sf = prep.scales.data_ptr(), x_sf.data_ptr()
    params.x_global, params.w_global = _ptr(x_global), _ptr(prep.global_scale)
    params.bias, params.out = _ptr(bias), out.data_ptr()
    params.ab_desc, params.sf_desc, params.idesc = AB_DESC, SF_DESC, instr_desc(prep.vec, tuning.block_t)
    params.M, params.N, params.Kp, params.out_stride = m, prep.n, prep.kp, out.stride(0)
    grid = (cdiv(prep.n, 128), cdiv(m, tuning.block_t), 1)
    smem = Sm100Layout(prep.vec, tuning.block_t, tuning.stages).smem_bytes
    kernel.launch(grid, smem, params, torch.cuda.current_stream(device_index).cuda_stream)


def sm100_activation_buffers(qa, kp: int, vec: int, block_t: int):
    """What the sm_100a kernel reads of a ``QuantizedActivation`` with token blocks of ``block_t``: codes
    ``uint8 [M, kp / 2]``, scale atoms (:func:`sf_atoms`) and the fp32 global scale ``[1]`` (or ``None``)."""
    codes, raw, gscale = activation_buffers(qa, kp, vec)
    return codes, sf_atoms(raw, vec, block_t), gscale


def run(prep: PreparedFp4, x, act, bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """``x [M, K]`` (float, quantized here with ``act``, or a ``QuantizedActivation``) ``@ W^T + bias`` ->
    ``[M, N]`` of ``out_dtype`` (bf16, fp16, fp32) on the current stream, by ``prep.arch``'s kernel."""
    from ..ir.activation import QuantizedActivation

    if isinstance(x, QuantizedActivation):
        qa = x
    else:
        from ..triton_kernels.act_quant import quantize_activation

        qa = quantize_activation(x, act)
    m = qa.codes.shape[0]
    device = qa.codes.device
    index = device_index(device)
    out = torch.empty(m, prep.n, dtype=out_dtype, device=device)
    if m == 0 or prep.n == 0:
        return out
    sm_count = device_info(index).sm_count
    bias_code = DTYPE_CODE[bias.dtype] if bias is not None else DTYPE_CODE[out_dtype]
    bias = None if bias is None else bias.contiguous()
    launch = _launch_sm100 if prep.arch == "sm_100a" else _launch_sm120
    launch(prep, qa, bias, out, sm_count, DTYPE_CODE[out_dtype], bias_code, index)
    return out


def warmup_jobs(
    qweight,
    act,
    m_values,
    out_dtype: torch.dtype,
    bias_dtype: torch.dtype | None,
    sm_count: int,
    cc: tuple[int, int] | None = None,
) -> list[tuple[KernelSpec, str]]:
    """``(spec, arch)`` of every kernel :func:`linear` runs for ``qweight`` and ``act`` at the token counts
    ``m_values`` on a device of compute capability ``cc`` (default: the weight's device) with ``sm_count``
    SMs; empty when the combination has no FP4 kernel."""
    if weight_unsupported(qweight) or _act_unsupported(qweight, act) or out_dtype not in DTYPE_CODE:
        return []
    if cc is None:
        cc = device_info(qweight.device).capability
    if cc not in ARCHS:
        return []
    bias_code = DTYPE_CODE[bias_dtype] if bias_dtype is not None else DTYPE_CODE[out_dtype]
    vec, out, n = qweight.group_shape[1], DTYPE_CODE[out_dtype], qweight.N
    if ARCHS[cc] == "sm_100a":
        specs = {sm100_spec(vec, out, bias_code, choose_sm100_tuning(m, n, sm_count, vec)) for m in m_values}
    else:
        specs = {fp4_spec(vec, out, bias_code, choose_tuning(m, n, sm_count)) for m in m_values}
    return [(spec, ARCHS[cc]) for spec in sorted(specs, key=lambda spec: spec.name)]


def linear(x, qweight, bias: torch.Tensor | None, act, out_dtype: torch.dtype) -> torch.Tensor:
    """``x [M, K] @ dequantize(qweight)^T + bias`` -> ``[M, N]`` of ``out_dtype`` (see :func:`supports`),
    on the sm_100a kernel on compute capability 10.0 and the sm_120a kernel on 12.0.

    ``x`` is a float tensor (quantized with ``act`` by the Triton activation pass) or a
    ``QuantizedActivation`` of scheme ``act``.
    """
    codes = getattr(x, "codes", x)
    reason = supports(qweight, act, codes, out_dtype)
    if reason is not None:
        raise ValueError(f"humming FP4 GEMM: {reason}")
    arch = ARCHS[device_info(codes.device).capability]
    return run(prepare(qweight, arch), x, act, bias, out_dtype)
