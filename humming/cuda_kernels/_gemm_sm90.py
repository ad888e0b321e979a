"""Hopper weight-only GEMM for large M (``include/humming/gemm_sm90.cuh``; :mod:`.wna16_sm90` is its entry
point): tuning, specs, checks and launch.

Layout: the shared fragment layout (``_layout``): tile groups of 8 (N % 128 == 0), or of 1 (any N % 16 == 0:
each 128-row block is copied as 8 separate 16-row tiles, the last one of each expert partly). Compute: w =
(q - z) * s rounded once to the activation dtype (MXFP4, bf16 only: e2m1 * 2^e, exact), bf16/fp16 wgmma
with fp32 accumulation. Tuning: tokens per block tile (the block tile is 128 weight rows x ``bm`` tokens)
and pipeline ``stages``.

The grouped (MoE) variant (``grouped=True``, :func:`run_grouped_gemm`) is the same kernel with a
compile-time flag: x rows come grouped by expert in ``block_m``-row segments (the contiguous grouped
layout of ``humming.moe.moe_align``), each token tile reads its segment's expert id, skips the tile
when it is -1, and offsets its weight, scale, zero-point and bias tiles to that expert. With
``gather=True`` it reads grouped row ``r`` as token ``rows[r]`` of the ``[T, K]`` tokens (zeros for -1)
in place, with cp.async instead of the TMA: no grouped copy of the tokens.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, replace

import torch

from ..device import device_index, device_limits
from ..workspaces import WORKSPACES
from ._driver import PackedLaunch, current_stream, fields, get_kernel, rows_tensor_map, tensor_map
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
    "GEMM_CCS",
    "GEMM_MIN_M",
    "GROUPED_BMS",
    "GemmLaunch",
    "GemmTuning",
    "default_gemm_tuning",
    "default_grouped_tuning",
    "gemm_spec",
    "gemm_unsupported",
    "grouped_launch",
    "grouped_unsupported",
    "reserve_gemm_workspace",
    "run_gemm",
    "run_grouped_gemm",
    "tile_time",
]

GEMM_CCS = ((9, 0),)
#: The GEMM takes M above this: below, the decode kernel's 8-token tiles waste less of a tile (the
#: dispatcher's tables choose between the two where both run).
GEMM_MIN_M = 32
#: Token tiles of the grouped kernel (wgmma N: _wgmma_source.WIDTHS), largest first: each must divide
#: ``block_m``; routing blocks sized to the tokens per expert (144 for 256 +- 16) pad less.
GROUPED_BMS = tuple(range(256, 0, -16))


@dataclass(frozen=True)
class GemmTuning:
    """Speed-only knobs: tokens per block tile (``bm``: 128 or 256 dense; a multiple of 16 up to 256 grouped),
    pipeline ``stages`` (chunks of 64 columns in flight), ``blocks`` per SM (1, or 2 for tiles of at
    most 64 tokens: fewer registers per consumer, two blocks' copies in flight) and ``splits`` of K (dense
    only: each tile's K in that many blocks, summed in an fp32 workspace with atomics). ``persistent``: one
    grid of ``blocks`` per SM that walks the tiles (a block's pipeline runs on from one tile into the next,
    and the grouped kernel's unused segments cost a skip rather than a block launch); not with splits.
    ``arrive_lag`` (the gathering kernel only, at most ``stages - 2``): 0, each producer thread's row copies
    arrive on their chunk's barrier as they land and the consumers fence the chunk for wgmma; L > 0, the
    producer threads wait for the copies of the chunk L steps back, fence them and arrive. The bound: the
    producer reuses chunk s - stages's stage for chunk s once the consumers release it, which they do after
    acquiring chunk s - stages + 1 (its dequantization runs before the wait for chunk s - stages); that chunk
    has arrived only once the producer has issued chunk s - stages + 1 + L, so L = stages - 1 deadlocks."""

    bm: int
    stages: int
    blocks: int = 1
    splits: int = 1
    persistent: bool = False
    arrive_lag: int = 0

    def __post_init__(self) -> None:
        blocks_ok = self.blocks == 1 or (self.blocks == 2 and self.bm <= 64)
        if self.bm not in GROUPED_BMS or self.stages < 1 or not blocks_ok or self.splits < 1:
            raise ValueError(
                f"tuning: bm a multiple of 16 up to 256, stages >= 1, blocks 1 (or 2 with bm <= 64), splits >= 1, "
                f"got {self}"
            )
        if self.persistent and self.splits > 1:
            raise ValueError(f"tuning: a persistent grid does not split K, got {self}")
        if not 0 <= self.arrive_lag <= max(0, self.stages - 2):
            raise ValueError(f"tuning: arrive_lag in [0, stages - 2] (stages - 1 deadlocks), got {self}")

    def smem_bytes(self, layout: WeightLayout) -> int:
        """Dynamic shared memory (``SmemLayout::kTotal`` in gemm_sm90.cuh) plus 1 KiB alignment slack."""
        four_byte_scales = layout.scale in ("f32", "bf16_halves", "f16_halves")  # halves: two per row
        per_stage = self.bm * 128 + 128 * 64 * layout.bits // 8 + 128 * (4 if four_byte_scales else 2)
        per_stage += 128 * 2 if layout.zero < 0 else 0
        return self.stages * (per_stage + 16) + (16 if self.splits > 1 else 0) + 1024


#: Time of one 128-row tile over 1,000 K columns (us) by token tile, alone on its SM (``_TILE_US``) and
#: two at a time on one SM with two blocks per SM (``_PAIR_US``): measured on the H200 over the standard
#: shapes (bench/results/h200/tuning.json, bench/tools/tuning_sweep.py).
_TILE_US = {32: 6.0, 64: 6.3, 128: 7.1, 256: 10.5}
_PAIR_US = {32: 8.1, 64: 9.1}
#: (tokens per tile, blocks per SM) :func:`default_gemm_tuning` chooses among.
_DENSE_TILES = ((32, 2), (64, 2), (64, 1), (128, 1), (256, 1))
_MAX_STAGES = 8
#: K splits :func:`default_gemm_tuning` considers: up to 8, each split at least 16 chunks (1,024 columns).
_MAX_SPLITS = 8
_MIN_SPLIT_CHUNKS = 16
#: Time per million fp32 words of the split-K reduction: each of the ``splits`` blocks of a tile red.adds
#: its sums into the workspace and the last one reads the totals back, ``(splits + 1) * M * N`` words
#: through L2 (fitted on the H200's split runs, bench/results/h200/linear_splitk.json).
_REDUCE_US_PER_MWORD = 4.0


def tile_time(m: int, n: int, bm: int, blocks: int, sm_count: int, splits: int = 1) -> float:
    """The modelled time (us) of the dense GEMM's tiles per 1,000 K columns: the blocks (128 rows x ``bm``
    tokens x 1 / ``splits`` of K) spread over the SMs, each SM running its share one at a time, or two at
    a time with two blocks per SM."""
    n_blocks = -(-n // 128)
    per_sm = -(-n_blocks * -(-m // bm) * splits // sm_count)
    if blocks == 1:
        return per_sm * _TILE_US[bm] / splits
    return (per_sm // 2 * _PAIR_US[bm] + per_sm % 2 * _TILE_US[bm]) / splits


def gemm_time(m: int, n: int, k: int, bm: int, blocks: int, sm_count: int, splits: int = 1) -> float:
    """The modelled time (us) of the dense GEMM: its tiles over all of K, plus the split-K reduction."""
    reduction = _REDUCE_US_PER_MWORD * (splits + 1) * m * n / 1e6 if splits > 1 else 0.0
    return tile_time(m, n, bm, blocks, sm_count, splits) * k / 1000 + reduction


@per_call_cache
def default_gemm_tuning(
    m: int, n: int, k: int, layout: WeightLayout, limits, max_splits: int = _MAX_SPLITS
) -> GemmTuning:
    """The token tile, blocks per SM and K splits of least modelled time (:func:`gemm_time`: small tiles
    spread a small grid over every SM, two blocks per SM hide each other's copies, 256-token tiles halve
    the dequantization per FLOP once the grid is full, K splits fill the SMs that a small grid leaves idle
    at the cost of their reduction), the smaller tile, fewer blocks and fewer splits on a tie; then as many
    stages (up to 8) as the block's share of shared memory holds. Tiles of fewer than 128 tokens are
    candidates up to M = 4 x their size, the range the model was fitted on. ``max_splits``: 1 for the tile
    model alone."""
    tiles = [t for t in _DENSE_TILES if t[0] >= 128 or 4 * t[0] >= m]  # small tiles: measured up to M = 4 bm
    most = min(max_splits, max(1, k // 64 // _MIN_SPLIT_CHUNKS))
    candidates = [(bm, blocks, splits) for bm, blocks in tiles for splits in range(1, most + 1)]

    def cost(c: tuple[int, int, int]) -> tuple:
        bm, blocks, splits = c
        modelled = gemm_time(m, n, k, bm, blocks, limits.sm_count, splits)
        return round(modelled, 6), bm, blocks, splits  # rounded: equal models tie, whatever the float noise

    bm, blocks, splits = min(candidates, key=cost)
    return _with_stages(bm, blocks, layout, limits.smem_per_block, _MAX_STAGES, splits)


def _with_stages(
    bm: int, blocks: int, layout: WeightLayout, smem_per_block: int, most: int, splits: int = 1
) -> GemmTuning:
    """``GemmTuning(bm, stages, blocks, splits)`` with as many stages (2 to ``most``) as fit the block's share
    of shared memory (the SM reserves 1 KiB per block)."""
    budget = smem_per_block // blocks - 1024 * (blocks - 1)
    stages = most
    while stages > 2 and GemmTuning(bm, stages, blocks, splits).smem_bytes(layout) > budget:
        stages -= 1
    return GemmTuning(bm, stages, blocks, splits)


def default_grouped_tuning(block_m: int, rows: int, num_experts: int, layout: WeightLayout, smem_per_block: int):
    """The largest token tile that divides ``block_m`` (one weight pass per segment: the kernel cannot tell
    padding rows from used ones), 256 only when the ``rows`` (grouped rows, padding included) average
    512 per expert, as in the dense choice. Tiles of up to 64 tokens run two blocks per SM (their
    consumers need few registers; the second block hides the first one's copy latency), each with up to 8
    stages in half the shared memory; larger tiles one block with as many stages (up to 8) as fit: more
    stages measured faster at every prefill point of bench/results/h200/grouped_gemm.json. The grid is
    persistent: the rows are sized for the worst case of the routing, and most segments of a decode call
    are unused (a skip inside a block, where a block of their own would be launched and retired)."""
    bm = next(b for b in GROUPED_BMS if block_m % b == 0 and (b < 256 or rows >= 512 * num_experts))
    blocks = 2 if bm <= 64 else 1
    return replace(_with_stages(bm, blocks, layout, smem_per_block, _MAX_STAGES), persistent=True)


def gemm_unsupported(qw, x: torch.Tensor, cc: tuple[int, int]) -> str | None:
    """``None`` when the sm_90a GEMM runs this call (given the checks of ``decode_unsupported`` pass)."""
    if cc not in GEMM_CCS:
        return f"the large-M CUDA GEMM needs compute capability 9.0 (wgmma, TMA), got {cc}"
    if qw.format.name == "e2m1" and x.dtype != torch.bfloat16:
        return f"the large-M CUDA GEMM takes MXFP4 weights with bfloat16 activations, not {x.dtype}"
    if x.stride(0) % 8 or x.data_ptr() % 16:
        return "the large-M CUDA GEMM needs 16-byte aligned activation rows (TMA)"
    return None


def grouped_unsupported(qw, x: torch.Tensor, block_m: int, cc: tuple[int, int]) -> str | None:
    """``None`` when the grouped sm_90a GEMM runs this call (given ``weight_unsupported`` passes)."""
    reason = gemm_unsupported(qw, x, cc)
    if reason is not None:
        return reason.replace("large-M", "grouped")
    if block_m <= 0 or block_m % 16:
        return f"the grouped CUDA GEMM needs block_m % 16 == 0 (token tiles of 16 to 256), got {block_m}"
    return None


@per_call_cache
def gemm_spec(
    layout: WeightLayout,
    act: str,
    out: str,
    bias: str,
    tuning: GemmTuning,
    grouped: bool = False,
    gather: bool = False,
    gated: str | None = None,
    tile_group: int = 8,
) -> KernelSpec:
    """The sm_90a GEMM for one layout, dtypes and tuning; ``grouped`` (MoE), ``gather`` (token rows through
    an index) and ``gated`` (a :data:`GATED_ACTS` name: the fused activation of gate-up rows) variants;
    ``tile_group`` the prepared weight's (:func:`~._layout.tile_group`: 1 where N % 128 != 0)."""
    if gather and not grouped:
        raise ValueError("gather: the gathering GEMM is a grouped variant (grouped=True)")
    if gated is not None and (not grouped or gated not in GATED_ACTS or out == "f32"):
        raise ValueError(
            f"gated: a grouped variant with a 16-bit output and an activation in {sorted(GATED_ACTS)}, got "
            f"gated={gated!r}, grouped={grouped}, out={out}"
        )
    if tile_group not in (1, 8) or (tile_group == 1 and gated is not None):
        raise ValueError(f"tile_group: 8, or 1 without a gated epilogue, got {tile_group} (gated={gated!r})")
    if grouped and tuning.splits > 1:
        raise ValueError(f"tuning: the grouped GEMM does not split K, got splits={tuning.splits}")
    if tuning.arrive_lag and not gather:
        raise ValueError(f"tuning: arrive_lag is the gathering kernel's, got {tuning.arrive_lag} without gather")
    kind = "grouped_gather_" if gather else "grouped_" if grouped else ""
    blocks = f"_x{tuning.blocks}" if tuning.blocks > 1 else ""
    split_k = "_splitk" if tuning.splits > 1 else ""
    persistent = "_p" if tuning.persistent else ""
    activation = f"_{gated}" if gated is not None else ""
    lag = f"_lag{tuning.arrive_lag}" if tuning.arrive_lag else ""
    ragged = "_tg1" if tile_group == 1 else ""
    name = (
        f"humming_gemm_sm90_{kind}{layout.tag}_a{act}_s{layout.scale}_o{out}_b{bias}"
        f"_bm{tuning.bm}_s{tuning.stages}{blocks}{split_k}{persistent}{activation}{lag}{ragged}"
    )
    args = ", ".join(
        (
            CPP_DTYPE[act],
            str(layout.bits),
            str(layout.zero),
            CPP_DTYPE[layout.scale],
            CPP_DTYPE[out],
            CPP_DTYPE[bias],
            str(tuning.bm),
            str(tuning.stages),
            "true" if grouped else "false",
            "true" if gather else "false",
            "true" if tuning.splits > 1 else "false",
            str(tuning.blocks),
            "true" if tuning.persistent else "false",
            str(GATED_ACTS.get(gated, 0)),
            str(tuning.arrive_lag),
            str(tile_group),
        )
    )
    return KernelSpec(
        family="gemm_sm90",
        name=name,
        header="humming/gemm_sm90.cuh",
        entry=f"humming::gemm_sm90::run<{args}>",
        params="humming::gemm_sm90::Params",
        threads=384,
        ccs=GEMM_CCS,
        min_blocks=tuning.blocks,
        arch_specific=True,
    )


def gemm_call_spec(
    prep: PreparedWeight,
    x: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    tuning: GemmTuning,
    grouped: bool = False,
    gather: bool = False,
    gated: str | None = None,
) -> KernelSpec:
    bias_code = DTYPE_CODE[bias.dtype] if bias is not None else DTYPE_CODE[x.dtype]
    codes = DTYPE_CODE[x.dtype], DTYPE_CODE[out_dtype], bias_code
    return gemm_spec(prep.layout, *codes, tuning, grouped, gather, gated, prep.tile_group)


class _Params(ctypes.Structure):
    """Mirror of ``humming::gemm_sm90::Params`` (the tensor maps first; 660 bytes of fields that alignas(64)
    pads to 704, all of which the launch copies)."""

    _fields_ = (
        *fields(ctypes.c_uint8 * 128, "x_map w_map s_map z_map"),
        *fields(ctypes.c_void_p, "qweight scales zeros bias out expert_ids"),
        *fields(ctypes.c_int, "M N K out_stride groups chunks_per_group block_m"),
        *fields(ctypes.c_void_p, "x_scale"),
        *fields(ctypes.c_int, "x_scale_stride"),
        *fields(ctypes.c_void_p, "x rows"),
        *fields(ctypes.c_int, "x_stride splits"),
        *fields(ctypes.c_void_p, "sums arrivals"),
        *fields(ctypes.c_float, "act_alpha act_limit"),
        *fields(ctypes.c_int, "gate_up_interleaved"),
        ("_pad", ctypes.c_uint8 * 44),
    )


def run_gemm(
    prep: PreparedWeight,
    x: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    tuning: GemmTuning | None = None,
    out: torch.Tensor | None = None,
    x_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x [M, K] @ W^T * x_scale + bias`` -> ``[M, N]`` of ``out_dtype`` on the current stream (sm_90a);
    ``x_scale``: fp32 per-token ``[M]`` or per-tensor ``[1]`` scales of quantized activations, or ``None``."""
    x = aligned_rows(x)
    bias_dtype = None if bias is None else bias.dtype
    launch = GemmLaunch(prep, x.shape[0], x.dtype, x.stride(0), bias_dtype, out_dtype, tuning, _device_index(x))
    return launch(x, bias, out, x_scale=x_scale)


def run_grouped_gemm(
    prep: PreparedWeight,
    x: torch.Tensor,
    expert_ids: torch.Tensor,
    block_m: int,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    tuning: GemmTuning | None = None,
    out: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
    gated=None,
    kept=None,
) -> torch.Tensor:
    """Grouped ``x [M_pad, K]`` times the expert-stacked ``prep`` -> ``[M_pad, N]`` of ``out_dtype`` (sm_90a).

    Row ``r`` uses expert ``expert_ids[r // block_m]`` (int32, contiguous, ``M_pad // block_m`` entries);
    rows of segments whose id is -1 are not written. ``bias`` is ``[E, N]`` contiguous or ``None``.
    ``rows``: int32 ``[M_pad]`` (contiguous), the token of each grouped row (-1: a padding row, read as
    zeros); ``x`` is then the ``[T, K]`` tokens, read in place by the gathering variant. ``gated``: a
    ``humming.reference.moe_layer.Activation``; ``prep`` then holds w13's rows in gate-up order
    (:func:`~._layout.gate_up_rows`) and the result is the activation, ``[M_pad, N / 2]``. ``kept``: where
    the launch made ready for this kind of call is kept, ``kept(key, make) -> GemmLaunch`` (the caller's
    per-weight store), or ``None`` (made for this call).
    """
    if rows is not None and x.shape[0] == 0:  # no token to read: every grouped row is padding
        x, rows = x.new_zeros(rows.shape[0], x.shape[1]), None
    m = x.shape[0] if rows is None else rows.shape[0]
    if tuning is not None and block_m % tuning.bm:
        raise ValueError(f"tuning: the token tile bm={tuning.bm} must divide block_m={block_m}")
    x = aligned_rows(x)
    bias_dtype = None if bias is None else bias.dtype
    device = _device_index(x)
    gather = rows is not None

    def make() -> GemmLaunch:
        return grouped_launch(
            prep, m, x.dtype, x.stride(0), bias_dtype, out_dtype, tuning, device, block_m, gather, gated
        )

    key = (m, x.dtype, x.stride(0), bias_dtype, out_dtype, tuning, device, block_m, gather, gated)
    launch = make() if kept is None else kept(key, make)
    return launch(x, bias, out, expert_ids, rows=rows)


def grouped_launch(
    prep, m, x_dtype, x_stride, bias_dtype, out_dtype, tuning, device, block_m, gather, gated, programmatic=True
):
    """The :class:`GemmLaunch` of a grouped call of ``m`` grouped rows (``tuning`` None: the default one),
    launched programmatically (the grouped kernel waits for the kernel before it first) unless ``programmatic``
    is false."""
    if tuning is None:
        smem = device_limits(device).smem_per_block
        tuning = default_grouped_tuning(block_m, m, prep.num_experts, prep.layout, smem)
    return GemmLaunch(
        prep, m, x_dtype, x_stride, bias_dtype, out_dtype, tuning, device, block_m, gather, gated, programmatic
    )


def _device_index(x: torch.Tensor) -> int:
    return device_index(x.device)


class GemmLaunch:
    """One call shape of the sm_90a GEMM made ready: ``x [m, K]`` of ``x_dtype`` with rows ``x_stride``
    elements apart (16-byte aligned, unit column stride), the bias dtype (``None``: no bias), the output
    dtype, the tuning (``None``: :func:`default_gemm_tuning`) and, for the grouped kernel, the routing
    ``block_m`` (and ``gather``: x is the tokens, read through the call's ``rows``; ``gated``: the fused
    activation of gate-up rows, see :func:`run_grouped_gemm`). It holds the loaded kernel, the grid, the
    encoder of x's tensor map and the parameter struct with everything but the addresses of the call's
    tensors. Calls must match the shape it was made for. ``programmatic``: a programmatic launch
    (:class:`~._driver.PackedLaunch`): dense, right behind the call's activation pass; grouped, behind any kernel
    (the grouped kernel waits before reading anything)."""

    def __init__(
        self,
        prep: PreparedWeight,
        m: int,
        x_dtype: torch.dtype,
        x_stride: int,
        bias_dtype: torch.dtype | None,
        out_dtype: torch.dtype,
        tuning: GemmTuning | None,
        device: int,
        block_m: int = 0,
        gather: bool = False,
        gated=None,
        programmatic: bool = False,
    ) -> None:
        if tuning is None:
            tuning = default_gemm_tuning(m, prep.n, prep.k, prep.layout, device_limits(device))
        grouped = block_m > 0
        if tuning.splits > prep.k // 64:
            raise ValueError(f"tuning: splits={tuning.splits} exceeds the {prep.k // 64} chunks of 64 columns of K")
        bias_code = DTYPE_CODE[bias_dtype if bias_dtype is not None else x_dtype]
        codes = DTYPE_CODE[x_dtype], DTYPE_CODE[out_dtype], bias_code
        gate = None if gated is None else gated.name
        spec = gemm_spec(prep.layout, *codes, tuning, grouped, gather, gate, prep.tile_group)
        self.kernel = get_kernel(spec, device)
        self.prep = prep  # the parameter struct holds its tensors' addresses
        self.m, self.out_dtype, self.device = m, out_dtype, device
        self.n = prep.n // 2 if gated is not None else prep.n  # the output's columns
        self.torch_device = torch.device("cuda", device)
        self.smem = tuning.smem_bytes(prep.layout)
        tiles = (-(-prep.n // 128), -(-m // tuning.bm))
        if tuning.persistent:  # the block slots of the device, at most one block per tile
            self.grid = (min(tiles[0] * tiles[1], device_limits(device).sm_count * tuning.blocks), 1, 1)
        else:
            self.grid = (*tiles, tuning.splits)
        # split-K: the fp32 sums [m, N], then one arrival counter per tile (decode's zero-between-calls buffers)
        self.workspace_words = m * prep.n + self.grid[0] * self.grid[1] if tuning.splits > 1 else 0
        # TMA descriptor of x [M, K]: 64 x bm boxes (128 bytes wide), 128-byte swizzle, zero fill
        self.x_map = tensor_map(x_dtype, m, prep.k, x_stride, 64, tuning.bm) if m and not gather else None
        self.packed = PackedLaunch(
            self.kernel,
            self.grid,
            self.smem,
            _Params(
                (ctypes.c_uint8 * 128)(),
                *_tile_row_maps(prep),
                prep.qweight.data_ptr(),
                prep.scales.data_ptr(),
                prep.zeros.data_ptr() if prep.zeros is not None else None,
                None,
                None,
                None,
                m,
                prep.n,
                prep.k,
                prep.n,
                prep.groups,
                prep.chunks_per_group,
                block_m,
                None,
                0,
                None,
                None,
                x_stride,
                tuning.splits,
                None,
                None,
                1.0 if gated is None or gated.alpha is None else gated.alpha,
                1.0 if gated is None or gated.limit is None else gated.limit,
                int(gated is not None and gated.gate_up_layout == "interleaved"),
            ),
            programmatic,
        )
        self.x_map_address = ctypes.addressof(self.packed.params) + _Params.x_map.offset

    def __call__(
        self,
        x: torch.Tensor,
        bias: torch.Tensor | None,
        out: torch.Tensor | None = None,
        expert_ids: torch.Tensor | None = None,
        x_scale: torch.Tensor | None = None,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x @ W^T * x_scale + bias`` into ``out`` (``[m, N]`` of the output dtype, unit column stride) or a
        new tensor; ``expert_ids``: the grouped kernel's segment experts; ``rows``: the gathering kernel's
        token of each grouped row."""
        return self.at(x.data_ptr(), bias, out, x_scale_args(x_scale, self.m), expert_ids, rows)

    def at(
        self,
        x: int,
        bias: torch.Tensor | None,
        out: torch.Tensor | None,
        x_scale: tuple[int | None, int],
        expert_ids: torch.Tensor | None = None,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The call of :meth:`__call__` with ``x`` and its scales given by address: ``x`` the address of the
        rows the launch was made for, ``x_scale`` ``(address, stride)`` as :func:`x_scale_args` gives them (an
        activation pass's buffer, which holds both, then costs one allocation)."""
        m, n = self.m, self.n
        if out is None:
            out = torch.empty((m, n), dtype=self.out_dtype, device=self.torch_device)
        else:
            check_out(out, m, n, self.out_dtype)
        if m == 0:
            return out
        stream = current_stream(self.device)
        packed = self.packed
        with packed.lock:
            params = packed.params
            if self.x_map is None:
                params.x, params.rows = x, rows.data_ptr()
            else:
                ctypes.memmove(self.x_map_address, self.x_map.encode(x), 128)
            params.out, params.out_stride = out.data_ptr(), out.stride(0)
            params.bias = None if bias is None else bias.data_ptr()
            params.expert_ids = None if expert_ids is None else expert_ids.data_ptr()
            params.x_scale, params.x_scale_stride = x_scale
            if self.workspace_words:
                sums = WORKSPACES.get(self.workspace_words, self.device, stream).data_ptr()
                params.sums, params.arrivals = sums, sums + 4 * m * n
            packed(stream)
        return out


def _tile_row_maps(prep: PreparedWeight) -> tuple:
    """The kernel's ``w_map``, ``s_map`` and ``z_map`` for a layout of ungrouped 16-row tiles (tile group 1:
    each chunk's 8 tiles of a 128-row block, K / 64 chunks apart, are one TMA box of 8 rows); zeros otherwise."""
    maps = [(ctypes.c_uint8 * 128)() for _ in range(3)]
    if prep.tile_group == 1:
        tiles = [prep.qweight, prep.scales] + ([prep.zeros] if prep.zeros is not None else [])
        for i, t in enumerate(tiles):
            per_group = t[0].numel() * t.element_size() // (prep.k // 64 if i == 0 else prep.groups) // 4
            maps[i] = (ctypes.c_uint8 * 128).from_buffer_copy(rows_tensor_map(t, per_group, 8))
    return tuple(maps)


def reserve_gemm_workspace(m: int, n: int, k: int, tuning: GemmTuning | None, layout: WeightLayout, device: int):
    """Allocate, outside graph capture, the split-K workspace of a call ``[m, n]`` (``tuning`` None: the
    default's) for the current stream and one CUDA graph capture stream (no-op without split-K)."""
    if tuning is None:
        tuning = default_gemm_tuning(m, n, k, layout, device_limits(device))
    if tuning.splits > 1:
        WORKSPACES.reserve(m * n + -(-n // 128) * -(-m // tuning.bm), device)
