"""Triton WnA16 GEMM: ``y = x @ dequantize(W)^T + bias`` with fp16/bf16 activations and any IR weight.

Kernels specialised by ``constexpr`` for the weight's format (int/uint 1..8 bits, any <= 8-bit eXmY, lookup
tables), scale dtype and layout (per tensor, channel, group, 2-D block, act-order ``g_idx`` read in place:
the weights are never permuted), zero points (int or float) and global scale. They read the IR as is: there
is no repacking step, so no cache either. Three paths, chosen by M (:mod:`.wna16_configs`):

- M = 1 (decode): a GEMV kernel without tensor cores; elementwise fp32 products of the unrounded fp32
  weights, one reduction along K at the end (it also takes M <= 4 when a config asks for it).
- otherwise a tiled kernel: weight tiles dequantized in registers exactly as :func:`humming.dequantize`
  does, rounded once to the activations' dtype, fed to ``tl.dot`` (mma.sync on Ampere/Ada, wgmma on
  Hopper, tcgen05 on Blackwell) with fp32 accumulation; 16 x 64 tiles for small M, up to 128 x 256.
- large M without bias and with ``out_dtype == x.dtype``: the weight is dequantized once per call
  (:mod:`.dequant`) and one cuBLAS GEMM runs (same numerics as the tiled kernel).

Both kernels split K when the grid would not fill the GPU (fp32 atomics into a workspace); the bias is added
in fp32 and the output rounded once to ``out_dtype``.

This module holds the entry points, the support checks and the kernel object the dispatcher lists
(:data:`KERNEL`, ``triton.wna16``); the kernels live in ``_wna16_kernel``, their launch and compile-check
specs in ``_wna16_launch``, the tile heuristics in :mod:`.wna16_configs`.
"""

from __future__ import annotations

import weakref

import torch

from ..device import device_limits
from ..ir.dtypes import HALF_DTYPES
from ..ir.weight import QuantizedWeight
from ..kernel import Kernel
from ..workspaces import WORKSPACES
from . import dequant, registry
from ._dequant16 import packed_codes
from ._support import device_unsupported, unavailable
from ._tiles import split_k_words
from ._wna16_launch import compile_specs, kernel_spec, launch, ready_launch, uses_workspace
from .configs import MIN_GROUPED_BLOCK_M, TileConfig
from .interpreter import INTERPRET
from .wna16_configs import grouped_config, wna16_config

__all__ = [
    "KERNEL",
    "default_config",
    "deterministic_config",
    "grouped_config",
    "grouped_launcher",
    "grouped_linear",
    "grouped_unsupported",
    "kernel_spec",
    "linear",
    "unsupported",
]


def _unsupported(qweight: QuantizedWeight, x: torch.Tensor) -> str | None:
    """What the dense and the grouped kernel both need of the weight format and of ``x``."""
    if qweight.format.kind not in ("int", "float", "lut"):
        return f"weight format {qweight.format.name} is not an element format"
    if x.dtype not in HALF_DTYPES:
        return f"x dtype {x.dtype}: the Triton WnA16 kernel takes float16 or bfloat16 activations"
    if x.dim() != 2 or (x.shape[1] and x.stride(1) != 1):
        return f"x must be 2-D [M, K] with a contiguous last dimension, got shape {tuple(x.shape)}"
    return None


def unsupported(qweight: QuantizedWeight, x: torch.Tensor) -> str | None:
    """``None`` if :func:`linear` runs this weight with activations like ``x``, else the reason."""
    if qweight.num_experts is not None:
        return f"expert-stacked weights {qweight.shape} are not supported by the dense GEMM"
    return _unsupported(qweight, x)


def grouped_unsupported(qweight: QuantizedWeight, x: torch.Tensor, block_m: int) -> str | None:
    """``None`` if :func:`grouped_linear` runs this expert-stacked weight, else the reason."""
    if qweight.num_experts is None:
        return f"the grouped GEMM needs an expert-stacked weight [E, N, K], got {qweight.shape}"
    if block_m % MIN_GROUPED_BLOCK_M:
        return f"block_m={block_m}: the Triton grouped GEMM needs a multiple of {MIN_GROUPED_BLOCK_M}"
    return _unsupported(qweight, x)


def _group_k(qweight: QuantizedWeight) -> int:
    return 0 if qweight.g_idx is not None else max(qweight.group_shape[1], 0)


def _out_buffer(out, m: int, n: int, out_dtype: torch.dtype, device) -> torch.Tensor:
    if out is not None and (out.shape != (m, n) or out.dtype != out_dtype or not out.is_contiguous()):
        raise ValueError(f"triton wna16: out must be a contiguous [{m}, {n}] {out_dtype} tensor")
    return torch.empty(m, n, dtype=out_dtype, device=device) if out is None else out


def linear(
    x: torch.Tensor,
    qweight: QuantizedWeight,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    config: TileConfig | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x [M, K] (fp16/bf16) @ dequantize(qweight)^T + bias -> [M, N]`` in ``out_dtype`` (default x's).

    ``out``: an optional contiguous ``[M, N]`` tensor of ``out_dtype`` to write into (tests poison it).
    ``config`` overrides the tile configuration of :func:`~humming.triton_kernels.wna16_configs.wna16_config`
    (benchmarks and the tuner use it; it never changes results beyond fp32 summation order).
    """
    _check(x, qweight)
    out_dtype = out_dtype or x.dtype
    out = _out_buffer(out, x.shape[0], qweight.N, out_dtype, x.device)
    if x.shape[0] == 0:
        return out
    cfg = _config(x, qweight, config)
    if _dequant_first(cfg, bias is not None, x.dtype, out_dtype):
        return torch.matmul(x, dequant.dequantize(qweight, x.dtype).T, out=out)
    return launch(x, qweight, bias, out, cfg)


def _check(x: torch.Tensor, qweight: QuantizedWeight) -> None:
    """:func:`linear`'s checks of its weight and activations."""
    reason = unsupported(qweight, x)
    if reason:
        raise ValueError(f"triton wna16: {reason}")
    if x.shape[1] != qweight.K:
        raise ValueError(f"triton wna16: x has K={x.shape[1]}, qweight has K={qweight.K}")
    if x.device.type != "cuda" and not INTERPRET:
        raise ValueError(f"triton wna16: x is on {x.device}; CPU tensors need TRITON_INTERPRET=1")


def _dequant_first(cfg: TileConfig, bias: bool, x_dtype: torch.dtype, out_dtype: torch.dtype) -> bool:
    """Whether a call with tile ``cfg`` runs as dequantize + one library GEMM: where the tile asks for it, without
    bias and with an output of x's dtype (else the Triton kernel runs with the tile)."""
    return cfg.dequant_first and not bias and out_dtype == x_dtype


def _config(x: torch.Tensor, qweight: QuantizedWeight, config: TileConfig | None) -> TileConfig:
    """The tile configuration of a call of :func:`linear` with ``x``'s M > 0 rows: ``config`` or the default."""
    m = x.shape[0]
    cfg = config or default_config(qweight, x)
    if (cfg.gemv or cfg.swap) and m > cfg.block_m:
        kind = "swapped-operand" if cfg.swap else "GEMV"
        raise ValueError(f"triton wna16: {kind} config block_m={cfg.block_m} cannot take M={m}")
    return cfg


def _launcher(x: torch.Tensor, qweight: QuantizedWeight, act, bias_dtype, out_dtype: torch.dtype, tuning):
    """:attr:`humming.kernel.Kernel.launcher`: ``(x, bias) -> out`` for calls shaped as ``x`` with a bias of
    ``bias_dtype``: the checks, the tile configuration and the prepared launch made once, so that a call
    allocates its output and launches (the dequantize-first GEMM: its dequantization, prepared per weight,
    and cuBLAS)."""
    _check(x, qweight)
    cfg = _config(x, qweight, tuning)
    m, n = x.shape[0], qweight.N
    if _dequant_first(cfg, bias_dtype is not None, x.dtype, out_dtype):
        weight = weakref.ref(qweight)  # the prepared call is kept per weight, weakly: it must not hold it
        return lambda x, bias: torch.matmul(x, dequant.dequantize(weight(), x.dtype).T)
    bias = None if bias_dtype is None else torch.empty(n, dtype=bias_dtype, device=x.device)
    ready = ready_launch(x, qweight, bias, torch.empty(m, n, dtype=out_dtype, device=x.device), cfg)
    return lambda x, bias: ready(x, bias, torch.empty(m, n, dtype=out_dtype, device=x.device), None, None)


def default_config(qweight: QuantizedWeight, x: torch.Tensor) -> TileConfig:
    """The tile configuration :func:`linear` runs ``x [M, K]`` with (:func:`.wna16_configs.wna16_config`)."""
    m, k = x.shape
    limits = device_limits(x.device)
    act_order, zero_points = qweight.g_idx is not None, qweight.zeros is not None
    group_k = _group_k(qweight)
    packed = packed_codes(qweight, x.dtype, x.device)
    return wna16_config(
        m, qweight.N, k, qweight.bits, limits.sm_count, group_k, limits.smem_per_block, act_order, zero_points, packed
    )


def deterministic_config(qweight: QuantizedWeight, x: torch.Tensor) -> TileConfig:
    """One tile configuration for every M (the one for M = 64, never split along K, no dequantize-first):
    each output row then comes from the same instructions in the same order whatever the batch
    (``humming.set_deterministic``)."""
    smem = device_limits(x.device).smem_per_block
    act_order, zero_points = qweight.g_idx is not None, qweight.zeros is not None
    return wna16_config(64, qweight.N, qweight.K, qweight.bits, 0, _group_k(qweight), smem, act_order, zero_points)


def grouped_linear(
    x: torch.Tensor,
    qweight: QuantizedWeight,
    expert_ids: torch.Tensor,
    block_m: int,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    config: TileConfig | None = None,
    out: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """MoE grouped GEMM: row ``r`` of ``x [M_pad, K]`` times expert ``expert_ids[r // block_m]`` of
    ``qweight [E, N, K]`` (+ ``bias [E, N]``) -> ``[M_pad, N]``; blocks of expert -1 are skipped (their
    rows of ``out`` are left as they are). With ``rows`` (int32 ``[M_pad]``, -1 for padding rows), ``x`` is
    ``[T, K]`` and row ``r`` reads ``x[rows[r]]`` in the kernel (no gathered copy). Arguments are those of
    :func:`humming.moe.grouped_linear`, already checked there.

    The tile's ``block_m`` divides the routing ``block_m`` (:func:`~.configs.grouped_tile`), so each tile
    reads one expert id; ``config`` overrides the tile (its ``block_m`` must divide the routing one).
    """
    reason = grouped_unsupported(qweight, x, block_m)
    if reason:
        raise ValueError(f"triton wna16: {reason}")
    m, n = x.shape[0] if rows is None else rows.shape[0], qweight.N
    out_dtype = out_dtype or x.dtype
    out = _out_buffer(out, m, n, out_dtype, x.device)
    if m == 0 or x.shape[0] == 0:  # no rows, or only padding rows (unspecified)
        return out
    cfg = config or _grouped_config(qweight, x, block_m, m)
    if block_m % cfg.block_m or cfg.block_m < MIN_GROUPED_BLOCK_M:
        raise ValueError(f"triton wna16: config block_m={cfg.block_m} must divide block_m={block_m} and be >= 16")
    bias = None if bias is None else bias.contiguous()
    rows = None if rows is None else rows.contiguous()
    return launch(x, qweight, bias, out, cfg, expert_ids.contiguous(), block_m, rows)


def _grouped_config(qweight: QuantizedWeight, x: torch.Tensor, block_m: int, m_pad: int) -> TileConfig:
    """The tile :func:`grouped_linear` runs ``m_pad`` grouped rows with (:func:`.wna16_configs.grouped_config`)."""
    limits = device_limits(x.device)
    return grouped_config(
        m_pad,
        qweight.N,
        qweight.K,
        qweight.bits,
        block_m,
        limits.sm_count,
        limits.smem_per_block,
        _group_k(qweight),
        qweight.g_idx is not None,
        qweight.zeros is not None,
        qweight.format.name == "e2m1",
    )


def grouped_launcher(x, qweight: QuantizedWeight, block_m: int, m_pad: int, out_dtype: torch.dtype):
    """:func:`grouped_linear` made ready for every call shaped as this one (``humming.moe.grouped_step``):
    ``(x, expert_ids, bias, rows) -> out`` for ``m_pad`` grouped rows of 16-bit ``x`` (its grouped rows, or
    the tokens read through ``rows``, the same for every call), checked and its tile chosen here, once; the
    launch is made ready at the first call (the one :func:`grouped_linear` keeps for such calls). ``None`` for
    calls of no rows (:func:`grouped_linear` runs them)."""
    reason = grouped_unsupported(qweight, x, block_m)
    if reason:
        raise ValueError(f"triton wna16: {reason}")
    if m_pad == 0 or x.shape[0] == 0:
        return None
    cfg = _grouped_config(qweight, x, block_m, m_pad)
    weight, ready, n = weakref.ref(qweight), None, qweight.N  # held weakly, as the caller keeps it per weight

    def call(x, expert_ids, bias, rows):
        nonlocal ready
        out = torch.empty(m_pad, n, dtype=out_dtype, device=x.device)
        bias = None if bias is None else bias.contiguous()
        if ready is None:
            ready = ready_launch(x, weight(), bias, out, cfg, expert_ids, block_m, rows)
        return ready(x, bias, out, expert_ids, rows)

    return call


def _kernel_unsupported(qweight: QuantizedWeight, act, x: torch.Tensor) -> str | None:
    if act is not None:
        return "the WnA16 GEMM takes 16-bit activations (act=None)"
    return unavailable() or device_unsupported(x) or unsupported(qweight, x)


def _run(x, qweight, bias, act, out_dtype, tuning):
    return linear(x, qweight, bias, out_dtype, config=tuning)


def _warmup_jobs(qweight, act, m, *, act_dtype, out_dtype, bias_dtype, device, block_m=None) -> list:
    """Nothing to compile ahead (Triton compiles at the first launch, which warmup runs); sets aside the
    split-K workspace of a dense call of ``m`` rows, which a CUDA graph capture cannot allocate."""
    if block_m is None:
        cfg = default_config(qweight, torch.empty(m, qweight.K, dtype=act_dtype, device=f"cuda:{device}"))
        if uses_workspace(cfg) and not _dequant_first(cfg, bias_dtype is not None, act_dtype, out_dtype):
            tiles = -(-m // cfg.block_m) * -(-qweight.N // cfg.block_n)
            WORKSPACES.reserve(split_k_words(m, qweight.N, tiles), device)
    return []


#: ``triton.wna16``: every weight format with 16-bit activations, batch-invariant with one tile for every M.
KERNEL = Kernel(
    "triton.wna16",
    "triton",
    "ir",
    _kernel_unsupported,
    _run,
    tuning=lambda qweight, act, x: default_config(qweight, x),
    deterministic_tuning=lambda qweight, act, x: deterministic_config(qweight, x),
    warmup_jobs=_warmup_jobs,
    launcher=_launcher,
)

registry.register("wna16", compile_specs)
