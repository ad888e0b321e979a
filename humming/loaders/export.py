"""Write ``QuantizedWeight``s in a checkpoint format: compressed-tensors where the scheme exists there (vLLM,
SGLang and transformers read it without humming), else humming's own (``quant_method: humming-ir``).

compressed-tensors, each the layout :class:`~.compressed_tensors.CompressedTensorsReader` reads back into the
same bits (and the real-producer fixtures hold):

- ``intN`` (symmetric) and ``uintN`` with integer zero points, 2-8 bits, fp32 / fp16 / bf16 scales per
  tensor, channel, group along K (act-order ``weight_g_idx`` included) or block: ``pack-quantized``;
  ``int-quantized`` (``weight`` int8) for int8 weights that run with int8 activations (W8A8).
- ``e4m3`` with fp32 / fp16 / bf16 scales: ``float-quantized`` (``weight`` float8_e4m3fn).
- NVFP4 (``e2m1``, e4m3 scales per 16, fp32 global scale): ``nvfp4-pack-quantized``. Its
  ``weight_global_scale`` divides, so it is written as a divisor ``d`` with ``fp32(1 / d)`` equal to the
  global scale (``humming.quantize`` makes its global scales so); a global scale no such ``d`` gives back
  has no exact compressed-tensors form.
- MXFP4 (``e2m1``, e8m0 scales per 32): ``mxfp4-pack-quantized``.
- Activations: 16-bit; int8 / fp8 / int4 per token, int8 / fp8 per tensor (dynamic, or static with
  ``input_scale``), fp8 per 1x128 group, MXFP4.

Everything else has no compressed-tensors form and is written in humming's own: NF4, the 6-bit and other
``eXmY`` floats, MXFP6 / MXFP8, e5m2, float zero points, ``uintN`` without zero points, scale dtypes the
format does not use; NVFP4 activations (compressed-tensors stores a calibrated ``input_global_scale``,
humming computes it per call) and static scales with per-token or grouped schemes. Humming's own holds each
weight's tensors as ``<module>.<field>`` (the IR's ``qweight``, ``scales``, ``zeros``, ``global_scale``,
``g_idx``, ``bias``; ``input_scale`` for a static activation scale) and ``quantization_config.modules``:
``{module: {shape, format, group_shape, act, static}}``.
"""

from __future__ import annotations

import math

import torch

from ..ir.packing import unpack_codes
from ..ir.weight import QuantizedWeight, layout_name
from .compressed_tensors import pack_fp4, pack_int_quantized

__all__ = [
    "CT_VERSION",
    "HUMMING_METHOD",
    "compressed_tensors_scheme",
    "compressed_tensors_tensors",
    "humming_tensors",
]

#: ``quant_method`` of humming's own checkpoints (vLLM's built-in ``"humming"`` is humming-kernels').
HUMMING_METHOD = "humming-ir"
#: The compressed-tensors release whose layouts this writes (dense ``pack-quantized`` packing, >= 0.18).
CT_VERSION = "0.19.0"
_FLOAT_SCALES = (torch.float32, torch.float16, torch.bfloat16)
#: humming activation scheme -> compressed-tensors ``input_activations`` (dynamic).
_CT_ACTS = {
    "int8": dict(type="int", num_bits=8, strategy="token"),
    "fp8": dict(type="float", num_bits=8, strategy="token"),
    "int8_tensor": dict(type="int", num_bits=8, strategy="tensor"),
    "fp8_tensor": dict(type="float", num_bits=8, strategy="tensor"),
    "fp8_g128": dict(type="float", num_bits=8, strategy="group", group_size=128),
    "int4": dict(type="int", num_bits=4, strategy="token"),
    "mxfp4": dict(type="float", num_bits=4, strategy="group", group_size=32),
}


def _strategy(qw: QuantizedWeight) -> dict:
    layout = layout_name(qw.group_shape)
    if layout == "group":
        return dict(strategy="group", group_size=qw.group_shape[1])
    if layout == "block":
        return dict(strategy="block", block_structure=list(qw.block_shape))
    return dict(strategy=layout)


def _weights(qw: QuantizedWeight) -> tuple[str, dict] | str:
    """``(storage format, weights args)`` of ``qw`` in compressed-tensors, or why it has none."""
    fmt, scales = qw.format, qw.scales
    if scales is None:
        return "no scales"
    if fmt.is_int and fmt.bits >= 2:
        if scales.dtype not in _FLOAT_SCALES:
            return f"{fmt.name} with {scales.dtype} scales (compressed-tensors' int scales are 16/32-bit floats)"
        if qw.zeros is not None and qw.zeros.is_floating_point():
            return "float zero points"
        if not fmt.signed and qw.zeros is None:
            return f"{fmt.name} without zero points"
        args = dict(type="int", num_bits=fmt.bits, symmetric=qw.zeros is None, **_strategy(qw))
        if qw.g_idx is not None:
            args["actorder"] = "group"
        return "pack-quantized", args
    if fmt.name == "e4m3" and scales.dtype in _FLOAT_SCALES and qw.g_idx is None:
        return "float-quantized", dict(type="float", num_bits=8, symmetric=True, **_strategy(qw))
    if fmt.name == "e2m1" and qw.layout == "group" and qw.g_idx is None:
        if scales.dtype == torch.float8_e4m3fn and qw.group_size == 16:
            if qw.global_scale is not None and _divisors(qw.global_scale) is None:
                return "an NVFP4 global scale that is no fp32 reciprocal"
            args = dict(type="float", num_bits=4, symmetric=True, strategy="tensor_group", group_size=16)
            return "nvfp4-pack-quantized", args
        if scales.dtype == torch.float8_e8m0fnu and qw.group_size == 32:
            args = dict(type="float", num_bits=4, symmetric=True, strategy="group", group_size=32)
            return "mxfp4-pack-quantized", args
    return f"{qw.describe()} has no compressed-tensors form"


def compressed_tensors_scheme(qw: QuantizedWeight, act: str | None, static: bool) -> dict | str:
    """The compressed-tensors config group of ``qw`` run with activation scheme ``act`` (``static``: with a
    static per-tensor scale): ``{"format", "weights", "input_activations"}``, or why there is none."""
    found = _weights(qw)
    if isinstance(found, str):
        return found
    fmt, weights = found
    weights = dict(dynamic=False, **weights)
    if act is None:
        inputs = None
    elif act not in _CT_ACTS:
        return f"activations {act!r} (no compressed-tensors form: a calibrated input_global_scale)"
    elif static and _CT_ACTS[act]["strategy"] != "tensor":
        return f"a static scale with activations {act!r} (compressed-tensors: static scales are per tensor)"
    else:
        inputs = dict(_CT_ACTS[act], symmetric=True, dynamic=not static)
    if fmt == "pack-quantized" and weights["num_bits"] == 8 and weights["symmetric"] and act == "int8":
        fmt = "int-quantized"  # W8A8: int8 weights, as llm-compressor writes them
    return dict(format=fmt, weights=weights, input_activations=inputs)


def compressed_tensors_tensors(qw: QuantizedWeight, fmt: str) -> dict[str, torch.Tensor]:
    """A 2-D weight's tensors ``{leaf: tensor}`` in compressed-tensors storage format ``fmt`` (one that
    :func:`compressed_tensors_scheme` gave for it), on the CPU."""
    qw = qw.to("cpu")
    codes = unpack_codes(qw.qweight, qw.bits, qw.K)
    scales = qw.scales
    out: dict[str, torch.Tensor] = {}
    if fmt in ("pack-quantized", "int-quantized"):
        bits, offset = qw.bits, 1 << (qw.bits - 1)
        if qw.zeros is None:  # two's complement codes
            q = codes.to(torch.int16) - ((codes.to(torch.int16) >> (bits - 1)) << bits)
            zero_point = None
        else:  # offset binary: q = u - 2^(b-1), zp = z - 2^(b-1)
            q = codes.to(torch.int16) - offset
            zero_point = qw.zeros.to(torch.int16) - offset
        if fmt == "int-quantized":
            out.update(weight=q.to(torch.int8), weight_scale=scales)
        else:
            out.update(pack_int_quantized(q, scales, zero_point, bits=bits))
        if qw.g_idx is not None:
            out["weight_g_idx"] = qw.g_idx
    elif fmt == "float-quantized":
        out.update(weight=codes.view(torch.float8_e4m3fn), weight_scale=scales)
    elif fmt == "nvfp4-pack-quantized":
        gscale = torch.ones((), dtype=torch.float32) if qw.global_scale is None else qw.global_scale
        out.update(weight_packed=pack_fp4(codes), weight_scale=scales, weight_global_scale=_divisors(gscale))
    elif fmt == "mxfp4-pack-quantized":
        out.update(weight_packed=pack_fp4(codes), weight_scale=scales.view(torch.uint8))
    else:
        raise ValueError(f"fmt: expected a storage format compressed_tensors_scheme gives, got {fmt!r}")
    if fmt.endswith("fp4-pack-quantized") and qw.K % 2:
        out["weight_shape"] = torch.tensor(list(qw.shape), dtype=torch.int64)
    if qw.bias is not None:
        out["bias"] = qw.bias
    return {leaf: t.contiguous() for leaf, t in out.items()}


def _divisors(gscale: torch.Tensor) -> torch.Tensor | None:
    """float32 ``[1]`` ``d`` with ``fp32(1 / d) == gscale`` (a one-element global scale), or ``None``."""
    g = gscale.reshape(1).to(torch.float32)
    if not bool(torch.isfinite(g).all()) or float(g) <= 0:
        return None
    up = down = torch.reciprocal(g)
    for _ in range(4):  # the divisor that made g lies within a few ulps of 1 / g
        for candidate in (up, down):
            if torch.equal(torch.reciprocal(candidate), g):
                return candidate
        up, down = torch.nextafter(up, torch.tensor(math.inf)), torch.nextafter(down, torch.tensor(0.0))
    return None


def humming_tensors(qw: QuantizedWeight) -> dict[str, torch.Tensor]:
    """A weight's tensors in humming's own checkpoint format (the IR's fields), on the CPU."""
    return {name: t.detach().cpu().contiguous() for name, t in qw.tensors().items()}
