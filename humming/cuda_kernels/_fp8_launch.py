"""Kernel specs and launch of the FP8 GEMM (:mod:`humming.cuda_kernels.fp8_gemm`): the spec of each
specialisation (:func:`fp8_spec`, :func:`call_spec`), the activations in the kernel's layout, the ctypes
mirror of ``humming::fp8_sm90::Params`` and :func:`_launch`, which fills it and launches on the current
stream."""

from __future__ import annotations

import ctypes
import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..device import device_index, device_limits
from ..ir.weight import cdiv
from ..workspaces import WORKSPACES
from ._driver import PackedLaunch, current_stream, fields, get_kernel, tensor_map, tensor_map_2d
from ._fp8_layout import SCALE_MODES, W_FORMATS, PreparedFp8
from ._fp8_tuning import _BK, Fp8Tuning, smem_bytes
from ._layout import CPP_DTYPE, DTYPE_CODE
from .act_quant import CudaQuantizePass, quantize_pass
from .jit import KernelSpec, per_call_cache

#: Compute capabilities the kernel is built for (wgmma and setmaxnreg need sm_90a).
FP8_CCS = ((9, 0),)
#: Kernel-name tokens of the weight formats.
_W_NAMES = {"e4m3": "w8a8", "int4": "w4a8", "mxfp4": "wmxfp4a8"}


@per_call_cache
def fp8_spec(
    w_format: str, scale_mode: str, out: str, bias: str, tuning: Fp8Tuning, grouped: bool = False
) -> KernelSpec:
    """The kernel spec for a weight format (a key of :data:`W_FORMATS`), a scale mode, output / bias dtype
    codes, tuning, and the grouped (MoE) flag. Split-K kernels (``tuning.splits > 1``, one kernel for any
    count: the count is grid.z) write fp32 with plain stores and are not grouped."""
    split = tuning.splits > 1
    if split and ((out != "f32" and not tuning.read_back) or tuning.tma_store or grouped):
        raise ValueError(
            f"tuning: split-K (splits={tuning.splits}) adds fp32 partial sums with plain stores (into an fp32"
            f" output unless read back), not grouped; got out={out!r}, tma_store={tuning.tma_store},"
            f" grouped={grouped} (call_spec sets these)"
        )
    producer, consumer = tuning.registers()
    promote = tuning.promotes_every(scale_mode)
    prefetch = tuning.reads_codes_ahead(w_format)
    halves = tuning.issues_token_halves(w_format, scale_mode)
    kind = "grouped_" if grouped else ""
    name = (
        f"humming_fp8_gemm_sm90_{kind}{_W_NAMES[w_format]}_{scale_mode}_o{out}_b{bias}_w{tuning.wgs}"
        f"_m{tuning.block_m}_s{tuning.stages}_mb{tuning.min_blocks}"
        + ("_sk" if split else "")
        + ("" if tuning.tma_store else "_stg")
        + (f"_p{promote}" if promote > 1 else "")
        + ("_pc" if prefetch else "")
        + ("_th" if halves else "")
        + ("_rb" if tuning.read_back else "")
    )
    args = ", ".join(
        (
            str(tuning.wgs),
            str(tuning.block_m),
            str(tuning.stages),
            str(W_FORMATS[w_format]),
            str(SCALE_MODES[scale_mode]),
            "true" if tuning.tma_store else "false",
            "true" if grouped else "false",
            "true" if split else "false",
            CPP_DTYPE[out],
            CPP_DTYPE[bias],
            str(producer),
            str(consumer),
            str(promote),
            "true" if prefetch else "false",
            "true" if halves else "false",
            "true" if tuning.read_back else "false",
        )
    )
    return KernelSpec(
        family="fp8_gemm_sm90",
        name=name,
        header="humming/fp8_gemm_sm90.cuh",
        entry=f"humming::fp8_sm90::run<{args}>",
        params="humming::fp8_sm90::Params",
        threads=tuning.threads,
        ccs=FP8_CCS,
        min_blocks=tuning.min_blocks,
        arch_specific=True,
    )


@dataclass(frozen=True)
class _Activations:
    codes: torch.Tensor  # uint8 [M, Kp], e4m3 bytes
    x_scale: torch.Tensor | None  # fp32 per-token [M] or per-tensor [1]
    x_block_scale: torch.Tensor | None  # fp32 [ceil(K / 128), tiles_m * block_m]


def _activations(x, act, kp: int, block_m: int) -> _Activations:
    """Quantize ``x`` (a float ``[M, K]``, or take a ``QuantizedActivation``) into the kernel's layout."""
    from ..ir.activation import QuantizedActivation

    if isinstance(x, QuantizedActivation):
        qa = x
    else:
        from ..triton_kernels.act_quant import quantize_activation

        qa = quantize_activation(x, act)
    m, k = qa.codes.shape
    codes = qa.codes if kp == k else F.pad(qa.codes, (0, kp - k))
    scales = qa.scales.to(torch.float32)
    if qa.scheme.group == 128:
        # [num_kb, M padded to the token tile], row-major: F.pad with nothing to pad returns a clone that keeps
        # the transposed strides, which the kernel would read as row-major, hence .contiguous()
        blocks = F.pad(scales.T, (0, cdiv(m, block_m) * block_m - m)).contiguous()
        return _Activations(codes.contiguous(), None, blocks)
    return _Activations(codes.contiguous(), scales.reshape(-1).contiguous(), None)


class _Params(ctypes.Structure):
    """Mirror of ``humming::fp8_sm90::Params`` (576 bytes, 64-byte aligned in the kernel)."""

    _fields_ = (
        *fields(ctypes.c_uint8 * 128, "w_map x_map out_map"),
        *fields(ctypes.c_void_p, "w_scale x_scale w_block_scale x_block_scale bias"),
        *fields(ctypes.c_int, "M N num_kb x_scale_stride x_block_stride tiles_m tiles_n group_m"),
        *fields(ctypes.c_void_p, "out"),
        *fields(ctypes.c_int, "out_stride"),
        *fields(ctypes.c_void_p, "w_packed w_group_scale"),
        *fields(ctypes.c_int, "w_group_stride"),
        *fields(ctypes.c_void_p, "expert_ids"),
        *fields(ctypes.c_int, "block_m"),
        ("_pad", ctypes.c_uint8 * 4),
        *fields(ctypes.c_void_p, "sums arrivals"),
        ("_tail", ctypes.c_uint8 * 48),
    )


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


@per_call_cache
def call_spec(
    w_format: str,
    scale_mode: str,
    bias_dtype: torch.dtype | None,
    out_dtype: torch.dtype,
    tuning: Fp8Tuning,
    grouped: bool = False,
) -> KernelSpec:
    """The spec of one call: weight format, scale mode, bias dtype (``None``: no bias), output dtype, tuning
    (fp32 output: the plain-store epilogue; split-K: that epilogue into the fp32 workspace, or read back into the
    output), grouped flag."""
    bias_code = DTYPE_CODE[bias_dtype] if bias_dtype is not None else DTYPE_CODE[out_dtype]
    if tuning.splits > 1 and not tuning.read_back:
        out_dtype = torch.float32
    if out_dtype == torch.float32 or tuning.splits > 1:  # the TMA-store epilogue: 16-bit floats, one split
        tuning = dataclasses.replace(tuning, tma_store=False)
    return fp8_spec(w_format, scale_mode, DTYPE_CODE[out_dtype], bias_code, tuning, grouped)


class Fp8Launch:
    """One call shape of the FP8 GEMM made ready: activations shaped as ``x`` (float ``[M, K]`` quantized here
    with ``act``, of x's dtype, shape and strides; or a ``QuantizedActivation`` of M rows), the bias dtype
    (``None``: no bias), the output dtype, the tuning and, for the grouped kernel, the routing ``block_m``. It
    holds the loaded kernel, the grid, the activation pass, the TMA descriptor encoders and the parameter
    struct with everything but the addresses of the call's tensors, so that a call quantizes, allocates and
    launches. Calls must match the shape it was made for."""

    def __init__(
        self,
        prep: PreparedFp8,
        act,
        x,
        bias_dtype: torch.dtype | None,
        out_dtype: torch.dtype,
        tuning: Fp8Tuning | None,
        device: int,
        block_m: int = 0,
    ) -> None:

        m = getattr(x, "codes", x).shape[0]
        self.prep, self.act, self.m, self.out_dtype, self.device = prep, act, m, out_dtype, device
        self.torch_device = torch.device("cuda", device)
        self.n_pad = cdiv(prep.n, 16 // out_dtype.itemsize) * (16 // out_dtype.itemsize)
        if m == 0:  # nothing to launch (no tuning either)
            return
        if out_dtype == torch.float32 or tuning.splits > 1:  # the TMA-store epilogue writes 16-bit floats only
            tuning = dataclasses.replace(tuning, tma_store=False)
        self.tuning = tuning
        # read back: the splits' fp32 sums [m, N], then one arrival counter per tile (zero between calls)
        tiles = cdiv(m, tuning.block_m) * cdiv(prep.n, tuning.block_n)
        self.workspace_words = m * prep.n + tiles if tuning.read_back else 0
        if self.workspace_words and not torch.cuda.is_current_stream_capturing():
            WORKSPACES.reserve(self.workspace_words, device)  # and a spare for a capture stream
        self.kernel = get_kernel(
            call_spec(prep.w_format, prep.scale_mode, bias_dtype, out_dtype, tuning, block_m > 0), device
        )
        tiles_m, tiles_n = cdiv(m, tuning.block_m), cdiv(prep.n, tuning.block_n)
        self.grid = (tuning.grid_blocks(tiles_m * tiles_n, device_limits(device)), 1, tuning.splits)
        self.smem = smem_bytes(tuning.wgs, tuning.block_m, tuning.stages, prep.w_format)
        # float x straight into the kernel's layout: codes [M, K] (K padded: the general path), per-token /
        # per-tensor scales as they come, 1x128 scales written transposed, [num_kb, M padded to the tile]
        self.block_rows = tiles_m * tuning.block_m if act is not None and act.group == 128 else 0
        self.quantize = None
        if isinstance(x, torch.Tensor) and prep.kp == prep.k:
            self.quantize = quantize_pass(x, act, scales_rows=self.block_rows)
        self.x_scale_stride = int(act is not None and act.group == "token" and m > 1)  # per-token / per-tensor
        self.x_map = tensor_map(torch.uint8, m, prep.kp, prep.kp, _BK, tuning.block_m)
        self.out_map = tensor_map(out_dtype, m, prep.n, self.n_pad, 64, tuning.block_m) if tuning.tma_store else None
        if prep.w_bits == 8 and tuning.block_n not in prep.maps:
            prep.maps[tuning.block_n] = tensor_map_2d(prep.weight, _BK, tuning.block_n)
        params = _Params()
        if prep.w_bits == 8:
            params.w_map[:] = prep.maps[tuning.block_n]
        params.w_scale = _ptr(prep.w_scale)
        params.w_block_scale = _ptr(prep.w_block_scale)
        params.M, params.N, params.num_kb = m, prep.n, cdiv(prep.kp, _BK)
        params.x_block_stride = self.block_rows
        params.tiles_m, params.tiles_n, params.group_m = tiles_m, tiles_n, tuning.group_m
        if prep.w_bits == 4:
            params.w_packed = prep.weight.data_ptr()
            params.w_group_scale = _ptr(prep.w_group_scale)
            params.w_group_stride = prep.w_group_scale.shape[1] if prep.w_group_scale is not None else 0
        params.block_m = block_m
        # programmatic launch: dense behind the CUDA pass (the GEMM starts while the pass runs); grouped always
        # (the grouped kernel waits for the kernel before it first)
        programmatic = block_m > 0 or isinstance(self.quantize, CudaQuantizePass)
        self.packed = PackedLaunch(self.kernel, self.grid, self.smem, params, programmatic)
        self.address = ctypes.addressof(params)

    def __call__(
        self, x, bias: torch.Tensor | None, out: torch.Tensor | None = None, expert_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x`` (float ``[m, K]``, or a ``QuantizedActivation``) ``@ W^T + bias`` into ``out`` (``[m, N]`` of
        the output dtype, unit column stride, 16-byte rows) or a new tensor (a view with padded rows unless N
        fills whole 16-byte rows); ``expert_ids``: the grouped kernel's segment experts."""
        m, n, out_dtype = self.m, self.prep.n, self.out_dtype
        given = out is not None
        if out is None:
            out = torch.empty((m, self.n_pad), dtype=out_dtype, device=self.torch_device)
            if self.n_pad != n:
                out = out[:, :n]
        elif (
            tuple(out.shape) != (m, n)
            or out.dtype != out_dtype
            or out.stride(1) != 1
            or (out.stride(0) * out.element_size()) % 16
            or out.data_ptr() % 16
        ):
            raise ValueError(f"out: expected a [{m}, {n}] {out_dtype} tensor, unit column stride, 16-byte rows")
        if m == 0:
            return out
        tuning = self.tuning
        if self.quantize is not None:
            held, codes, scales = self._quantized(x)
            x_scale, x_scale_stride = (None, 0) if self.block_rows else (scales, self.x_scale_stride)
            x_block_scale = scales if self.block_rows else None
        else:
            held = _activations(x, self.act, self.prep.kp, tuning.block_m)
            codes, x_block_scale = held.codes.data_ptr(), _ptr(held.x_block_scale)
            x_scale, x_scale_stride = _ptr(held.x_scale), int(held.x_scale is not None and held.x_scale.numel() > 1)
        if bias is not None:
            bias = bias.contiguous()
        # split-K: the splits add into a zero-filled fp32 workspace (fp32 out: ``out`` itself), rounded afterwards;
        # the memset and the copy are stream work, so CUDA-graph capture records them. Read back: into the
        # zero-between-calls workspace, the last split writing ``out``.
        acc = out
        if tuning.splits > 1 and not tuning.read_back and out_dtype == torch.float32:
            acc = out.zero_()
        elif tuning.splits > 1 and not tuning.read_back:
            acc = torch.zeros((m, n), dtype=torch.float32, device=self.torch_device)
        packed, address = self.packed, self.address
        with packed.lock:
            params = packed.params
            ctypes.memmove(address + _X_MAP, self.x_map.encode(codes), 128)
            if tuning.tma_store:
                out_map = tensor_map(out_dtype, m, n, out.stride(0), 64, tuning.block_m) if given else self.out_map
                ctypes.memmove(address + _OUT_MAP, out_map.encode(out.data_ptr()), 128)
            params.x_scale, params.x_scale_stride, params.x_block_scale = x_scale, x_scale_stride, x_block_scale
            params.bias = None if bias is None else bias.data_ptr()
            params.out, params.out_stride = acc.data_ptr(), acc.stride(0)
            params.expert_ids = None if expert_ids is None else expert_ids.data_ptr()
            stream = current_stream(self.device)
            if self.workspace_words:
                sums = WORKSPACES.get(self.workspace_words, self.device, stream).data_ptr()
                params.sums, params.arrivals = sums, sums + 4 * m * n
            packed(stream)
        del held  # the kernel is queued: the activations' memory may be reused in stream order
        if acc is not out:
            out.copy_(acc)
        return out

    def _quantized(self, x) -> tuple[object, int, int]:
        """``(what holds them, codes address, scales address)`` of float ``x`` quantized by the pass."""
        if isinstance(self.quantize, CudaQuantizePass):
            return self.quantize.addresses(x)
        codes, scales, _ = self.quantize(x)
        return (codes, scales), codes.data_ptr(), scales.data_ptr()


_X_MAP, _OUT_MAP = _Params.x_map.offset, _Params.out_map.offset


def _launch(
    prep: PreparedFp8,
    x,
    act,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    tuning: Fp8Tuning | None,
    out: torch.Tensor | None,
    expert_ids: torch.Tensor | None,
    block_m: int,
) -> torch.Tensor:
    """One call of the FP8 GEMM (:class:`Fp8Launch` made for it)."""
    device = device_index(getattr(x, "codes", x).device)
    launch = Fp8Launch(prep, act, x, None if bias is None else bias.dtype, out_dtype, tuning, device, block_m)
    return launch(x, bias, out, expert_ids)
