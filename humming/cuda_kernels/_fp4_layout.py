"""Operand layouts of the FP4 GEMMs (:mod:`humming.cuda_kernels.fp4_gemm`): which weights the kernels take
(:func:`weight_unsupported`), the packed codes and scale bytes each architecture reads (:func:`sf_atoms` for
sm_100a), for weights (:func:`prepare`, :class:`PreparedFp4`) and for quantized activations
(:func:`activation_buffers`, :func:`sm100_activation_buffers`)."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..ir.weight import cdiv

#: Scale block along K -> (scale dtype, whether a global scale may come with it, activation scheme).
SCALE_VECS = {
    16: (torch.float8_e4m3fn, True, "nvfp4"),
    32: (torch.float8_e8m0fnu, False, "mxfp4"),
}
_BK = {"sm_120a": 128, "sm_100a": 256}  # K per pipeline stage (kBK in each header)
_SCALE_PAD = {16: 0x00, 32: 0x7F}  # e4m3 0.0 / e8m0 1.0 past K: finite, and the padded codes are zero
_prepared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


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


def sm100_activation_buffers(qa, kp: int, vec: int, block_t: int):
    """What the sm_100a kernel reads of a ``QuantizedActivation`` with token blocks of ``block_t``: codes
    ``uint8 [M, kp / 2]``, scale atoms (:func:`sf_atoms`) and the fp32 global scale ``[1]`` (or ``None``)."""
    codes, raw, gscale = activation_buffers(qa, kp, vec)
    return codes, sf_atoms(raw, vec, block_t), gscale


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
