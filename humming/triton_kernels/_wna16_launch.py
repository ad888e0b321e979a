"""The launch of the Triton WnA16 kernels (:mod:`._wna16_kernel`) and their compile-check specialisations
(:mod:`.registry`): the entry points of :mod:`.wna16` call :func:`launch` once their checks pass."""

from __future__ import annotations

import torch
import triton

from ..device import KNOWN_LIMITS, device_limits, resident_blocks
from ..ir.weight import QuantizedWeight
from ..workspaces import WORKSPACES
from . import registry
from ._dequant16 import packed_asm, packed_decode
from ._launch import LaunchesByWeight, PreparedLaunch
from ._tiles import split_k_words
from ._weight_tile import kernel_tensors, pointer_args, pointer_types, triton_type, weight_spec
from ._wna16_kernel import _wna16_gemv_kernel, _wna16_kernel, _wna16_swap_kernel
from .configs import TileConfig
from .wna16_configs import _BUCKETS, TILED_16, grouped_config, wna16_config

__all__ = ["compile_specs", "kernel_spec", "launch", "ready_launch", "uses_workspace"]


def launch(x, qweight, bias, out, cfg: TileConfig, expert_ids=None, route_bm: int = 1, rows=None) -> torch.Tensor:
    """One launch of the tiled (or swapped-operand, or GEMV) kernel into ``out`` (``[M, N]``: ``x``'s rows, or
    ``rows``' count when the grouped kernel gathers them); split-K accumulates in an fp32 workspace."""
    return ready_launch(x, qweight, bias, out, cfg, expert_ids, route_bm, rows)(x, bias, out, expert_ids, rows)


def ready_launch(x, qweight, bias, out, cfg: TileConfig, expert_ids=None, route_bm: int = 1, rows=None):
    """The launch of :func:`launch`'s calls of this kind, made ready by the first and kept per weight:
    ``(x, bias, out, expert_ids, rows) -> out``."""
    grouped = expert_ids is not None
    key = (
        out.shape[0],
        x.shape[1],
        x.stride(0),
        out.stride(0),
        cfg,
        bias is None,
        bias.stride(0) if grouped and bias is not None else 0,
        grouped,
        route_bm,
        rows is not None,
        x.device,
    )
    return _ready.get(qweight, key, lambda: _Ready(x, qweight, bias, out, cfg, grouped, route_bm, rows))


#: The launches made ready, per weight object, by the kind of call (what :func:`launch` keys them on).
_ready = LaunchesByWeight()


class _Ready:
    """One kind of call of the WnA16 kernels with a weight, made ready once: the kernel (tiled, swapped or GEMV), its
    grid, the weight's tensors and every integer and constexpr argument (a :class:`~._launch.PreparedLaunch`).
    A call launches on its pointers and the split-K workspace (the weight's codes stand in for an absent bias,
    expert ids and rows, the output for the workspace without split-K: never read)."""

    def __init__(self, x, qweight, bias, out, cfg: TileConfig, grouped: bool, route_bm: int, rows) -> None:
        m, n, k = out.shape[0], qweight.N, x.shape[1]
        t = kernel_tensors(qweight)
        self.m, self.n, self.route_bm, self.stand_in = m, n, route_bm, t["qw"]
        gemv = cfg.gemv
        self.tiled = not cfg.swap and not gemv  # else the swapped-operand or the GEMV kernel
        self.split = uses_workspace(cfg)
        values = {
            **pointer_args(t),
            "M": m,
            "N": n,
            "K": k,
            "stride_xm": x.stride(0),
            "stride_qn": t["qw"].stride(-2),
            "stride_sn": t["s"].stride(-2),
            "stride_zn": t["z"].stride(-2),
            "stride_om": out.stride(0),
            "BM": cfg.block_m,
            "BN": cfg.block_n,
            "BK": cfg.block_k,
            "HAS_BIAS": bias is not None,
            "EVEN_K": k % cfg.block_k == 0,
            "WEIGHT": weight_spec(qweight),
        }
        if not gemv:
            values["SPLIT_K"] = cfg.split_k
        else:
            values["PREFETCH"] = gemv_prefetch(cfg)
        per_call = ("x_ptr", "bias_ptr", "out_ptr", "ws_ptr")
        kernel = _wna16_swap_kernel if cfg.swap else _wna16_gemv_kernel
        if cfg.swap or self.tiled:
            values["PACKED"] = packed_decode(qweight, x.dtype, cfg.block_k, x.device, global_scale_after=True)
        if self.tiled:
            e_stride = lambda name, per_expert_dims: t[name].stride(0) if t[name].dim() == per_expert_dims else 0
            kernel, per_call = _wna16_kernel, (*per_call, "expert_ptr", "rows_ptr")
            values.update(
                GROUP_M=cfg.group_m,
                GROUPED=grouped,
                GATHER=rows is not None,
                stride_qe=e_stride("qw", 3) if grouped else 0,
                stride_se=e_stride("s", 3) if grouped else 0,
                stride_ze=e_stride("z", 3) if grouped else 0,
                stride_gse=e_stride("gs", 1) if grouped else 0,
                stride_gie=e_stride("gidx", 2) if grouped else 0,
                stride_be=bias.stride(0) if grouped and bias is not None else 0,
                route_bm=route_bm,
            )
        tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
        grid, regrid = (tiles, cfg.split_k), None
        if gemv:  # persistent: split_k waves of what the multiprocessors hold, at most one program per K tile
            grid, regrid = _gemv_grids(x.device, tiles * triton.cdiv(k, cfg.block_k), cfg)
        self.workspace_words = split_k_words(m, n, tiles) if self.split else 0
        self.launch = PreparedLaunch(
            kernel, grid, values, per_call, cfg.num_warps, regrid=regrid, num_stages=triton_stages(cfg)
        )

    def __call__(self, x, bias, out, expert_ids, rows) -> torch.Tensor:
        device = x.device
        workspace = WORKSPACES.on(self.workspace_words, device) if self.split else out
        stand_in = self.stand_in
        tensors = (x, stand_in if bias is None else bias, out, workspace)
        if self.tiled:
            tensors += (stand_in if expert_ids is None else expert_ids, stand_in if rows is None else rows)
        self.launch(device.index, *tensors)
        return out


def gemv_prefetch(cfg: TileConfig) -> bool:
    """Whether the GEMV kernel with tile ``cfg`` loads each K tile one iteration ahead, in registers: a GEMV
    tile of more than one stage does (on its packed path, whole-word fields; the others load in the loop).
    Triton's own pipelining (through shared memory) does not run it: that adds a shared-memory round trip per
    word to a kernel that reads each word once."""
    return cfg.gemv and cfg.num_stages > 1


def triton_stages(cfg: TileConfig) -> int:
    """The ``num_stages`` Triton compiles the WnA16 kernel of tile ``cfg`` with (one for the GEMV:
    :func:`gemv_prefetch`)."""
    return 1 if cfg.gemv else cfg.num_stages


def uses_workspace(cfg: TileConfig) -> bool:
    """Whether a launch of the WnA16 kernels with tile ``cfg`` adds partial sums into the split-K workspace:
    split along K, or the GEMV, whose stream-K shares may end inside an output tile."""
    return cfg.split_k > 1 or cfg.gemv


def _gemv_grids(device: torch.device, units: int, cfg: TileConfig):
    """The persistent GEMV's grid before its kernel is compiled (one program per multiprocessor and wave) and
    the function of the compiled kernel that gives the grid after (as many per multiprocessor as it holds);
    never more programs than ``units`` (K tiles of all output tiles)."""
    sm_count = device_limits(device).sm_count
    grid = lambda per_sm: (min(units, sm_count * per_sm * cfg.split_k), 1)

    def held(kernel) -> int:  # a Triton that does not report the registers keeps one program per multiprocessor
        regs = getattr(kernel, "n_regs", None)
        return resident_blocks(device, cfg.num_warps, regs, kernel.metadata.shared) if regs else 1

    return grid(1), lambda kernel: grid(held(kernel))


def compile_specs() -> list[registry.CompileSpec]:
    """Representative specialisations: each M bucket's tiles, the main formats and layouts, fp16 for sm_75."""
    from ..ir.quantize import quantize

    w = torch.ones(256, 512)
    small, large = TILED_16, _BUCKETS[-1][1].replace(dequant_first=False)  # the kernel's own tiles
    medium = next(c for bound, c in _BUCKETS if bound == 128)
    h200 = KNOWN_LIMITS["NVIDIA H200"]  # the tiles of an H200-like problem
    gemv = lambda m, group_k: wna16_config(m, 28672, 8192, 4, h200.sm_count, group_k)
    swap = wna16_config(8, 28672, 8192, 4, h200.sm_count, 128, h200.smem_per_block)
    swap_packed = wna16_config(8, 28672, 8192, 4, h200.sm_count, 128, h200.smem_per_block, packed="int")
    cases = (
        ("int4-g128", quantize(w, "int4", 128, scale_dtype=torch.bfloat16), torch.bfloat16, gemv(1, 128), 80),
        (  # the GEMV loading one K tile ahead (gemv_prefetch)
            "int4-g128",
            quantize(w, "int4", 128, scale_dtype=torch.bfloat16),
            torch.bfloat16,
            gemv(1, 128).replace(num_stages=2),
            80,
        ),
        ("int8-channel", quantize(w, "int8", -1, scale_dtype=torch.bfloat16), torch.bfloat16, gemv(1, 0), 80),
        ("mxfp4", quantize(w, "mxfp4"), torch.bfloat16, gemv(1, 32), 80),
        ("uint4-zp-g128", quantize(w, "int4", 128, True), torch.float16, TileConfig(4, 16, 128, num_stages=1), 75),
        ("nvfp4", quantize(w, "nvfp4"), torch.bfloat16, gemv(1, 16), 80),
        ("int4-g128", quantize(w, "int4", 128, scale_dtype=torch.bfloat16), torch.bfloat16, swap, 80),
        ("uint4-zp-g32", quantize(w, "int4", 32, True, scale_dtype=torch.float16), torch.float16, swap, 75),
        ("uint4-zp-g64", quantize(w, "int4", 64, True, scale_dtype=torch.bfloat16), torch.bfloat16, medium, 80),
        ("mxfp4", quantize(w, "mxfp4"), torch.bfloat16, swap, 80),
        ("int4-g128", quantize(w, "int4", 128, scale_dtype=torch.bfloat16), torch.bfloat16, swap_packed, 80),
        ("nvfp4", quantize(w, "nvfp4"), torch.bfloat16, small, 80),
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
    tiles = (grouped_config(4096, 2816, 2048, 4, bm, h200.sm_count, h200.smem_per_block, 128) for bm in (16, 128))
    decode, prefill = tiles
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
    is_gemv = cfg.gemv
    narrow = is_gemv or cfg.swap  # the kernels without expert and row pointers
    tiled = {"GROUP_M": cfg.group_m, "GROUPED": qw.num_experts is not None, "GATHER": gather}
    kind = "_gemv" if is_gemv else "_swap" if cfg.swap else ""
    return registry.CompileSpec(
        name=f"wna16{kind}-{label}-{triton_type(x_dtype)}-{cfg.name()}",
        kernel=_wna16_gemv_kernel if is_gemv else _wna16_swap_kernel if cfg.swap else _wna16_kernel,
        pointers={
            **pointer_types(qw),
            "x_ptr": "*" + triton_type(x_dtype),
            "bias_ptr": "*fp32",
            "out_ptr": "*" + triton_type(x_dtype),
            "ws_ptr": "*i32" if uses_workspace(cfg) else "*" + triton_type(x_dtype),  # no workspace: the output
            **({} if narrow else {"expert_ptr": "*i32", "rows_ptr": "*i32"}),
        },
        constexprs={
            "BM": cfg.block_m,
            "BN": cfg.block_n,
            "BK": cfg.block_k,
            **({"PREFETCH": gemv_prefetch(cfg)} if is_gemv else {"SPLIT_K": cfg.split_k}),
            **({} if narrow else tiled),
            "HAS_BIAS": True,
            "EVEN_K": True,
            "WEIGHT": spec,
            **({} if is_gemv else {"PACKED": packed_asm(qw, x_dtype, cfg.block_k, divmod(min_arch, 10), True)}),
        },
        num_warps=cfg.num_warps,
        num_stages=triton_stages(cfg),
        mma="none" if is_gemv else "best" if cfg.block_m >= 64 else "any",
        min_arch=min_arch,
        aligned=("N", "K", "stride_xm", "stride_qn", "stride_sn", "stride_zn", "stride_om"),
    )
