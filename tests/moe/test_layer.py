"""``humming.triton_kernels.moe_layer`` (fused_moe's activation pass and combine) against the torch
definitions in ``humming.reference.moe_layer``.

- Activation pass: every activation, both gate / up layouts, fp16 / bf16 / fp32. Unquantized, within one
  rounding of the reference norm-wise (``||out - ref|| / ||ref|| <= eps`` of the dtype: the kernel's exp /
  erf are not torch's, and its tanh-GELU is the equivalent ``x * sigmoid(2y)``, which does not cancel where
  torch's ``1 + tanh(y)`` does). Quantized for ``w2``: codes and scales bit-exact with
  ``humming.ops.quantize_activation`` of the activations (the pass's own, and torch's on every row where the
  two agree bit for bit).
- Combine: the weighted sum over each token's slots against the reference; slots without a row add nothing.

Rows the kernels must not read (past ``num_rows``, rows no slot points to) hold NaN, and no NaN may reach
an output; non-finite inputs must reach it.
"""

from __future__ import annotations

import pytest
import torch
from helpers import rel_err

from humming import ops
from humming.reference import moe_layer as _moe_layer

moe_layer = pytest.importorskip("humming.triton_kernels.moe_layer")
# exp(-x) of a very negative x is inf by design (x / (1 + inf) = 0); the interpreter's numpy says so
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")

ACTIVATIONS = _moe_layer.ACTIVATIONS
LAYOUTS = _moe_layer.GATE_UP_LAYOUTS
QUANTIZED = ["fp8", "fp8_g128", "int8", "int4", "mxfp4", "mxfp8", "fp8_e5m2"]


def _activation(name: str, layout: str) -> _moe_layer.Activation:
    return _moe_layer.check_activation(name, None, None, layout)


def _h(m: int, inter: int, dtype: torch.dtype, device, used: int) -> torch.Tensor:
    """``[m, 2 * inter]`` with values up to ~15 (past swiglu_oai's limit of 7); rows from ``used`` on NaN."""
    h = (torch.randn(m, 2 * inter, device=device) * 4).to(dtype)
    h[used:] = float("nan")
    return h


def _num_rows(n: int, device) -> torch.Tensor:
    return torch.tensor(n, dtype=torch.int32, device=device)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activate_matches_reference(name: str, layout: str, dtype, seed: int, device: str) -> None:
    """37 rows (30 in use), I = 96 (not a power of two)."""
    h = _h(37, 96, dtype, device, used=30)
    activation = _activation(name, layout)
    out = moe_layer.activate(h, activation, num_rows=_num_rows(30, device))
    assert out.shape == (37, 96) and out.dtype == dtype
    want = _moe_layer.activate(h[:30], activation, dtype)
    err = rel_err(out[:30], want.double())
    assert err <= torch.finfo(dtype).eps, f"seed {seed}: rel err {err:.2e}"


@pytest.mark.parametrize("act", QUANTIZED)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activate_quantized_is_bit_exact(name: str, layout: str, act: str, seed: int, device: str) -> None:
    """21 rows (17 in use), I = 160: 1x128 groups end with a partial one, MX groups of 32 fill it."""
    h = _h(21, 160, torch.bfloat16, device, used=17)
    activation = _activation(name, layout)
    qa = moe_layer.activate(h, activation, act, _num_rows(17, device))
    assert qa.scheme.name == act and qa.codes.shape == (21, 160)
    values = moe_layer.activate(h, activation)[:17]
    want = ops.quantize_activation(values, act)
    assert torch.equal(qa.codes[:17], want.codes)
    assert torch.equal(qa.scales[:17].view(torch.uint8), want.scales.view(torch.uint8))
    # torch's activations: the same codes wherever they are the pass's own (per-row scales: row by row)
    torch_values = _moe_layer.activate(h[:17], activation, torch.bfloat16)
    same = (torch_values == values).all(dim=1)
    if same.any():
        from_torch = ops.quantize_activation(torch_values[same], act)
        assert torch.equal(qa.codes[:17][same], from_torch.codes)
        assert torch.equal(qa.scales[:17][same].view(torch.uint8), from_torch.scales.view(torch.uint8))


@pytest.mark.parametrize("act", [None, "fp8", "fp8_g128", "mxfp4"])
@pytest.mark.parametrize("name", ["silu", "swiglu_oai"])
def test_activate_non_finite(name: str, act, device: str) -> None:
    """A NaN gate stays NaN (swiglu_oai's clamp included); with act, the spans holding one get a NaN scale
    (so the w2 GEMM makes the row NaN), and the other spans and rows are quantized as usual."""
    h = _h(4, 160, torch.bfloat16, device, used=4)
    h[1, 3] = float("nan")  # gate of column 3 (concat layout)
    activation = _activation(name, "concat")
    values = moe_layer.activate(h, activation)
    assert torch.isnan(values[1, 3]) and torch.isfinite(values[[0, 2, 3]]).all()
    assert torch.equal(torch.isnan(values), torch.isnan(_moe_layer.activate(h, activation, torch.bfloat16)))
    if act is None:
        return
    qa = moe_layer.activate(h, activation, act)
    scales = qa.scales.float()
    assert torch.isnan(scales[1, 0]) and torch.isfinite(scales[[0, 2, 3]]).all()
    assert torch.isfinite(scales[1, 1:]).all()  # the other groups of row 1
    clean = ops.quantize_activation(values[[0, 2, 3]], act)
    assert torch.equal(qa.codes[[0, 2, 3]], clean.codes)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize(("t", "topk"), [(1, 1), (5, 2), (3, 4), (7, 8)], ids=str)
def test_combine_matches_reference(t: int, topk: int, out_dtype, seed: int, device: str) -> None:
    """Slots -1 (dropped: an expert off this rank) carry NaN weights and must add nothing; rows of y that no
    slot points to are NaN."""
    h, m_pad = 200, 64
    y = torch.full((m_pad, h), float("nan"), dtype=torch.bfloat16, device=device)
    slot_rows = torch.randperm(m_pad, device=device)[: t * topk].to(torch.int32)
    y[slot_rows.long()] = torch.randn(t * topk, h, device=device).bfloat16()
    dropped = torch.rand(t * topk, device=device) < 0.3
    slot_rows[dropped] = -1
    weights = torch.rand(t, topk, device=device)
    weights.view(-1)[dropped] = float("nan")
    out = moe_layer.combine(y, slot_rows, weights, out_dtype)
    want = _moe_layer.combine(y, slot_rows, weights, out_dtype)
    assert out.shape == (t, h) and out.dtype == out_dtype
    assert not torch.isnan(out).any()
    assert rel_err(out, want.double()) <= (1e-6 if out_dtype == torch.float32 else 4e-3)
    # float64 from scratch: the reference is what it says
    exact = torch.zeros(t, h, dtype=torch.float64, device=device)
    for s, row in enumerate(slot_rows.tolist()):
        if row >= 0:
            exact[s // topk] += float(weights.view(-1)[s]) * y[row].double()
    assert rel_err(want, exact) <= (1e-6 if out_dtype == torch.float32 else 4e-3)


@pytest.mark.parametrize("block", [8, 16])
@pytest.mark.parametrize(("t", "topk"), [(1, 4), (1, 8), (3, 2)], ids=str)
def test_combine_of_slot_major_rows(t: int, topk: int, block: int, seed: int, device: str) -> None:
    """``slot_block``: slot ``s`` has row ``s * slot_block`` where its expert id is in ``[0, E)``; the rows of
    slots whose id is out of range (-1, E, beyond) are NaN and must add nothing, as the rows of no slot."""
    e, h = 16, 200
    ids = torch.randint(0, e, (t, topk), dtype=torch.int32, device=device)
    ids.view(-1)[0], ids.view(-1)[-1] = -1, e + 7  # an expert off this rank, an id out of range
    if t * topk > 2:
        ids.view(-1)[1] = e
    y = torch.full((t * topk * block, h), float("nan"), dtype=torch.bfloat16, device=device)
    valid = (ids.view(-1) >= 0) & (ids.view(-1) < e)
    slot_rows = torch.where(valid, torch.arange(t * topk, device=device, dtype=torch.int32) * block, -1).int()
    y[slot_rows[valid].long()] = torch.randn(int(valid.sum()), h, device=device).bfloat16()
    weights = torch.rand(t, topk, device=device)
    prepared = moe_layer.PreparedCombine(y, ids.view(-1), weights, torch.float32, block, e)
    out = prepared(y, ids.view(-1), weights)
    assert not torch.isnan(out).any()
    want = _moe_layer.combine(y, slot_rows, weights, torch.float32)
    assert rel_err(out, want.double()) <= 1e-6


def test_activate_and_combine_reject() -> None:
    activation = _activation("silu", "concat")
    with pytest.raises(ValueError, match="odd width 7"):
        moe_layer.activate(torch.zeros(2, 7), activation)
    with pytest.raises(ValueError, match="h: expected a 2-D"):
        moe_layer.activate(torch.zeros(2, 8, dtype=torch.int32), activation)
    with pytest.raises(ValueError, match="per-token or per-group scales only"):
        moe_layer.activate(torch.zeros(2, 8), activation, "fp8_tensor")
    with pytest.raises(ValueError, match="activation: expected a checked Activation"):
        moe_layer.activate(torch.zeros(2, 8), "silu")
    with pytest.raises(ValueError, match=r"slot_rows: expected int32 \[4\]"):
        moe_layer.combine(torch.zeros(4, 8), torch.zeros(3, dtype=torch.int32), torch.ones(2, 2), torch.float32)


# ------------------------------------------------------------------------------------- GPU, real MoE shapes
@pytest.mark.gpu
@pytest.mark.parametrize("act", [None, "fp8", "fp8_g128", "mxfp4"])
@pytest.mark.parametrize(("name", "layout", "inter"), [("silu", "concat", 1408), ("swiglu_oai", "interleaved", 2880)])
def test_activate_gpu_realistic(name: str, layout: str, inter: int, act, seed: int) -> None:
    """Qwen-MoE's I = 1408 and gpt-oss's 2880 over 968 grouped rows (decode at E = 64, topk = 8, block_m =
    16), 128 of them in use."""
    h = _h(968, inter, torch.bfloat16, "cuda", used=128)
    activation = _activation(name, layout)
    values = moe_layer.activate(h, activation, num_rows=_num_rows(128, "cuda"))[:128]
    assert rel_err(values, _moe_layer.activate(h[:128], activation, torch.bfloat16).double()) <= 2**-8
    if act is not None:
        qa = moe_layer.activate(h, activation, act, _num_rows(128, "cuda"))
        want = ops.quantize_activation(values, act, backend="reference")
        assert torch.equal(qa.codes[:128], want.codes)
        assert torch.equal(qa.scales[:128].view(torch.uint8), want.scales.view(torch.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize(("t", "topk"), [(1, 8), (256, 8), (4096, 4)])
def test_combine_gpu_realistic(t: int, topk: int, seed: int) -> None:
    h = 2880
    m_pad = t * topk + 64 * 15
    y = torch.full((m_pad, h), float("nan"), dtype=torch.bfloat16, device="cuda")
    slot_rows = torch.randperm(m_pad, device="cuda")[: t * topk].to(torch.int32)
    y[slot_rows.long()] = torch.randn(t * topk, h, device="cuda").bfloat16()
    slot_rows[torch.rand(t * topk, device="cuda") < 0.25] = -1
    weights = torch.softmax(torch.randn(t, topk, device="cuda"), -1)
    out = moe_layer.combine(y, slot_rows, weights, torch.bfloat16)
    assert rel_err(out, _moe_layer.combine(y, slot_rows, weights, torch.float32).double()) <= 4e-3
