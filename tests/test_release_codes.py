"""Released codes: a weight whose IR codes a prepared CUDA layout also holds frees them
(``QuantizedWeight.release_codes``, ``humming.warmup(..., keep_codes=False)``) and rebuilds them, exactly, from
that layout whenever something reads ``qweight``. The layout's inverse is checked on CPU for every format the
fragment layout holds, dense and expert-stacked, in the gated epilogue's row order too; the served results and
the memory on the GPU."""

from __future__ import annotations

import copy
import gc
import pickle
import weakref

import pytest
import torch

import humming
from humming import cuda_kernels, moe
from humming.cuda_kernels import _layout, _wna16
from humming.cuda_kernels._layout import gate_up_rows, prepare_weight, restore_codes
from humming.ir.shard import permute_rows
from humming.nn import QuantizedLinear

FORMATS = {
    "int4-g128": dict(weight="int4", group_size=128),
    "uint4-zp-g128": dict(weight="int4", group_size=128, zero_point=True),
    "int4-channel": dict(weight="int4", group_size=-1),
    "int8-channel": dict(weight="int8", group_size=-1),
    "uint8-zp-g64": dict(weight="int8", group_size=64, zero_point=True),
    "mxfp4": dict(weight="mxfp4"),
}
#: dense, expert-stacked, and N with 16-row tile groups (N % 128 != 0) whose experts end mid-step
SHAPES = ((256, 512), (3, 384, 256), (2, 2880, 128))


def _weight(fmt: str, shape, seed: int = 0, dtype=torch.float32):
    torch.manual_seed(seed)
    return humming.quantize(torch.randn(*shape, dtype=dtype), **FORMATS[fmt])


@pytest.mark.parametrize("step_rows", [None, 500], ids=["one-step", "steps-across-experts"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("fmt", FORMATS)
def test_restore_undoes_the_fragment_layout(fmt, shape, step_rows, monkeypatch):
    qw = _weight(fmt, shape)
    if step_rows is not None:  # about this many rows per step (whole tile blocks), so steps end mid-expert
        monkeypatch.setattr(_layout, "_CODES_PER_STEP", step_rows * qw.K)
    prep = prepare_weight(qw)
    assert torch.equal(restore_codes(prep).reshape(qw.qweight.shape), qw.qweight)
    rows = torch.randperm(qw.N, generator=torch.Generator().manual_seed(1))
    reordered = prepare_weight(qw, rows)
    copied = prepare_weight(permute_rows(qw, rows))  # the reordered weight, made whole first
    for name in ("qweight", "scales", "zeros"):
        a, b = getattr(reordered, name), getattr(copied, name)
        assert (a is None and b is None) or torch.equal(a, b), name
    assert torch.equal(restore_codes(reordered, rows).reshape(qw.qweight.shape), qw.qweight)


@pytest.mark.parametrize("layout", ["concat", "interleaved"])
def test_gate_up_layout_restores_w13(layout):
    w13 = _weight("int4-g128", (4, 256, 128))
    want = w13.qweight.clone()
    prep = _wna16.prepare_gate_up(w13, layout)
    assert torch.equal(prep.qweight, prepare_weight(permute_rows(w13, gate_up_rows(256, layout))).qweight)
    assert cuda_kernels.release_codes(w13)
    assert torch.equal(w13.qweight, want)


@pytest.mark.parametrize("fmt", ["int4-g128", "mxfp4", "uint8-zp-g64"])
def test_a_released_weight_reads_as_before(fmt):
    qw = _weight(fmt, (2, 256, 256))
    codes, nbytes, text = qw.qweight.clone(), qw.nbytes, repr(qw)
    ref = humming.dequantize(qw)
    assert not cuda_kernels.release_codes(qw)  # no layout prepared: nothing holds the codes
    assert qw.released_codes is None
    _wna16.prepare(qw)
    assert cuda_kernels.release_codes(qw)
    released = qw.released_codes
    assert released is not None and "qweight" not in qw.__dict__  # the weight holds no codes
    assert qw.held_codes is released.stand_in and qw.held_codes.numel() == 0
    assert torch.equal(qw.qweight, codes) and qw.qweight is not qw.qweight  # rebuilt on every read
    assert (qw.nbytes, repr(qw), qw.device) == (nbytes, text, codes.device)
    assert torch.equal(humming.dequantize(qw), ref)
    assert torch.equal(qw.replace(bias=None).qweight, codes)
    copies = [copy.deepcopy(qw)]
    if qw.scales.dtype != torch.float8_e8m0fnu:  # torch cannot pickle e8m0 tensors (released or not)
        copies.append(pickle.loads(pickle.dumps(qw)))
    for copied in copies:  # a copy holds its codes again
        assert copied.released_codes is None and torch.equal(copied.qweight, codes)
    qw.release_codes(lambda: pytest.fail("released twice"))  # already released: no-op
    with pytest.raises(AttributeError, match="no attribute 'codes'"):
        qw.codes  # noqa: B018


def test_a_module_lets_go_of_released_codes_and_saves_them_whole():
    layer = QuantizedLinear.from_float(torch.nn.Linear(256, 128), "int4", 128)
    qw = layer.weight
    codes = qw.qweight.clone()
    _wna16.prepare(qw)
    assert cuda_kernels.release_codes(qw)
    assert layer.weight is qw  # the same weight object (its plans and layouts stay)
    assert layer.qweight is qw.released_codes.stand_in  # the module's buffer no longer holds the codes
    state = layer.state_dict()
    assert torch.equal(state["qweight"], codes)
    other = QuantizedLinear.from_float(torch.nn.Linear(256, 128), "int4", 128)
    other.load_state_dict(state)
    assert torch.equal(other.weight.qweight, codes)
    layer.load_state_dict(other.state_dict())  # loading into a released module: the codes come back
    assert torch.equal(layer.weight.qweight, codes) and layer.weight.released_codes is None
    _wna16.prepare(layer.weight)
    assert cuda_kernels.release_codes(layer.weight)
    layer.to("cpu")
    assert torch.equal(layer.weight.qweight, codes)


def test_warmup_checks_keep_codes():
    qw = _weight("int4-g128", (256, 256))
    with pytest.raises(TypeError, match="keep_codes: expected a bool"):
        humming.warmup([qw], keep_codes="no")


# ------------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["int4-g128", "mxfp4"])
def test_warmup_frees_the_codes_of_served_weights(fmt):
    """A dense weight and a fused_moe layer warmed with keep_codes=False: nothing holds their codes any more,
    and every served call gives what it gave before: the same bits for fused_moe, the same to the rounding that
    the dense split-K's atomic order may move."""
    torch.manual_seed(0)
    dense = humming.quantize(torch.randn(1024, 2048, device="cuda", dtype=torch.bfloat16), **FORMATS[fmt])
    w13 = humming.quantize(torch.randn(8, 512, 1024, device="cuda", dtype=torch.bfloat16), **FORMATS[fmt])
    w2 = humming.quantize(torch.randn(8, 1024, 256, device="cuda", dtype=torch.bfloat16), **FORMATS[fmt])
    call = moe.MoeCall(w13, w2, 2)
    m_values = (1, 16, 128)
    humming.warmup([dense, call], m_values)
    x = torch.randn(128, 2048, device="cuda", dtype=torch.bfloat16)
    xm = torch.randn(128, 1024, device="cuda", dtype=torch.bfloat16)
    weights, ids = torch.randn(128, 2, device="cuda").softmax(-1), torch.randint(0, 8, (128, 2), device="cuda")
    before = [humming.linear(x[:m], dense) for m in m_values]
    before += [moe.fused_moe(xm[:m], w13, w2, weights[:m], ids[:m]) for m in m_values]
    codes = [w.qweight.clone() for w in (dense, w13, w2)]
    held = [weakref.ref(w.qweight) for w in (dense, w13, w2)]
    humming.warmup([dense, call], m_values, keep_codes=False)
    gc.collect()
    assert all(w.released_codes is not None for w in (dense, w13, w2))
    assert all(ref() is None for ref in held)  # nothing holds the codes: the allocator has their memory back
    _poison = [torch.full_like(c, -1) for c in codes]  # likely in the codes' old blocks: a stale read shows
    after = [humming.linear(x[:m], dense) for m in m_values]
    after += [moe.fused_moe(xm[:m], w13, w2, weights[:m], ids[:m]) for m in m_values]
    linears = len(m_values)  # the first outputs: humming.linear's
    for a, b in zip(after[:linears], before[:linears], strict=True):
        # the dense kernels' split-K adds fp32 partial sums with atomics, in no fixed order: a value may move by
        # one bf16 rounding between two calls with nothing released
        torch.testing.assert_close(a, b, rtol=2**-7, atol=1e-3)
    for a, b in zip(after[linears:], before[linears:], strict=True):  # the grouped kernels run whole K per block
        assert torch.equal(a, b)
    for w, c in zip((dense, w13, w2), codes, strict=True):
        assert torch.equal(w.qweight, c)


@pytest.mark.gpu
def test_weights_a_triton_plan_reads_keep_their_codes():
    qw = humming.quantize(torch.randn(256, 512, device="cuda", dtype=torch.bfloat16), "int4", group_size=128)
    humming.warmup([qw], (1, 16), backend="triton", keep_codes=False)
    assert qw.released_codes is None


def test_compiled_calls_take_the_stand_in():
    """Under torch.compile the op is passed the stand-in; the call's result is the eager one."""
    qw = _weight("int4-g128", (256, 512))
    _wna16.prepare(qw)
    x = torch.randn(4, 512)
    want = humming.linear(x, qw)
    assert cuda_kernels.release_codes(qw)
    compiled = torch.compile(lambda x: humming.linear(x, qw), fullgraph=True, dynamic=True)
    assert torch.equal(compiled(x), want)
    assert torch.equal(humming.linear(x, qw), want)


def test_warmup_frees_only_weights_every_planned_kernel_of_which_is_cuda():
    from humming.warmup import _release_codes

    served, mixed = _weight("int4-g128", (256, 256)), _weight("int4-g128", (256, 256), seed=1)
    for qw in (served, mixed):
        _wna16.prepare(qw)
    _release_codes({served: {"cuda"}, mixed: {"cuda", "triton"}})
    assert served.released_codes is not None and mixed.released_codes is None
