"""Kernel specs and launch of the FP4 GEMMs (:mod:`humming.cuda_kernels.fp4_gemm`): the spec of each
specialisation (:func:`fp4_spec`, :func:`sm100_spec`), the sm_100a descriptors built on the host
(:func:`smem_desc`, :func:`instr_desc`), the ctypes mirrors of the kernels' ``Params`` and the launches,
and the single-MMA probes that check the hardware against the PTX ISA tables."""

from __future__ import annotations

import ctypes

import torch

from ..device import DeviceLimits, device_index
from ..ir.weight import cdiv
from ._driver import fields
from ._fp4_layout import SCALE_VECS, activation_buffers, sm100_activation_buffers
from ._fp4_tuning import Fp4Tuning, Sm100Layout, Sm100Tuning, choose_sm100_tuning, choose_tuning
from ._layout import CPP_DTYPE
from .jit import KernelSpec


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


def _probe_spec(sm: int, vec: int, threads: int) -> KernelSpec:
    """The MMA probe of ``include/humming/fp4_mma_probe_sm{sm}.cuh`` for one scale vector."""
    return KernelSpec(
        family=f"fp4_mma_probe_sm{sm}",
        name=f"humming_fp4_mma_probe_sm{sm}_{SCALE_VECS[vec][2]}",
        header=f"humming/fp4_mma_probe_sm{sm}.cuh",
        entry=f"humming::fp4_sm{sm}::mma_probe<{vec}>",
        params=f"humming::fp4_sm{sm}::ProbeParams",
        threads=threads,
        ccs=((sm // 10, 0),),
        arch_specific=True,
    )


def probe_spec(vec: int) -> KernelSpec:
    """One block-scaled MMA on registers given per lane, on sm_120."""
    return _probe_spec(120, vec, threads=32)


def mma_probe(regs: torch.Tensor, vec: int) -> torch.Tensor:
    """Run one m16n8k64 block-scaled MMA: ``regs`` int32 ``[32, 8]`` on an sm_120 device (lane l: a0..a3,
    b0, b1, scale-A word, scale-B word) -> fp32 ``[32, 4]`` (lane l: c0..c3). Checks the hardware against the
    PTX ISA fragment and scale tables (tests/test_cuda_fp4.py)."""
    regs = regs.to(torch.int32).contiguous()
    d = torch.full((32, 4), float("nan"), dtype=torch.float32, device=regs.device)
    _launch_probe(probe_spec(vec), _ProbeParams(regs.data_ptr(), d.data_ptr()), regs.device)
    return d


def _launch_probe(spec: KernelSpec, params: ctypes.Structure, device: torch.device) -> None:
    """One block of a probe kernel on ``device``'s current stream."""
    from ._driver import current_stream, get_kernel

    index = device_index(device)
    get_kernel(spec, index).launch((1, 1, 1), 0, params, current_stream(index))


class _Sm100ProbeParams(ctypes.Structure):
    """Mirror of ``humming::fp4_sm100::ProbeParams``."""

    _fields_ = (
        *fields(ctypes.c_void_p, "a b sfa sfb d"),
        *fields(ctypes.c_uint64, "ab_desc sf_desc"),
        *fields(ctypes.c_uint32, "idesc sf_id"),
    )


def sm100_probe_spec(vec: int) -> KernelSpec:
    """One block-scaled tcgen05 UMMA, 128 x 32 x 64, on sm_100."""
    return _probe_spec(100, vec, threads=128)


def sm100_mma_probe(a, b, sfa, sfb, vec: int, sf_id: int) -> torch.Tensor:
    """Run one block-scaled UMMA on an sm_100 device: e2m1 codes ``a`` uint8 ``[128, 32]`` and ``b`` ``[32, 32]``
    (64 elements a row), one scale atom each (uint8 ``[512]``, :func:`sf_atoms` layout), scale-factor id
    ``sf_id`` -> fp32 D ``[128, 32]``. Checks the hardware against the descriptors and layouts the sm_100a
    GEMM uses (tests/test_cuda_fp4_sm100.py)."""
    a, b, sfa, sfb = (t.to(torch.uint8).contiguous() for t in (a, b, sfa, sfb))
    d = torch.full((128, 32), float("nan"), dtype=torch.float32, device=a.device)
    params = _Sm100ProbeParams(a.data_ptr(), b.data_ptr(), sfa.data_ptr(), sfb.data_ptr(), d.data_ptr())
    params.ab_desc, params.sf_desc, params.idesc, params.sf_id = AB_DESC, SF_DESC, instr_desc(vec, 32), sf_id
    _launch_probe(sm100_probe_spec(vec), params, a.device)
    return d


class _Params(ctypes.Structure):
    """Mirror of ``humming::fp4_sm120::Params`` (80 bytes)."""

    _fields_ = (
        *fields(ctypes.c_void_p, "x w x_scale w_scale x_global w_global bias out"),
        *fields(ctypes.c_int, "M N Kp out_stride"),
    )


class _Sm100Params(ctypes.Structure):
    """Mirror of ``humming::fp4_sm100::Params`` (384 bytes: two 64-byte aligned TMA descriptors first)."""

    _fields_ = (
        *fields(ctypes.c_uint8 * 128, "w_map x_map"),
        *fields(ctypes.c_void_p, "w_sf x_sf x_global w_global bias out"),
        *fields(ctypes.c_uint64, "ab_desc sf_desc"),
        *fields(ctypes.c_uint32, "idesc"),
        *fields(ctypes.c_int, "M N Kp out_stride"),
        ("_tail", ctypes.c_uint8 * 44),  # sizeof rounds up to the 64-byte alignment
    )


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _launch_sm120(prep, qa, bias, out, limits: DeviceLimits, out_code: str, bias_code: str, index: int) -> None:
    from ._driver import current_stream, get_kernel

    m = out.shape[0]
    tuning = choose_tuning(m, prep.n, limits.sm_count)
    kernel = get_kernel(fp4_spec(prep.vec, out_code, bias_code, tuning), index)
    x_codes, x_scales, x_global = activation_buffers(qa, prep.kp, prep.vec)
    params = _Params()
    params.x, params.w = x_codes.data_ptr(), prep.codes.data_ptr()
    params.x_scale, params.w_scale = x_scales.data_ptr(), prep.scales.data_ptr()
    params.x_global, params.w_global = _ptr(x_global), _ptr(prep.global_scale)
    params.bias, params.out = _ptr(bias), out.data_ptr()
    params.M, params.N, params.Kp, params.out_stride = m, prep.n, prep.kp, out.stride(0)
    grid = (cdiv(prep.n, tuning.block_n), cdiv(m, tuning.block_m), 1)
    kernel.launch(grid, 0, params, current_stream(index))


def _launch_sm100(prep, qa, bias, out, limits: DeviceLimits, out_code: str, bias_code: str, index: int) -> None:
    from ._driver import current_stream, get_kernel, tensor_map_2d

    m = out.shape[0]
    tuning = choose_sm100_tuning(m, prep.n, limits.sm_count, prep.vec, limits.smem_per_block)
    kernel = get_kernel(sm100_spec(prep.vec, out_code, bias_code, tuning), index)
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
    kernel.launch(grid, smem, params, current_stream(index))
