"""The inputs every benchmarked system starts from, seeded, and the float32 products they are checked against.

Imports torch only: the humming-kernels worker process (:mod:`humming.bench.peer`) loads this file beside
the other package's ``humming``, so that both processes build the same weight, activations and routing.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "ROUTINGS",
    "activations",
    "bias",
    "expert_weight",
    "moe_reference",
    "rel_err",
    "routing",
    "sorted_routing",
    "topk_weights",
    "weight",
]

#: Expert routings of the MoE benchmarks (see :func:`routing`).
ROUTINGS = ("random", "skewed")
#: Spread of the skewed routing's per-expert score offsets (in units of the scores' own spread).
SKEW = 1.0


def _generator(device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def weight(n: int, k: int, experts: int | None, dtype: torch.dtype, device, seed: int = 0) -> torch.Tensor:
    """The layer's unquantized weight: ``[N, K]`` (``[E, N, K]`` with ``experts``) of ``dtype``, N(0, 1/K).

    Expert ``e`` is drawn alone from seed ``seed * 65536 + e`` (:func:`expert_weight`), so that a stack of
    hundreds of experts never needs a float32 copy of itself and any expert can be drawn again."""
    if experts is None:
        return (torch.randn(n, k, device=device, generator=_generator(device, seed)) / math.sqrt(k)).to(dtype)
    w = torch.empty(experts, n, k, device=device, dtype=dtype)
    for e in range(experts):
        w[e] = expert_weight(e, n, k, dtype, device, seed)
    return w


def expert_weight(e: int, n: int, k: int, dtype: torch.dtype, device, seed: int = 0) -> torch.Tensor:
    """Expert ``e`` of :func:`weight`'s ``[E, N, K]`` stack: ``[N, K]`` of ``dtype``."""
    g = _generator(device, seed * 65536 + e)
    return (torch.randn(n, k, device=device, generator=g) / math.sqrt(k)).to(dtype)


def bias(n: int, experts: int, dtype: torch.dtype, device, seed: int = 0) -> torch.Tensor:
    """A per-expert bias ``[E, N]`` of ``dtype``, N(0, 0.1^2) (gpt-oss's experts have biases)."""
    return (0.1 * torch.randn(experts, n, device=device, generator=_generator(device, 4096 + seed))).to(dtype)


def random_experts(fmt: str, e: int, n: int, k: int, device="cuda"):
    """An expert-stacked weight of random codes and scales at full size, without the float weight that
    quantizing would need (4x the memory): ``"int4"`` g128 or ``"e4m3"`` 128x128 blocks. Random e4m3 words
    hold NaN codes, so it is for repacking and timing, not for checking values."""
    from ..ir.formats import get_format
    from ..ir.weight import QuantizedWeight

    shape = (e, n, k * get_format(fmt).bits // 32)
    words = torch.randint(-(2**31), 2**31 - 1, shape, dtype=torch.int32, device=device)
    if fmt == "int4":
        scales, group = torch.rand(e, n, k // 128, device=device, dtype=torch.bfloat16) + 0.5, (1, 128)
    elif fmt == "e4m3":
        scales, group = torch.rand(e, n // 128, k // 128, device=device) + 0.5, (128, 128)
    else:
        raise ValueError(f"fmt: expected 'int4' or 'e4m3', got {fmt!r}")
    return QuantizedWeight(shape=(e, n, k), format=fmt, qweight=words, scales=scales, group_shape=group)


def activations(m: int, k: int, dtype: torch.dtype, device) -> torch.Tensor:
    """``[M, K]`` N(0, 1) activations of ``dtype``, seeded by M."""
    return torch.randn(m, k, device=device, generator=_generator(device, m)).to(dtype)


def routing(m: int, experts: int, topk: int, device, kind: str = "random") -> torch.Tensor:
    """int64 ``[M, topk]`` expert ids, the top-k of Gaussian scores seeded by M.

    ``"random"``: what ``torch.cuda.manual_seed(M); torch.randn(M, E, device="cuda").topk(topk).indices``
    draws (every expert equally likely). ``"skewed"``: the same scores plus a fixed per-expert offset,
    ``SKEW`` times N(0, 1) drawn on the CPU from seed 7, so that a few hot experts take most slots and many
    are rarely hit (real traffic is uneven: the grouped GEMM sees a few long segments and many short ones)."""
    if kind not in ROUTINGS:
        raise ValueError(f"kind: expected one of {ROUTINGS}, got {kind!r}")
    scores = torch.randn(m, experts, device=device, generator=_generator(device, m))
    if kind == "skewed":
        offset = SKEW * torch.randn(experts, generator=_generator("cpu", 7))
        scores += offset.to(device)
    return scores.topk(topk).indices


def topk_weights(ids: torch.Tensor) -> torch.Tensor:
    """float32 ``[M, topk]`` combine weights for routing ``ids``: a softmax over N(0, 1) logits seeded by M
    (the layer's weighted sum; their values do not change its cost)."""
    m, topk = ids.shape
    logits = torch.randn(m, topk, device=ids.device, generator=_generator(ids.device, 8192 + m))
    return logits.softmax(-1)


def sorted_routing(ids: torch.Tensor, experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The routed slots ``t * topk + j`` sorted by expert (stable) and each expert's row count (int64 ``[E]``):
    the unpadded grouped layout of torch's and humming-kernels' grouped GEMMs."""
    flat = ids.reshape(-1)
    return torch.argsort(flat, stable=True), torch.bincount(flat, minlength=experts)


def moe_reference(x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """float32 ``[M * topk, N]``: slot ``t * topk + j`` is ``x[t] @ w[ids[t, j]]^T`` (``+ b[ids[t, j]]``)."""
    topk = ids.shape[1]
    flat = ids.reshape(-1)
    out = torch.empty(flat.numel(), w.shape[1], device=x.device, dtype=torch.float32)
    for e in flat.unique().tolist():
        slots = (flat == e).nonzero().squeeze(1)
        out[slots] = x[slots // topk].float() @ w[e].float().T
        if b is not None:
            out[slots] += b[e].float()
    return out


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float64 (NaN when ``out`` has NaN)."""
    ref = ref.double()
    return float((out.double() - ref).norm() / ref.norm().clamp_min(1e-30))
