"""``torch.compile(fullgraph=True, dynamic=True)`` of every public entry point: one graph for every M (no
graph break, no recompilation) and the eager result, bit for bit. On CPU the calls run the reference (or
the Triton interpreter); the ``gpu`` cases run the same table on the GPU's kernels, on the torch the GPU
machine has. Engines pin torch 2.9-2.11: the README's table says which versions ran this file."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

import humming
from humming import moe
from humming.ir.activation import QuantizedActivation
from humming.nn import FusedMoE, QuantizedLinear

K, N, E, INTER, TOP_K = 128, 64, 8, 64, 2
#: Token counts of one graph. M = 1 is left out: torch 2.9 specialises a size-1 dimension even for a plain
#: nn.Linear (its own broadcasting guard), so it compiles a graph of its own there; its result is still
#: checked, after the others.
SHARED_M = (3, 8, 21)


@dataclass(frozen=True)
class Entry:
    """A public entry point: ``build(device)`` -> ``(fn, inputs)``, ``inputs(m)`` the call's tensors."""

    name: str
    build: Callable


def _linear(device):
    qw = humming.quantize(torch.randn(N, K, device=device), "int4", group_size=64)
    return lambda x: humming.linear(x, qw), lambda m: (torch.randn(m, K, dtype=torch.bfloat16, device=device),)


def _linear_fp8(device):
    qw = humming.quantize(torch.randn(N, K, device=device), "e4m3", group_size=-1)
    return lambda x: humming.linear(x, qw, act="fp8"), lambda m: (
        torch.randn(m, K, dtype=torch.bfloat16, device=device),
    )


def _quantize_activation(device):
    return lambda x: humming.ops.quantize_activation(x, "fp8"), lambda m: (
        torch.randn(m, K, dtype=torch.bfloat16, device=device),
    )


def _rmsnorm_quantize(device):
    weight = torch.rand(K, dtype=torch.bfloat16, device=device) + 0.5

    def fn(x, residual):
        return humming.rmsnorm_quantize(x, weight, 1e-6, "fp8", residual=residual)

    return fn, lambda m: tuple(torch.randn(m, K, dtype=torch.bfloat16, device=device) for _ in range(2))


def _moe_weights(device):
    w13 = humming.quantize(torch.randn(E, 2 * INTER, K, device=device), "int4", group_size=64)
    w2 = humming.quantize(torch.randn(E, K, INTER, device=device), "int4", group_size=64)
    return w13, w2


def _topk_routing(device):
    return lambda logits: moe.topk_routing(logits, TOP_K, renormalize=True, routed_scaling=2.5), lambda m: (
        torch.randn(m, E, device=device),
    )


def _fused_moe(device):
    w13, w2 = _moe_weights(device)

    def fn(x, logits):
        weights, ids = moe.topk_routing(logits, TOP_K, renormalize=True)
        return moe.fused_moe(x, w13, w2, weights, ids, activation="swiglu_oai", alpha=1.5, limit=5.0)

    return fn, lambda m: (torch.randn(m, K, dtype=torch.bfloat16, device=device), torch.randn(m, E, device=device))


def _grouped_linear(device):
    w13, _ = _moe_weights(device)

    def fn(x, ids):  # rows of no token (padding, unused blocks) are not written: zeros here
        routing = moe.moe_align(ids, E, 16)
        rows = routing.token_rows(TOP_K)
        out = moe.grouped_linear(x, w13, routing.expert_ids, 16, rows=rows)
        return torch.where((rows >= 0)[:, None], out, 0)

    def inputs(m):
        ids = torch.stack([torch.randperm(E, device=device)[:TOP_K] for _ in range(m)]).int()
        return torch.randn(m, K, dtype=torch.bfloat16, device=device), ids

    return fn, inputs


def _quantized_linear(device):
    layer = QuantizedLinear(humming.quantize(torch.randn(N, K, device=device), "nvfp4"))
    return layer, lambda m: (torch.randn(m, K, dtype=torch.bfloat16, device=device),)


def _fused_moe_module(device):
    w13, w2 = (torch.randn(E, 2 * INTER, K, device=device), torch.randn(E, K, INTER, device=device))
    layer = FusedMoE.from_float(w13, w2, TOP_K, "mxfp4", scoring="sigmoid", num_groups=4, topk_groups=2)
    return layer, lambda m: (torch.randn(m, K, dtype=torch.bfloat16, device=device), torch.randn(m, E, device=device))


ENTRIES = [
    Entry("linear", _linear),
    Entry("linear-fp8", _linear_fp8),
    Entry("ops.quantize_activation", _quantize_activation),
    Entry("rmsnorm_quantize", _rmsnorm_quantize),
    Entry("moe.topk_routing", _topk_routing),
    Entry("moe.fused_moe", _fused_moe),
    Entry("moe.grouped_linear", _grouped_linear),
    Entry("nn.QuantizedLinear", _quantized_linear),
    Entry("nn.FusedMoE", _fused_moe_module),
]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _flat(out) -> list[torch.Tensor]:
    """The tensors of an entry point's result (a QuantizedActivation's codes, scales and global scale)."""
    if isinstance(out, QuantizedActivation):
        return [t for t in (out.codes, out.scales, out.global_scale) if t is not None]
    if isinstance(out, tuple | list):
        return [t for item in out for t in _flat(item)]
    return [out]


def _assert_same(got, expect, what: str) -> None:
    got, expect = _flat(got), _flat(expect)
    assert len(got) == len(expect), what
    for i, (g, e) in enumerate(zip(got, expect)):
        assert g.shape == e.shape and g.dtype == e.dtype, (what, i, g.shape, e.shape)
        assert torch.equal(g.view(torch.uint8), e.view(torch.uint8)), f"{what}: output {i} differs from eager"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_fullgraph_dynamic_compile(entry: Entry, device: str, seed: int) -> None:
    fn, inputs = entry.build(device)
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, dynamic=True)
    try:
        with torch.inference_mode(), torch._dynamo.config.patch(error_on_recompile=True):
            for m in SHARED_M:
                args = inputs(m)
                _assert_same(compiled(*args), fn(*args), f"{entry.name} M={m}")
        with torch.inference_mode():
            args = inputs(1)
            _assert_same(compiled(*args), fn(*args), f"{entry.name} M=1")
    finally:
        torch._dynamo.reset()
