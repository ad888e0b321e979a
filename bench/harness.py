"""Shared benchmark machinery: the methods compared, device roofs, CUDA-graph and eager timing.

Used by bench/sweep.py (the committed sweeps) and bench/test_bench_linear.py (pytest-benchmark).
Every method is ``build(n, k, device) -> op`` with ``op(x) -> y``, ``x`` bf16 ``[M, K]``; each build makes
a fresh weight copy, so a timing loop can rotate through copies whose total exceeds the L2 cache.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

import humming
from humming.triton_kernels import scaled_mm, wna16
from humming.triton_kernels.configs import TileConfig

__all__ = ["METHODS", "MOE_METHODS", "Method", "MoeProblem", "measure_roofs", "time_op"]

Op = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Method:
    """A way to compute ``x @ W^T`` for a bf16 weight ``W [N, K]`` (quantized or not)."""

    name: str
    build: Callable[..., Op]
    weight_bytes: Callable[[int, int], int]  # bytes one weight copy occupies (what the op must read)
    note: str = ""


def _bf16_weight(n: int, k: int, device) -> torch.Tensor:
    return torch.randn(n, k, device=device, dtype=torch.bfloat16) / math.sqrt(k)


def _torch_bf16(n, k, device, config=None) -> Op:
    w = _bf16_weight(n, k, device)
    return lambda x: torch.nn.functional.linear(x, w)


def _humming_wna16(weight: str, group_size) -> Callable[..., Op]:
    def build(n, k, device, config: TileConfig | None = None) -> Op:
        qw = humming.quantize(_bf16_weight(n, k, device), weight, group_size=group_size)
        return lambda x: wna16.linear(x, qw, None, torch.bfloat16, config=config)

    return build


def _humming_scaled(weight: str, group_size, act: str) -> Callable[..., Op]:
    def build(n, k, device, config=None) -> Op:
        qw = humming.quantize(_bf16_weight(n, k, device), weight, group_size=group_size, scale_dtype=torch.float32)
        return lambda x: scaled_mm.linear(x, qw, None, act, torch.bfloat16)

    return build


def _humming_auto(weight: str, group_size, act: str | None = None) -> Callable[..., Op]:
    """``humming.linear`` as users call it: the dispatcher picks the backend (CUDA first, then Triton)."""

    def build(n, k, device, config=None) -> Op:
        qw = humming.quantize(_bf16_weight(n, k, device), weight, group_size=group_size)
        return lambda x: humming.linear(x, qw, act=act)

    return build


def _torch_int4pack(n, k, device, config=None) -> Op:
    group = 128
    codes = torch.randint(0, 16, (n, k), dtype=torch.int32, device=device)
    packed_u8 = (codes[:, ::2] << 4 | codes[:, 1::2]).to(torch.uint8)
    packed = torch.ops.aten._convert_weight_to_int4pack(packed_u8, 8)
    scales_zeros = torch.rand(k // group, n, 2, device=device, dtype=torch.bfloat16)
    return lambda x: torch.ops.aten._weight_int4pack_mm(x, packed, group, scales_zeros)


def _torch_scaled_mm_fp8(n, k, device, config=None) -> Op:
    w = _bf16_weight(n, k, device).to(torch.float8_e4m3fn)
    scale_b = torch.rand(1, n, device=device, dtype=torch.float32)
    cache: dict[int, tuple] = {}

    def op(x):
        # Activations quantized beforehand (this baseline times the GEMM alone).
        if x.shape[0] not in cache:
            cache[x.shape[0]] = (x.to(torch.float8_e4m3fn), torch.rand(x.shape[0], 1, device=device))
        xq, scale_a = cache[x.shape[0]]
        return torch._scaled_mm(xq, w.t(), scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)

    return op


def _gemlite(kind: str) -> Callable[..., Op]:
    def build(n, k, device, config=None) -> Op:
        from gemlite import helper

        w = _bf16_weight(n, k, device)
        if kind == "w4g128":
            g = 128
            layer = helper.A16W4_HQQ_INT(device=device, dtype=torch.bfloat16).from_weights(
                W_q=torch.randint(0, 16, (n, k), dtype=torch.uint8, device=device),
                scales=torch.rand(n, k // g, device=device, dtype=torch.bfloat16),
                zeros=torch.full((n, k // g), 8.0, device=device, dtype=torch.bfloat16),
            )
        elif kind == "w8":
            layer = helper.A16W8_INT8(device=device, dtype=torch.bfloat16).from_weights(w)
        else:
            linear = torch.nn.Linear(k, n, bias=False, device=device, dtype=torch.bfloat16)
            linear.weight.data.copy_(w)
            layer = helper.A16W4_MXFP(device=device, dtype=torch.bfloat16).from_linear(linear)
        return layer

    return build


def _bytes(bits_per_weight: float) -> Callable[[int, int], int]:
    return lambda n, k: int(n * k * bits_per_weight / 8)


#: name -> Method; quantized weights' bytes include their scales.
METHODS = {
    m.name: m
    for m in (
        Method("torch_bf16", _torch_bf16, _bytes(16)),
        Method("triton_w4a16_g128", _humming_wna16("int4", 128), _bytes(4 + 16 / 128)),
        Method("triton_w8a16", _humming_wna16("int8", -1), _bytes(8)),
        Method("triton_mxfp4_a16", _humming_wna16("mxfp4", 32), _bytes(4 + 8 / 32)),
        Method("triton_w8a8_fp8", _humming_scaled("e4m3", -1, "fp8"), _bytes(8), "includes activation quant"),
        Method("triton_w4a8_fp8", _humming_scaled("int4", 128, "fp8"), _bytes(4 + 32 / 128), "incl. act quant"),
        Method("auto_w4a16_g128", _humming_auto("int4", 128), _bytes(4 + 16 / 128), "humming.linear"),
        Method("auto_w8a16", _humming_auto("int8", -1), _bytes(8), "humming.linear"),
        Method("auto_mxfp4_a16", _humming_auto("mxfp4", 32), _bytes(4 + 8 / 32), "humming.linear"),
        Method("auto_w8a8_fp8", _humming_auto("e4m3", -1, "fp8"), _bytes(8), "humming.linear, incl. act quant"),
        Method(
            "auto_w4a8_fp8", _humming_auto("int4", 128, "fp8"), _bytes(4 + 16 / 128), "humming.linear, incl. act quant"
        ),
        Method("auto_mxfp4_w4a8_fp8", _humming_auto("mxfp4", 32, "fp8"), _bytes(4 + 8 / 32), "incl. act quant"),
        Method("torch_int4pack_g128", _torch_int4pack, _bytes(4 + 32 / 128)),
        Method("torch_scaled_mm_fp8", _torch_scaled_mm_fp8, _bytes(8), "activations pre-quantized"),
        Method("gemlite_w4a16_g128", _gemlite("w4g128"), _bytes(4 + 32 / 128)),
        Method("gemlite_w8a16", _gemlite("w8"), _bytes(8)),
        Method("gemlite_mxfp4_a16", _gemlite("mxfp4"), _bytes(4 + 8 / 32)),
    )
}


def _median_ms(fn: Callable[[], None], reps: int) -> float:
    start = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        start[i].record()
        fn()
        end[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(start, end))


def time_op(ops: list[Op], x: torch.Tensor, target_ms: float = 2.0) -> dict[str, float]:
    """Median time of one call, in microseconds: ``graph_us`` (CUDA-graph replay of calls rotating through
    ``ops``, i.e. through weight copies) and ``eager_us`` (the same calls launched from Python)."""
    for op in ops:
        op(x)
    torch.cuda.synchronize()
    one = _median_ms(lambda: [op(x) for op in ops], 3) / len(ops)
    calls = max(1, min(50, math.ceil(target_ms / max(one, 1e-3))))
    rounds = max(1, calls // len(ops))

    def run_all():
        for _ in range(rounds):
            for op in ops:
                op(x)

    eager = _median_ms(run_all, 5) / (rounds * len(ops))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run_all()  # warm-up on the capture stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_all()
    graph.replay()
    torch.cuda.synchronize()
    replay = _median_ms(graph.replay, 7) / (rounds * len(ops))
    del graph
    return {"graph_us": replay * 1e3, "eager_us": eager * 1e3}


def measure_roofs(device: torch.device) -> dict[str, float]:
    """Measured ceilings: device-to-device copy bandwidth (bytes read + written) and bf16 matmul rate."""
    src = torch.empty(2 * 1024**3, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = _median_ms(lambda: dst.copy_(src), 10)
    bandwidth = 2 * src.numel() / (ms * 1e-3)
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    ms = _median_ms(lambda: a @ b, 10)
    return {"copy_bytes_per_s": bandwidth, "bf16_flops_per_s": 2 * 8192**3 / (ms * 1e-3)}


# ------------------------------------------------------------------------------------------------------ MoE
@dataclass(frozen=True)
class MoeProblem:
    """One MoE layer: ``e`` experts of ``w13 [2 * inter, k]`` and ``w2 [k, inter]``, ``topk`` per token."""

    e: int
    k: int
    inter: int
    topk: int

    def weight_bytes(self, bits_per_weight: float) -> int:
        return int(self.e * 3 * self.inter * self.k * bits_per_weight / 8)


def _moe_routing(p: MoeProblem, t: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.randn(t, p.e, device=device)
    weights, ids = logits.softmax(-1).topk(p.topk)
    return weights, ids.to(torch.int32)


def _moe_fused(backend: str, weight: str = "int4", group_size: int | None = 128, act: str | None = None):
    """``humming.moe.fused_moe`` on ``weight`` experts (int4 g128 by default; ``fp8_block`` with ``act="fp8_g128"``
    is the DeepSeek-V3 recipe, ``group_size=None`` = the scheme's own); ``backend``: "auto" or "triton"."""
    group = {} if group_size is None else {"group_size": group_size}

    def build(p: MoeProblem, t: int, device) -> Op:
        w13 = _bf16_weight(p.e * 2 * p.inter, p.k, device).view(p.e, -1, p.k)
        w2 = _bf16_weight(p.e * p.k, p.inter, device).view(p.e, p.k, p.inter)
        w13, w2 = (humming.quantize(w, weight, **group) for w in (w13, w2))
        weights, ids = _moe_routing(p, t, device)
        return lambda x: humming.moe.fused_moe(x, w13, w2, weights, ids, act=act, backend=backend)

    return build


def _moe_grouped(backend: str):
    """``humming.moe.grouped_linear`` of ``w13`` alone on rows grouped beforehand (routing not timed)."""

    def build(p: MoeProblem, t: int, device) -> Op:
        w13 = humming.quantize(_bf16_weight(p.e * 2 * p.inter, p.k, device).view(p.e, -1, p.k), "int4", 128)
        _, ids = _moe_routing(p, t, device)
        block_m = humming.moe.default_block_m(t * p.topk, p.e)
        routing = humming.moe.moe_align(ids, p.e, block_m)
        rows = routing.src_slots.clamp_min(0).long() // p.topk
        return lambda x: humming.moe.grouped_linear(x[rows], w13, routing.expert_ids, block_m, backend=backend)

    return build


def _moe_torch_loop(w2_too: bool):
    """The baseline: a loop over experts of bf16 ``torch.nn.functional.linear`` on each expert's tokens
    (routing resolved on the host beforehand, so the loop is capturable); ``w2_too``: the whole MLP."""

    def build(p: MoeProblem, t: int, device) -> Op:
        w13 = _bf16_weight(p.e * 2 * p.inter, p.k, device).view(p.e, -1, p.k)
        w2 = _bf16_weight(p.e * p.k, p.inter, device).view(p.e, p.k, p.inter)
        weights, ids = _moe_routing(p, t, device)
        per_expert = []
        for e in range(p.e):
            token, j = (ids == e).nonzero(as_tuple=True)
            if token.numel():
                per_expert.append((e, token, weights[token, j].float()[:, None]))

        def op(x):
            out = torch.zeros(x.shape[0], p.k if w2_too else 2 * p.inter, device=x.device, dtype=torch.float32)
            for e, token, w in per_expert:
                h = torch.nn.functional.linear(x[token], w13[e])
                if w2_too:
                    gate, up = h.chunk(2, dim=-1)
                    h = torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, w2[e]) * w
                out.index_add_(0, token, h.float())
            return out

        return op

    return build


#: name -> build(problem, tokens, device) -> op(x [tokens, k] bf16); int4 g128 experts for humming.
MOE_METHODS = {
    "fused_moe_auto": _moe_fused("auto"),
    "fused_moe_triton": _moe_fused("triton"),
    "fused_moe_fp8_channel_auto": _moe_fused("auto", "e4m3", -1, "fp8"),
    "fused_moe_fp8_block_auto": _moe_fused("auto", "fp8_block", None, "fp8_g128"),
    "torch_bf16_moe_loop": _moe_torch_loop(w2_too=True),
    "grouped_w13_auto": _moe_grouped("auto"),
    "grouped_w13_triton": _moe_grouped("triton"),
    "torch_bf16_w13_loop": _moe_torch_loop(w2_too=False),
}
