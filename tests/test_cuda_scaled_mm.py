"""``cuda.scaled_mm`` (``torch._scaled_mm`` for W8A8 e4m3): its support checks and the dispatcher's order on
CPU; results against the float64 reference on a Hopper GPU."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from helpers import assert_rel_close, capture

from humming.cuda_kernels import scaled_mm
from humming.dispatch.plan import heuristic_order
from humming.ir.activation import get_act_scheme
from humming.testing import random_activation, random_weight, reference


def test_heuristic_puts_the_vendor_gemm_first_for_e4m3_at_large_m():
    qw = random_weight(256, 256, -1, "cpu")
    fp8 = get_act_scheme("fp8")
    assert heuristic_order(qw, fp8, 256)[:2] == ("cuda.scaled_mm", "cuda.fp8_gemm")
    assert heuristic_order(qw, fp8, 128)[0] == "cuda.fp8_gemm"  # small M: the FP8 GEMM's tiles
    int4 = random_weight(256, 256, 128, "cpu", fmt="int4")
    assert heuristic_order(int4, fp8, 4096)[0] == "cuda.fp8_gemm"


@pytest.mark.parametrize(
    "weight,fmt,act,why",
    [
        (-1, "int4", "fp8", "2-D e4m3 weights"),
        ((128, 128), "e4m3", "fp8_g128", "per-tensor or per-channel weight scales"),
        (-1, "e4m3", "fp8_g128", "per token or per tensor"),
        (-1, "e4m3", "int8", "per token or per tensor"),
    ],
)
def test_unsupported_says_why(weight, fmt, act, why):
    qw = random_weight(256, 256, weight, "cpu", fmt=fmt)
    reason = scaled_mm.unsupported(qw, get_act_scheme(act), torch.empty(4, 256))
    assert reason is not None and why in reason, reason


def test_unsupported_refuses_cpu_tensors_and_odd_shapes():
    qw = random_weight(256, 256, -1, "cpu")
    assert "not a CUDA device" in scaled_mm.unsupported(qw, get_act_scheme("fp8"), torch.empty(4, 256))
    odd = random_weight(250, 256, -1, "cpu")
    assert "N % 16 == 0" in scaled_mm.unsupported(odd, get_act_scheme("fp8"), torch.empty(4, 256))


# ---- GPU ----


@pytest.fixture
def sm90() -> None:
    if torch.cuda.get_device_capability() != scaled_mm.ROWWISE_CC:
        pytest.skip("torch's row-wise-scaled fp8 GEMM runs on sm_90")


@dataclass(frozen=True)
class Case:
    m: int
    n: int
    k: int
    weight: object  # "tensor" or -1 (per channel)
    act: str
    out: torch.dtype = torch.bfloat16
    bias: torch.dtype | None = None


CASES = [
    Case(256, 8192, 8192, -1, "fp8"),
    Case(1024, 28672, 8192, -1, "fp8", bias=torch.bfloat16),
    Case(300, 1024, 4096, "tensor", "fp8"),
    Case(300, 1024, 4096, -1, "fp8_tensor", bias=torch.float32),
    Case(77, 1024, 1024, "tensor", "fp8_tensor", torch.float16),  # per-tensor both: cuBLASLt, any output dtype
    Case(77, 1024, 1024, "tensor", "fp8_tensor", torch.float32, torch.float32),
    Case(1, 2048, 7168, -1, "fp8"),
    Case(33, 7168, 2048, -1, "fp8", torch.float16),  # row-wise with fp16 out: runs on cuda.fp8_gemm
]


def _ids(case: Case) -> str:
    return f"m{case.m}-n{case.n}-k{case.k}-w{case.weight}-{case.act}-{str(case.out)[6:]}-b{str(case.bias)[6:]}"


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_matches_float64_reference(case, seed, sm90):
    qw = random_weight(case.n, case.k, case.weight, "cuda")
    qa = random_activation(case.m, case.k, case.act, "cuda")
    bias = None if case.bias is None else torch.randn(case.n, device="cuda", dtype=case.bias)
    assert scaled_mm.unsupported(qw, qa.scheme, qa.codes) is None
    out = scaled_mm.linear(qa, qw, bias, qa.scheme, case.out)
    assert out.dtype == case.out and out.shape == (case.m, case.n)
    assert_rel_close(out, reference(qa, qw, bias), precision=torch.float64, seed=seed)


@pytest.mark.gpu
@pytest.mark.parametrize("act_name", ["fp8", "fp8_tensor"])
def test_float_activations_go_through_the_triton_pass(act_name, seed, sm90):
    from humming.triton_kernels.act_quant import quantize_activation

    qw = random_weight(1024, 2048, -1, "cuda")
    act = get_act_scheme(act_name)
    x = torch.randn(300, 2048, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    out = scaled_mm.KERNEL.run(x, qw, bias, act, torch.bfloat16, None)
    qa = quantize_activation(x, act)
    assert torch.equal(out, scaled_mm.linear(qa, qw, bias, act, torch.bfloat16))
    assert_rel_close(out, reference(qa, qw, bias), precision=torch.float64, seed=seed)


@pytest.mark.gpu
def test_cuda_graph_replay_and_empty_batch(seed, sm90):
    qw = random_weight(1024, 2048, -1, "cuda")
    act = get_act_scheme("fp8")
    x = torch.randn(256, 2048, device="cuda", dtype=torch.bfloat16)
    run = lambda: scaled_mm.KERNEL.run(x, qw, None, act, torch.bfloat16, None)
    eager = run()
    graph, captured = capture(run)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, run()) and not torch.equal(captured, eager)
    empty = scaled_mm.KERNEL.run(x[:0], qw, None, act, torch.bfloat16, None)
    assert empty.shape == (0, 1024)
