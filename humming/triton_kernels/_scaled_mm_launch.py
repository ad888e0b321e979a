"""Launch of the Triton scaled GEMM (:mod:`.scaled_mm`), private: the kernel's arguments for one call
(:func:`launch`), and the :class:`~.registry.CompileSpec` of a specialisation (:func:`kernel_spec`) with the
representative ones the all-architecture compile check builds (:func:`compile_specs`)."""

from __future__ import annotations

import weakref

import torch

from ..ir.activation import ActScheme, QuantizedActivation, get_act_scheme
from ..ir.weight import QuantizedWeight
from ..workspaces import WORKSPACES
from . import registry
from ._decode_e4m3 import e4m3_ptx, packed_e4m3
from ._launch import LaunchesByWeight, PreparedLaunch
from ._scaled_mm_kernel import _scaled_mm_kernel
from ._scaled_mm_plan import (
    ComputePlan,
    act_group_k,
    call_config,
    compute_plan,
    device_capability,
    grid,
    grouped_call_config,
    plan_constexprs,
    row_tops,
    weight_decode,
)
from ._tiles import split_k_words
from ._weight_tile import WeightSpec, kernel_tensors, pointer_types, triton_type, weight_spec
from .scaled_mm_configs import ScaledMMConfig

__all__ = ["compile_specs", "dense_launcher", "grouped_launch", "kernel_spec", "launch", "launch_codes"]


def launch(
    qa: QuantizedActivation,
    qweight: QuantizedWeight,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    config: ScaledMMConfig | None,
    out: torch.Tensor | None,
    expert_ids: torch.Tensor | None = None,
    route_bm: int = 1,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """One launch of the scaled GEMM on quantized activations ``qa`` (arguments checked by the caller):
    ``[M, N]`` of ``out_dtype``, into ``out`` when given. ``config``: the tile (``None``: the plan's default);
    ``expert_ids`` / ``route_bm``: the grouped kernel, row ``r`` times expert ``expert_ids[r // route_bm]``;
    ``rows`` (int32 ``[M]``, grouped only): row ``r`` reads the codes and scales of ``qa``'s row ``rows[r]``
    (-1: a padding row, zeros)."""
    a_scales = qa.scales if qa.scales.dtype == torch.float32 else qa.scales.view(torch.uint8)
    args = (qa.codes, a_scales, qa.global_scale, qweight, bias, out_dtype, config, out, expert_ids, route_bm, rows)
    return launch_codes(qa.scheme, *args)


def launch_codes(
    scheme: ActScheme,
    codes: torch.Tensor,
    a_scales: torch.Tensor,
    global_scale: torch.Tensor | None,
    qweight: QuantizedWeight,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    config: ScaledMMConfig | None,
    out: torch.Tensor | None,
    expert_ids: torch.Tensor | None = None,
    route_bm: int = 1,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`launch` on the buffers of a quantized activation: ``codes``, the scales as the kernel reads them
    (float32, or the uint8 bytes of 8-bit scales) and the global scale, as the quantizing pass returns them."""
    ready = _ready_launch(scheme, codes, a_scales, qweight, bias, out_dtype, config, out, expert_ids, route_bm, rows)
    return ready(codes, a_scales, global_scale, bias, out, expert_ids, rows)


def _ready_launch(scheme, codes, a_scales, qweight, bias, out_dtype, config, out, expert_ids, route_bm, rows):
    """The :class:`_Ready` of calls of this kind, kept per weight (made by the first)."""
    grouped = expert_ids is not None
    m = codes.shape[0] if rows is None else rows.shape[0]
    key = (
        scheme,
        m,
        codes.shape[1],
        codes.stride(0),
        tuple(a_scales.shape),
        a_scales.stride(0),
        out_dtype,
        config,
        bias is None,
        bias.stride(0) if grouped and bias is not None else 0,
        grouped,
        route_bm,
        rows is not None,
        None if out is None else out.stride(0),
        codes.device,
    )
    make = lambda: _Ready(scheme, codes, a_scales, qweight, bias, out_dtype, config, out, grouped, route_bm, rows)
    return _ready.get(qweight, key, make)


def dense_launcher(scheme: ActScheme, quantize, qweight: QuantizedWeight, out_dtype: torch.dtype, config):
    """``(x, bias) -> out`` for dense calls of one kind (activations quantized by ``quantize``, a cached pass
    of :mod:`.act_quant`; the bias's presence and dtype fixed) on ``config`` (``None``: the plan's default):
    the launch is made ready at the first call, from that call's quantized buffers, and reused by the next
    ones without a lookup."""
    weight, ready = weakref.ref(qweight), None  # held weakly, as the caller keeps it per weight

    def call(x, bias):
        nonlocal ready
        codes, a_scales, global_scale = quantize(x)
        if ready is None:
            ready = _Ready(scheme, codes, a_scales, weight(), bias, out_dtype, config, None, False, 1, None)
        return ready(codes, a_scales, global_scale, bias, None, None, None)

    return call


def grouped_launch(
    scheme: ActScheme, quantize, qweight: QuantizedWeight, out_dtype: torch.dtype, route_bm: int, m_pad: int
):
    """``(x, expert_ids, bias, rows) -> out`` for grouped calls of one kind, ``m_pad`` grouped rows in routing
    blocks of ``route_bm``: ``x`` 16-bit, quantized by ``quantize`` (a cached pass of :mod:`.act_quant`), or, with
    ``quantize`` ``None``, a :class:`QuantizedActivation` of ``scheme``; read through ``rows`` or in grouped order,
    the same for every call of the kind. The tile is :func:`~._scaled_mm_plan.grouped_call_config`'s, as
    :func:`.scaled_mm.grouped_linear` picks it; it and the launch are made ready at the first call, from that
    call's quantized buffers (the one :func:`launch_codes` keeps for them), and reused by the next ones without a
    lookup."""
    weight, ready = weakref.ref(qweight), None  # held weakly, as the caller keeps it per weight
    byte_scales = scheme.scale_dtype != torch.float32  # 8-bit scales: the kernel reads their bytes

    def call(x, expert_ids, bias, rows):
        nonlocal ready
        if quantize is None:
            codes, global_scale = x.codes, x.global_scale
            a_scales = x.scales.view(torch.uint8) if byte_scales else x.scales
        else:
            codes, a_scales, global_scale = quantize(x)
        bias = None if bias is None else bias.contiguous()
        if ready is None:
            qw, device = weight(), codes.device
            plan = compute_plan(qw, scheme, act_group_k(scheme, a_scales), device_capability(device))
            if isinstance(plan, str):
                raise ValueError(f"triton scaled_mm: {plan}")
            config = grouped_call_config(plan, qw, route_bm, m_pad, device)
            args = (codes, a_scales, qw, bias, out_dtype, config, None, expert_ids, route_bm, rows)
            ready = _ready_launch(scheme, *args)
        return ready(codes, a_scales, global_scale, bias, None, expert_ids, rows)

    return call


#: The launches made ready, per weight object, by the kind of call (everything :func:`launch_codes` keys them on).
_ready = LaunchesByWeight()

#: The kernel's parameters that change between calls of one kind (the weight's codes stand in for an absent
#: bias, expert ids and rows: never read).
_PER_CALL = ("a_ptr", "as_ptr", "ags_ptr", "bias_ptr", "out_ptr", "ws_ptr", "expert_ptr", "rows_ptr")


class _Ready:
    """One kind of call of the scaled GEMM with a weight, made ready once: its plan, tile, grid, the weight's
    tensors, every integer and constexpr argument (a :class:`~._launch.PreparedLaunch`). A call allocates the
    output (and the split-K workspace), and launches on its pointers."""

    def __init__(self, scheme, codes, a_scales, qweight, bias, out_dtype, config, out, grouped, route_bm, rows):
        m, k = (codes.shape[0] if rows is None else rows.shape[0]), codes.shape[1]
        n = qweight.N
        device = codes.device
        a_gk = act_group_k(scheme, a_scales)
        plan = compute_plan(qweight, scheme, a_gk, device_capability(device))
        if isinstance(plan, str):
            raise ValueError(f"triton scaled_mm: {plan}")
        cfg = config or call_config(plan, qweight, m, device)
        if plan.k_step and plan.k_step % cfg.block_k:
            raise ValueError(f"config: block_k={cfg.block_k} must divide the promotion step {plan.k_step}")
        t = kernel_tensors(qweight)
        e_stride = lambda name, per_expert_dims: (
            t[name].stride(0) if grouped and t[name].dim() == per_expert_dims else 0
        )
        self.m, self.n, self.out_dtype, self.device, self.route_bm = m, n, out_dtype, device, route_bm
        self.split = cfg.split_k > 1
        self.stand_in = t["qw"]
        tops = row_tops(qweight) if plan.w_scale == "rowfold" else None
        values = {
            "qw_ptr": t["qw"],
            "qb_ptr": t["qw"].view(torch.uint8),
            "s_ptr": t["s"],
            "z_ptr": t["z"],
            "gs_ptr": t["gs"],
            "lut_ptr": t["lut"],
            "rt_ptr": t["qw"] if tops is None else tops,
            "M": m,
            "N": n,
            "K": k,
            "stride_am": codes.stride(0),
            "stride_asm": a_scales.stride(0),
            "stride_qn": t["qw"].stride(-2),
            "stride_qb": t["qw"].stride(-2) * 4,
            "stride_sn": t["s"].stride(-2),
            "stride_zn": t["z"].stride(-2),
            "stride_om": n if out is None else out.stride(0),
            "stride_qe": e_stride("qw", 3),
            "stride_se": e_stride("s", 3),
            "stride_ze": e_stride("z", 3),
            "stride_gse": e_stride("gs", 1),
            "stride_rte": n if grouped and tops is not None else 0,
            "stride_be": bias.stride(0) if grouped and bias is not None else 0,
            "route_bm": route_bm,
            "BM": cfg.block_m,
            "BN": cfg.block_n,
            "BK": cfg.block_k,
            "SPLIT_K": cfg.split_k,
            "GROUP_M": cfg.group_m,
            "EVEN_K": k % cfg.block_k == 0,
            "HAS_BIAS": bias is not None,
            **plan_constexprs(plan, scheme, a_gk, per_row=a_scales.numel() > 1),
            "WEIGHT": _weight(qweight),
            "GROUPED": grouped,
            "GATHER": rows is not None,
            "PACKED": packed_e4m3(qweight, plan.mma, plan.w_scale, device_capability(device)),
        }
        cfg_grid = grid(cfg, m, n)
        self.workspace_words = split_k_words(m, n, cfg_grid[0]) if self.split else 0
        self.launch = PreparedLaunch(
            _scaled_mm_kernel, cfg_grid, values, _PER_CALL, cfg.num_warps, num_stages=cfg.num_stages
        )

    def __call__(self, codes, a_scales, global_scale, bias, out, expert_ids, rows) -> torch.Tensor:
        m, n = self.m, self.n
        if out is None:
            out = torch.empty(m, n, dtype=self.out_dtype, device=self.device)
        elif out.shape != (m, n) or out.dtype != self.out_dtype or out.stride(1) != 1:
            raise ValueError(
                f"out: expected [{m}, {n}] {self.out_dtype} with contiguous rows, got {out.shape} {out.dtype}"
            )
        workspace = WORKSPACES.on(self.workspace_words, self.device) if self.split else out
        stand_in = self.stand_in
        self.launch(
            self.device.index,
            codes,
            a_scales,
            a_scales if global_scale is None else global_scale,
            stand_in if bias is None else bias,
            out,
            workspace,
            stand_in if expert_ids is None else expert_ids,
            stand_in if rows is None else rows,
        )
        return out


def _weight(qw: QuantizedWeight) -> WeightSpec:
    """The weight's layout constexprs as the kernel takes them: without act-order, which it does not support."""
    return weight_spec(qw)._replace(ACT_ORDER=False)


def compile_specs() -> list[registry.CompileSpec]:
    """Representative specialisations for the all-architecture compile check: each plan kind (int8, e4m3,
    fp16 / bf16 folds and promotions, the pre-Ampere fp32 fallback) at small- and large-M tiles."""
    from ..ir.quantize import quantize
    from .scaled_mm_configs import buckets, fit_registers

    w = torch.ones(256, 512)
    cases = (  # label, weight, act, capability the plan is made for, oldest arch, output dtype
        ("int8-channel", quantize(w, "int8", -1, scale_dtype=torch.float32), "int8", (8, 0), 80, torch.float16),
        ("int8-channel", quantize(w, "int8", -1, scale_dtype=torch.float32), "int8", (7, 5), 75, torch.float16),
        ("int4-g128", quantize(w, "int4", 128, scale_dtype=torch.float16), "int8", (8, 0), 80, torch.float16),
        ("int4-channel", quantize(w, "int4", -1, scale_dtype=torch.float32), "int4", (8, 0), 80, torch.float16),
        ("e4m3-channel", quantize(w, "e4m3", -1, scale_dtype=torch.float32), "fp8", (9, 0), 89, torch.bfloat16),
        ("fp8-block128", quantize(w, "fp8_block"), "fp8_g128", (9, 0), 89, torch.bfloat16),
        ("int4-g128", quantize(w, "int4", 128, scale_dtype=torch.bfloat16), "fp8", (9, 0), 89, torch.bfloat16),
        ("uint4-zp-g128", quantize(w, "int4", 128, True, scale_dtype=torch.float16), "fp8", (9, 0), 89, torch.float16),
        ("mxfp4", quantize(w, "mxfp4"), "fp8", (9, 0), 89, torch.bfloat16),
        ("mxfp4", quantize(w, "mxfp4"), "fp8_g128", (9, 0), 89, torch.bfloat16),
        ("mxfp4-bf16", quantize(w, "mxfp4"), "fp8", (8, 0), 80, torch.bfloat16),
        ("nf4-g64", quantize(w, "nf4", 64, scale_dtype=torch.float16), "fp8", (8, 0), 75, torch.float16),
        ("nvfp4", quantize(w, "nvfp4"), "nvfp4", (8, 0), 75, torch.float16),
        ("mxfp4", quantize(w, "mxfp4"), "mxfp4", (8, 0), 80, torch.bfloat16),
        ("mxfp4-fp32", quantize(w, "mxfp4"), "mxfp4", (7, 5), 75, torch.float16),
        ("mxfp4-native", quantize(w, "mxfp4"), "mxfp4", (10, 0), 100, torch.bfloat16),
        ("mxfp4-native", quantize(w, "mxfp4"), "mxfp8", (10, 0), 100, torch.bfloat16),
    )
    # MoE: grouped rows, and token rows gathered through ``rows`` (codes and per-row scales; per-tensor and
    # NVFP4 global scales): per-token / per-tensor in the epilogue, promoted 1x128 groups, folded e4m3 / e8m0
    # groups, int8 MMAs, and Blackwell's dot_scaled
    experts = lambda fmt, *args, **kw: quantize(torch.ones(2, 256, 512), fmt, *args, **kw)
    e4m3_experts = experts("e4m3", -1, scale_dtype=torch.float32)
    cases += (
        ("grouped-e4m3-channel", e4m3_experts, "fp8", (9, 0), 89, torch.bfloat16),
        ("grouped-gather-e4m3-channel", e4m3_experts, "fp8", (9, 0), 89, torch.bfloat16),
        ("grouped-gather-e4m3-channel", e4m3_experts, "fp8_tensor", (9, 0), 89, torch.bfloat16),
        ("grouped-gather-fp8-block128", experts("fp8_block"), "fp8_g128", (9, 0), 89, torch.bfloat16),
        ("grouped-gather-uint4-zp-g128", experts("int4", 128, True), "int8", (8, 0), 80, torch.bfloat16),
        ("grouped-gather-nvfp4", experts("nvfp4"), "nvfp4", (8, 0), 75, torch.float16),
        ("grouped-gather-mxfp4", experts("mxfp4"), "mxfp4", (8, 0), 80, torch.bfloat16),
        ("grouped-gather-mxfp4", experts("mxfp4"), "fp8", (9, 0), 89, torch.bfloat16),
        ("grouped-gather-mxfp4-native", experts("mxfp4"), "mxfp4", (10, 0), 100, torch.bfloat16),
    )
    specs = []
    for label, qw, act, capability, min_arch, out_dtype in cases:
        scheme = get_act_scheme(act)
        plan = compute_plan(qw, scheme, act_group_k(scheme), capability)
        decode = weight_decode(plan, qw)
        table = buckets(plan.operand_bits, capability, decode)
        gather = label.startswith("grouped-gather-")
        large = fit_registers(table[-1][1], capability, plan.accumulators(capability), decode)
        for cfg in (table[0][1].replace(split_k=4), large):  # small M: the split-K epilogue
            if plan.k_step:
                cfg = cfg.replace(block_k=min(cfg.block_k, plan.k_step))
            specs.append(kernel_spec(f"{label}-{act}", qw, scheme, plan, out_dtype, cfg, min_arch, gather))
    return specs


def kernel_spec(
    label: str,
    qw: QuantizedWeight,
    scheme: ActScheme,
    plan: ComputePlan,
    out_dtype: torch.dtype,
    cfg: ScaledMMConfig,
    min_arch: int = 75,
    gather: bool = False,
) -> registry.CompileSpec:
    """The :class:`~.registry.CompileSpec` of the kernel :func:`linear` (or :func:`grouped_linear`, for an
    expert-stacked ``qw``; ``gather``: reading token rows through ``rows``) launches for ``qw`` with
    activations ``scheme`` under ``plan`` and tile ``cfg`` (a static scale compiles as a per-tensor one)."""
    a_scale_type = "*fp32" if scheme.scale_dtype == torch.float32 else "*u8"
    # int8: Triton has no tcgen05 int8 path (mma.sync on sm_100); fp32: FMA, no tensor cores.
    mma_check = "best" if cfg.block_m >= 64 and plan.mma != "int8" else "any"
    if plan.mma == "fp32":
        mma_check = "none"
    return registry.CompileSpec(
        name=f"scaled_mm-{label}-{plan.mma}-{triton_type(out_dtype)}-{cfg.name()}",
        kernel=_scaled_mm_kernel,
        pointers={
            **pointer_types(qw),
            "qb_ptr": "*u8",
            "a_ptr": "*u8",
            "as_ptr": a_scale_type,
            "ags_ptr": "*fp32",
            "rt_ptr": "*i32",
            "bias_ptr": "*fp32",
            "out_ptr": "*" + triton_type(out_dtype),
            "ws_ptr": "*i32" if cfg.split_k > 1 else "*" + triton_type(out_dtype),  # no split-K: the output
            "expert_ptr": "*i32",
            "rows_ptr": "*i32",
        },
        constexprs={
            "BM": cfg.block_m,
            "BN": cfg.block_n,
            "BK": cfg.block_k,
            "SPLIT_K": cfg.split_k,
            "GROUP_M": cfg.group_m,
            "EVEN_K": True,
            "HAS_BIAS": True,
            **plan_constexprs(plan, scheme, act_group_k(scheme), per_row=scheme.group_shape[0] == 1),
            "WEIGHT": _weight(qw),
            "GROUPED": qw.num_experts is not None,
            "GATHER": gather,
            "PACKED": e4m3_ptx(qw, plan.mma, plan.w_scale, divmod(min_arch, 10)),
        },
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        mma=mma_check,
        min_arch=min_arch,
        aligned=("N", "K", "stride_am", "stride_qn", "stride_qb", "stride_om"),
    )
