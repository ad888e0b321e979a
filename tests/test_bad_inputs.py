"""Bad inputs to every public entry point: each raises ``ValueError`` / ``TypeError`` whose message names the
argument. One table of :class:`Case` records (entry point, arguments, expected type, argument name); CPU,
tiny shapes."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from unittest import mock

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
    assert len(CASES) + len(TUNE_CASES) >= 250, len(CASES) + len(TUNE_CASES)
