"""Bad input to ``humming.moe.grouped_linear`` and ``humming.moe.fused_moe``: a ValueError naming the
argument, what was expected and what was got."""

from __future__ import annotations

import pytest
import torch
from moe_cases import moe_args, quantize_experts

import humming
from humming import moe

wna16 = pytest.importorskip("humming.triton_kernels.wna16")

# ---------------------------------------------------------------------------------------------- bad input
_TRITON_INT8 = {"backend": "triton", "act": "int8"}
_act_order = lambda: quantize_experts("int4-g32", 2, 32, 64, "cpu", True)


def _ok():
    qw = quantize_experts("int4-g32", 2, 32, 64, "cpu")
    return torch.randn(32, 64).bfloat16(), qw, torch.tensor([0, 1], dtype=torch.int32)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda x, qw, ids: (x.double(), qw, ids, 16, {}), "x: expected dtype"),
        (lambda x, qw, ids: (x[:, :48], qw, ids, 16, {}), r"x: expected shape \[M, 64\]"),
        (lambda x, qw, ids: (x[:24], qw, ids, 16, {}), "not a multiple of block_m=16"),
        (lambda x, qw, ids: (x, qw, ids, 12, {}), "block_m: expected a positive multiple of 8"),
        (lambda x, qw, ids: (x, qw, ids.long(), 16, {}), "expert_ids: expected an int32"),
        (lambda x, qw, ids: (x, qw, ids[:1], 16, {}), r"expert_ids: expected shape \(2,\)"),
        (lambda x, qw, ids: (x, qw, ids.to("meta"), 16, {}), "expert_ids is on meta"),
        (lambda x, qw, ids: (x, qw, torch.tensor([0, 2], dtype=torch.int32), 16, {}), r"\[-1, 2\)"),
        (lambda x, qw, ids: (x, moe.expert_weight(qw, 0), ids, 16, {}), "expected an expert-stacked weight"),
        (lambda x, qw, ids: (x, qw, ids, 16, {"bias": torch.randn(32)}), r"bias: expected .* \(2, 32\)"),
        (lambda x, qw, ids: (x, qw, ids, 16, {"out_dtype": torch.int8}), "out_dtype"),
        (
            lambda x, qw, ids: (x, quantize_experts("int4-g32", 2, 32, 64, "cpu", True), ids, 16, _TRITON_INT8),
            "act-order",
        ),
        (lambda x, qw, ids: (x, qw, torch.tensor([0, 1, 1, -1], dtype=torch.int32), 8, {"backend": "triton"}), "of 16"),
        (lambda x, qw, ids: (x, qw, ids, 16, {"backend": "tpu"}), "backend: expected one of"),
    ],
    ids=[
        "x-dtype",
        "x-k",
        "rows",
        "block-m",
        "ids-dtype",
        "ids-shape",
        "ids-device",
        "ids-range",
        "dense-weight",
        "bias-shape",
        "out-dtype",
        "triton-act",
        "triton-block-8",
        "backend-name",
    ],
)
def test_grouped_linear_rejects(change, match: str) -> None:
    x, qw, ids, block_m, kwargs = change(*_ok())
    with pytest.raises(ValueError, match=match):
        moe.grouped_linear(x, qw, ids, block_m, **kwargs)


def test_grouped_linear_rejects_combination() -> None:
    qw = humming.quantize(torch.randn(2, 32, 64), "nf4", group_size=32)
    with pytest.raises(ValueError, match="nf4 with act=int8 is not supported"):
        moe.grouped_linear(torch.randn(16, 64).bfloat16(), qw, torch.zeros(1, dtype=torch.int32), 16, act="int8")


def test_linear_rejects_experts() -> None:
    with pytest.raises(ValueError, match="expert-stacked"):
        humming.linear(torch.randn(2, 64).bfloat16(), quantize_experts("int4-g32", 2, 32, 64, "cpu"))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda x, a, b, w, i: ((x, moe.expert_weight(a, 0), b, w, i), {}), "w13: expected an expert-stacked"),
        (lambda x, a, b, w, i: ((x, a, a, w, i), {}), r"w2: expected shape \(3, 64, 32\)"),
        (lambda x, a, b, w, i: ((x[:, :32], a, b, w, i), {}), r"x: expected shape \[M, 64\]"),
        (lambda x, a, b, w, i: ((x, a, b, w, i[:1]), {}), r"topk_ids: expected shape \[T=2, topk\]"),
        (lambda x, a, b, w, i: ((x, a, b, w.long(), i), {}), "topk_weights: expected a float"),
        (lambda x, a, b, w, i: ((x, a, b, w[:, :1], i), {}), r"topk_weights: expected shape \(2, 2\)"),
        (lambda x, a, b, w, i: ((x, a, b, w, i.float()), {}), "topk_ids: expected an integer"),
        (lambda x, a, b, w, i: ((x, a, b, w, i + 2), {}), r"topk_ids: values must lie in \[0, 3\)"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"activation": "relu"}), "activation: expected one of"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"gate_up_layout": "split"}), "gate_up_layout: expected one of"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"alpha": 1.0}), "alpha: parameters of activation='swiglu_oai'"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"activation": "gelu", "limit": 7}), "limit: parameters of"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"activation": "swiglu_oai", "limit": 0.0}), "limit: expected a pos"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"activation": "swiglu_oai", "alpha": float("nan")}), "alpha: exp"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"activation": "swiglu_oai", "alpha": True}), "alpha: expected"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"expert_map": [0, 1, 2]}), "expert_map: expected a torch.Tensor"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"expert_map": torch.zeros(3)}), "expert_map: expected an integer"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"expert_map": torch.zeros(2, 3, dtype=torch.int32)}), "E_global"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"expert_map": torch.arange(2)}), r"E_global >= 3"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"expert_map": torch.arange(3, device="meta")}), "expert_map is on"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"expert_map": torch.tensor([0, 1, 3])}), r"expert_map: .* \[-1, 3\)"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"expert_map": torch.tensor([0, -2, 1])}), r"found -2"),
        (lambda x, a, b, w, i: ((x, a, b, w, i + 2), {"expert_map": torch.arange(4)}), r"topk_ids: .* \[0, 4\)"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"block_m": 20}), "block_m"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"w13_act_scale": torch.ones(1)}), "w13_act_scale: a static"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"act": "mxfp4", "w2_act_scale": torch.ones(1)}), "w2_act_scale"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"act": "fp8", "w2_act_scale": torch.ones(2)}), "one-element"),
        (lambda x, a, b, w, i: ((x, a, b, w, i), {"act": "fp8", "w13_act_scale": 0.5}), "one-element float"),
    ],
    ids=[
        "dense-w13",
        "w2-shape",
        "x-k",
        "ids-shape",
        "weights-dtype",
        "weights-shape",
        "ids-dtype",
        "ids-range",
        "activation",
        "gate-up-layout",
        "alpha-not-swiglu",
        "limit-not-swiglu",
        "limit-zero",
        "alpha-nan",
        "alpha-bool",
        "map-list",
        "map-float",
        "map-2d",
        "map-short",
        "map-device",
        "map-value-large",
        "map-value-negative",
        "map-ids-range",
        "block-m",
        "scale-no-act",
        "scale-mxfp4",
        "scale-two",
        "scale-float",
    ],
)
def test_fused_moe_rejects(change, match: str) -> None:
    args, kwargs = change(*moe_args())
    with pytest.raises(ValueError, match=match):
        moe.fused_moe(*args, **kwargs)
