"""The reference numerics give the same bits on a GPU as on the CPU (quantizers run where the weights are)."""

from __future__ import annotations

import pytest
import torch

import humming
from humming.ir.activation import quantize_activation
from humming.ir.formats import FORMATS

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_encode_decode_match_cpu(fmt, seed):
    scale = 10.0 if fmt.kind == "e8m0" else max(fmt.max_value, 1.0) / 3
    x = torch.randn(1 << 14, dtype=torch.float64) * scale
    if fmt.kind == "e8m0":
        x = x.abs() + 1e-3
    cpu = fmt.encode(x)
    assert torch.equal(fmt.encode(x.cuda()).cpu(), cpu)
    decoded = fmt.decode(cpu.cuda()).cpu()
    assert torch.equal(decoded.view(torch.int32), fmt.decode(cpu).view(torch.int32))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(weight="e4m3", group_size=-1),
        dict(weight="int4", group_size=128),
        dict(weight="int4", group_size=128, zero_point=True),
        dict(weight="nvfp4"),
        dict(weight="mxfp4"),
        dict(weight="fp8_block"),
    ],
    ids=lambda kw: "-".join(str(v) for v in kw.values()),
)
def test_quantize_matches_cpu(kwargs, seed):
    w = torch.randn(256, 512, dtype=torch.bfloat16)
    on_cpu, on_gpu = humming.quantize(w, **kwargs), humming.quantize(w.cuda(), **kwargs)
    for name, t in on_cpu.tensors().items():
        assert torch.equal(on_gpu.tensors()[name].cpu().reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8))
    assert torch.equal(humming.dequantize(on_gpu).cpu(), humming.dequantize(on_cpu))


@pytest.mark.parametrize("act", ["int8", "fp8", "fp8_g128", "nvfp4", "mxfp4"])
def test_quantize_activation_matches_cpu(act, seed):
    x = torch.randn(64, 512, dtype=torch.bfloat16)
    a, b = quantize_activation(x, act), quantize_activation(x.cuda(), act)
    assert torch.equal(b.codes.cpu(), a.codes)
    assert torch.equal(b.scales.cpu().float(), a.scales.float())
