"""Top-k expert routing in Triton (:func:`humming.moe.topk_routing`): the ids of the reference
(:func:`humming.reference.routing.topk_routing`, which defines the routing) exactly, its weights to float32 rounding.

One program routes one token: it holds the token's logits as a ``[BLOCK_G, BLOCK_S]`` tile (groups x
experts of a group, each padded to a power of two; one group when there are no groups), so that a group's
score is a reduction along the last axis, and takes a warp per 256 padded experts (reductions of one warp
are shuffles). Each expert's ranking key is packed with its id into one int64: the key's float32 bits,
mapped to an int32 of the same order, in the high half and ``2^31 - 1 - id`` in the low half. One max
reduction then yields the best key and, among equal keys, the lowest id (the reference's tie rule), with
no rounding; the top k are k such reductions, each masking its pick out, and the kept groups are chosen the
same way. The call's shape (E, k, groups, scoring) is constexpr and T is the grid (one compiled kernel for
every T); nothing is read back to the host, so the launch can be captured in a CUDA graph.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..ir.dtypes import FLOAT_DTYPES
from ..reference.routing import RoutingSpec
from . import registry
from ._launch import CompiledLaunches
from .interpreter import INTERPRET

__all__ = ["MAX_TILE", "MAX_TOP_K", "Tile", "tile", "topk_routing", "unsupported"]

#: The most padded experts (:attr:`Tile.slots`) and the largest top_k a program handles; ``"auto"`` runs
#: larger calls on the reference.
MAX_TILE = 1024
MAX_TOP_K = 32

_NONE = tl.constexpr(-(2**63))  # the packed key of an expert that cannot be picked: below every real one


@triton.jit
def _pack(value, index):
    """float32 ``value`` and int32 ``index`` in [0, 2^31) -> int64 keys ordered by value, then lower index
    first; NaN ranks as -inf, and -0 as +0 (they compare equal)."""
    value = tl.where(value != value, float("-inf"), value)
    value = tl.where(value == 0.0, 0.0, value)
    bits = value.to(tl.int32, bitcast=True)
    ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # negative floats order backwards as ints
    return (ordered.to(tl.int64) << 32) | (0x7FFFFFFF - index).to(tl.int64)


@triton.jit
def _unpack_value(packed):
    ordered = (packed >> 32).to(tl.int32)
    bits = tl.where(ordered < 0, ordered ^ 0x7FFFFFFF, ordered)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _unpack_index(packed):
    return 0x7FFFFFFF - packed.to(tl.int32)  # the low half


@triton.jit(do_not_specialize=["stride_t"])
def _topk_routing_kernel(
    logits_ptr,
    bias_ptr,
    weights_ptr,
    ids_ptr,
    stride_t,
    routed_scaling,
    NUM_GROUPS: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    TOPK_GROUPS: tl.constexpr,
    TOP_K: tl.constexpr,
    SCORES: tl.constexpr,  # "softmax", "sigmoid", or "logits" (topk_then_softmax: a softmax of the picked)
    KEYS_ARE_LOGITS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Row ``program_id(0)`` of logits [T, NUM_GROUPS * GROUP_SIZE] (rows ``stride_t`` apart) -> its row of
    weights float32 and ids int32 [T, TOP_K] (contiguous). Grid: (T,)."""
    row = tl.program_id(0).to(tl.int64)  # int64 offsets: T * E may exceed 2^31
    group = tl.arange(0, BLOCK_G)
    member = tl.arange(0, BLOCK_S)
    expert = group[:, None] * GROUP_SIZE + member[None, :]  # [BLOCK_G, BLOCK_S]
    real = (group[:, None] < NUM_GROUPS) & (member[None, :] < GROUP_SIZE)
    # padding reads -inf: no share of a softmax, and never picked (masked below)
    x = tl.load(logits_ptr + row * stride_t + expert, mask=real, other=float("-inf")).to(tl.float32)

    if SCORES == "softmax":
        p = tl.exp(x - tl.max(tl.max(x, axis=1), axis=0))
        scores = p / tl.sum(tl.sum(p, axis=1), axis=0)
    elif SCORES == "sigmoid":
        scores = tl.sigmoid(x)
    else:
        scores = x
    if KEYS_ARE_LOGITS:
        keys = x
    elif HAS_BIAS:
        keys = scores + tl.load(bias_ptr + expert, mask=real, other=0.0).to(tl.float32)
    else:
        keys = scores
    packed = tl.where(real, _pack(keys, expert), _NONE)

    if NUM_GROUPS > 1:
        # a group's score: the sum of its two highest keys; the TOPK_GROUPS best groups stay pickable
        first = tl.max(packed, axis=1)
        group_scores = _unpack_value(first)
        if GROUP_SIZE > 1:
            group_scores += _unpack_value(tl.max(tl.where(packed == first[:, None], _NONE, packed), axis=1))
        ranked = tl.where(group < NUM_GROUPS, _pack(group_scores, group), _NONE)
        kept = tl.zeros([BLOCK_G], dtype=tl.int32)
        for _ in range(TOPK_GROUPS):
            hit = ranked == tl.max(ranked, axis=0)
            kept = tl.where(hit, 1, kept)
            ranked = tl.where(hit, _NONE, ranked)
        packed = tl.where(kept[:, None] != 0, packed, _NONE)

    col = tl.arange(0, BLOCK_K)
    weights = tl.zeros([BLOCK_K], dtype=tl.float32)
    ids = tl.zeros([BLOCK_K], dtype=tl.int32)
    for j in range(TOP_K):
        best = tl.max(tl.max(packed, axis=1), axis=0)
        hit = packed == best  # one expert: the packed keys are distinct
        picked = tl.sum(tl.sum(tl.where(hit, scores, 0.0), axis=1), axis=0)
        packed = tl.where(hit, _NONE, packed)
        weights = tl.where(col == j, picked, weights)
        ids = tl.where(col == j, _unpack_index(best), ids)

    if SCORES == "logits":
        top = tl.where(col < TOP_K, weights, float("-inf"))
        p = tl.exp(top - tl.max(top, axis=0))
        weights = p / tl.sum(p, axis=0)
    if RENORMALIZE:
        weights = weights / tl.sum(weights, axis=0)
    weights = weights * routed_scaling
    tl.store(weights_ptr + row * TOP_K + col, weights, mask=col < TOP_K)
    tl.store(ids_ptr + row * TOP_K + col, ids, mask=col < TOP_K)


@dataclass(frozen=True)
class Tile:
    """How a call is laid out: a token's experts padded per group (``block_g`` groups of ``block_s``), the
    picks padded to ``block_k``, and a warp per 256 padded experts (one warp up to 256: its reductions are
    shuffles, with no barrier)."""

    block_g: int
    block_s: int
    block_k: int
    num_warps: int

    @property
    def slots(self) -> int:
        return self.block_g * self.block_s


@functools.lru_cache(maxsize=1024)
def tile(spec: RoutingSpec) -> Tile:
    """The :class:`Tile` of a call: a pure function of its spec."""
    block_g = triton.next_power_of_2(spec.num_groups)
    block_s = triton.next_power_of_2(spec.group_size)
    return Tile(block_g, block_s, triton.next_power_of_2(spec.top_k), max(1, block_g * block_s // 256))


def unsupported(router_logits: torch.Tensor, correction_bias, spec: RoutingSpec) -> str | None:
    """``None`` if :func:`topk_routing` runs this call, else the reason."""
    if router_logits.device.type != "cuda" and not INTERPRET:
        return f"router_logits is on {router_logits.device}; the kernel runs on CUDA tensors (or the interpreter)"
    if router_logits.dtype not in FLOAT_DTYPES:
        return f"router_logits: the kernel reads float16, bfloat16 or float32, got {router_logits.dtype}"
    if correction_bias is not None and correction_bias.dtype not in FLOAT_DTYPES:
        return f"correction_bias: the kernel reads float16, bfloat16 or float32, got {correction_bias.dtype}"
    slots = tile(spec).slots
    if slots > MAX_TILE:
        return f"{spec.num_experts} experts pad to {slots} slots per token, above the kernel's {MAX_TILE}"
    if spec.top_k > MAX_TOP_K:
        return f"top_k={spec.top_k} is above the kernel's {MAX_TOP_K}"
    return None


def _constexprs(spec: RoutingSpec) -> dict:
    """The kernel's constexprs for ``spec``, by name, in the kernel's order."""
    layout = tile(spec)
    return {
        "NUM_GROUPS": spec.num_groups,
        "GROUP_SIZE": spec.group_size,
        "TOPK_GROUPS": spec.topk_groups,
        "TOP_K": spec.top_k,
        "SCORES": "logits" if spec.order == "topk_then_softmax" else spec.scoring,
        "KEYS_ARE_LOGITS": spec.keys_are_logits,
        "HAS_BIAS": spec.has_bias,
        "RENORMALIZE": spec.renormalize,
        "BLOCK_G": layout.block_g,
        "BLOCK_S": layout.block_s,
        "BLOCK_K": layout.block_k,
    }


@functools.lru_cache(maxsize=1024)
def _constexpr_values(spec: RoutingSpec) -> tuple:
    return tuple(_constexprs(spec).values())


_launches = CompiledLaunches(_topk_routing_kernel)


def topk_routing(router_logits: torch.Tensor, correction_bias, spec: RoutingSpec):
    """``(weights float32 [T, top_k], ids int32 [T, top_k])`` of a call :func:`unsupported` accepts."""
    t, k = router_logits.shape[0], spec.top_k
    dev = router_logits.device
    weights = torch.empty((t, k), dtype=torch.float32, device=dev)
    ids = torch.empty((t, k), dtype=torch.int32, device=dev)
    if t == 0:
        return weights, ids
    if router_logits.stride(1) != 1:
        router_logits = router_logits.contiguous()
    bias = router_logits if correction_bias is None else correction_bias.contiguous()  # unread without a bias
    # Launch key: what Triton specializes on besides the constexprs (stride_t is not specialized): the
    # dtypes and 16-byte alignment of the pointers that are not fresh allocations, and the device.
    key = (dev.index, router_logits.dtype, router_logits.data_ptr() % 16, bias.dtype, bias.data_ptr() % 16, spec)
    args = (router_logits, bias, weights, ids, router_logits.stride(0), spec.routed_scaling)
    _launches.launch(key, (t, 1, 1), (*args, *_constexpr_values(spec)), tile(spec).num_warps, dev.index)
    return weights, ids


def _compile_specs() -> list[registry.CompileSpec]:
    """The routing of Mixtral, Qwen3-MoE, DeepSeek-V3, gpt-oss and Kimi-K2, and the kernel's limits."""

    def spec(e, k, scoring="softmax", *, order="score_then_topk", groups=(1, 1), bias=False, renormalize=True):
        return RoutingSpec(e, k, scoring, order, renormalize, *groups, 2.5 if bias else 1.0, bias)

    styles = {  # name: (logits dtype, spec)
        "softmax-e8-k2": ("bf16", spec(8, 2)),
        "softmax-e128-k8": ("fp32", spec(128, 8)),
        "sigmoid-g8-e256-k8-bias": ("fp32", spec(256, 8, "sigmoid", groups=(8, 4), bias=True)),
        "topk_then_softmax-e128-k4": ("bf16", spec(128, 4, order="topk_then_softmax", renormalize=False)),
        "sigmoid-e384-k8-bias": ("bf16", spec(384, 8, "sigmoid", bias=True)),
        "softmax-e1024-k32": ("fp32", spec(MAX_TILE, MAX_TOP_K, renormalize=False)),
    }
    return [
        registry.CompileSpec(
            name=f"routing-{name}",
            kernel=_topk_routing_kernel,
            pointers={"logits_ptr": f"*{dtype}", "bias_ptr": "*fp32", "weights_ptr": "*fp32", "ids_ptr": "*i32"},
            scalars={"routed_scaling": "fp32"},
            constexprs=_constexprs(routing),
            num_warps=tile(routing).num_warps,
        )
        for name, (dtype, routing) in styles.items()
    ]


registry.register("routing", _compile_specs)
