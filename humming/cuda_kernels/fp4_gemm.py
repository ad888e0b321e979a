"""Block-scaled FP4 GEMM for consumer Blackwell (``include/humming/fp4_gemm_sm120.cuh``, sm_120a): e2m1
activations x e2m1 weights (W4A4), NVFP4 (ue4m3 scales per 16 + fp32 global scales) or MXFP4 (ue8m0 per 32).

NOT YET RUN ON HARDWARE: no sm_120 GPU has been available. CI compiles every variant for sm_120a and checks
its SASS; ``tests/test_cuda_fp4.py`` mirrors the kernel's fragment and scale layouts in torch and checks that
they reproduce the ``humming.dequantize``-based matmul. The ``gpu`` tests there have never run.

``out[M, N] = x[M, K] @ dequantize(W)^T + bias`` with ``x`` quantized by ``act`` (``"nvfp4"`` or
``"mxfp4"``, the scheme that matches the weight's scales) through the Triton activation pass, or given as a
``QuantizedActivation``.

- layout (:class:`PreparedFp4`): weight codes ``uint8 [N, Kp/2]`` (two per byte, K zero-padded to a multiple
  of 128), scale bytes ``[N, Kp/vec]``, the fp32 global scale; built once per ``QuantizedWeight``;
- compute: the tensor core applies both operands' block scales and accumulates in fp32; the global scales
  multiply the result in the epilogue;
- tuning (:class:`Fp4Tuning`): warps and tiles per block, pipeline stages; :func:`choose_tuning` is a pure
  function of M, N and the SM count. A tuning change never changes results beyond fp32 summation order.
"""

from __future__ import annotations

import ctypes
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..ir.weight import cdiv
from ._support import device_unsupported
from .jit import KernelSpec

__all__ = [
    "FP4_CCS",
    "LARGE_M",
    "SCALE_VECS",
    "SMALL_M",
    "TUNINGS",
    "Fp4Tuning",
    "PreparedFp4",
    "activation_buffers",
    "choose_tuning",
    "fp4_spec",
    "linear",
    "mma_probe",
    "pack_codes",
    "prepare",
    "probe_spec",
    "run",
    "supports",
    "warmup_jobs",
    "weight_unsupported",
]

#: Compute capabilities the kernel is built for (block-scaled mma.sync with kind::mxf4 / mxf4nvf4: sm_120a).
FP4_CCS = ((12, 0),)
#: Scale block along K -> (scale dtype, whether a global scale may come with it, activation scheme).
SCALE_VECS = {
    16: (torch.float8_e4m3fn, True, "nvfp4"),
    32: (torch.float8_e8m0fnu, False, "mxfp4"),
}
_BK = 128  # K per pipeline stage (kBK in the header)
_SCALE_PAD = {16: 0x00, 32: 0x7F}  # e4m3 0.0 / e8m0 1.0 past K: finite, and the padded codes are zero
_OUT_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
_CPP_DTYPE = {"f32": "humming::DType::f32", "bf16": "humming::DType::bf16", "f16": "humming::DType::f16"}
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
    args = (vec, t.warps_m, t.warps_n, t.m_tiles, t.n_tiles, t.stages, _CPP_DTYPE[out], _CPP_DTYPE[bias])
    return KernelSpec(
        family="fp4_gemm_sm120",
        name=name,
        header="humming/fp4_gemm_sm120.cuh",
        entry=f"humming::fp4_sm120::run<{', '.join(map(str, args))}>",
        params="humming::fp4_sm120::Params",
        threads=t.threads,
        ccs=FP4_CCS,
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
        ccs=FP4_CCS,
        arch_specific=True,
    )


def mma_probe(regs: torch.Tensor, vec: int) -> torch.Tensor:
    """Run one m16n8k64 block-scaled MMA: ``regs`` int32 ``[32, 8]`` on an sm_120 device (lane l: a0..a3,
    b0, b1, scale-A word, scale-B word) -> fp32 ``[32, 4]`` (lane l: c0..c3). Checks the hardware against the
    PTX ISA fragment and scale tables (tests/test_cuda_fp4.py)."""
    from .jit import get_kernel

    device_index = regs.device.index if regs.device.index is not None else torch.cuda.current_device()
    regs = regs.to(torch.int32).contiguous()
    d = torch.full((32, 4), float("nan"), dtype=torch.float32, device=regs.device)
    params = _ProbeParams(regs.data_ptr(), d.data_ptr())
    kernel = get_kernel(probe_spec(vec), device_index)
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
    """Weights as the kernel reads them; built once per QuantizedWeight (:func:`prepare`)."""

    n: int
    k: int
    kp: int  # K padded to a multiple of 128
    vec: int  # 16 (NVFP4) or 32 (MXFP4)
    codes: torch.Tensor  # uint8 [N, kp / 2]
    scales: torch.Tensor  # uint8 [N, kp / vec], e4m3 or e8m0 bytes
    global_scale: torch.Tensor | None  # fp32 [1]


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
        or device_unsupported("FP4 GEMM", x, FP4_CCS, "sm_120a", out_dtype, _OUT_DTYPES)
    )


def prepare(qw) -> PreparedFp4:
    """The kernel's view of an NVFP4 / MXFP4 ``QuantizedWeight`` (see :func:`weight_unsupported`); cached."""
    prep = _prepared.get(qw)
    if prep is not None:
        return prep
    n, k, vec = qw.N, qw.K, qw.group_shape[1]
    kp = cdiv(max(k, 1), _BK) * _BK
    packed = qw.qweight.contiguous().view(torch.uint8)[:, : cdiv(k, 2)]  # little-endian words: byte i = 2i, 2i+1
    codes = F.pad(packed, (0, kp // 2 - packed.shape[1])).contiguous()
    gscale = None if qw.global_scale is None else qw.global_scale.to(torch.float32).reshape(1).contiguous()
    prep = _prepared[qw] = PreparedFp4(n, k, kp, vec, codes, _scale_bytes(qw.scales, vec, kp), gscale)
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


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def run(prep: PreparedFp4, x, act, bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """``x [M, K]`` (float, quantized here with ``act``, or a ``QuantizedActivation``) ``@ W^T + bias`` ->
    ``[M, N]`` of ``out_dtype`` (bf16, fp16, fp32) on the current stream."""
    from ..ir.activation import QuantizedActivation
    from .jit import get_kernel

    if isinstance(x, QuantizedActivation):
        qa = x
    else:
        from ..triton_kernels.act_quant import quantize_activation

        qa = quantize_activation(x, act)
    m = qa.codes.shape[0]
    device = qa.codes.device
    device_index = device.index if device.index is not None else torch.cuda.current_device()
    out = torch.empty(m, prep.n, dtype=out_dtype, device=device)
    if m == 0 or prep.n == 0:
        return out
    tuning = choose_tuning(m, prep.n, torch.cuda.get_device_properties(device_index).multi_processor_count)
    bias_code = _OUT_DTYPES[bias.dtype] if bias is not None else _OUT_DTYPES[out_dtype]
    kernel = get_kernel(fp4_spec(prep.vec, _OUT_DTYPES[out_dtype], bias_code, tuning), device_index)
    x_codes, x_scales, x_global = activation_buffers(qa, prep.kp, prep.vec)
    if bias is not None:
        bias = bias.contiguous()
    params = _Params()
    params.x, params.w = x_codes.data_ptr(), prep.codes.data_ptr()
    params.x_scale, params.w_scale = x_scales.data_ptr(), prep.scales.data_ptr()
    params.x_global, params.w_global = _ptr(x_global), _ptr(prep.global_scale)
    params.bias, params.out = _ptr(bias), out.data_ptr()
    params.M, params.N, params.Kp, params.out_stride = m, prep.n, prep.kp, out.stride(0)
    grid = (cdiv(prep.n, tuning.block_n), cdiv(m, tuning.block_m), 1)
    kernel.launch(grid, 0, params, torch.cuda.current_stream(device_index).cuda_stream)
    return out


def warmup_jobs(
    qweight, act, m_values, out_dtype: torch.dtype, bias_dtype: torch.dtype | None, sm_count: int
) -> list[tuple[KernelSpec, str]]:
    """``(spec, "sm_120a")`` of every kernel :func:`linear` runs for ``qweight`` and ``act`` at the token counts
    ``m_values`` on a device with ``sm_count`` SMs; empty when the combination has no FP4 kernel."""
    if weight_unsupported(qweight) or _act_unsupported(qweight, act) or out_dtype not in _OUT_DTYPES:
        return []
    bias_code = _OUT_DTYPES[bias_dtype] if bias_dtype is not None else _OUT_DTYPES[out_dtype]
    vec, out = qweight.group_shape[1], _OUT_DTYPES[out_dtype]
    specs = {fp4_spec(vec, out, bias_code, choose_tuning(m, qweight.N, sm_count)) for m in m_values}
    return [(spec, "sm_120a") for spec in sorted(specs, key=lambda spec: spec.name)]


def linear(x, qweight, bias: torch.Tensor | None, act, out_dtype: torch.dtype) -> torch.Tensor:
    """``x [M, K] @ dequantize(qweight)^T + bias`` -> ``[M, N]`` of ``out_dtype`` (see :func:`supports`).

    ``x`` is a float tensor (quantized with ``act`` by the Triton activation pass) or a
    ``QuantizedActivation`` of scheme ``act``.
    """
    codes = getattr(x, "codes", x)
    reason = supports(qweight, act, codes, out_dtype)
    if reason is not None:
        raise ValueError(f"humming FP4 GEMM: {reason}")
    return run(prepare(qweight), x, act, bias, out_dtype)
