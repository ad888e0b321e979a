"""Triton WnA16 GEMM: ``y = x @ dequantize(W)^T + bias`` with fp16/bf16 activations and any IR weight.

Kernels specialised by ``constexpr`` for the weight's format (int/uint 1..8 bits, any <= 8-bit eXmY, lookup
tables), scale dtype and layout (per tensor, channel, group, 2-D block, act-order ``g_idx`` read in place:
the weights are never permuted), zero points (int or float) and global scale. They read the IR as is: there
is no repacking step, so no cache either. Three paths, chosen by M (:mod:`.configs`):

- M = 1 (decode): a GEMV kernel without tensor cores; elementwise fp32 products of the unrounded fp32
  weights, one reduction along K at the end (it also takes M <= 4 when a config asks for it).
- otherwise a tiled kernel: weight tiles dequantized in registers exactly as :func:`humming.dequantize`
  does, rounded once to the activations' dtype, fed to ``tl.dot`` (mma.sync on Ampere/Ada, wgmma on
  Hopper, tcgen05 on Blackwell) with fp32 accumulation; 16 x 64 tiles for small M, up to 128 x 256.
- large M without bias and with ``out_dtype == x.dtype``: the weight is dequantized once per call
  (:mod:`.dequant`) and one cuBLAS GEMM runs (same numerics as the tiled kernel).

Both kernels split K when the grid would not fill the GPU (fp32 atomics into a workspace); the bias is added
in fp32 and the output rounded once to ``out_dtype``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ir.weight import QuantizedWeight
from . import dequant, registry
from ._tiles import route_tile, store_tile, tile_ids
from ._weight_tile import (
    WeightArgs,
    WeightSpec,
    decode_weight,
    kernel_tensors,
    load_weight_tile,
    pointer_types,
    scale_tile,
    triton_type,
    weight_spec,
    with_global_scale,
    zero_tile,
)
from .configs import MIN_GROUPED_BLOCK_M, TileConfig, device_limits, finish_split_k, grouped_tile, wna16_config
from .interpreter import INTERPRET, cast, dot

__all__ = [
    "default_config",
    "deterministic_config",
    "grouped_config",
    "grouped_linear",
    "linear",
    "supports",
    "supports_grouped",
]


@triton.jit
def _wna16_kernel(
    x_ptr,
    qw_ptr,
    s_ptr,
    z_ptr,
    gs_ptr,
    gidx_ptr,
    lut_ptr,
    bias_ptr,
    out_ptr,
    expert_ptr,
    rows_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_qn,
    stride_sn,
    stride_zn,
    stride_om,
    stride_qe,
    stride_se,
    stride_ze,
    stride_gse,
    stride_gie,
    stride_be,
    route_bm,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SPLIT_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    W_KIND: tl.constexpr,
    W_BITS: tl.constexpr,
    W_EBITS: tl.constexpr,
    W_MBITS: tl.constexpr,
    W_BIAS: tl.constexpr,
    W_NAN: tl.constexpr,
    S_KIND: tl.constexpr,
    GN: tl.constexpr,
    GK: tl.constexpr,
    HAS_ZP: tl.constexpr,
    HAS_GS: tl.constexpr,
    ACT_ORDER: tl.constexpr,
    EVEN_K: tl.constexpr,
    GROUPED: tl.constexpr,
    GATHER: tl.constexpr,
):
    """The tiled kernel; with ``GROUPED`` the MoE grouped GEMM: row ``r`` of ``x`` uses expert
    ``expert_ptr[r // route_bm]`` (``BM`` divides ``route_bm``, so one tile has one expert), tiles of
    expert -1 return at once, and every per-expert tensor is offset by ``expert * stride_*e``. With
    ``GATHER`` output row ``r`` reads row ``rows_ptr[r]`` of ``x`` (-1: a padding row, read as zeros)."""
    pid_m, pid_n = tile_ids(M, N, BM, BN, GROUP_M)
    expert, offs_m, src, src_ok = route_tile(expert_ptr, rows_ptr, pid_m, M, route_bm, BM, GROUPED, GATHER)
    if GROUPED:
        if expert < 0:
            return
        qw_ptr += expert * stride_qe
        s_ptr += expert * stride_se
        z_ptr += expert * stride_ze
        gs_ptr += expert * stride_gse
        gidx_ptr += expert * stride_gie
        bias_ptr += expert * stride_be
    weight = WeightArgs(qw_ptr, s_ptr, z_ptr, gs_ptr, gidx_ptr, lut_ptr, stride_qn, stride_sn, stride_zn)
    spec: tl.constexpr = WeightSpec(
        W_KIND, W_BITS, W_EBITS, W_MBITS, W_BIAS, W_NAN, S_KIND, GN, GK, HAS_ZP, HAS_GS, ACT_ORDER
    )

    offs_n = pid_n * BN + tl.arange(0, BN)
    x_rows = x_ptr + src[:, None] * stride_xm
    m_ok = src_ok[:, None]

    k_tiles = tl.cdiv(K, BK)
    per_split = tl.cdiv(k_tiles, SPLIT_K)
    first = tl.program_id(1) * per_split
    last = tl.minimum(first + per_split, k_tiles)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for t in range(first, last):
        k0 = t * BK
        offs_k = k0 + tl.arange(0, BK)
        x = tl.load(x_rows + offs_k[None, :], mask=m_ok if EVEN_K else m_ok & (offs_k[None, :] < K), other=0.0)
        w = load_weight_tile(weight, spec, offs_n, k0, N, K, BK, EVEN_K)
        acc = dot(x, tl.trans(cast(w, x.dtype)), acc)

    store_tile(acc, out_ptr, stride_om, bias_ptr, offs_m, offs_n, M, N, HAS_BIAS, SPLIT_K, GROUPED)


@triton.jit
def _wna16_gemv_kernel(
    x_ptr,
    qw_ptr,
    s_ptr,
    z_ptr,
    gs_ptr,
    gidx_ptr,
    lut_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_qn,
    stride_sn,
    stride_zn,
    stride_om,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SPLIT_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    W_KIND: tl.constexpr,
    W_BITS: tl.constexpr,
    W_EBITS: tl.constexpr,
    W_MBITS: tl.constexpr,
    W_BIAS: tl.constexpr,
    W_NAN: tl.constexpr,
    S_KIND: tl.constexpr,
    GN: tl.constexpr,
    GK: tl.constexpr,
    HAS_ZP: tl.constexpr,
    HAS_GS: tl.constexpr,
    ACT_ORDER: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    """Decode (M <= BM <= 4): no tensor cores, so no layout change of the weight tile; products accumulate
    elementwise in fp32 ``[BM, BN, BK]`` and are reduced along K once, after the loop.

    Compute config, not tuning: the fp32 weights are used as they are, without the rounding to the
    activations' dtype that tensor cores need (a conversion per weight would cost more than the bandwidth
    allows at decode). Results are at least as accurate; they differ from the tensor-core path by up to one
    bf16/fp16 rounding of each weight, inside the tolerances the tests state.
    """
    weight = WeightArgs(qw_ptr, s_ptr, z_ptr, gs_ptr, gidx_ptr, lut_ptr, stride_qn, stride_sn, stride_zn)
    spec: tl.constexpr = WeightSpec(
        W_KIND, W_BITS, W_EBITS, W_MBITS, W_BIAS, W_NAN, S_KIND, GN, GK, HAS_ZP, HAS_GS, ACT_ORDER
    )
    offs_m = tl.arange(0, BM)
    offs_n = tl.program_id(0) * BN + tl.arange(0, BN)
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    m_ok = offs_m[:, None] < M
    k_tiles = tl.cdiv(K, BK)
    per_split = tl.cdiv(k_tiles, SPLIT_K)
    first = tl.program_id(1) * per_split
    last = tl.minimum(first + per_split, k_tiles)
    # Whole-word fields and groups of whole words: unpack field j of every word in place (the K order of a
    # dot product is free), so the word tile keeps its load layout; x is read at the matching positions.
    PER_WORD: tl.constexpr = 32 // W_BITS
    PACKED: tl.constexpr = (32 % W_BITS == 0) and (not ACT_ORDER) and (GK % PER_WORD == 0)
    if PACKED:
        BKW: tl.constexpr = BK // PER_WORD
        # One row (decode): a 2-D accumulator in the word tile's own layout (no layout conversions).
        acc = tl.zeros((BN, BKW) if BM == 1 else (BM, BN, BKW), dtype=tl.float32)
        n_words = (K * W_BITS + 31) // 32
        q_rows = qw_ptr + offs_n.to(tl.int64)[:, None] * stride_qn
        n_ok = offs_n[:, None] < N
        for t in range(first, last):
            offs_w = tl.multiple_of(t * BKW, BKW) + tl.arange(0, BKW)
            w_ok = n_ok if EVEN_K else n_ok & (offs_w[None, :] < n_words)
            words = tl.load(q_rows + offs_w[None, :], mask=w_ok, other=0)
            first_k = offs_w * PER_WORD  # element index of each word's field 0; one group holds whole words
            k0 = t * BK
            if HAS_ZP:
                z = zero_tile(weight, spec, offs_n, first_k, k0, N, K, BK, EVEN_K).to(tl.float32)
            if S_KIND != 0:
                sc = with_global_scale(scale_tile(weight, spec, offs_n, first_k, k0, N, K, BK, EVEN_K), weight, spec)
            for j in tl.static_range(PER_WORD):
                codes = (words >> (j * W_BITS)) & ((1 << W_BITS) - 1)
                w = decode_weight(codes, weight, spec)
                if HAS_ZP:
                    w = w - z
                if S_KIND != 0:
                    w = w * sc
                xk = first_k + j
                x = tl.load(x_rows + xk[None, :], mask=m_ok if EVEN_K else m_ok & (xk[None, :] < K), other=0.0)
                if BM == 1:
                    acc += x.to(tl.float32) * w
                else:
                    acc += x.to(tl.float32)[:, None, :] * w[None, :, :]
    else:
        acc = tl.zeros((BM, BN, BK), dtype=tl.float32)
        for t in range(first, last):
            k0 = t * BK
            offs_k = k0 + tl.arange(0, BK)
            x = tl.load(x_rows + offs_k[None, :], mask=m_ok if EVEN_K else m_ok & (offs_k[None, :] < K), other=0.0)
            w = load_weight_tile(weight, spec, offs_n, k0, N, K, BK, EVEN_K)
            acc += x.to(tl.float32)[:, None, :] * w[None, :, :]
    y = tl.sum(acc, axis=1)[None, :] if PACKED and BM == 1 else tl.sum(acc, axis=2)
    store_tile(y, out_ptr, stride_om, bias_ptr, offs_m, offs_n, M, N, HAS_BIAS, SPLIT_K, False)


_X_DTYPES = (torch.float16, torch.bfloat16)


def _unsupported(qweight: QuantizedWeight, x: torch.Tensor) -> str | None:
    """What the dense and the grouped kernel both need of the weight format and of ``x``."""
    if qweight.format.kind not in ("int", "float", "lut"):
        return f"weight format {qweight.format.name} is not an element format"
    if x.dtype not in _X_DTYPES:
        return f"x dtype {x.dtype}: the Triton WnA16 kernel takes float16 or bfloat16 activations"
    if x.dim() != 2 or (x.shape[1] and x.stride(1) != 1):
        return f"x must be 2-D [M, K] with a contiguous last dimension, got shape {tuple(x.shape)}"
    return None


def supports(qweight: QuantizedWeight, x: torch.Tensor) -> str | None:
    """``None`` if :func:`linear` runs this weight with activations like ``x``, else the reason."""
    if qweight.num_experts is not None:
        return f"expert-stacked weights {qweight.shape} are not supported by the dense GEMM"
    return _unsupported(qweight, x)


def supports_grouped(qweight: QuantizedWeight, x: torch.Tensor, block_m: int) -> str | None:
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
    ``config`` overrides the tile configuration of :func:`~humming.triton_kernels.configs.wna16_config`
    (benchmarks and the tuner use it; it never changes results beyond fp32 summation order).
    """
    reason = supports(qweight, x)
    if reason:
        raise ValueError(f"triton wna16: {reason}")
    m, k = x.shape
    n = qweight.N
    if k != qweight.K:
        raise ValueError(f"triton wna16: x has K={k}, qweight has K={qweight.K}")
    if x.device.type != "cuda" and not INTERPRET:
        raise ValueError(f"triton wna16: x is on {x.device}; CPU tensors need TRITON_INTERPRET=1")
    out_dtype = out_dtype or x.dtype
    out = _out_buffer(out, m, n, out_dtype, x.device)
    if m == 0:
        return out
    cfg = config or default_config(qweight, x)
    if cfg.dequant_first and bias is None and out_dtype == x.dtype:
        return torch.matmul(x, dequant.dequantize(qweight, x.dtype).T, out=out)
    if cfg.block_m <= 4 and m > cfg.block_m:
        raise ValueError(f"triton wna16: GEMV config block_m={cfg.block_m} cannot take M={m}")
    return _launch(x, qweight, bias, out, cfg)


def default_config(qweight: QuantizedWeight, x: torch.Tensor) -> TileConfig:
    """The tile configuration :func:`linear` runs ``x [M, K]`` with (:func:`.configs.wna16_config`)."""
    m, k = x.shape
    sm_count, smem = device_limits(x.device)
    return wna16_config(m, qweight.N, k, qweight.bits, sm_count, _group_k(qweight), smem, qweight.g_idx is not None)


def deterministic_config(qweight: QuantizedWeight, x: torch.Tensor) -> TileConfig:
    """One tile configuration for every M (the one for M = 64, never split along K, no dequantize-first):
    each output row then comes from the same instructions in the same order whatever the batch
    (``humming.set_deterministic``)."""
    smem = device_limits(x.device)[1]
    return wna16_config(64, qweight.N, qweight.K, qweight.bits, 0, _group_k(qweight), smem, qweight.g_idx is not None)


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
    reason = supports_grouped(qweight, x, block_m)
    if reason:
        raise ValueError(f"triton wna16: {reason}")
    m, n = x.shape[0] if rows is None else rows.shape[0], qweight.N
    out_dtype = out_dtype or x.dtype
    out = _out_buffer(out, m, n, out_dtype, x.device)
    if m == 0 or x.shape[0] == 0:  # no rows, or only padding rows (unspecified)
        return out
    cfg = config or grouped_config(
        m, n, qweight.K, qweight.bits, block_m, *device_limits(x.device), _group_k(qweight), qweight.g_idx is not None
    )
    if block_m % cfg.block_m or cfg.block_m < MIN_GROUPED_BLOCK_M:
        raise ValueError(f"triton wna16: config block_m={cfg.block_m} must divide block_m={block_m} and be >= 16")
    bias = None if bias is None else bias.contiguous()
    rows = None if rows is None else rows.contiguous()
    return _launch(x, qweight, bias, out, cfg, expert_ids.contiguous(), block_m, rows)


def grouped_config(
    m_pad: int,
    n: int,
    k: int,
    bits: int,
    block_m: int,
    sm_count: int,
    smem_limit: int = 0,
    group_k: int = 0,
    act_order: bool = False,
) -> TileConfig:
    """The tile of the grouped kernel: the dense tile for ``block_m`` rows (within ``smem_limit`` bytes of
    shared memory; 0: no limit), cut by :func:`grouped_tile` (a smaller ``block_m`` needs less)."""
    dense = wna16_config(block_m, n, k, bits, sm_count, group_k, smem_limit, act_order)
    return grouped_tile(dense, block_m, m_pad, n, k, sm_count)


def _launch(x, qweight, bias, out, cfg: TileConfig, expert_ids=None, route_bm: int = 1, rows=None) -> torch.Tensor:
    """One launch of the tiled (or GEMV) kernel into ``out`` (``[M, N]``: ``x``'s rows, or ``rows``' count
    when the grouped kernel gathers them); split-K accumulates in an fp32 workspace."""
    m, n, k = out.shape[0], qweight.N, x.shape[1]
    t = kernel_tensors(qweight)
    grouped = expert_ids is not None
    split = cfg.split_k > 1
    acc = torch.zeros(m, n, dtype=torch.float32, device=x.device) if split else out
    gemv = cfg.block_m <= 4
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n), cfg.split_k)
    if gemv:
        kernel, extra = _wna16_gemv_kernel, {}
    else:
        e_stride = lambda name, per_expert_dims: t[name].stride(0) if t[name].dim() == per_expert_dims else 0
        kernel = _wna16_kernel
        extra = {
            "GROUP_M": cfg.group_m,
            "GROUPED": grouped,
            "GATHER": rows is not None,
            "expert_ptr": expert_ids if grouped else t["qw"],
            "rows_ptr": rows if rows is not None else t["qw"],
            "stride_qe": e_stride("qw", 3) if grouped else 0,
            "stride_se": e_stride("s", 3) if grouped else 0,
            "stride_ze": e_stride("z", 3) if grouped else 0,
            "stride_gse": e_stride("gs", 1) if grouped else 0,
            "stride_gie": e_stride("gidx", 2) if grouped else 0,
            "stride_be": bias.stride(0) if grouped and bias is not None else 0,
            "route_bm": route_bm,
        }
    kernel[grid](
        x_ptr=x,
        qw_ptr=t["qw"],
        s_ptr=t["s"],
        z_ptr=t["z"],
        gs_ptr=t["gs"],
        gidx_ptr=t["gidx"],
        lut_ptr=t["lut"],
        bias_ptr=t["qw"] if bias is None else bias,
        out_ptr=acc,
        M=m,
        N=n,
        K=k,
        stride_xm=x.stride(0),
        stride_qn=t["qw"].stride(-2),
        stride_sn=t["s"].stride(-2),
        stride_zn=t["z"].stride(-2),
        stride_om=acc.stride(0),
        BM=cfg.block_m,
        BN=cfg.block_n,
        BK=cfg.block_k,
        SPLIT_K=cfg.split_k,
        HAS_BIAS=bias is not None,
        EVEN_K=k % cfg.block_k == 0,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **extra,
        **weight_spec(qweight).constexprs(),
    )
    if split:
        finish_split_k(acc, out, bias, expert_ids, route_bm)
    return out


def _compile_specs() -> list[registry.CompileSpec]:
    """Representative specialisations: each M bucket's tiles, the main formats and layouts, fp16 for sm_75."""
    from ..ir.quantize import quantize
    from .configs import _BUCKETS

    w = torch.ones(256, 512)
    small, large = _BUCKETS[1][1], _BUCKETS[-1][1].replace(dequant_first=False)  # the kernel's own tiles
    medium = next(c for bound, c in _BUCKETS if bound == 128)
    gemv = lambda m, group_k: wna16_config(m, 28672, 8192, 4, 132, group_k)  # H200-like problem
    cases = (
        ("int4-g128", quantize(w, "int4", 128, scale_dtype=torch.bfloat16), torch.bfloat16, gemv(1, 128), 80),
        ("int8-channel", quantize(w, "int8", -1, scale_dtype=torch.bfloat16), torch.bfloat16, gemv(1, 0), 80),
        ("mxfp4", quantize(w, "mxfp4"), torch.bfloat16, gemv(1, 32), 80),
        ("uint4-zp-g128", quantize(w, "int4", 128, True), torch.float16, TileConfig(4, 16, 128, num_stages=1), 75),
        ("int4-g128", quantize(w, "int4", 128, scale_dtype=torch.bfloat16), torch.bfloat16, small, 80),
        ("int4-g128", quantize(w, "int4", 128, scale_dtype=torch.bfloat16), torch.bfloat16, large, 80),
        ("int8-channel", quantize(w, "int8", -1, scale_dtype=torch.bfloat16), torch.bfloat16, large, 80),
        ("mxfp4", quantize(w, "mxfp4"), torch.bfloat16, large, 80),
        ("nvfp4", quantize(w, "nvfp4"), torch.bfloat16, medium, 80),
        ("uint4-zp-actorder", quantize(w, "int4", 64, True, g_idx=torch.arange(512) % 8), torch.float16, medium, 75),
        ("int3-g32", quantize(w, "int3", 32, scale_dtype=torch.float16), torch.float16, small.replace(block_k=64), 75),
        ("nf4-g64", quantize(w, "nf4", 64, scale_dtype=torch.float16), torch.float16, large, 75),
    )
    specs = [kernel_spec(label, qw, dtype, cfg, min_arch) for label, qw, dtype, cfg, min_arch in cases]
    # MoE: the grouped kernel on grouped rows, and gathering token rows (fused_moe's w13) at decode and prefill
    experts = quantize(torch.ones(2, 256, 512), "int4", 128, True)  # uint4 + zero points, E = 2
    mxfp4_experts = quantize(torch.ones(2, 256, 512), "mxfp4")
    decode, prefill = (grouped_config(4096, 2816, 2048, 4, bm, 132, 232448, 128) for bm in (16, 128))
    specs += [
        kernel_spec("grouped-uint4-zp-g128", experts, torch.bfloat16, decode, 80),
        kernel_spec("grouped-gather-uint4-zp-g128", experts, torch.bfloat16, decode, 80, gather=True),
        kernel_spec("grouped-gather-mxfp4", mxfp4_experts, torch.float16, prefill, 75, gather=True),
    ]
    return specs


def kernel_spec(
    label: str, qw: QuantizedWeight, x_dtype: torch.dtype, cfg: TileConfig, min_arch: int = 75, gather: bool = False
) -> registry.CompileSpec:
    """The :class:`~.registry.CompileSpec` of the kernel that :func:`linear` (or :func:`grouped_linear`, for
    an expert-stacked ``qw``; ``gather``: reading token rows through ``rows``) launches for ``qw`` with
    ``x_dtype`` activations and tile ``cfg``."""
    spec = weight_spec(qw)
    is_gemv = cfg.block_m <= 4
    tiled = {"GROUP_M": cfg.group_m, "GROUPED": qw.num_experts is not None, "GATHER": gather}
    return registry.CompileSpec(
        name=f"wna16{'_gemv' if is_gemv else ''}-{label}-{triton_type(x_dtype)}-{cfg.name()}",
        kernel=_wna16_gemv_kernel if is_gemv else _wna16_kernel,
        pointers={
            **pointer_types(qw),
            "x_ptr": "*" + triton_type(x_dtype),
            "bias_ptr": "*fp32",
            "out_ptr": "*fp32" if cfg.split_k > 1 else "*" + triton_type(x_dtype),  # split-K: the fp32 workspace
            **({} if is_gemv else {"expert_ptr": "*i32", "rows_ptr": "*i32"}),
        },
        constexprs={
            "BM": cfg.block_m,
            "BN": cfg.block_n,
            "BK": cfg.block_k,
            "SPLIT_K": cfg.split_k,
            **({} if is_gemv else tiled),
            "HAS_BIAS": True,
            "EVEN_K": True,
            **spec.constexprs(),
        },
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        mma="none" if is_gemv else "best" if cfg.block_m >= 64 else "any",
        min_arch=min_arch,
        aligned=("N", "K", "stride_xm", "stride_qn", "stride_sn", "stride_zn", "stride_om"),
    )


registry.register("wna16", _compile_specs)
