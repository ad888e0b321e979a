"""Batch invariance (``humming.set_deterministic``): each output row is bit-identical whatever M and whatever
batch the row came in, for every weight format and every activation scheme whose scales are per row or per
group (per-tensor dynamic scales, and NVFP4's global scale, span the batch by definition)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import humming
from humming.triton_kernels.interpreter import dot

CASES = [
    (dict(weight="int4", group_size=128), None),
    (dict(weight="int4", group_size=128, zero_point=True), None),
    (dict(weight="int8", group_size=-1), None),
    (dict(weight="e4m3", group_size=-1), None),
    (dict(weight="mxfp4"), None),
    (dict(weight="nvfp4"), None),
    (dict(weight="int3", group_size=64), None),
    (dict(weight="int4", group_size=128), "fp8"),
    (dict(weight="e4m3", group_size=-1), "fp8"),
    (dict(weight="fp8_block"), "fp8_g128"),
    (dict(weight="int8", group_size=-1), "int8"),
    (dict(weight="mxfp4"), "mxfp4"),
]
IDS = [f"{q['weight']}{'-zp' if q.get('zero_point') else ''}-{act or 'a16'}" for q, act in CASES]


@pytest.fixture
def deterministic():
    humming.set_deterministic(True)
    yield
    humming.set_deterministic(None)


def _rows_are_batch_invariant(qw, act, x, batches) -> None:
    full = humming.linear(x, qw, act=act)
    assert torch.isfinite(full).all()
    for start, m in batches:
        part = humming.linear(x[start : start + m], qw, act=act)
        diff = (part != full[start : start + m]).any(dim=1).nonzero()
        assert diff.numel() == 0, f"M={m} from row {start}: rows {diff[:5, 0].tolist()} differ from the full batch"


@pytest.mark.gpu
@pytest.mark.parametrize("qargs, act", CASES, ids=IDS)
def test_rows_are_bit_identical_for_every_m_on_the_gpu(qargs, act, deterministic, seed):
    qw = humming.quantize(torch.randn(1536, 2048, device="cuda") / 45, **qargs)
    x = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16)
    plan = humming.explain(qw, 1, act)
    assert plan.kernel.startswith("triton.") and plan.source.startswith("deterministic"), plan
    batches = [(0, m) for m in (1, 2, 7, 16, 33, 64, 100, 256, 1024)] + [(777, 1), (1000, 63), (2048, 2048)]
    _rows_are_batch_invariant(qw, act, x, batches)


@triton.jit
def _dot_kernel(a_ptr, b_ptr, out_ptr, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr):
    rows, ks, cols = tl.arange(0, M), tl.arange(0, K), tl.arange(0, N)
    a = tl.load(a_ptr + rows[:, None] * K + ks[None, :])
    b = tl.load(b_ptr + ks[:, None] * N + cols[None, :])
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], dot(a, b, tl.zeros((M, N), tl.float32)))


def test_a_rows_dot_does_not_depend_on_its_place_in_the_tile(seed):
    """The kernels' ``dot`` gives each row the same bits wherever the row sits in the tile (numpy's matmul,
    the interpreter's ``tl.dot``, does not), so that the interpreter tests of batch invariance can hold."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    a = torch.randn(32, 64, device=device, dtype=torch.bfloat16)
    b = torch.randn(64, 32, device=device, dtype=torch.bfloat16)
    outs = []
    for shift in (0, 5, 17):
        out = torch.full((32, 32), float("nan"), device=device)
        _dot_kernel[(1,)](a.roll(shift, 0), b, out, 32, 64, 32)
        outs.append(out.roll(-shift, 0))
    assert torch.isfinite(outs[0]).all()
    assert all(torch.equal(out, outs[0]) for out in outs[1:])
    torch.testing.assert_close(outs[0], a.float() @ b.float(), rtol=1e-5, atol=1e-4)


INTERPRETER_CASES = [
    (dict(weight="int4", group_size=64), None),
    (dict(weight="int4", group_size=64, zero_point=True), None),
    (dict(weight="int4", group_size=64), "fp8"),
    (dict(weight="e4m3", group_size=-1), "fp8"),
]


@pytest.mark.parametrize("act", [None, "int8"])
def test_prepared_triton_calls_launch_the_one_tile(act, deterministic, monkeypatch, seed):
    """humming.linear's prepared Triton calls (WnA16, scaled GEMM) launch the deterministic plan's one tile at
    every M, not the per-M default."""
    from humming.dispatch.plan import plan_linear
    from humming.ir.activation import get_act_scheme
    from humming.triton_kernels import _scaled_mm_launch, _wna16_launch

    launched = []
    for module, at in ((_wna16_launch, 4), (_scaled_mm_launch, 6)):  # the config's place in _Ready's arguments
        ready = module._Ready
        monkeypatch.setattr(module, "_Ready", lambda *a, ready=ready, at=at: launched.append(a[at]) or ready(*a))
    qw = humming.quantize(torch.randn(48, 128), "int8", group_size=-1, scale_dtype=torch.float32)
    for m in (1, 40):
        x = torch.randn(m, 128, dtype=torch.bfloat16)
        humming.linear(x, qw, act=act, backend="triton")
        tile = plan_linear(qw, None if act is None else get_act_scheme(act), x, "triton").tuning
        assert tile is not None and launched[-1] == tile, (m, launched[-1], tile)


@pytest.mark.parametrize("qargs, act", INTERPRETER_CASES, ids=lambda v: str(v))
def test_rows_are_bit_identical_for_every_m_in_the_interpreter(qargs, act, deterministic, seed):
    qw = humming.quantize(torch.randn(48, 128) / 11, **qargs)
    x = torch.randn(40, 128, dtype=torch.bfloat16)
    full = humming.linear(x, qw, act=act, backend="triton")
    assert torch.isfinite(full).all()
    for start, m in [(0, 1), (0, 17), (5, 3), (39, 1)]:
        assert torch.equal(humming.linear(x[start : start + m], qw, act=act, backend="triton"), full[start : start + m])


REFERENCE_CASES = [
    (dict(weight="int4", group_size=128), None),
    (dict(weight="e4m3", group_size=-1), "fp8"),
    (dict(weight="int8", group_size=-1), "int8"),
    (dict(weight="mxfp4"), None),
]


@pytest.mark.parametrize("qargs, act", REFERENCE_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_rows_are_bit_identical_for_every_m_on_the_reference(qargs, act, out_dtype, deterministic, seed):
    """The reference backend (what CPU tensors run) keeps the promise too: each dot product is summed in one
    fixed order, so a row's bits do not follow M or its neighbours; and it is still the float64 product."""
    qw = humming.quantize(torch.randn(96, 256) / 11, **qargs)
    x = torch.randn(70, 256, dtype=torch.bfloat16)
    full = humming.linear(x, qw, act=act, out_dtype=out_dtype, backend="reference")
    xq = x if act is None else humming.dequantize_activation(humming.quantize_activation(x, act))
    ref = xq.double() @ humming.dequantize(qw).double().T
    assert ((full.double() - ref).norm() / ref.norm()).item() <= (1e-6 if out_dtype == torch.float32 else 8e-3)
    for start, m in [(0, 1), (0, 64), (5, 3), (69, 1), (33, 37)]:
        part = humming.linear(x[start : start + m], qw, act=act, out_dtype=out_dtype, backend="reference")
        assert torch.equal(part, full[start : start + m]), (start, m)
