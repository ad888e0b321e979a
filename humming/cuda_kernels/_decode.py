"""Small-M weight-only GEMM (``include/humming/decode.cuh``): heuristics, kernel specs and launch.

Configs come in the three kinds of the house style:

- layout (:class:`~humming.cuda_kernels._layout.WeightLayout`): what the prepared weights are (code
  bits, zero points, scale dtype); fixed by ``prepare_weight``.
- compute: fp32 accumulation of exact integer-times-activation products, scaled per row and 64-column
  chunk in fp32; the same for every tuning.
- tuning (:class:`DecodeTuning`): token tiles, row tiles per warp, warps, loads in flight, split-K or
  stream-K. A tuning change never changes results beyond fp32 summation order.

Stream-K (``DecodeTuning.stream_k``) runs a persistent grid whose warps each take one contiguous range
of the (row tile group, 64-column chunk) units; tiles shared by several warps are summed in an fp32
workspace with atomics, in an order that varies from call to call (results are nondeterministic in the
last bits of fp32). The workspace and its arrival counters are zero between calls (the last warp of a
tile restores them), so they are allocated once per (device, stream), zero-filled, and grown when a
larger ``M * N`` comes; concurrent calls on different streams get different workspaces. A CUDA graph
captures the workspace of its capture stream: :func:`reserve_workspace` (called by
``humming.warmup``) sets one aside for a stream that first runs the kernel while capturing;
without it, the capture allocates one from the graph's pool, and its zero fill becomes a memset node
that every replay runs (correct, a microsecond slower). Replay a graph where no call on its capture
stream runs concurrently. :func:`choose_decode_tuning` picks stream-K where it balances the last wave.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

import torch

from ..device import DeviceLimits, device_index, device_info
from ._driver import current_stream, get_kernel
from ._layout import (
    CPP_DTYPE,
    DTYPE_CODE,
    PreparedWeight,
    WeightLayout,
    aligned_rows,
    check_out,
    weight_unsupported,
    x_scale_args,
)
from .jit import KernelSpec, per_call_cache

__all__ = [
    "DECODE_CCS",
    "DECODE_MAX_M",
    "DecodeLaunch",
    "DecodeTuning",
    "candidate_tunings",
    "choose_decode_tuning",
    "decode_spec",
    "decode_unsupported",
    "default_tuning",
    "device_limits",
    "reserve_workspace",
    "run_decode",
    "stream_k_grid",
]

#: Compute capabilities the decode kernel is built for (bf16 mma.sync m16n8k16 needs sm_80).
DECODE_CCS = ((8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0))
#: Largest M the decode kernel takes (8 token tiles of 8).
DECODE_MAX_M = 64


@dataclass(frozen=True)
class DecodeTuning:
    """Speed-only knobs: token tiles of 8 (``mt``), 16-row tiles per warp (``r``), ``warps`` per block,
    cp.async pipeline ``stages`` (chunks in flight per thread), blocks along K (``splits``), and
    ``stream_k``: 0 for one block per ``r`` row tiles, else the blocks per SM of the persistent stream-K
    grid (also the kernel's ``__launch_bounds__`` minimum, so registers allow that many)."""

    mt: int
    r: int
    warps: int
    stages: int
    splits: int
    stream_k: int = 0

    def __post_init__(self) -> None:
        if self.stream_k < 0 or (self.stream_k and (self.splits != 1 or 8 % self.r)):
            raise ValueError(f"stream_k: expected 0, or > 0 with splits=1 and r dividing 8; got {self}")

    def smem_bytes(self, bits: int) -> int:
        """Dynamic shared memory of the pipeline (``Pipeline`` in decode.cuh)."""
        per_thread = self.r * (bits // 4) * 16 + self.mt * 32 + self.r * 8 + self.r * 4
        return self.stages * self.warps * 32 * per_thread


def decode_unsupported(qw, x: torch.Tensor) -> str | None:
    """``None`` when the decode kernel runs this call, else why not."""
    reason = weight_unsupported(qw, x)
    if reason is None and x.shape[0] > DECODE_MAX_M:
        reason = f"the decode kernel takes M <= {DECODE_MAX_M}, got M={x.shape[0]}"
    return reason


@per_call_cache
def choose_decode_tuning(
    m: int, n: int, k: int, bits: int, sm_count: int, smem_per_block: int, smem_per_sm: int
) -> DecodeTuning:
    """Tuning for ``out[m, n] = x[m, k] @ W^T`` with ``bits``-bit weights: a pure function of the problem
    and the device's SM count, shared memory per block (``sharedMemPerBlockOptin``) and per SM.

    Tile grid or its stream-K twin (:func:`candidate_tunings`): stream-K from two token tiles (M > 8) on
    when the tile grid takes more than one wave, and with eight token tiles always (its persistent warps
    balance the last wave); the tile grid with one token tile or a one-wave grid, where stream-K's fp32
    workspace costs more than it balances. Split-K tile grids (too few row tiles) keep split-K."""
    tiles, stream_k = candidate_tunings(m, n, k, bits, sm_count, smem_per_block, smem_per_sm)
    if tiles.mt == 1 or tiles.splits > 1:
        return tiles
    waves = (n // (16 * tiles.r)) / (stream_k.stream_k * sm_count)
    return stream_k if tiles.mt == 8 or waves > 1 else tiles


def candidate_tunings(
    m: int, n: int, k: int, bits: int, sm_count: int, smem_per_block: int, smem_per_sm: int
) -> tuple[DecodeTuning, DecodeTuning]:
    """The tile-grid tuning (split-K when there are too few row tiles) and its stream-K twin (the same
    token tiles, row tiles, warps and stages on a persistent grid)."""
    mt = 1
    while mt * 8 < m:
        mt *= 2
    # Two row tiles per warp halve the per-chunk overhead (activation fragments, pipeline bookkeeping)
    # per weight byte; one when that would leave SMs without a block, or with 8 token tiles (registers).
    r = 2 if n % 32 == 0 and n // 32 >= sm_count and mt < 8 else 1
    warps = 8
    # 3 stages keep two blocks per SM, whose interleaved loads beat deeper pipelines with one block per SM.
    stages = {1: 3, 2: 3, 4: 3, 8: 2}[mt]
    while stages > 2 and DecodeTuning(mt, r, warps, stages, 1).smem_bytes(bits) > smem_per_block:
        stages -= 1
    if DecodeTuning(mt, r, warps, stages, 1).smem_bytes(bits) > smem_per_block:
        warps = 4
    blocks = n // (16 * r)
    chunks = k // 64
    splits = 1
    if blocks < sm_count:  # too few row tiles to fill the GPU: split K across blocks
        splits = max(1, min(-(-2 * sm_count // blocks), chunks // (warps * 2)))
    tiles = DecodeTuning(mt, r, warps, stages, splits)
    stream_k = DecodeTuning(mt, r, warps, stages, 1, stream_k_blocks_per_sm(tiles, bits, smem_per_sm))
    return tiles, stream_k


def stream_k_blocks_per_sm(tuning: DecodeTuning, bits: int, smem_per_sm: int) -> int:
    """Blocks per SM of the persistent grid: as many as shared memory (1 KiB reserved per block) and the
    SM's 64 warps allow, at most 2 (the kernel is built with ``__launch_bounds__(threads, that)``, so
    registers allow them; 2 x 8 warps with 3 stages is the tile grid's best occupancy on Hopper)."""
    return max(1, min(2, smem_per_sm // (tuning.smem_bytes(bits) + 1024), 64 // tuning.warps))


@per_call_cache
def decode_spec(layout: WeightLayout, act: str, out: str, bias: str, tuning: DecodeTuning) -> KernelSpec:
    """The kernel spec for a layout, activation / output / bias dtype codes and tuning."""
    out_kernel = "f32" if tuning.splits > 1 else out
    codes = "e2m1" if layout.codes == "e2m1" else f"u{layout.bits}" + ("zp" if layout.zero < 0 else f"z{layout.zero}")
    if tuning.stream_k:
        schedule, suffix = "stream_k", f"_sk{tuning.stream_k}"
    else:
        schedule, suffix = ("split_k", "_splitk") if tuning.splits > 1 else ("tiles", "")
    name = (
        f"humming_decode_{codes}_a{act}_s{layout.scale}_o{out_kernel}_b{bias}"
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


def device_limits(device: int) -> DeviceLimits:
    """(SM count, opt-in shared memory per block, shared memory per SM) of CUDA device ``device``."""
    return device_info(device).limits


def default_tuning(m: int, n: int, k: int, bits: int, device: int) -> DecodeTuning:
    """:func:`choose_decode_tuning` with the limits of CUDA device ``device``."""
    return choose_decode_tuning(m, n, k, bits, *device_limits(device))


class _Params(ctypes.Structure):
    """Mirror of ``humming::decode::Params``."""

    _fields_ = (
        ("qweight", ctypes.c_void_p),
        ("x", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
        ("zeros", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("M", ctypes.c_int),
        ("N", ctypes.c_int),
        ("K", ctypes.c_int),
        ("x_stride", ctypes.c_int),
        ("out_stride", ctypes.c_int),
        ("groups", ctypes.c_int),
        ("group_shift", ctypes.c_int),
        ("chunks_per_split", ctypes.c_int),
        ("tile_group", ctypes.c_int),
        ("sums", ctypes.c_void_p),
        ("arrivals", ctypes.c_void_p),
        ("total_warps", ctypes.c_int),
        ("x_scale", ctypes.c_void_p),
        ("x_scale_stride", ctypes.c_int),
    )


def stream_k_grid(n: int, k: int, tuning: DecodeTuning, sm_count: int) -> tuple[int, int]:
    """(blocks, warps) of the persistent grid: ``stream_k`` blocks per SM, fewer when there are fewer
    work units (``n / 16 / r`` row tile groups x ``k / 64`` chunks) than warps."""
    units = (n // (16 * tuning.r)) * (k // 64)
    blocks = min(tuning.stream_k * sm_count, -(-units // tuning.warps))
    return blocks, blocks * tuning.warps


class _Workspaces:
    """The stream-K workspaces: one zero-filled int32 buffer per (device, stream) holding ``M * N`` fp32
    sums then the arrival counters, plus per device one spare that a stream first seen during CUDA
    graph capture takes (without one, a capture takes a temporary zeroed by a captured memset on every
    replay). A buffer a graph captured is never freed."""

    def __init__(self) -> None:
        self.by_stream: dict[tuple[int, int], torch.Tensor] = {}
        self.spare: dict[int, torch.Tensor] = {}
        self.captured: list[torch.Tensor] = []
        self.lock = threading.Lock()

    def get(self, numel: int, device: int, stream: int) -> torch.Tensor:
        """The workspace of at least ``numel`` words for ``stream`` (a ``cudaStream_t``) on ``device``."""
        key = (device, stream)
        with self.lock:
            buf = self.by_stream.get(key)
            capturing = torch.cuda.is_current_stream_capturing()
            if buf is None or buf.numel() < numel:
                if capturing:
                    spare = self.spare.get(device)
                    if spare is None or spare.numel() < numel:
                        # A temporary from the graph's pool, zeroed by a memset node on every replay; not
                        # kept for eager calls, which would find it unzeroed before the first replay.
                        return torch.zeros(numel, dtype=torch.int32, device=f"cuda:{device}")
                    del self.spare[device]
                    new = spare
                else:
                    size = max(numel, 2 * buf.numel()) if buf is not None else numel
                    new = torch.zeros(size, dtype=torch.int32, device=f"cuda:{device}")
                # A replaced buffer stays alive in self.captured if a graph uses it; otherwise it is freed
                # to the caching allocator on the stream it was allocated and used on, so reuse is ordered.
                buf = self.by_stream[key] = new
            if capturing and not any(buf is t for t in self.captured):
                self.captured.append(buf)
            return buf

    def reserve(self, numel: int, device: int) -> None:
        stream = torch.cuda.current_stream(device)
        self.get(numel, device, stream.cuda_stream)
        with self.lock:
            spare = self.spare.get(device)
            if spare is None or spare.numel() < numel:
                self.spare[device] = torch.zeros(numel, dtype=torch.int32, device=f"cuda:{device}")
                stream.synchronize()  # zeroed before a capture on another stream uses it


_WORKSPACES = _Workspaces()


def _workspace_words(m: int, n: int, tuning: DecodeTuning) -> int:
    return m * n + n // (16 * tuning.r)


def reserve_workspace(m: int, n: int, tuning: DecodeTuning, device: int) -> None:
    """Allocate, outside graph capture, the stream-K workspace a call ``[m, n]`` with ``tuning`` needs, for
    the current stream and for one CUDA graph capture stream (no-op for the tile grid)."""
    if tuning.stream_k:
        _WORKSPACES.reserve(_workspace_words(m, n, tuning), device)


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
    ) -> None:
        n, k = prep.n, prep.k
        if tuning is None:
            tuning = default_tuning(m, n, k, prep.layout.bits, device)
        elif n % (16 * tuning.r):
            raise ValueError(f"tuning: r={tuning.r} row tiles per warp must divide N / 16 = {n // 16}")
        bias_code = DTYPE_CODE[bias_dtype if bias_dtype is not None else x_dtype]
        spec = decode_spec(prep.layout, DTYPE_CODE[x_dtype], DTYPE_CODE[out_dtype], bias_code, tuning)
        self.kernel = get_kernel(spec, device)
        self.prep = prep  # the template holds its tensors' addresses
        self.m, self.n, self.out_dtype, self.device = m, n, out_dtype, device
        self.torch_device = torch.device("cuda", device)
        self.split = tuning.splits > 1
        self.smem = tuning.smem_bytes(prep.layout.bits)
        self.grid = (n // (16 * tuning.r), tuning.splits, 1)
        self.workspace_words = 0
        total_warps = 0
        if tuning.stream_k:
            blocks, total_warps = stream_k_grid(n, k, tuning, device_limits(device)[0])
            self.grid = (blocks, 1, 1)
            self.workspace_words = _workspace_words(m, n, tuning)
        chunks = k // 64
        self.template = bytes(
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
            )
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
        m, n = self.m, self.n
        result = out
        if out is not None:
            check_out(out, m, n, self.out_dtype)
        if self.split:
            acc = torch.zeros((m, n), dtype=torch.float32, device=self.torch_device)
        elif out is None:
            acc = result = torch.empty((m, n), dtype=self.out_dtype, device=self.torch_device)
        else:
            acc = out
        stream = current_stream(self.device)
        params = _Params.from_buffer_copy(self.template)
        params.x = x.data_ptr()
        params.out = acc.data_ptr()
        if acc is out:
            params.out_stride = out.stride(0)
        if bias is not None:
            params.bias = bias.data_ptr()
        if self.workspace_words:
            sums = _WORKSPACES.get(self.workspace_words, self.device, stream).data_ptr()
            params.sums, params.arrivals = sums, sums + 4 * m * n
        if x_scale is not None:
            params.x_scale, params.x_scale_stride = x_scale_args(x_scale, m)
        self.kernel.launch(self.grid, self.smem, params, stream)
        if not self.split:
            return result
        if result is None:
            return acc.to(self.out_dtype)
        return result.copy_(acc)


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
