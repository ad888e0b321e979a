"""Bad inputs to every public entry point: each raises ``ValueError`` / ``TypeError`` (``CheckpointError`` for
checkpoints) whose message names the argument, the field or the file. One table of :class:`Case` records (entry
point, arguments, expected type, the name the message holds); then the odd inputs that must get the right answer
rather than an error. CPU, tiny shapes."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from unittest import mock

import numpy as np
import pytest
import torch

import humming
from humming import moe
from humming.device import device_info


@dataclass(frozen=True)
class Case:
    entry: str  # the entry point, for the test id
    call: Callable[[object], object]  # tmp_path -> runs the call
    error: type[Exception]
    name: str  # must appear in the message
    label: str = ""

    def __str__(self) -> str:
        return f"{self.entry}-{self.name}-{self.label}"


def _w(n: int = 16, k: int = 64, **kwargs) -> humming.QuantizedWeight:
    return humming.quantize(torch.randn(n, k), **{"weight": "int4", "group_size": 32, **kwargs})


def _with_env(**variables):
    """Run a call with environment variables set (then restored): ``_with_env(A="1")(fn)``."""
    return lambda fn: mock.patch.dict(os.environ, variables)(fn)()


def _experts(e: int = 2, n: int = 16, k: int = 64) -> humming.QuantizedWeight:
    return humming.quantize(torch.randn(e, n, k), "int4", group_size=32)


def _x(m: int = 3, k: int = 64, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(m, k, dtype=dtype)


def _qw_fields(**changes) -> dict:
    qw = _w()
    fields = {"shape": qw.shape, "format": qw.format, "qweight": qw.qweight, "scales": qw.scales}
    return {**fields, "group_shape": qw.group_shape, **changes}


def _saved(tmp_path, edit: Callable[[dict, dict], None]) -> str:
    """A file saved by humming.save, then its tensors / metadata edited."""
    import safetensors
    import safetensors.torch

    path = tmp_path / "w.safetensors"
    humming.save(_w(), path)
    with safetensors.safe_open(path, "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
    edit(tensors, meta)
    safetensors.torch.save_file(tensors, path, metadata=meta)
    return path


def _v1_record(tmp_path, record: dict) -> str:
    import safetensors.torch

    path = tmp_path / "v1.safetensors"
    qw = _w()
    meta = {"humming_format_version": "1", "__single__.__meta__": json.dumps(record)}
    safetensors.torch.save_file({f"__single__.{n}": t for n, t in qw.tensors().items()}, path, metadata=meta)
    return path


def _checkpoint(tmp_path) -> str:
    from safetensors.torch import save_file

    from humming.loaders.gptq import pack_gptq

    t = pack_gptq(
        torch.zeros(16, 64, dtype=torch.uint8), torch.ones(16, 2).half(), torch.full((16, 2), 8), bits=4, group_size=32
    )
    save_file({f"m.{k}": v for k, v in t.items()}, str(tmp_path / "model.safetensors"))
    config = {"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": True}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


V, T = ValueError, TypeError
lin = humming.linear
CASES: list[Case] = []


def case(entry, error, name, label=""):
    def add(fn):
        CASES.append(Case(entry, fn, error, name, label))
        return fn

    return add


# ----------------------------------------------------------------------------------------------- linear
for label, make in {
    "x-int": lambda: lin(torch.zeros(3, 64, dtype=torch.int32), _w()),
    "x-list": lambda: lin([[0.0] * 64], _w()),
    "x-0d": lambda: lin(torch.tensor(1.0), _w()),
    "x-k": lambda: lin(_x(k=32), _w()),
    "x-strided": lambda: lin(_x(k=128)[:, ::2], _w()),
    "x-fp64": lambda: lin(_x().double(), _w()),
}.items():
    CASES.append(Case("linear", lambda _, f=make: f(), V, "x", label))
for label, make in {
    "tensor": lambda: lin(_x(), torch.zeros(16, 8, dtype=torch.int32)),
    "none": lambda: lin(_x(), None),
    "experts": lambda: lin(_x(), _experts()),
}.items():
    CASES.append(Case("linear", lambda _, f=make: f(), V, "qweight", label))
for label, make in {
    "shape": lambda: lin(_x(), _w(), torch.zeros(15)),
    "int": lambda: lin(_x(), _w(), torch.zeros(16, dtype=torch.int32)),
    "2d": lambda: lin(_x(), _w(), torch.zeros(1, 16)),
    "list": lambda: lin(_x(), _w(), [0.0] * 16),
}.items():
    CASES.append(Case("linear", lambda _, f=make: f(), V, "bias", label))
for label, make in {
    "int": lambda: lin(_x(), _w(), out_dtype=torch.int32),
    "fp64": lambda: lin(_x(), _w(), out_dtype=torch.float64),
    "str": lambda: lin(_x(), _w(), out_dtype="bf16"),
}.items():
    CASES.append(Case("linear", lambda _, f=make: f(), V, "out_dtype", label))
for label, act in {"unknown": "fp9", "empty": "", "case": "FP8", "int": 8}.items():
    CASES.append(Case("linear", lambda _, a=act: lin(_x(), _w(), act=a), V, "act", label))
CASES.append(
    Case(
        "linear",
        lambda _: lin(humming.quantize_activation(_x(), "fp8"), _w(), act="int8"),
        V,
        "act",
        "prequantized-mismatch",
    )
)
for label, backend in {"unknown": "tensorrt", "empty-case": "Triton", "int": 3}.items():
    CASES.append(Case("linear", lambda _, b=backend: lin(_x(), _w(), backend=b), V, "backend", label))

# --------------------------------------------------------------------------------------------- quantize
q = humming.quantize
for label, w in {
    "int": torch.zeros(16, 64, dtype=torch.int32),
    "1d": torch.zeros(64),
    "4d": torch.zeros(1, 1, 16, 64),
    "list": [[0.0] * 64],
}.items():
    CASES.append(Case("quantize", lambda _, w=w: q(w), V, "w", label))
for label, fmt in {"unknown": "int9000", "e8m0": "e8m0", "empty": "", "bad-float": "e0m0"}.items():
    CASES.append(Case("quantize", lambda _, f=fmt: q(torch.randn(16, 64), f), V, "weight" if fmt else "", label))
for label, gs in {
    "zero": 0,
    "pair-zero": (0, 32),
    "pair-neg": (1, -2),
    "neg": -3,
    "str": "block",
    "float": 32.0,
    "triple": (1, 2, 3),
    "pair-str": ("a", 32),
    "bool": True,
}.items():
    CASES.append(Case("quantize", lambda _, g=gs: q(torch.randn(16, 64), group_size=g), V, "group_size", label))
for label, zp in {"str": "yes", "int": 2, "none": None}.items():
    CASES.append(Case("quantize", lambda _, z=zp: q(torch.randn(16, 64), zero_point=z), V, "zero_point", label))
CASES.append(
    Case("quantize", lambda _: q(torch.randn(16, 64), "e4m3", zero_point=True), V, "zero_point", "float-format")
)
for label, sd in {"int8": torch.int8, "fp64": torch.float64, "str": "fp16"}.items():
    CASES.append(Case("quantize", lambda _, s=sd: q(torch.randn(16, 64), scale_dtype=s), V, "scale_dtype", label))
CASES.append(
    Case("quantize", lambda _: q(torch.randn(16, 64), zero_point=True, global_scale=True), V, "global_scale", "zp")
)
for label, g in {
    "short": torch.zeros(32, dtype=torch.int32),
    "2d": torch.zeros(2, 64, dtype=torch.int32),
}.items():
    CASES.append(Case("quantize", lambda _, g=g: q(torch.randn(16, 64), g_idx=g), V, "g_idx", label))
CASES.append(
    Case(
        "quantize",
        lambda _: q(torch.randn(16, 64), group_size=(16, 32), g_idx=torch.zeros(64, dtype=torch.int32)),
        V,
        "g_idx",
        "block",
    )
)
for label, b in {"shape": torch.zeros(15), "int": torch.zeros(16, dtype=torch.int32)}.items():
    CASES.append(Case("quantize", lambda _, b=b: q(torch.randn(16, 64), bias=b), V, "bias", label))
CASES.append(Case("quantize", lambda _: q(torch.randn(16, 64), "int1"), V, "weight", "symmetric-int1"))
CASES.append(Case("quantize", lambda _: q(torch.randn(16, 64), "uint1"), V, "zero_point", "symmetric-uint1"))
for dt in (torch.float32, torch.float16, torch.bfloat16):
    wide = lambda _, dt=dt: q(torch.randn(16, 64), "e4m3", scale_dtype=dt, global_scale=True)
    CASES.append(Case("quantize", wide, V, "global_scale", f"global-{dt}"))

# ------------------------------------------------------------------------------------------- dequantize
for label, arg in {"tensor": torch.zeros(2, 2), "none": None, "dict": {}}.items():
    CASES.append(Case("dequantize", lambda _, a=arg: humming.dequantize(a), V, "qw", label))

# ---------------------------------------------------------------------------------- quantize_activation
qa = humming.quantize_activation
for label, x in {"1d": torch.zeros(64), "empty": torch.zeros(0, 64), "3d": torch.zeros(1, 2, 64)}.items():
    CASES.append(Case("quantize_activation", lambda _, x=x: qa(x, "fp8"), V, "x", label))
for label, act in {"unknown": "fp7", "none": None}.items():
    CASES.append(Case("quantize_activation", lambda _, a=act: qa(_x(), a), V, "act", label))
for label, s in {
    "zero": torch.tensor(0.0),
    "negative": torch.tensor(-1.0),
    "nan": torch.tensor(float("nan")),
    "inf": torch.tensor(float("inf")),
    "two": torch.ones(2),
    "float": 0.5,
}.items():
    CASES.append(Case("quantize_activation", lambda _, s=s: qa(_x(), "fp8", scale=s), V, "scale", label))
CASES.append(
    Case("quantize_activation", lambda _: qa(_x(), "nvfp4", global_scale=torch.tensor(1.0)), V, "global_scale")
)

# -------------------------------------------------------------------------------- QuantizedActivation
_qa = lambda act="fp8": humming.quantize_activation(_x(), act)
QA = humming.QuantizedActivation
for label, make in {
    "scales-shape": lambda: QA(_qa().scheme, _qa().codes, torch.ones(1, 3)),
    "scales-dtype": lambda: QA(_qa().scheme, _qa().codes, torch.ones(3, 1, dtype=torch.float16)),
    "scales-list": lambda: QA(_qa().scheme, _qa().codes, [1.0]),
    "scales-e8m0-fp32": lambda: QA(_qa("mxfp4").scheme, _qa("mxfp4").codes, torch.ones(3, 2)),
}.items():
    CASES.append(Case("QuantizedActivation", lambda _, f=make: f(), V, "scales", label))
for label, make in {
    "int8": lambda: QA(_qa().scheme, torch.zeros(3, 64, dtype=torch.int8), _qa().scales),
    "1d": lambda: QA(_qa().scheme, torch.zeros(64, dtype=torch.uint8), _qa().scales),
    "list": lambda: QA(_qa().scheme, [[0]], _qa().scales),
}.items():
    CASES.append(Case("QuantizedActivation", lambda _, f=make: f(), V, "codes", label))
for label, make in {
    "missing": lambda: QA(_qa("nvfp4").scheme, _qa("nvfp4").codes, _qa("nvfp4").scales),
    "extra": lambda: QA(_qa().scheme, _qa().codes, _qa().scales, torch.ones(())),
    "shape": lambda: QA(_qa("nvfp4").scheme, _qa("nvfp4").codes, _qa("nvfp4").scales, torch.ones(2)),
}.items():
    CASES.append(Case("QuantizedActivation", lambda _, f=make: f(), V, "global_scale", label))
CASES.append(Case("QuantizedActivation", lambda _: QA("fp9", _qa().codes, _qa().scales), V, "act", "unknown"))
CASES.append(Case("QuantizedActivation", lambda _: QA(3, _qa().codes, _qa().scales), T, "scheme", "int"))
CASES.append(Case("dequantize_activation", lambda _: humming.dequantize_activation(_w()), T, "qa"))

# ------------------------------------------------------------------------------ QuantizedWeight(...)
QW = humming.QuantizedWeight
for field, value in {
    "shape": [(16,), (0, 64), (16, -64), "16x64", (1, 2, 3, 4)],
    "format": ["int99", "e8m0", "", 4],
    "group_shape": [(0, 32), (1,), "g32", (1, -2)],
    "qweight": [torch.zeros(16, 8, dtype=torch.int64), torch.zeros(16, 7, dtype=torch.int32), None, [[0]]],
    "scales": [torch.ones(16, 3), torch.ones(16, 2, dtype=torch.int32), torch.ones(2, 16)],
    "zeros": [torch.zeros(16, 2, dtype=torch.uint8), torch.zeros(16, 3), torch.zeros(16, 2, dtype=torch.bool)],
    "global_scale": [torch.ones(2), torch.ones((), dtype=torch.float16), torch.ones(1, 1)],
    "g_idx": [
        torch.zeros(63, dtype=torch.int32),
        torch.zeros(64, dtype=torch.int64),
        torch.full((64,), 5, dtype=torch.int32),
    ],
    "bias": [torch.zeros(15), torch.zeros(16, dtype=torch.int32), torch.zeros(1, 16)],
}.items():
    for i, v in enumerate(value):
        CASES.append(Case("QuantizedWeight", lambda _, f=field, v=v: QW(**_qw_fields(**{f: v})), V, field, str(i)))
CASES.append(
    Case("QuantizedWeight", lambda _: QW(**_qw_fields(scales=None, zeros=torch.zeros(16, 2))), V, "zeros", "no-scales")
)

# ------------------------------------------------------------------------------------------ save / load
for label, w in {"tensor": torch.zeros(2), "list": [_w()], "dict-of-tensor": {"a": torch.zeros(2)}}.items():
    CASES.append(Case("save", lambda p, w=w: humming.save(w, p / "x.safetensors"), (V, T), "weights", label))
CASES.append(Case("save", lambda _: humming.save(_w(), 3), T, "path", "int"))
CASES.append(Case("save", lambda p: humming.save({"": _w()}, p / "x.safetensors"), V, "weights", "empty-name"))
CASES.append(Case("load", lambda _: humming.load(3), T, "path", "int"))
CASES.append(Case("load", lambda p: humming.load(_saved(p, lambda t, m: None), device="gpu9"), V, "device"))
for label, edit in {
    "no-version": lambda t, m: m.pop("humming_format_version"),
    "future-version": lambda t, m: m.update(humming_format_version="7"),
    "no-manifest": lambda t, m: m.pop("humming_manifest"),
    "manifest-edited": lambda t, m: m.update(humming_manifest=m["humming_manifest"].replace("int4", "int5")),
    "missing-tensor": lambda t, m: t.pop("__single__.scales"),
    "extra-tensor": lambda t, m: t.update({"__single__.zeros": torch.zeros(16, 2, dtype=torch.uint8)}),
    "changed-tensor": lambda t, m: t["__single__.qweight"].add_(1),
    "truncated-tensor": lambda t, m: t.update({"__single__.scales": t["__single__.scales"][:8].clone()}),
}.items():
    CASES.append(Case("load", lambda p, e=edit: humming.load(_saved(p, e)), V, "path", label))
for label, record in {
    "no-format": {"shape": [16, 64], "group_shape": [1, 32]},
    "no-shape": {"format": "int4", "group_shape": [1, 32]},
    "no-group-shape": {"shape": [16, 64], "format": "int4"},
    "bad-format": {"shape": [16, 64], "format": "int77", "group_shape": [1, 32]},
}.items():
    CASES.append(Case("load", lambda p, r=record: humming.load(_v1_record(p, r)), V, "path", f"v1-{label}"))
CASES.append(Case("load", lambda p: humming.load(p / "nothing.safetensors"), FileNotFoundError, "nothing"))


# ------------------------------------------------------------------------------ checkpoints, concat...
def _load_ckpt(p, **kwargs):
    return humming.load_checkpoint(_checkpoint(p), **kwargs)


for label, modules in {"string": "m", "bytes": b"m", "ints": [1, 2]}.items():
    CASES.append(Case("load_checkpoint", lambda p, m=modules: _load_ckpt(p, modules=m), T, "modules", label))
CASES.append(Case("load_checkpoint", lambda p: humming.load_checkpoint(p / "missing"), V, "missing"))
for label, parts in {
    "empty": [],
    "tensor": [torch.zeros(2)],
    "k-mismatch": [_w(k=64), _w(k=128)],
    "format-mismatch": [_w(), _w(weight="int8")],
}.items():
    CASES.append(Case("concat", lambda _, ps=parts: humming.concat(ps), (V, T), "parts", label))
    CASES.append(Case("stack", lambda _, ps=parts: humming.stack(ps), (V, T), "parts", label))
for label, (args, name) in {
    "dim": ((2, 0, 2), "dim"),
    "rank": ((0, 2, 2), "rank"),
    "world": ((0, 0, 0), "world_size"),
    "uneven": ((0, 0, 3), "world_size"),
}.items():
    CASES.append(Case("shard", lambda _, a=args: humming.shard(_w(), *a), V, name, label))

# -------------------------------------------------------------------------------------------------- moe
_ids = lambda: torch.zeros(4, 2, dtype=torch.int64)
for label, (ids, e, bm) in {
    "ids-float": (torch.zeros(4, 2), 2, 16),
    "ids-1d": (torch.zeros(4, dtype=torch.int64), 2, 16),
    "ids-range": (torch.full((4, 2), 5), 2, 16),
    "ids-list": ([[0, 1]], 2, 16),
}.items():
    CASES.append(Case("moe_align", lambda _, a=(ids, e, bm): moe.moe_align(*a), V, "topk_ids", label))
for label, e in {"zero": 0, "bool": True, "float": 2.0}.items():
    CASES.append(Case("moe_align", lambda _, e=e: moe.moe_align(_ids(), e, 16), V, "num_experts", label))
for label, bm in {"zero": 0, "odd": 12, "float": 16.0, "bool": True}.items():
    CASES.append(Case("moe_align", lambda _, bm=bm: moe.moe_align(_ids(), 2, bm), V, "block_m", label))


def _grouped(**changes):
    args = {
        "x": torch.randn(32, 64),
        "qweight": _experts(),
        "expert_ids": torch.zeros(2, dtype=torch.int32),
        "block_m": 16,
    }
    args.update(changes)
    return moe.grouped_linear(**args)


for field, values in {
    "x": [torch.randn(32, 32), torch.zeros(32, 64, dtype=torch.int32), torch.randn(30, 64)],
    "qweight": [_w(), torch.zeros(2)],
    "expert_ids": [torch.zeros(3, dtype=torch.int32), torch.full((2,), 7, dtype=torch.int32)],
    "block_m": [0, 12],
    "bias": [torch.zeros(16), torch.zeros(2, 15)],
    "out_dtype": [torch.int8],
    "act": ["fp9"],
}.items():
    for i, v in enumerate(values):
        name = "x" if field == "x" and i == 2 else field
        CASES.append(Case("grouped_linear", lambda _, f=field, v=v: _grouped(**{f: v}), V, name, str(i)))


def _fused(**changes):
    args = {
        "x": torch.randn(4, 64),
        "w13": _experts(n=32, k=64),
        "w2": _experts(n=64, k=16),
        "topk_weights": torch.ones(4, 2),
        "topk_ids": _ids(),
    }
    args.update(changes)
    return moe.fused_moe(**args)


for field, values in {
    "activation": ["relu", None],
    "w13": [_w(32, 64), _experts(n=31, k=64)],
    "w2": [_w(64, 16), _experts(n=64, k=8)],
    "topk_weights": [torch.ones(4, 3), torch.ones(4, 2, dtype=torch.int32)],
    "topk_ids": [torch.zeros(4, 3, dtype=torch.int64), torch.zeros(4, 2)],
    "x": [torch.randn(4, 32), torch.zeros(4, 64, dtype=torch.int32)],
}.items():
    for i, v in enumerate(values):
        CASES.append(Case("fused_moe", lambda _, f=field, v=v: _fused(**{f: v}), V, field, str(i)))

# ----------------------------------------------------------------------------- prepare, warmup, formats
for label, make in {
    "qw-tensor": (lambda: humming.prepare(torch.zeros(2)), "qweight"),
    "backend": (lambda: humming.prepare(_w(), backend="tensorrt"), "backend"),
    "act": (lambda: humming.prepare(_w(), act="fp9"), "act"),
}.items():
    CASES.append(Case("prepare", lambda _, f=make[0]: f(), V, make[1], label))
for label, (layers, name, err) in {
    "cpu": ([_w()], "layers[0]", V),
    "single": (_w(), "layers", T),
    "tensor-in-list": ([torch.zeros(2)], "layers[0]", T),
    "int": (3, "layers", T),
}.items():
    CASES.append(Case("warmup", lambda _, ls=layers: humming.warmup(ls), err, name, label))
for label, m in {"zero": (0,), "str": "16", "neg": (1, -4)}.items():
    CASES.append(Case("warmup", lambda _, m=m: humming.warmup([], m_values=m), (V, T), "m_values", label))
for label, name in {"unknown": "int99", "empty": "", "bad-e": "e9m9", "none": None, "int": 4}.items():
    CASES.append(Case("get_format", lambda _, n=name: humming.get_format(n), (V, T), "", label))

for label, (call, name, err) in {
    "block-ms-none": (lambda: humming.warmup([], block_ms=None), "block_ms", T),
    "m-float": (lambda: humming.warmup([], m_values=(1.5,)), "m_values", T),
    "m-bool": (lambda: humming.warmup([], m_values=(True,)), "m_values", T),
    "m-empty": (lambda: humming.warmup([], m_values=()), "m_values", V),
    "block-ms-str": (lambda: humming.warmup([], block_ms="16"), "block_ms", T),
    "block-ms-zero": (lambda: humming.warmup([], block_ms=(0,)), "block_ms", V),
    "block-ms-odd": (lambda: humming.warmup([], block_ms=(12,)), "block_ms", V),
    "backend": (lambda: humming.warmup([], backend="tpu"), "backend", V),
    "act": (lambda: humming.warmup([], act="fp9"), "act", V),
    "act-dtype": (lambda: humming.warmup([], act_dtype=torch.int32), "act_dtype", V),
    "out-dtype": (lambda: humming.warmup([], out_dtype=torch.int8), "out_dtype", V),
    "bias-dtype": (lambda: humming.warmup([], bias_dtype=torch.int8), "bias_dtype", V),
    "workers-zero": (lambda: humming.warmup([], max_workers=0), "max_workers", V),
    "workers-float": (lambda: humming.warmup([], max_workers=2.0), "max_workers", V),
    "layers-none": (lambda: humming.warmup(None), "layers", T),
}.items():
    CASES.append(Case("warmup", lambda _, f=call: f(), err, name, label))

# ----------------------------------------------------------------------- explain, set_deterministic, device
for label, (call, name, err) in {
    "m-zero": (lambda: humming.explain(_w(), 0), "m", V),
    "m-negative": (lambda: humming.explain(_w(), -1), "m", V),
    "m-float": (lambda: humming.explain(_w(), 2.0), "m", V),
    "m-bool": (lambda: humming.explain(_w(), True), "m", V),
    "m-str": (lambda: humming.explain(_w(), "4"), "m", V),
    "m-experts-zero": (lambda: humming.explain(_experts(), 0), "m", V),
    "act-unknown": (lambda: humming.explain(_w(), 4, act="fp9"), "act", V),
    "act-int": (lambda: humming.explain(_w(), 4, act=8), "act", V),
    "backend-unknown": (lambda: humming.explain(_w(), 4, backend="tensorrt"), "backend", V),
    "backend-int": (lambda: humming.explain(_w(), 4, backend=3), "backend", V),
    "qw-tensor": (lambda: humming.explain(torch.zeros(2), 4), "qweight", T),
    "qw-none": (lambda: humming.explain(None, 4), "qweight", T),
    "dtype-int": (lambda: humming.explain(_w(), 4, dtype=torch.int32), "dtype", V),
    "dtype-str": (lambda: humming.explain(_w(), 4, dtype="bf16"), "dtype", V),
}.items():
    CASES.append(Case("explain", lambda _, f=call: f(), err, name, label))
for label, value in {"int": 1, "str": "yes", "float": 0.0, "list": [True]}.items():
    CASES.append(Case("set_deterministic", lambda _, v=value: humming.set_deterministic(v), T, "enabled", label))
for label, (value, err) in {
    "cpu": ("cpu", V),
    "cpu-device": (torch.device("cpu"), V),
    "meta": ("meta", V),
    "bad-string": ("gpu9", V),
    "bad-index-string": ("cuda:x", V),
    "negative": (-1, V),
    "float": (1.5, T),
    "bool": (True, T),
}.items():
    CASES.append(Case("device_info", lambda _, v=value: device_info(v), err, "device", label))

# -------------------------------------------------------------------------- backend= and HUMMING_BACKEND
for label, make in {
    "linear": lambda: lin(_x(), _w(), backend="tpu"),
    "linear-int": lambda: lin(_x(), _w(), backend=3),
    "linear-none": lambda: lin(_x(), _w(), backend=None),
    "linear-env": lambda: _with_env(HUMMING_BACKEND="tpu")(lambda: lin(_x(), _w())),
    "grouped": lambda: _grouped(backend="tpu"),
    "grouped-env": lambda: _with_env(HUMMING_BACKEND="tpu")(lambda: _grouped()),
    "fused": lambda: _fused(backend="tpu"),
}.items():
    CASES.append(Case("backend", lambda _, f=make: f(), V, "backend", label))

# ------------------------------------------------------------------------------------ more grouped / fused
for label, (change, name) in {
    "block-m-negative": ({"block_m": -16}, "block_m"),
    "block-m-bool": ({"block_m": True}, "block_m"),
    "block-m-str": ({"block_m": "16"}, "block_m"),
    "ids-int64": ({"expert_ids": torch.zeros(2, dtype=torch.int64)}, "expert_ids"),
    "ids-below-minus-one": ({"expert_ids": torch.full((2,), -2, dtype=torch.int32)}, "expert_ids"),
    "ids-list": ({"expert_ids": [0, 0]}, "expert_ids"),
    "ids-2d": ({"expert_ids": torch.zeros(2, 1, dtype=torch.int32)}, "expert_ids"),
    "x-list": ({"x": [[0.0] * 64] * 32}, "x"),
    "x-3d": ({"x": torch.randn(2, 16, 64)}, "x"),
    "x-fp64": ({"x": torch.randn(32, 64, dtype=torch.float64)}, "x"),
    "x-strided": ({"x": torch.randn(32, 128)[:, ::2]}, "x"),
    "bias-1d": ({"bias": torch.zeros(16)}, "bias"),
    "out-dtype-str": ({"out_dtype": "bf16"}, "out_dtype"),
    "act-int": ({"act": 8}, "act"),
}.items():
    CASES.append(Case("grouped_linear", lambda _, c=change: _grouped(**c), V, name, label))
for label, (change, name) in {
    "block-m-odd": ({"block_m": 12}, "block_m"),
    "block-m-zero": ({"block_m": 0}, "block_m"),
    "act": ({"act": "fp9"}, "act"),
    "ids-range": ({"topk_ids": torch.full((4, 2), 5)}, "topk_ids"),
    "ids-negative": ({"topk_ids": torch.full((4, 2), -1)}, "topk_ids"),
    "weights-list": ({"topk_weights": [[1.0, 1.0]] * 4}, "topk_weights"),
    "weights-rows": ({"topk_weights": torch.ones(5, 2)}, "topk_weights"),
    "x-list": ({"x": [[0.0] * 64] * 4}, "x"),
    "w13-tensor": ({"w13": torch.zeros(2)}, "w13"),
    "w2-experts": ({"w2": _experts(e=3, n=64, k=16)}, "w2"),
    "activation-int": ({"activation": 3}, "activation"),
}.items():
    CASES.append(Case("fused_moe", lambda _, c=change: _fused(**c), V, name, label))

# ======================================================================== issue 27: the second hostile pass
# ------------------------------------------------------------------ QuantizedWeight: exact ints, finite data
for label, (field, value) in {
    "shape-float": ("shape", (16.9, 64)),
    "shape-bool": ("shape", (True, 64)),
    "shape-gen": ("shape", (d for d in (16, 64))),
    "group-float": ("group_shape", (1, 32.7)),
    "group-bool": ("group_shape", (True, True)),
    "group-str-pair": ("group_shape", ("1", "32")),
    "scales-nan": ("scales", torch.full((16, 2), float("nan"))),
    "scales-inf": ("scales", torch.full((16, 2), float("-inf"))),
    "scales-one-nan-fp16": (
        "scales",
        torch.ones(16, 2, dtype=torch.float16).index_fill_(1, torch.tensor([1]), float("nan")),
    ),
    "scales-e8m0-nan-code": ("scales", torch.full((16, 2), 255, dtype=torch.uint8).view(torch.float8_e8m0fnu)),
    "g_idx-float": ("g_idx", torch.zeros(64)),
    "g_idx-negative": ("g_idx", torch.full((64,), -1, dtype=torch.int32)),
}.items():
    CASES.append(Case("QuantizedWeight", lambda _, f=field, v=value: QW(**_qw_fields(**{f: v})), V, field, label))
_nv = lambda: humming.quantize(torch.randn(16, 64), "nvfp4")
_zp = lambda: humming.quantize(torch.randn(16, 64), "int4", 32, zero_point="float")
for label, (make, name) in {
    "global-nan": (lambda: _nv().replace(global_scale=torch.tensor(float("nan"))), "global_scale"),
    "global-inf": (lambda: _nv().replace(global_scale=torch.tensor(float("inf"))), "global_scale"),
    "float-zeros-nan": (lambda: _zp().replace(zeros=torch.full((16, 2), float("nan"))), "zeros"),
    "to-dtype": (lambda: _w().to(torch.float16), "device"),
    "to-garbage": (lambda: _w().to("gpu9"), "device"),
}.items():
    CASES.append(Case("QuantizedWeight", lambda _, f=make: f(), (V, T), name, label))

# ------------------------------------------------------------------------ quantize: what cannot be stored
for label, (make, name) in {
    "w-nan": (lambda: q(torch.randn(16, 64).index_fill_(1, torch.tensor([3]), float("nan"))), "w"),
    "w-inf": (lambda: q(torch.full((16, 64), float("inf"))), "w"),
    "w-empty": (lambda: q(torch.zeros(0, 64)), "w"),
    "e4m3-scales-underflow": (
        lambda: q(torch.full((16, 32), 1e-6), "e2m1", 16, scale_dtype=torch.float8_e4m3fn),
        "scale_dtype",
    ),
    "e4m3-scales-overflow": (
        lambda: q(torch.full((16, 32), 1e4), "int4", 16, scale_dtype=torch.float8_e4m3fn),
        "scale_dtype",
    ),
    "fp16-scales-overflow": (
        lambda: q(torch.full((16, 32), 1e6), "int4", 16, scale_dtype=torch.float16),
        "scale_dtype",
    ),
    "fp16-scales-flush": (lambda: q(torch.full((16, 32), 1e-9), "int4", 16, scale_dtype=torch.float16), "scale_dtype"),
    "fp16-zp-scales-overflow": (lambda: q(torch.full((16, 32), 1e6), "int4", 16, True, torch.float16), "scale_dtype"),
    "fp32-scales-from-fp64": (lambda: q(torch.full((16, 32), 1e300, dtype=torch.float64), "int8", -1), "scale_dtype"),
    "g_idx-float": (lambda: q(torch.randn(16, 64), group_size=32, g_idx=torch.zeros(64) + 0.7), "g_idx"),
    "g_idx-negative": (lambda: q(torch.randn(16, 64), group_size=32, g_idx=torch.full((64,), -1)), "g_idx"),
    "g_idx-huge": (lambda: q(torch.randn(16, 64), group_size=32, g_idx=torch.full((64,), 10**9)), "g_idx"),
    "g_idx-beyond-int32": (lambda: q(torch.randn(16, 64), group_size=32, g_idx=torch.full((64,), 2**33)), "g_idx"),
    "g_idx-list": (lambda: q(torch.randn(16, 64), group_size=32, g_idx=[0] * 64), "g_idx"),
    "group-zero": (lambda: q(torch.randn(16, 64), group_size=0), "group_size"),
    "scale-dtype-device": (lambda: q(torch.randn(16, 64), scale_dtype="cuda"), "scale_dtype"),
}.items():
    CASES.append(Case("quantize", lambda _, f=make: f(), V, name, label))
for label, dtype in {
    "int8": torch.int8,
    "int32": torch.int32,
    "bool": torch.bool,
    "device": "cpu",
    "e4m3": torch.float8_e4m3fn,
}.items():
    CASES.append(Case("dequantize", lambda _, d=dtype: humming.dequantize(_w(), d), V, "dtype", label))
    CASES.append(
        Case("dequantize_activation", lambda _, d=dtype: humming.dequantize_activation(_qa(), d), V, "dtype", label)
    )


# ------------------------------------------------------------------------- activations: codes, schemes
def _qa_rows(act: str, m: int):
    return humming.quantize_activation(torch.randn(m, 64), act)


_int4_qa = lambda code: QA(_qa("int4").scheme, torch.full((3, 64), code, dtype=torch.uint8), _qa("int4").scales)
for label, (make, name) in {
    "codes-200-dequantize": (lambda: humming.dequantize_activation(_int4_qa(200)), "codes"),
    "codes-16-linear": (lambda: lin(_int4_qa(16), _w()), "codes"),
    "codes-e2m1-grouped": (
        lambda: _grouped(
            x=QA(_qa("mxfp4").scheme, torch.full((32, 64), 17, dtype=torch.uint8), _qa_rows("mxfp4", 32).scales)
        ),
        "codes",
    ),
    "static-nvfp4": (lambda: qa(_x(), "nvfp4", scale=torch.tensor(0.1)), "scale"),
    "static-mxfp4": (lambda: qa(_x(), "mxfp4", scale=torch.tensor(0.1)), "scale"),
    "static-mxfp4-op": (lambda: humming.ops.quantize_activation(_x(), "mxfp4", scale=torch.tensor(0.1)), "scale"),
    "x-list": (lambda: qa([[0.0] * 64], "fp8"), "x"),
    "x-int": (lambda: qa(torch.zeros(3, 64, dtype=torch.int32), "fp8"), "x"),
}.items():
    CASES.append(Case("activations", lambda _, f=make: f(), V, name, label))
AS = humming.ActScheme
for label, (kwargs, name) in {
    "format-unknown": (dict(format="int99", group="token"), "format"),
    "format-e8m0": (dict(format="e8m0", group="token"), "format"),
    "format-uint": (dict(format="uint4", group="token"), "format"),
    "format-int1": (dict(format="int1", group="token"), "format"),
    "group-zero": (dict(format="int8", group=0), "group"),
    "group-str": (dict(format="int8", group="row"), "group"),
    "group-bool": (dict(format="int8", group=True), "group"),
    "scale-dtype": (dict(format="int8", group="token", scale_dtype=torch.int8), "scale_dtype"),
    "global-fp32": (dict(format="e2m1", group=16, global_scale=True), "global_scale"),
    "global-str": (dict(format="e2m1", group=16, scale_dtype=torch.float8_e4m3fn, global_scale="yes"), "global_scale"),
}.items():
    CASES.append(Case("ActScheme", lambda _, k=kwargs: AS("mine", **k), V, name, label))
CASES.append(Case("ActScheme", lambda _: AS("", "int8", "token"), V, "name", "empty-name"))


# ------------------------------------------------------------------------------- joins, shards, integers
_uint = lambda: humming.quantize(torch.randn(16, 64), "int4", 32, zero_point=True)
_bare = lambda fmt: QW((16, 64), fmt, torch.zeros(16, 8, dtype=torch.int32))
for label, (make, name) in {
    "concat-int-uint-no-scales": (lambda: humming.concat([_bare("uint4"), _bare("int4")]), "parts"),
    "stack-int-uint-no-scales": (lambda: humming.stack([_bare("int4"), _bare("uint4")]), "parts"),
    "concat-some-global": (
        lambda: humming.concat([_nv(), q(torch.randn(16, 64), "e2m1", 16, scale_dtype=torch.float8_e4m3fn)]),
        "parts",
    ),
    "concat-dim-bool": (lambda: humming.concat([_experts(), _experts()], dim=True), "dim"),
    "concat-dim-float": (lambda: humming.concat([_w(), _w()], dim=0.0), "dim"),
    "shard-dim-bool": (lambda: humming.shard(_w(), True, 0, 2), "dim"),
    "shard-rank-float": (lambda: humming.shard(_w(), 0, 0.0, 2), "rank"),
    "shard-world-float": (lambda: humming.shard(_w(), 0, 0, 2.0), "world_size"),
    "shard-tensor": (lambda: humming.shard(torch.zeros(16, 64), 0, 0, 2), "qw"),
    "shard-rank-negative": (lambda: humming.shard(_w(), 0, -1, 2), "rank"),
}.items():
    CASES.append(Case("joins", lambda _, f=make: f(), V, name, label))

# --------------------------------------------------------------------------- environment variables
_det = lambda: humming.is_deterministic()
_lock = lambda: __import__("humming.cuda_kernels._cache", fromlist=["x"]).lock_timeout_s()
_cache_dir = lambda: __import__("humming.cuda_kernels._cache", fromlist=["x"]).cache_dir()
for label, (variables, call, name) in {
    "det-garbage": ({"HUMMING_DETERMINISTIC": "garbage"}, _det, "HUMMING_DETERMINISTIC"),
    "det-float": ({"HUMMING_DETERMINISTIC": "0.0"}, _det, "HUMMING_DETERMINISTIC"),
    "det-two": ({"HUMMING_DETERMINISTIC": "2"}, _det, "HUMMING_DETERMINISTIC"),
    "lock-nan": ({"HUMMING_CACHE_LOCK_TIMEOUT": "nan"}, _lock, "HUMMING_CACHE_LOCK_TIMEOUT"),
    "lock-inf": ({"HUMMING_CACHE_LOCK_TIMEOUT": "inf"}, _lock, "HUMMING_CACHE_LOCK_TIMEOUT"),
    "lock-negative": ({"HUMMING_CACHE_LOCK_TIMEOUT": "-1"}, _lock, "HUMMING_CACHE_LOCK_TIMEOUT"),
    "lock-text": ({"HUMMING_CACHE_LOCK_TIMEOUT": "ten"}, _lock, "HUMMING_CACHE_LOCK_TIMEOUT"),
    "log-garbage": ({"HUMMING_LOG_DISPATCH": "verbose"}, lambda: lin(_x(), _w(n=24)), "HUMMING_LOG_DISPATCH"),
    "backend-topk": ({"HUMMING_BACKEND": "bogus"}, lambda: moe.topk_routing(torch.randn(4, 8), 2), "HUMMING_BACKEND"),
    "backend-rmsq": (
        {"HUMMING_BACKEND": "bogus"},
        lambda: humming.rmsnorm_quantize(_x(), torch.ones(64), 1e-6, "fp8"),
        "HUMMING_BACKEND",
    ),
    "backend-qact": (
        {"HUMMING_BACKEND": "bogus"},
        lambda: humming.ops.quantize_activation(_x(), "fp8"),
        "HUMMING_BACKEND",
    ),
    "backend-case": ({"HUMMING_BACKEND": "Triton"}, lambda: lin(_x(), _w()), "HUMMING_BACKEND"),
    "backend-fused": ({"HUMMING_BACKEND": "tpu"}, lambda: _fused(), "HUMMING_BACKEND"),
}.items():
    CASES.append(Case("environment", lambda _, v=variables, c=call: _with_env(**v)(c), V, name, label))


def _file(tmp_path):
    (tmp_path / "file").write_text("")
    return str(tmp_path / "file")


CASES.append(
    Case(
        "environment",
        lambda p: _with_env(HUMMING_CACHE_DIR=_file(p))(_cache_dir),
        V,
        "HUMMING_CACHE_DIR",
        "cache-dir-file",
    )
)
CASES.append(
    Case(
        "environment",
        lambda _: _with_env(TRITON_INTERPRET="maybe")(lambda: humming._env.env("TRITON_INTERPRET")),
        V,
        "TRITON_INTERPRET",
        "interpret-garbage",
    )
)


# ------------------------------------------------------------------------------- the custom ops' boundary
def _op_linear(x=None, weight=None, out_dtype=torch.float32, act=None):
    args = list(humming.ops.weight_args(_w())) if weight is None else weight
    return torch.ops.humming.linear(_x() if x is None else x, None, None, *args, None, act, out_dtype, "reference")


def _op_weight(**changes):
    args = dict(
        zip(("qweight", "scales", "zeros", "global_scale", "g_idx", "handle", "meta"), humming.ops.weight_args(_w()))
    )
    return list({**args, **changes}.values())


def _op_grouped(rows: int, out_dtype):
    """torch.ops.humming.grouped_linear on ``rows`` rows of one routing block of 16 (reference backend)."""
    ids, weight = torch.zeros(1, dtype=torch.int32), humming.ops.weight_args(_experts())
    args = (torch.randn(rows, 64), None, None, ids, 16, None, *weight, None, None, out_dtype, "reference")
    return torch.ops.humming.grouped_linear(*args)


for label, (make, name) in {
    "linear-out-int32": (lambda: _op_linear(out_dtype=torch.int32), "out_dtype"),
    "linear-x-int64": (lambda: _op_linear(x=torch.zeros(3, 64, dtype=torch.int64)), "x"),
    "linear-x-k": (lambda: _op_linear(x=torch.randn(3, 32)), "x"),
    "linear-act": (lambda: _op_linear(act="fp9"), "act"),
    "meta-garbage": (lambda: _op_linear(weight=_op_weight(handle=-1, meta="garbage")), "meta"),
    "meta-shape-text": (lambda: _op_linear(weight=_op_weight(handle=-1, meta="int4;1,32;16xK")), "meta"),
    "meta-format": (lambda: _op_linear(weight=_op_weight(handle=-1, meta="int99;1,32;16x64")), "format"),
    "grouped-block-m": (lambda: _op_grouped(24, torch.float32), "block_m"),
    "grouped-out-int": (lambda: _op_grouped(16, torch.int8), "out_dtype"),
    "moe-align-block-zero": (lambda: torch.ops.humming.moe_align(_ids(), 2, 0), "block_m"),
    "moe-align-experts-zero": (lambda: torch.ops.humming.moe_align(_ids(), 0, 16), "num_experts"),
    "fused-activation": (
        lambda: torch.ops.humming.fused_moe(
            torch.randn(4, 64),
            torch.ones(4, 2),
            _ids(),
            *humming.ops.weight_args(_experts(n=32)),
            None,
            *humming.ops.weight_args(_experts(n=64, k=16)),
            None,
            None,
            "relu",
            None,
            None,
            "concat",
            None,
            None,
            None,
            16,
            "reference",
        ),
        "activation",
    ),
}.items():
    CASES.append(Case("ops", lambda _, f=make: f(), V, name, label))


# ------------------------------------------------------------------------------------------- save / load
def _manifest_file(tmp_path, text: str) -> str:
    """A humming file whose manifest is ``text`` (with a valid checksum: only its form can be wrong)."""
    import hashlib

    import safetensors.torch

    path = tmp_path / "m.safetensors"
    meta = {
        "humming_format_version": "2",
        "humming_manifest": text,
        "humming_manifest_sha256": hashlib.sha256(text.encode()).hexdigest(),
    }
    safetensors.torch.save_file({"a.qweight": torch.zeros(1, dtype=torch.int32)}, path, metadata=meta)
    return path


def _fifo(tmp_path):
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


def _loop(tmp_path):
    path = tmp_path / "loop.safetensors"
    os.symlink(path, path)
    return path


for label, (make, name) in {
    "save-folder": (lambda p: humming.save(_w(), p), "path"),
    "save-missing-folder": (lambda p: humming.save(_w(), p / "no" / "x.safetensors"), "path"),
    "save-fifo": (lambda p: humming.save(_w(), _fifo(p)), "path"),
    "save-loop": (lambda p: humming.save(_w(), _loop(p)), "path"),
    "save-single-name": (lambda p: humming.save({"__single__": _w()}, p / "x.safetensors"), "weights"),
    "save-bytes-path": (lambda p: humming.save(_w(), bytes(p / "x.safetensors")), "path"),
    "load-folder": (lambda p: humming.load(p), "path"),
    "load-fifo": (lambda p: humming.load(_fifo(p)), "path"),
    "load-loop": (lambda p: humming.load(_loop(p)), "path"),
    "load-device-dtype": (lambda p: humming.load(_saved(p, lambda t, m: None), device=torch.float16), "device"),
    "manifest-not-json": (lambda p: humming.load(_manifest_file(p, "{not json")), "path"),
    "manifest-list": (lambda p: humming.load(_manifest_file(p, "[]")), "path"),
    "manifest-no-tensors": (lambda p: humming.load(_manifest_file(p, '{"a": {"shape": [1, 8]}}')), "path"),
    "manifest-bad-entry": (lambda p: humming.load(_manifest_file(p, '{"a": {"tensors": {"qweight": 3}}}')), "path"),
    "manifest-unknown-field": (
        lambda p: humming.load(
            _manifest_file(p, '{"a": {"tensors": {"codes": {"shape": [1], "dtype": "int32", "sha256": ""}}}}')
        ),
        "path",
    ),
    "v1-record-string": (lambda p: humming.load(_v1_record(p, "{oops")), "path"),
}.items():
    CASES.append(Case("save/load", make, (V, T), name, label))


# ------------------------------------------------------------------------------------------ checkpoints
def _ckpt(tmp_path, config=None, index=None, prefix="m", name="model.safetensors", scale=1.0):
    """A one-module GPTQ checkpoint (``config``: its quantization_config; ``index``: an index file's JSON;
    ``scale``: the value of every scale)."""
    from safetensors.torch import save_file

    from humming.loaders.gptq import pack_gptq

    codes, scales, zeros = (
        torch.zeros(16, 64, dtype=torch.uint8),
        torch.full((16, 2), scale).half(),
        torch.full((16, 2), 8),
    )
    t = pack_gptq(codes, scales, zeros, bits=4, group_size=32)
    save_file({f"{prefix}.{k}": v for k, v in t.items()}, str(tmp_path / name))
    gptq = {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": True}
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": gptq if config is None else config}))
    if index is not None:
        (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    return tmp_path


def _outside(tmp_path):
    (tmp_path / "outside").mkdir()
    (tmp_path / "m").mkdir()
    _ckpt(tmp_path / "outside", name="x.safetensors")
    folder = _ckpt(tmp_path / "m", index={"weight_map": {"m.qweight": "../outside/x.safetensors"}})
    (folder / "model.safetensors").unlink()
    return folder


def _truncated(tmp_path):
    folder = _ckpt(tmp_path)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) - 100])
    return folder


def _not_safetensors(tmp_path):
    folder = _ckpt(tmp_path)
    (folder / "model.safetensors").write_bytes(b"PK\x03\x04 a zip, not safetensors")
    return folder


_G = {"quant_method": "gptq", "bits": 4, "group_size": 32}
lc = humming.load_checkpoint
for label, (make, name) in {
    "index-empty-weight-map": (lambda p: lc(_ckpt(p, index={"weight_map": {}})), "weight_map"),
    "index-weight-map-list": (lambda p: lc(_ckpt(p, index={"weight_map": ["model.safetensors"]})), "weight_map"),
    "index-outside": (lambda p: lc(_outside(p)), "../outside"),
    "index-absolute": (lambda p: lc(_ckpt(p, index={"weight_map": {"m.qweight": "/etc/passwd"}})), "/etc/passwd"),
    "index-missing-file": (
        lambda p: lc(_ckpt(p, index={"weight_map": {"m.qweight": "shard-2.safetensors"}})),
        "shard-2",
    ),
    "index-file-int": (lambda p: lc(_ckpt(p, index={"weight_map": {"m.qweight": 3}})), "weight_map"),
    "modules-no-match": (lambda p: lc(_ckpt(p), modules=["nope*"]), "modules"),
    "modules-one-no-match": (lambda p: lc(_ckpt(p), modules=["m", "q_proj"]), "q_proj"),
    "modules-empty": (lambda p: lc(_ckpt(p), modules=[]), "modules"),
    "bits-float": (lambda p: lc(_ckpt(p, {**_G, "bits": 4.7})), "bits"),
    "bits-text": (lambda p: lc(_ckpt(p, {**_G, "bits": "four"})), "bits"),
    "bits-null": (lambda p: lc(_ckpt(p, {**_G, "bits": None})), "bits"),
    "bits-bool": (lambda p: lc(_ckpt(p, {**_G, "bits": True})), "bits"),
    "group-zero": (lambda p: lc(_ckpt(p, {**_G, "group_size": 0})), "group_size"),
    "group-negative": (lambda p: lc(_ckpt(p, {**_G, "group_size": -32})), "group_size"),
    "sym-text": (lambda p: lc(_ckpt(p, {**_G, "sym": "yes"})), "sym"),
    "dynamic-list": (lambda p: lc(_ckpt(p, {**_G, "dynamic": ["-:.*"]})), "dynamic"),
    "dynamic-bits": (lambda p: lc(_ckpt(p, {**_G, "dynamic": {"+:m": {"bits": "8"}}})), "bits"),
    "qconfig-list": (lambda p: lc(_ckpt(p, [_G])), "quantization_config"),
    "method-int": (lambda p: lc(_ckpt(p, {**_G, "quant_method": 3})), "quant_method"),
    "fp8-block-zero": (
        lambda p: lc(_ckpt(p, {"quant_method": "fp8", "weight_block_size": [0, 128]})),
        "weight_block_size",
    ),
    "fp8-block-int": (lambda p: lc(_ckpt(p, {"quant_method": "fp8", "weight_block_size": 128})), "weight_block_size"),
    "fp8-block-one": (lambda p: lc(_ckpt(p, {"quant_method": "fp8", "weight_block_size": [128]})), "weight_block_size"),
    "fp8-skip-str": (
        lambda p: lc(_ckpt(p, {"quant_method": "fp8", "modules_to_not_convert": "lm_head"})),
        "modules_to_not_convert",
    ),
    "awq-group-text": (lambda p: lc(_ckpt(p, {"quant_method": "awq", "group_size": "128"})), "group_size"),
    "ct-groups-list": (
        lambda p: lc(_ckpt(p, {"quant_method": "compressed-tensors", "config_groups": []})),
        "config_groups",
    ),
    "ct-targets-str": (
        lambda p: lc(_ckpt(p, {"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": "Linear"}}})),
        "targets",
    ),
    "ct-bits-text": (
        lambda p: lc(
            _ckpt(p, {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": "4"}}}})
        ),
        "num_bits",
    ),
    "modelopt-layers-list": (
        lambda p: lc(_ckpt(p, {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "quantized_layers": []})),
        "quantized_layers",
    ),
    "truncated-file": (lambda p: lc(_truncated(p)), "model.safetensors"),
    "not-safetensors": (lambda p: lc(_not_safetensors(p)), "model.safetensors"),
    "expert-index-1e10": (lambda p: lc(_ckpt(p, prefix=f"l.experts.{10**10}.p")), "experts"),
    "expert-gap": (lambda p: lc(_ckpt(p, prefix="l.experts.3.p")), "experts [0, 1, 2]"),
    "scales-nan": (lambda p: lc(_ckpt(p, scale=float("nan"))), "m: scales: expected finite values"),
    "scales-inf": (lambda p: lc(_ckpt(p, scale=float("inf"))), "m: scales: expected finite values"),
}.items():
    CASES.append(Case("checkpoints", make, (V, T), name, label))


def _ct_checkpoint(tmp_path, weight_shape):
    """A compressed-tensors pack-quantized module whose weight_shape tensor is ``weight_shape``."""
    from safetensors.torch import save_file

    from humming.loaders.compressed_tensors import pack_int_quantized

    t = pack_int_quantized(torch.zeros(16, 64, dtype=torch.int8), torch.ones(16, 2), None, bits=4)
    t["weight_shape"] = torch.tensor(weight_shape)
    save_file({f"m.{k}": v for k, v in t.items()}, str(tmp_path / "model.safetensors"))
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}
    group = {"targets": ["Linear"], "weights": weights, "format": "pack-quantized"}
    qconfig = {"quant_method": "compressed-tensors", "config_groups": {"group_0": group}}
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": qconfig}))
    return tmp_path


for label, shape in {"negative": [-16, 64], "three": [16, 64, 1], "float": [16.0, 64.0]}.items():
    CASES.append(
        Case("checkpoints", lambda p, s=shape: lc(_ct_checkpoint(p, s)), (V, T), "weight_shape", f"ct-{label}")
    )

# -------------------------------------------------------------------------- norms, routing, MoE, nn, CLI
_moe_layer = lambda: humming.nn.FusedMoE(_experts(e=4, n=32), _experts(e=4, n=64, k=16), 2)
for label, (make, err, name) in {
    "rmsnorm-eps-inf": (lambda: humming.rmsnorm(_x(), torch.ones(64), eps=float("inf")), V, "eps"),
    "rmsnorm-eps-nan": (lambda: humming.rmsnorm(_x(), torch.ones(64), eps=float("nan")), V, "eps"),
    "rmsq-eps-inf": (lambda: humming.rmsnorm_quantize(_x(), torch.ones(64), float("inf"), "fp8"), V, "eps"),
    "rmsq-strided-weight": (
        lambda: humming.rmsnorm_quantize(_x(), torch.ones(128)[::2], 1e-6, "fp8", backend="triton"),
        V,
        "weight",
    ),
    "topk-bias-nan": (
        lambda: moe.topk_routing(
            torch.randn(4, 8), 2, scoring="sigmoid", correction_bias=torch.full((8,), float("nan"))
        ),
        V,
        "correction_bias",
    ),
    "topk-bias-inf": (
        lambda: moe.topk_routing(
            torch.randn(4, 8), 2, scoring="sigmoid", correction_bias=torch.tensor([float("inf")] * 8)
        ),
        V,
        "correction_bias",
    ),
    "topk-zero": (lambda: moe.topk_routing(torch.randn(4, 8), 0), V, "top_k"),
    "fused-moe-layer-bias-nan": (
        lambda: humming.nn.FusedMoE(
            _experts(e=4, n=32),
            _experts(e=4, n=64, k=16),
            2,
            scoring="sigmoid",
            correction_bias=torch.full((4,), float("nan")),
        ),
        V,
        "correction_bias",
    ),
    "fused-moe-logits-wide": (lambda: _moe_layer()(torch.randn(3, 64), torch.randn(3, 6)), V, "router_logits"),
    "fused-moe-logits-narrow": (lambda: _moe_layer().route(torch.randn(3, 2)), V, "router_logits"),
    "fused-topk-zero": (
        lambda: _fused(topk_ids=torch.zeros(4, 0, dtype=torch.int64), topk_weights=torch.ones(4, 0)),
        V,
        "topk_ids",
    ),
    "block-m-huge": (lambda: moe.moe_align(_ids(), 2, 2**40), V, "block_m"),
    "fused-block-m-huge": (lambda: _fused(block_m=2**40), V, "block_m"),
    "masked-k-zero": (
        lambda: moe.grouped_linear_masked(torch.randn(2, 16, 0), _experts(), torch.ones(2, dtype=torch.int32)),
        V,
        "x",
    ),
    "from-pretrained-strict": (lambda: humming.nn.from_pretrained("/nonexistent", strict="no"), T, "strict"),
    "from-pretrained-remote": (
        lambda: humming.nn.from_pretrained("/nonexistent", trust_remote_code=1),
        T,
        "trust_remote_code",
    ),
    "quantized-linear-assign": (lambda: _assigned_scales(torch.full((16, 2), float("nan"))), V, "scales"),
    "quantized-linear-assign-shape": (lambda: _assigned_scales(torch.ones(16, 3)), V, "scales"),
}.items():
    CASES.append(Case("layers", lambda _, f=make: f(), err, name, label))


def _assigned_scales(scales):
    """A QuantizedLinear whose ``scales`` buffer is replaced, then run: the weight is rebuilt (and checked)."""
    layer = humming.nn.QuantizedLinear(_w())
    layer.scales = scales
    return layer(_x())


# found by the fresh pass: op boundaries and sizes past what can be allocated or described
_rmsq_op = lambda **c: torch.ops.humming.rmsnorm_quantize(
    *{
        "x": _x(),
        "weight": torch.ones(64),
        "eps": 1e-6,
        "act": "fp8",
        "residual": None,
        "scale": None,
        "backend": "triton",
        **c,
    }.values()
)
for label, (make, name) in {
    "rmsq-op-eps-negative": (lambda: _rmsq_op(eps=-1.0), "eps"),
    "rmsq-op-weight-shape": (lambda: _rmsq_op(weight=torch.ones(63)), "weight"),
    "moe-align-experts-2pow40": (lambda: moe.moe_align(_ids(), 2**40, 16), "num_experts"),
    "explain-m-past-int64": (lambda: humming.explain(_w(), 2**62, dtype=torch.float32), "m"),
    "explain-m-float-tensor": (lambda: humming.explain(_w(), torch.tensor(4.0), dtype=torch.float32), "m"),
}.items():
    CASES.append(Case("found", lambda _, f=make: f(), V, name, label))
if not torch.cuda.is_available():
    CASES.append(Case("found", lambda _: _w().to("cuda"), V, "device", "to-cuda-without-cuda"))
    CASES.append(
        Case("found", lambda p: humming.load(_saved(p, lambda t, m: None), device="cuda"), V, "device", "load-cuda")
    )


def test_explain_takes_numpy_ints() -> None:
    assert humming.explain(_w(), np.int64(16), dtype=torch.float32).kernel == "reference"


def test_linear_op_keeps_the_rank_of_x(seed) -> None:
    """The op's output has the shape its fake implementation promises, for an x of any rank."""
    x = torch.randn(2, 3, 64)
    qw = _w()
    y = torch.ops.humming.linear(x, None, None, *humming.ops.weight_args(qw), None, None, torch.float32, "reference")
    assert y.shape == (2, 3, 16)
    torch.testing.assert_close(y, x @ humming.dequantize(qw).T)


#: (label, argv, what the error names): ``python -m humming`` exits with status 2 (argparse) or 1.
CLI_CASES = [
    ("demo-n-zero", ["demo", "--n", "0"], "--n"),
    ("demo-m-text", ["demo", "--m", "many"], "--m"),
    ("explain-k-negative", ["explain", "--k", "-4"], "--k"),
]


@pytest.mark.parametrize("argv,option", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_cli_bad_arguments(argv: list[str], option: str, capsys) -> None:
    from humming.__main__ import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert option in capsys.readouterr().err


def test_inspect_reports_a_bad_checkpoint(tmp_path, capsys) -> None:
    """``python -m humming inspect`` on a checkpoint a loader refuses: the reason on stderr, exit status 1."""
    from humming.__main__ import main

    assert main(["inspect", str(_ckpt(tmp_path, {**_G, "bits": 4.7}))]) == 1
    assert "quantization_config.bits" in capsys.readouterr().err


# ---------------------------------------------------------------------- inputs that get the right answer
def test_joins_keep_float_zero_points(seed) -> None:
    """concat / stack of integer and float zero points: the float ones stay floats (exact), none truncate."""
    w = torch.randn(16, 64)
    a, b = humming.quantize(w, "int4", 32, True), humming.quantize(3 * w, "int4", 32, "float")
    assert torch.equal(
        humming.dequantize(humming.concat([a, b])), torch.cat([humming.dequantize(a), humming.dequantize(b)])
    )
    assert torch.equal(
        humming.dequantize(humming.stack([b, a])), torch.stack([humming.dequantize(b), humming.dequantize(a)])
    )


def test_ops_rebuild_the_weight_they_are_given(seed) -> None:
    """A custom op called with tensors (zeros) that are not the registered weight's runs on those tensors."""
    a = humming.quantize(torch.randn(16, 64), "uint4", 32, True)
    zeros = torch.zeros_like(a.zeros)
    args = list(humming.ops.weight_args(a))
    args[2] = zeros
    x = _x()
    y = torch.ops.humming.linear(x, None, None, *args, None, None, torch.float32, "reference")
    torch.testing.assert_close(y, x @ humming.dequantize(a.replace(zeros=zeros)).T)


def test_nn_modules_serve_their_buffers(seed) -> None:
    """A replaced buffer (an assignment, load_state_dict(assign=True)) is what the module runs."""
    x = _x()
    w1, w2 = humming.quantize(torch.randn(16, 64), "int4", 32), humming.quantize(torch.randn(16, 64), "int4", 32)
    layer = humming.nn.QuantizedLinear(w1)
    layer.load_state_dict(humming.nn.QuantizedLinear(w2).state_dict(), assign=True)
    torch.testing.assert_close(layer(x), x @ humming.dequantize(w2).T)
    layer.scales = w2.scales * 2
    torch.testing.assert_close(layer(x), x @ (2 * humming.dequantize(w2)).T)


def test_quantize_model_quantizes_every_name_of_a_shared_layer() -> None:
    model, shared = torch.nn.Module(), torch.nn.Linear(64, 16)
    model.a, model.b = shared, shared
    humming.nn.quantize_model(model, progress=False, ignore=())
    assert isinstance(model.a, humming.nn.QuantizedLinear) and model.a is model.b


def test_save_writes_through_a_symlink(tmp_path) -> None:
    """A symlink stays a symlink; the file it points to holds the weight."""
    target, link = tmp_path / "target.safetensors", tmp_path / "link.safetensors"
    target.write_bytes(b"old")
    link.symlink_to(target)
    qw = _w()
    humming.save(qw, link)
    assert link.is_symlink() and torch.equal(humming.load(target).qweight, qw.qweight)


def test_save_copies_shared_tensors(tmp_path) -> None:
    qw = _w()
    humming.save({"a": qw, "b": qw}, tmp_path / "s.safetensors")
    loaded = humming.load(tmp_path / "s.safetensors")
    assert sorted(loaded) == ["a", "b"] and torch.equal(loaded["b"].scales, qw.scales)


def test_explain_does_not_allocate_the_input() -> None:
    """10^12 tokens of 64 columns would be 128 TB: the plan is made without an input of that size."""
    assert humming.explain(_w(), 10**12, dtype=torch.float32).kernel == "reference"
    assert humming.explain(_experts(), 10**12, dtype=torch.float32).kernel == "reference"


def test_quantized_linear_takes_no_tokens() -> None:
    layer = humming.nn.QuantizedLinear(_w(), act="fp8", act_scale=torch.tensor(0.1))
    assert layer(torch.randn(0, 64)).shape == (0, 16)


@pytest.mark.parametrize("value", ["false", "no", "off", "0", "OFF", " False "])
def test_a_flag_reads_off(value: str, monkeypatch) -> None:
    monkeypatch.setenv("HUMMING_DETERMINISTIC", value)
    assert humming.is_deterministic() is False


@pytest.mark.parametrize("value", ["true", "yes", "on", "1", "TRUE"])
def test_a_flag_reads_on(value: str, monkeypatch) -> None:
    monkeypatch.setenv("HUMMING_DETERMINISTIC", value)
    assert humming.is_deterministic() is True


def test_env_reads_the_environment_through_os_environ(monkeypatch) -> None:
    """humming._env reads ``os.environ`` itself, not CPython's private byte dictionary behind it: a plain
    mapping put in its place is what it sees."""
    import humming._env as env_module

    monkeypatch.setattr(os, "environ", {**os.environ, "HUMMING_BACKEND": "reference"})
    assert env_module.env("HUMMING_BACKEND") == "reference"


# -------------------------------------------------------------------------------- python -m humming tune
#: (label, argv, the option the error names): argparse exits with status 2 and names it on stderr.
TUNE_CASES = [
    ("shapes-3d", ["--shapes", "1x2x3"], "--shapes"),
    ("shapes-text", ["--shapes", "big"], "--shapes"),
    ("shapes-zero", ["--shapes", "0x128"], "--shapes"),
    ("shapes-empty", ["--shapes", ""], "--shapes"),
    ("m-text", ["--m", "a,b"], "--m"),
    ("m-zero", ["--m", "0,16"], "--m"),
    ("m-negative", ["--m", "-4"], "--m"),
    ("cases-unknown", ["--cases", "w4a16-nope"], "--cases"),
    ("cases-partly-unknown", ["--cases", "nvfp4-a16,nope"], "--cases"),
    ("option-unknown", ["--bogus", "1"], "--bogus"),
]


@pytest.mark.parametrize("argv,option", [c[1:] for c in TUNE_CASES], ids=[c[0] for c in TUNE_CASES])
def test_tune_bad_arguments(argv: list[str], option: str, capsys) -> None:
    tune = pytest.importorskip("humming.dispatch.tune")
    with pytest.raises(SystemExit) as info:
        tune.main(argv)
    assert info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]  # the usage line above it lists every option
    assert error.startswith("humming tune: error:") and option in error, error


@pytest.mark.parametrize("case", CASES, ids=str)
def test_bad_input(case: Case, tmp_path) -> None:
    with pytest.raises(case.error) as info:
        case.call(tmp_path)
    assert case.name in str(info.value), f"the message does not name {case.name!r}: {info.value}"
    assert not isinstance(info.value, (AssertionError, KeyError, ZeroDivisionError, IndexError, AttributeError))


def test_case_count() -> None:
    assert len(CASES) + len(TUNE_CASES) >= 450, len(CASES) + len(TUNE_CASES)
