"""The small-M weight-only GEMM (``include/humming/decode.cuh``; :mod:`.wna16_decode` is its entry point):
kernel specs, the stream-K workspaces and the launch.

Stream-K (``DecodeTuning.stream_k``) runs a persistent grid whose warps each take one contiguous range
of the (row tile group, 64-column chunk) units; split-K (``DecodeTuning.splits``) a tile grid whose
blocks each take one range of K. Tiles shared by several warps or blocks are summed with atomics, in an
order that varies from call to call (results are nondeterministic in the last bits of fp32): in an fp32
workspace read back by the tile's last warp or block (stream-K, and split-K with one token tile or ``read_back``:
``DecodeTuning.reads_back``), else in a zeroed fp32 output rounded by a copy. The workspace and its
arrival counters are zero between calls (the last warp or block of a tile restores them), so they are
allocated once per (device, stream), zero-filled, and grown when a
larger ``M * N`` comes; concurrent calls on different streams get different workspaces. A CUDA graph
captures the workspace of its capture stream: :func:`reserve_workspace` (called by
``humming.warmup``) sets one aside for a stream that first runs the kernel while capturing;
without it, the capture allocates one from the graph's pool, and its zero fill becomes a memset node
that every replay runs (correct, a microsecond slower). Replay a graph where no call on its capture
stream runs concurrently.
"""

from __future__ import annotations

import ctypes

import torch

from ..device import device_index, device_limits
from ..workspaces import WORKSPACES
from ._decode_tuning import DecodeTuning, default_tuning
from ._driver import PackedLaunch, current_stream, fields, get_kernel
from ._layout import (
    CPP_DTYPE,
    DTYPE_CODE,
    GATED_ACTS,
    PreparedWeight,
    WeightLayout,
    aligned_rows,
    check_out,
    x_scale_args,
)
from .jit import KernelSpec, per_call_cache

__all__ = [
    "DECODE_CCS",
    "DECODE_MAX_M",
    "DecodeLaunch",
    "decode_call_spec",
    "decode_spec",
    "reserve_workspace",
    "run_decode",
    "stream_k_grid",
]

#: Compute capabilities the decode kernel is built for (bf16 mma.sync m16n8k16 needs sm_80).
DECODE_CCS = ((8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0))
#: Largest M the decode kernel takes (8 token tiles of 8).
DECODE_MAX_M = 64


@per_call_cache
def decode_spec(
    layout: WeightLayout,
    act: str,
    out: str,
    bias: str,
    tuning: DecodeTuning,
    grouped: bool = False,
    gated: str | None = None,
) -> KernelSpec:
    """The kernel spec for a layout, activation / output / bias dtype codes and tuning; ``grouped``: the MoE
    variant (:mod:`.grouped_decode`), ``gated`` (a :data:`GATED_ACTS` name) its fused activation of w13."""
    if (grouped or gated) and (tuning.splits > 1 or tuning.stream_k or (gated and (not grouped or out == "f32"))):
        raise ValueError(f"the grouped decode kernel runs the tile grid with a 16-bit gated output, got {tuning}")
    if gated is not None and gated not in GATED_ACTS:
        raise ValueError(f"gated: expected one of {sorted(GATED_ACTS)}, got {gated!r}")
    out_kernel = "f32" if tuning.splits > 1 and not tuning.reads_back else out
    if tuning.stream_k:
        schedule, suffix = "stream_k", f"_sk{tuning.stream_k}"
    elif tuning.reads_back:
        schedule, suffix = "split_k_read_back", "_splitk_rb"
    else:
        schedule, suffix = ("split_k", "_splitk") if tuning.splits > 1 else ("tiles", "")
    if grouped:
        suffix += "_grouped" + (f"_{gated}" if gated else "")
    name = (
        f"humming_decode_{layout.tag}_a{act}_s{layout.scale}_o{out_kernel}_b{bias}"
        f"_mt{tuning.mt}_r{tuning.r}_w{tuning.warps}_s{tuning.stages}{suffix}"
    )
    args = ", ".join(
        (
            CPP_DTYPE[act],
            str(layout.bits),
            "true" if layout.codes == "e2m1" else "false",
            str(layout.zero),
            CPP_DTYPE[layout.scale],
            CPP_DTYPE[out_kernel],
            CPP_DTYPE[bias],
            str(tuning.mt),
            str(tuning.r),
            str(tuning.warps),
            str(tuning.stages),
            f"humming::decode::Schedule::{schedule}",
            "true" if grouped else "false",
            str(GATED_ACTS.get(gated, 0)),
        )
    )
    return KernelSpec(
        family="decode",
        name=name,
        header="humming/decode.cuh",
        entry=f"humming::decode::run<{args}>",
        params="humming::decode::Params",
        threads=32 * tuning.warps,
        ccs=DECODE_CCS,
        min_blocks=max(1, tuning.stream_k),
    )


class _Params(ctypes.Structure):
    """Mirror of ``humming::decode::Params``."""

    _fields_ = (
        *fields(ctypes.c_void_p, "qweight x scales zeros bias out"),
        *fields(ctypes.c_int, "M N K x_stride out_stride groups group_shift chunks_per_split tile_group"),
        *fields(ctypes.c_void_p, "sums arrivals"),
        *fields(ctypes.c_int, "total_warps"),
        *fields(ctypes.c_void_p, "x_scale"),
        *fields(ctypes.c_int, "x_scale_stride"),
        *fields(ctypes.c_void_p, "expert_ids rows"),
        *fields(ctypes.c_int, "block_m"),
        *fields(ctypes.c_float, "act_alpha act_limit"),
        *fields(ctypes.c_int, "gate_up_interleaved num_experts"),
    )


def stream_k_grid(n: int, k: int, tuning: DecodeTuning, sm_count: int) -> tuple[int, int]:
    """(blocks, warps) of the persistent grid: ``stream_k`` blocks per SM, fewer when there are fewer
    work units (``n / 16 / r`` row tile groups x ``k / 64`` chunks) than warps."""
    units = (n // (16 * tuning.r)) * (k // 64)
    blocks = min(tuning.stream_k * sm_count, -(-units // tuning.warps))
    return blocks, blocks * tuning.warps


def _workspace_words(m: int, n: int, tuning: DecodeTuning) -> int:
    return m * n + n // (16 * tuning.r)


def reserve_workspace(m: int, n: int, tuning: DecodeTuning, device: int) -> None:
    """Allocate, outside graph capture, the stream-K or split-K workspace a call ``[m, n]`` with ``tuning``
    needs, for the current stream and for one CUDA graph capture stream (no-op for the tile grid)."""
    if tuning.stream_k or tuning.reads_back:
        WORKSPACES.reserve(_workspace_words(m, n, tuning), device)


def decode_call_spec(
    prep: PreparedWeight, x: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype, tuning: DecodeTuning
) -> KernelSpec:
    bias_code = DTYPE_CODE[bias.dtype] if bias is not None else DTYPE_CODE[x.dtype]
    return decode_spec(prep.layout, DTYPE_CODE[x.dtype], DTYPE_CODE[out_dtype], bias_code, tuning)


class DecodeLaunch:
    """One call shape of the decode kernel made ready: ``x [m, K]`` of ``x_dtype`` with rows ``x_stride``
    elements apart (16-byte aligned, unit column stride), the bias dtype (``None``: no bias), the output
    dtype and the tuning (``None``: :func:`default_tuning`). It holds the loaded kernel, the grid, the shared
    memory and the parameter struct with everything but the addresses of the call's tensors, so that a call
    only allocates the output and launches on the current stream. Calls must match the shape it was made for.
    ``programmatic``: launched right behind the call's activation pass (:class:`~._driver.PackedLaunch`), taken
    for one token tile (M <= 8) only: with two the programmatic launch measured slower on a one-wave grid
    (bench/results/h100/pdl_2026-12-07/pdl_ab.json).
    """

    def __init__(
        self,
        prep: PreparedWeight,
        m: int,
        x_dtype: torch.dtype,
        x_stride: int,
        bias_dtype: torch.dtype | None,
        out_dtype: torch.dtype,
        tuning: DecodeTuning | None,
        device: int,
        programmatic: bool = False,
    ) -> None:
        n, k = prep.n, prep.k
        if tuning is None:
            tuning = default_tuning(m, n, k, prep.layout.bits, device)
        elif n % (16 * tuning.r):
            raise ValueError(f"tuning: r={tuning.r} row tiles per warp must divide N / 16 = {n // 16}")
        bias_code = DTYPE_CODE[bias_dtype if bias_dtype is not None else x_dtype]
        spec = decode_spec(prep.layout, DTYPE_CODE[x_dtype], DTYPE_CODE[out_dtype], bias_code, tuning)
        self.kernel = get_kernel(spec, device)
        self.prep = prep  # the parameter struct holds its tensors' addresses
        self.m, self.n, self.out_dtype, self.device = m, n, out_dtype, device
        self.torch_device = torch.device("cuda", device)
        self.smem = tuning.smem_bytes(prep.layout.bits)
        self.grid = (n // (16 * tuning.r), tuning.splits, 1)
        self.fp32_output = tuning.splits > 1 and not tuning.reads_back
        self.workspace_words = _workspace_words(m, n, tuning) if tuning.reads_back else 0
        total_warps = 0
        if tuning.stream_k:
            blocks, total_warps = stream_k_grid(n, k, tuning, device_limits(device).sm_count)
            self.grid = (blocks, 1, 1)
            self.workspace_words = _workspace_words(m, n, tuning)
        chunks = k // 64
        self.packed = PackedLaunch(
            self.kernel,
            self.grid,
            self.smem,
            _Params(
                prep.qweight.data_ptr(),
                None,
                prep.scales.data_ptr(),
                prep.zeros.data_ptr() if prep.zeros is not None else None,
                None,
                None,
                m,
                n,
                k,
                x_stride,
                n,
                prep.groups,
                31 if prep.groups == 1 else prep.chunks_per_group.bit_length() - 1,
                -(-chunks // tuning.splits),
                prep.tile_group,
                None,
                None,
                total_warps,
                None,
                0,
            ),
            programmatic and tuning.mt == 1,
        )

    def __call__(
        self,
        x: torch.Tensor,
        bias: torch.Tensor | None,
        out: torch.Tensor | None = None,
        x_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x @ W^T * x_scale + bias`` into ``out`` (``[m, N]`` of the output dtype, unit column stride) or a
        new tensor."""
        return self.at(x.data_ptr(), bias, out, x_scale_args(x_scale, self.m))

    def at(
        self, x: int, bias: torch.Tensor | None, out: torch.Tensor | None, x_scale: tuple[int | None, int]
    ) -> torch.Tensor:
        """The call of :meth:`__call__` with ``x`` and its scales given by address: ``x`` the address of the
        rows the launch was made for, ``x_scale`` ``(address, stride)`` as :func:`x_scale_args` gives them (an
        activation pass's buffer, which holds both, then costs one allocation)."""
        m, n = self.m, self.n
        if out is not None:
            check_out(out, m, n, self.out_dtype)
        else:
            out = torch.empty((m, n), dtype=self.out_dtype, device=self.torch_device)
        acc = torch.zeros((m, n), dtype=torch.float32, device=self.torch_device) if self.fp32_output else out
        stream = current_stream(self.device)
        packed = self.packed
        with packed.lock:
            params = packed.params
            params.x = x
            params.out, params.out_stride = acc.data_ptr(), acc.stride(0)
            params.bias = None if bias is None else bias.data_ptr()
            if self.workspace_words:
                sums = WORKSPACES.get(self.workspace_words, self.device, stream).data_ptr()
                params.sums, params.arrivals = sums, sums + 4 * m * n
            params.x_scale, params.x_scale_stride = x_scale
            packed(stream)
        return out.copy_(acc) if self.fp32_output else out


def run_decode(
    prep: PreparedWeight,
    x: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    tuning: DecodeTuning | None = None,
    out: torch.Tensor | None = None,
    x_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x [M, K] @ W^T * x_scale + bias`` -> ``[M, N]`` of ``out_dtype`` on the current stream.

    ``out``: an optional ``[M, N]`` tensor of ``out_dtype`` (unit column stride) to write into. ``x_scale``:
    fp32 per-token ``[M]`` or per-tensor ``[1]`` scales when ``x`` holds quantized activations' values, or
    ``None``. Split-K and stream-K tunings sum partial results with fp32 atomics, in an order that varies
    between calls.
    """
    device = device_index(x.device)
    x = aligned_rows(x)
    bias_dtype = None if bias is None else bias.dtype
    launch = DecodeLaunch(prep, x.shape[0], x.dtype, x.stride(0), bias_dtype, out_dtype, tuning, device)
    return launch(x, bias, out, x_scale)
