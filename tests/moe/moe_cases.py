"""What the MoE tests share: weights in every format the MoE entry points take, random routings and the
float64 references of the grouped GEMM and of the fused layer (independent of the code under test)."""

from __future__ import annotations

import torch
from helpers import gated

import humming
from humming import moe

#: ``||out - ref|| / ||ref||`` of a GEMM: fp32 accumulation and one output rounding (weights rounded to x's
#: dtype, as the tensor-core kernel does, so the reference uses ``dequantize(qw, x.dtype)``).
TOL = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1e-2}
#: ``fused_moe`` rounds twice more (the first GEMM's output and the activation, to x's dtype) and runs
#: against fp32 weights.
MOE_TOL = {torch.float16: 5e-3, torch.bfloat16: 3e-2}
#: The formats of the GPU tests at real MoE shapes.
GPU_WEIGHTS = ["uint4-zp-g128", "int4-g32", "int8-channel", "e4m3-channel", "mxfp4"]


def random_routing(t: int, topk: int, e: int, device, empty: int = 0) -> torch.Tensor:
    """Random distinct experts per token, never choosing the last ``empty`` experts."""
    return torch.stack([torch.randperm(e - empty, device=device)[:topk] for _ in range(t)]).to(torch.int32)


def grouped_ref(x, qw, expert_ids, block_m, bias, w_dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 ``[M_pad, N]`` of every row in a used block, and the mask of those rows."""
    row_expert = expert_ids.long().repeat_interleave(block_m)
    ref = torch.zeros(x.shape[0], qw.N, dtype=torch.float64, device=x.device)
    for e in range(qw.num_experts):
        rows = row_expert == e
        w = humming.dequantize(moe.expert_weight(qw, e), w_dtype).double()
        ref[rows] = x[rows].double() @ w.T + (0 if bias is None else bias[e].double())
    return ref, row_expert >= 0


def grouped_input(t, topk, e, k, block_m, dtype, device, empty=1):
    """Random grouped rows ``[M_pad, K]`` of ``dtype`` and their blocks' expert ids, for a random routing of
    ``t`` tokens to ``topk`` of ``e`` experts (the last ``empty`` never chosen)."""
    r = moe.moe_align(random_routing(t, topk, e, device, min(empty, e - topk)), e, block_m)
    return torch.randn(r.m_pad, k, device=device).to(dtype), r.expert_ids


WEIGHTS = {
    "int4-g32": dict(weight="int4", group_size=32),
    "int4-g128": dict(weight="int4", group_size=128),
    "fp8-block": dict(weight="fp8_block", group_size=(16, 128)),
    "uint4-zp-g128": dict(weight="int4", group_size=128, zero_point=True),
    "int8-channel": dict(weight="int8", group_size=-1),
    "e4m3-channel": dict(weight="e4m3", group_size=-1),
    "mxfp4": dict(weight="mxfp4"),
    "nvfp4": dict(weight="nvfp4"),
    "int3-g64-float-zp": dict(weight="int3", group_size=64, zero_point="float"),
}


def quantize_experts(name: str, e: int, n: int, k: int, device, act_order: bool = False, bias: bool = False):
    kwargs = dict(WEIGHTS[name])
    if bias:
        kwargs["bias"] = torch.randn(e, n, device=device)
    if act_order:  # a different column -> group map per expert: g_idx [E, K]
        groups = -(-k // kwargs["group_size"])
        b = kwargs.pop("bias", [None] * e)
        g_idx = lambda: torch.randint(0, groups, (k,), dtype=torch.int32, device=device)
        parts = [
            humming.quantize(torch.randn(n, k, device=device), **kwargs, g_idx=g_idx(), bias=b[i]) for i in range(e)
        ]
        return humming.stack(parts)
    return humming.quantize(torch.randn(e, n, k, device=device), **kwargs)


def fused_ref(
    x,
    w13,
    w2,
    weights,
    ids,
    act=None,
    activation="silu",
    layout="concat",
    expert_map=None,
    scales=(None, None),
    **params,
):
    """A per-slot loop in float64 over fp32-dequantized experts: w13, the activation, w2, the weighted sum.
    With ``act``, w13's input is quantized over the ``T`` tokens and w2's (rounded to x's dtype, as the layer
    hands it over) over the hidden rows of every routed slot: each row alone for per-token and per-group
    schemes, one tensor-wide scale over those rows otherwise, which is the kernels' over their rows in use
    when w13 has no bias (padding rows are then zeros). With ``expert_map``, ``ids`` are global and slots of
    experts not on this rank (-1) are left out. ``scales``: static scales of w13's and w2's inputs."""
    q = lambda v, s: v if act is None else humming.dequantize_activation(humming.quantize_activation(v, act, scale=s))
    out = torch.zeros(x.shape[0], w2.N, dtype=torch.float64, device=x.device)
    xq = q(x, scales[0]).double()
    slots, hidden = [], []
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j]) if expert_map is None else int(expert_map[int(ids[t, j])])
            if e < 0:
                continue
            a = moe.expert_weight(w13, e)
            h = xq[t : t + 1] @ humming.dequantize(a).double().T + (0 if a.bias is None else a.bias.double())
            slots.append((t, j, e))
            hidden.append(gated(h, activation, layout, **params))
    if not slots:
        return out
    hidden = torch.cat(hidden).to(x.dtype if act else torch.float32)  # quantized as the layer rounds it
    for (t, j, e), h in zip(slots, q(hidden, scales[1]).double()):
        b = moe.expert_weight(w2, e)
        y = h @ humming.dequantize(b).double().T + (0 if b.bias is None else b.bias.double())
        out[t] += float(weights[t, j]) * y
    return out


def moe_args():
    """Small valid fused_moe arguments on CPU: ``(x, w13, w2, topk_weights, topk_ids)``."""
    e, k, inter = 3, 64, 32
    w13, w2 = quantize_experts("int4-g32", e, 2 * inter, k, "cpu"), quantize_experts("int4-g32", e, k, inter, "cpu")
    ids = torch.tensor([[0, 2], [1, 0]], dtype=torch.int32)
    return torch.randn(2, k).bfloat16(), w13, w2, torch.rand(2, 2), ids
