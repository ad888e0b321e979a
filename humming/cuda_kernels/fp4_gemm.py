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
  M, N and the device's limits. A tuning change never changes results beyond fp32 summation order.

The module holds the entry points, the support checks and the kernel object the dispatcher lists
(:data:`KERNEL`, ``cuda.fp4_gemm``); the tuning heuristics live in ``_fp4_tuning``, the operand layouts and
:func:`prepare` in ``_fp4_layout``, the kernel specs, descriptors and launches in ``_fp4_launch``.
"""

from __future__ import annotations

import torch

from ..device import DeviceLimits, device_index, device_info, device_limits
from ..kernel import Kernel
from ._fp4_launch import (
    AB_DESC,
    SF_DESC,
    _launch_sm100,
    _launch_sm120,
    fp4_spec,
    instr_desc,
    mma_probe,
    probe_spec,
    sm100_mma_probe,
    sm100_probe_spec,
    sm100_spec,
    smem_desc,
)
from ._fp4_layout import (
    SCALE_VECS,
    PreparedFp4,
    activation_buffers,
    pack_codes,
    prepare,
    sf_atoms,
    sm100_activation_buffers,
    weight_unsupported,
)
from ._fp4_tuning import (
    LARGE_M,
    SM100_BLOCK_T,
    SMALL_M,
    TUNINGS,
    Fp4Tuning,
    Sm100Layout,
    Sm100Tuning,
    choose_sm100_tuning,
    choose_tuning,
)
from ._layout import DTYPE_CODE
from ._support import device_unsupported, runtime_unavailable
from .jit import KernelSpec

__all__ = [
    "AB_DESC",
    "ARCHS",
    "FP4_CCS",
    "KERNEL",
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
    "prepare_for_device",
    "probe_spec",
    "run",
    "sf_atoms",
    "sm100_activation_buffers",
    "sm100_mma_probe",
    "sm100_probe_spec",
    "sm100_spec",
    "smem_desc",
    "unsupported",
    "warmup_jobs",
    "weight_unsupported",
]

#: Compute capability -> the architecture its FP4 kernel is built for: tcgen05 block-scaled UMMA (sm_100a) or
#: block-scaled mma.sync (sm_120a). The two instruction families exist on one architecture each (BLACKWELL.md).
ARCHS = {(10, 0): "sm_100a", (12, 0): "sm_120a"}
FP4_CCS = tuple(ARCHS)


def _act_unsupported(qw, act) -> str | None:
    if act is None or act.format != "e2m1":
        return "the FP4 GEMM needs e2m1 activations (act='nvfp4' or 'mxfp4')"
    vec = qw.group_shape[1]
    dtype, _, scheme = SCALE_VECS[vec]
    if act.group != vec or act.scale_dtype != dtype:
        return f"{scheme} weights need act={scheme!r}, not act={act.name}"
    return None


def unsupported(qweight, act, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> str | None:
    """``None`` when the FP4 kernel runs ``linear(x, qweight, act=act)``, else the reason it does not.

    ``x`` is the 2-D activation ``[M, K]`` (a float tensor, or the uint8 codes of a pre-quantized one).
    """
    return (
        weight_unsupported(qweight)
        or _act_unsupported(qweight, act)
        or device_unsupported("FP4 GEMM", x, FP4_CCS, "sm_100a / sm_120a", out_dtype)
    )


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
    bias_code = DTYPE_CODE[bias.dtype] if bias is not None else DTYPE_CODE[out_dtype]
    bias = None if bias is None else bias.contiguous()
    launch = _launch_sm100 if prep.arch == "sm_100a" else _launch_sm120
    launch(prep, qa, bias, out, device_limits(index), DTYPE_CODE[out_dtype], bias_code, index)
    return out


def warmup_jobs(
    qweight,
    act,
    m_values,
    out_dtype: torch.dtype,
    bias_dtype: torch.dtype | None,
    limits: DeviceLimits,
    cc: tuple[int, int] | None = None,
) -> list[tuple[KernelSpec, str]]:
    """``(spec, arch)`` of every kernel :func:`linear` runs for ``qweight`` and ``act`` at the token counts
    ``m_values`` on a device of compute capability ``cc`` (default: the weight's device) and ``limits``;
    empty when the combination has no FP4 kernel."""
    if weight_unsupported(qweight) or _act_unsupported(qweight, act) or out_dtype not in DTYPE_CODE:
        return []
    if cc is None:
        cc = device_info(qweight.device).capability
    if cc not in ARCHS:
        return []
    bias_code = DTYPE_CODE[bias_dtype] if bias_dtype is not None else DTYPE_CODE[out_dtype]
    vec, out, n = qweight.group_shape[1], DTYPE_CODE[out_dtype], qweight.N
    sm_count, smem = limits.sm_count, limits.smem_per_block
    if ARCHS[cc] == "sm_100a":
        specs = {sm100_spec(vec, out, bias_code, choose_sm100_tuning(m, n, sm_count, vec, smem)) for m in m_values}
    else:
        specs = {fp4_spec(vec, out, bias_code, choose_tuning(m, n, sm_count)) for m in m_values}
    return [(spec, ARCHS[cc]) for spec in sorted(specs, key=lambda spec: spec.name)]


def linear(x, qweight, bias: torch.Tensor | None, act, out_dtype: torch.dtype) -> torch.Tensor:
    """``x [M, K] @ dequantize(qweight)^T + bias`` -> ``[M, N]`` of ``out_dtype`` (see :func:`unsupported`),
    on the sm_100a kernel on compute capability 10.0 and the sm_120a kernel on 12.0.

    ``x`` is a float tensor (quantized with ``act`` by the Triton activation pass) or a
    ``QuantizedActivation`` of scheme ``act``.
    """
    codes = getattr(x, "codes", x)
    reason = unsupported(qweight, act, codes, out_dtype)
    if reason is not None:
        raise ValueError(f"humming FP4 GEMM: {reason}")
    arch = ARCHS[device_info(codes.device).capability]
    return run(prepare(qweight, arch), x, act, bias, out_dtype)


def prepare_for_device(qweight, act=None) -> PreparedFp4:
    """``qweight`` in the layout of the FP4 kernel of its device's architecture (cached per weight object)."""
    cc = device_info(qweight.device).capability
    if cc not in ARCHS:
        raise ValueError(f"act: no CUDA FP4 GEMM for compute capability {cc} (needs sm_100a / sm_120a)")
    return prepare(qweight, ARCHS[cc])


def _kernel_unsupported(qweight, act, x) -> str | None:
    reason = runtime_unavailable()
    if reason is None and (act is None or act.format != "e2m1"):
        reason = "the FP4 GEMM takes FP4 (nvfp4 / mxfp4) activations"
    return reason or unsupported(qweight, act, x)


def _run(x, qweight, bias, act, out_dtype, tuning):
    return linear(x, qweight, bias, act, out_dtype)


def _warmup_jobs(qweight, act, m, *, act_dtype, out_dtype, bias_dtype, device, block_m=None) -> list:
    info = device_info(device)
    return warmup_jobs(qweight, act, (m,), out_dtype, bias_dtype, info.limits, info.capability)


#: ``cuda.fp4_gemm``: W4A4 NVFP4 / MXFP4 on sm_100a and sm_120a; its tuning is chosen at launch.
KERNEL = Kernel(
    "cuda.fp4_gemm", "cuda", "fp4_gemm", _kernel_unsupported, _run, warmup_jobs=_warmup_jobs, prepare=prepare_for_device
)
