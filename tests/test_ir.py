"""The weight IR: canonical packing, quantize -> pack -> unpack -> dequantize, validation, save/load."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

import humming
from humming.ir import QuantizedWeight, get_format, pack_codes, packed_words, unpack_codes, unpacked_codes

# --------------------------------------------------------------------------------------------- packing


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("k", [1, 7, 31, 32, 33, 100, 256])
def test_pack_roundtrip(bits, k, seed):
    codes = torch.randint(0, 2**bits, (2, 3, k), dtype=torch.uint8)
    packed = pack_codes(codes, bits)
    assert packed.dtype == torch.int32 and packed.shape == (2, 3, packed_words(k, bits))
    assert torch.equal(unpack_codes(packed, bits, k), codes)


def test_pack_layout_is_a_little_endian_bit_stream():
    # 4 bits: element k in nibble k, low nibble first.
    assert pack_codes(torch.arange(1, 9, dtype=torch.uint8)[None], 4).item() == 0x87654321 - 2**32
    # 3 bits: element 10 straddles words 0 and 1 (stream bits 30..32).
    codes = torch.zeros(1, 11, dtype=torch.uint8)
    codes[0, 10] = 0b111
    words = pack_codes(codes, 3)[0].tolist()
    assert words == [-(2**31) + 2**30, 1]
    # Reference: build the stream bit by bit in Python.
    rng = np.random.default_rng(0)
    for bits in (3, 5, 6, 7):
        values = rng.integers(0, 2**bits, 45)
        stream = sum(int(v) << (i * bits) for i, v in enumerate(values))
        expected = [(stream >> (32 * w)) & 0xFFFFFFFF for w in range(packed_words(45, bits))]
        got = pack_codes(torch.tensor(values, dtype=torch.uint8)[None], bits)[0].tolist()
        assert [g & 0xFFFFFFFF for g in got] == expected


# ------------------------------------------------------------------------- quantize -> dequantize

ML_VIEWS = {
    "e2m1": ml_dtypes.float4_e2m1fn,
    "e2m3": ml_dtypes.float6_e2m3fn,
    "e3m2": ml_dtypes.float6_e3m2fn,
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
}


def independent_decode(codes: np.ndarray, name: str) -> np.ndarray:
    fmt = get_format(name)
    if fmt.kind == "int":
        c = codes.astype(np.int64)
        return np.where(fmt.signed & (c >= 2 ** (fmt.bits - 1)), c - 2**fmt.bits, c).astype(np.float32)
    if name in ML_VIEWS:
        return codes.astype(np.uint8).view(ML_VIEWS[name]).astype(np.float32)
    return fmt.value_table().numpy()[codes]  # eXmY without an outside decoder: checked in test_formats


def independent_dequantize(qw: QuantizedWeight) -> np.ndarray:
    """``(q - z) * (fp32(s) * g)`` in float32 with explicit group indices (no humming layout code)."""
    codes = unpack_codes(qw.qweight, qw.bits, qw.K).numpy()
    q = independent_decode(codes, qw.format.name)
    n_idx = np.arange(qw.N)[:, None]
    k_idx = np.arange(qw.K)[None, :]
    bn, bk = qw.block_shape
    if qw.g_idx is not None:
        rows, cols = np.broadcast_to(n_idx, (qw.N, qw.K)), qw.g_idx.numpy()[None, :].repeat(qw.N, 0)
    else:
        rows, cols = np.broadcast_to(n_idx // bn, (qw.N, qw.K)), np.broadcast_to(k_idx // bk, (qw.N, qw.K))
    out = np.empty(qw.shape, dtype=np.float32)
    for e in range(qw.num_experts or 1):
        sel = (e,) if qw.num_experts else ()
        s = np.ones((1, 1), np.float32) if qw.scales is None else qw.scales[sel].float().numpy()
        if qw.global_scale is not None:
            s = s * np.float32(qw.global_scale[sel].item())
        z = 0 if qw.zeros is None else qw.zeros[sel].float().numpy()[rows, cols]
        out[sel] = (q[sel] - z) * s[rows, cols] if s.size > 1 else (q[sel] - z) * s.item()
    return out


CASES = [  # (weight, kwargs): every format family x every layout
    *[(f"int{b}", dict(group_size=g)) for b in (2, 3, 4, 5, 8) for g in (32, -1)],
    *[(f"int{b}", dict(group_size=64, zero_point=True)) for b in (1, 2, 3, 4, 6, 7, 8)],
    ("int4", dict(group_size=64, zero_point="float")),
    ("int8", dict(group_size="tensor")),
    ("int4", dict(group_size=(32, 64))),
    ("int4", dict(group_size=128, scale_dtype=torch.float16)),
    ("int4", dict(group_size=32, scale_dtype=torch.float8_e8m0fnu)),
    ("int4", dict(group_size=32, act_order=True)),
    ("uint4", dict(group_size=32, zero_point=True, act_order=True, scale_dtype=torch.bfloat16)),
    *[(f, dict(group_size=32)) for f in ("e2m1", "e2m3", "e3m2", "e4m3", "e5m2", "e1m2", "e3m3", "e2m2", "nf4")],
    ("e4m3", dict(group_size=-1)),
    ("e4m3", dict(group_size="tensor")),
    ("fp8_block", dict()),
    ("fp8_block", dict(group_size=(32, 32))),
    ("mxfp4", dict()),
    ("mxfp6_e2m3", dict()),
    ("mxfp6_e3m2", dict()),
    ("mxfp8", dict()),
    ("nvfp4", dict()),
]


def _case_id(case):
    weight, kw = case
    return weight + "".join(f"-{k}={v}" for k, v in kw.items()).replace("torch.", "")


@pytest.mark.parametrize("case", CASES, ids=_case_id)
@pytest.mark.parametrize("shape", [(48, 160), (3, 40, 96)], ids=["2d", "moe"])
def test_quantize_dequantize_bit_exact(case, shape, seed, tmp_path):
    weight, kwargs = dict(case[0:1] and {"weight": case[0]}), dict(case[1])
    if kwargs.pop("act_order", False):
        k = shape[-1]
        kwargs["g_idx"] = torch.randperm(k) // kwargs["group_size"]
        kwargs["g_idx"] = kwargs["g_idx"].to(torch.int32)
    w = torch.randn(shape, dtype=torch.bfloat16)
    qw = humming.quantize(w, **weight, **kwargs)
    assert qw.shape == tuple(shape)
    deq = humming.dequantize(qw)
    assert deq.dtype == torch.float32 and torch.isfinite(deq).all()
    np.testing.assert_array_equal(deq.numpy().view(np.int32), independent_dequantize(qw).view(np.int32))
    # one rounding to the output dtype
    assert torch.equal(humming.dequantize(qw, torch.bfloat16), deq.to(torch.bfloat16))
    check_rounding_error(qw, w.float(), deq)
    # save / load is bit-exact
    check_roundtrip(qw, tmp_path / "qw.safetensors")


def check_rounding_error(qw, w, deq):
    """Round to nearest: integer codes are off by at most half a step (scale rounding adds a little);
    float formats (which saturate by the MX rules) are held to a norm bound by their mantissa width."""
    if qw.format.is_int:
        s = humming.dequantize(
            qw.replace(
                qweight=pack_codes(torch.ones(qw.shape, dtype=torch.uint8), qw.bits),
                zeros=None if qw.zeros is None else torch.zeros_like(qw.zeros),
            )
        )
        excess = (deq - w).abs() - s.abs() * 0.5 * (1 + 2**-6)
        assert float(excess.max()) <= 1e-6, float(excess.max())
    else:
        rel = float((deq - w).norm() / w.norm())
        mantissa = qw.format.mantissa_bits if qw.format.is_float else 2
        assert rel < 2.0 ** -(mantissa + 1), rel


def check_roundtrip(qw, tmp):
    humming.save(qw, tmp)
    back = humming.load(tmp)
    assert back.shape == qw.shape and back.format == qw.format and back.group_shape == qw.group_shape
    assert set(back.tensors()) == set(qw.tensors())
    for name, t in qw.tensors().items():
        assert back.tensors()[name].dtype == t.dtype
        assert torch.equal(back.tensors()[name].reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8)), name


def test_quantizer_scales_follow_the_rules(seed):
    w = torch.randn(8, 64)
    qw = humming.quantize(w, "int8", group_size=-1, scale_dtype=torch.float32)
    exact = w.double().abs().amax(-1, keepdim=True) / 127
    nearest = exact.float()  # integer grids take the smallest float32 scale >= amax / qmax: nothing clips
    expected = torch.where(nearest.double() < exact, torch.nextafter(nearest, torch.tensor(1e9)), nearest)
    assert torch.equal(qw.scales, expected)
    # MX: shared exponent floor(log2(amax)) - emax(e2m1 = 2)
    qw = humming.quantize(w, "mxfp4")
    amax = w.abs().reshape(8, 2, 32).amax(-1)
    assert torch.equal(qw.scales.float(), torch.exp2(torch.floor(torch.log2(amax)) - 2))
    # NVFP4: global = 1 / fp32((6 * 448) / amax), compressed-tensors' divisor inverted (~ amax / (6 * 448))
    qw = humming.quantize(w, "nvfp4")
    divisor = (6 * 448 / w.double().abs().amax()).float()
    assert torch.equal(qw.global_scale, torch.reciprocal(divisor))
    assert torch.allclose(qw.global_scale, w.abs().amax() / (6 * 448), rtol=3e-7, atol=0)


def test_zero_group_is_exact():
    w = torch.zeros(4, 64)
    w[0, :32] = torch.linspace(-1, 1, 32)
    for kwargs in (dict(weight="int4"), dict(weight="int4", zero_point=True), dict(weight="nvfp4")):
        deq = humming.dequantize(humming.quantize(w, group_size=16, **kwargs))
        assert torch.isfinite(deq).all() and bool((deq[1:] == 0).all())


def test_save_load_dict_and_to(tmp_path):
    w = torch.randn(16, 64)
    weights = {"a.q_proj": humming.quantize(w, "int4", group_size=32), "b": humming.quantize(w, "nvfp4")}
    humming.save(weights, tmp_path / "w.safetensors")
    back = humming.load(tmp_path / "w.safetensors")
    assert set(back) == set(weights)
    for name in weights:
        assert torch.equal(humming.dequantize(back[name]), humming.dequantize(weights[name]))
    moved = weights["b"].to("cpu")
    assert moved is not weights["b"] and torch.equal(moved.qweight, weights["b"].qweight)


def test_load_rejects_foreign_files(tmp_path):
    import safetensors.torch

    safetensors.torch.save_file({"x": torch.zeros(2)}, tmp_path / "x.safetensors")
    with pytest.raises(ValueError, match="not a humming file"):
        humming.load(tmp_path / "x.safetensors")


def test_properties_and_nbytes():
    qw = humming.quantize(torch.randn(2, 32, 256), "int4", group_size=128, scale_dtype=torch.float16)
    assert (qw.num_experts, qw.N, qw.K, qw.group_size, qw.layout) == (2, 32, 256, 128, "group")
    assert qw.nbytes == 2 * 32 * 256 // 2 + 2 * 32 * 2 * 2
    assert qw.describe() == "int4 g128 fp16-scales E=2"
    assert unpacked_codes(qw).shape == (2, 32, 256)


# ------------------------------------------------------------------------------------------ validation


def _valid(**changes):
    base = dict(
        shape=(8, 64),
        format="uint4",
        qweight=torch.zeros(8, 8, dtype=torch.int32),
        scales=torch.ones(8, 2),
        group_shape=(1, 32),
        zeros=torch.zeros(8, 2, dtype=torch.uint8),
    )
    base.update(changes)
    return QuantizedWeight(**base)


@pytest.mark.parametrize(
    "changes,field",
    [
        (dict(shape=(8,)), "shape"),
        (dict(shape=(0, 64)), "shape"),
        (dict(format="int9"), "format"),
        (dict(format="e8m0"), "format"),
        (dict(qweight=torch.zeros(8, 8, dtype=torch.uint8)), "qweight"),
        (dict(qweight=torch.zeros(8, 7, dtype=torch.int32)), "qweight"),
        (dict(qweight=[1, 2]), "qweight"),
        (dict(scales=torch.ones(8, 3)), "scales"),
        (dict(scales=torch.ones(8, 2, dtype=torch.float64)), "scales"),
        (dict(group_shape=(0, 32)), "group_shape"),
        (dict(group_shape=(1, -2)), "group_shape"),
        (dict(group_shape=7), "group_shape"),
        (dict(zeros=torch.zeros(8, 1, dtype=torch.uint8)), "zeros"),
        (dict(format="int4"), "zeros"),
        (dict(scales=None), "zeros"),
        (dict(global_scale=torch.ones(3)), "global_scale"),
        (dict(scales=None, zeros=None, global_scale=torch.ones(())), "global_scale"),
        (dict(global_scale=torch.ones((), dtype=torch.float16)), "global_scale"),
        (dict(g_idx=torch.zeros(63, dtype=torch.int32)), "g_idx"),
        (dict(g_idx=torch.full((64,), 2, dtype=torch.int32)), "g_idx"),
        (dict(g_idx=torch.zeros(64, dtype=torch.int64)), "g_idx"),
        (
            dict(group_shape=(2, 32), scales=torch.ones(4, 2), zeros=None, g_idx=torch.zeros(64, dtype=torch.int32)),
            "g_idx",
        ),
        (dict(bias=torch.ones(7)), "bias"),
        (dict(bias=torch.ones(8, dtype=torch.int32)), "bias"),
        (dict(scales=torch.ones(8, 2, device="meta"), zeros=None), "scales"),
    ],
)
def test_validation_names_the_field(changes, field):
    with pytest.raises(ValueError, match=rf"^{field}"):
        _valid(**changes)


def test_immutable_and_replace():
    qw = _valid()
    with pytest.raises(AttributeError):
        qw.scales = None
    other = qw.replace(bias=torch.ones(8))
    assert other.bias is not None and qw.bias is None
    with pytest.raises(ValueError, match=r"^bias"):
        qw.replace(bias=torch.ones(3))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(weight="e8m0"), "weight"),
        (dict(weight="e2m1", zero_point=True), "zero_point"),
        (dict(weight="int1"), "int1"),
        (dict(group_size=0), "group_size"),
        (dict(group_size="rows"), "group_size"),
        (dict(scale_dtype=torch.float64), "scale_dtype"),
        (dict(zero_point="yes"), "zero_point"),
        (dict(weight="nvfp4", zero_point=True), "zero_point"),
        (dict(g_idx=torch.zeros(5, dtype=torch.int32)), "g_idx"),
        (dict(g_idx=torch.zeros(64, dtype=torch.int32), group_size=(2, 32)), "g_idx"),
    ],
)
def test_quantize_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        humming.quantize(torch.randn(8, 64), **kwargs)


def _qa_fields(act: str, m: int = 3, k: int = 64) -> dict:
    qa = humming.quantize_activation(torch.randn(m, k), act)
    return {"scheme": qa.scheme, "codes": qa.codes, "scales": qa.scales, "global_scale": qa.global_scale}


@pytest.mark.parametrize(
    ("act", "changes", "field"),
    [
        ("fp8", {"scales": torch.ones(1, 3)}, "scales"),  # per-token scales transposed
        ("fp8", {"scales": torch.ones(3, 1, dtype=torch.float16)}, "scales"),
        ("fp8_g128", {"scales": torch.ones(3, 2)}, "scales"),  # K = 64 is one group of 128
        ("mxfp4", {"scales": torch.ones(3, 2)}, "scales"),  # float32 for e8m0
        ("nvfp4", {"global_scale": None}, "global_scale"),
        ("nvfp4", {"global_scale": torch.ones(2)}, "global_scale"),
        ("int8", {"global_scale": torch.ones(())}, "global_scale"),
        ("int8", {"codes": torch.zeros(3, 64, dtype=torch.int8)}, "codes"),
        ("int8", {"codes": torch.zeros(3, 2, 64, dtype=torch.uint8)}, "codes"),
    ],
)
def test_quantized_activation_validated(act, changes, field):
    """Construction checks codes, scales and global scale against the scheme, naming the field."""
    with pytest.raises(ValueError, match=f"^{field}:"):
        humming.QuantizedActivation(**{**_qa_fields(act), **changes})
    humming.QuantizedActivation(**_qa_fields(act))  # what quantize_activation returns is valid
    static = humming.quantize_activation(torch.randn(3, 64), "fp8", scale=torch.tensor(0.5))
    assert static.scales.shape == (1, 1)


def _rich_weight() -> QuantizedWeight:
    """A weight that has every optional tensor: zeros, g_idx, global_scale and bias (two experts)."""
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(2, 8, 64, generator=gen)
    g_idx = torch.randperm(64, generator=gen).to(torch.int32) % 4
    qw = humming.quantize(w, "int4", group_size=16, zero_point=True, g_idx=g_idx, bias=torch.randn(2, 8))
    return qw.replace(global_scale=torch.tensor([0.5, 2.0]))


def _same_weight(a: QuantizedWeight, b: QuantizedWeight) -> bool:
    same_fields = (a.shape, a.format.name, a.group_shape) == (b.shape, b.format.name, b.group_shape)
    ta, tb = a.tensors(), b.tensors()
    same_tensors = all(ta[n].dtype == tb[n].dtype and torch.equal(ta[n], tb[n]) for n in ta)
    return same_fields and set(ta) == set(tb) and same_tensors


@pytest.mark.parametrize("field", ["zeros", "g_idx", "global_scale", "bias", "scales"])
def test_load_notices_a_missing_tensor(field, tmp_path):
    """A file whose manifest lists a tensor the file lacks is refused, not loaded as a different weight."""
    import safetensors.torch

    path = tmp_path / "w.safetensors"
    humming.save(_rich_weight(), path)
    with safetensors.safe_open(path, "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys() if k != f"__single__.{field}"}  # noqa: SIM118 (not iterable)
    safetensors.torch.save_file(tensors, path, metadata=meta)
    with pytest.raises(ValueError, match=f"{field}"):
        humming.load(path)


def test_load_header_bit_flips_never_load_a_different_weight(tmp_path):
    """Flip each of a seeded sample of bits in the safetensors header (and its length prefix): the file
    either loads the same weight bit for bit or is refused with a ValueError."""
    path = tmp_path / "w.safetensors"
    qw = _rich_weight()
    humming.save(qw, path)
    data = path.read_bytes()
    header_end = 8 + int.from_bytes(data[:8], "little")
    gen = torch.Generator().manual_seed(0)
    bits = torch.randperm(header_end * 8, generator=gen)[:600].tolist()
    silent = []
    for bit in bits:
        flipped = bytearray(data)
        flipped[bit // 8] ^= 1 << (bit % 8)
        path.write_bytes(bytes(flipped))
        try:
            back = humming.load(path)
        except ValueError:
            continue
        if not isinstance(back, QuantizedWeight) or not _same_weight(back, qw):
            silent.append(bit)
    assert not silent, f"{len(silent)} of {len(bits)} header bit flips loaded a different weight: bits {silent[:10]}"


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda meta: meta.pop("humming_format_version"), "not a humming file"),
        (lambda meta: meta.update(humming_format_version="9"), "version 9"),
    ],
)
def test_load_refuses_bad_metadata(edit, match, tmp_path):
    import safetensors.torch

    path = tmp_path / "w.safetensors"
    humming.save(_rich_weight(), path)
    with safetensors.safe_open(path, "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
    edit(meta)
    safetensors.torch.save_file(tensors, path, metadata=meta)
    with pytest.raises(ValueError, match=match):
        humming.load(path)


def test_load_reads_format_version_1(tmp_path):
    """Files of format version 1 (no manifest) still load, with a warning that they cannot be verified;
    a version-1 record without its fields is a ValueError naming the field."""
    import json

    import safetensors.torch

    qw = _rich_weight()
    path = tmp_path / "w.safetensors"
    record = {"shape": list(qw.shape), "format": qw.format.name, "group_shape": list(qw.group_shape)}
    tensors = {f"__single__.{n}": t.contiguous() for n, t in qw.tensors().items()}
    meta = {"humming_format_version": "1", "__single__.__meta__": json.dumps(record)}
    safetensors.torch.save_file(tensors, path, metadata=meta)
    with pytest.warns(UserWarning, match="no manifest"):
        assert _same_weight(humming.load(path), qw)
    del record["format"]
    safetensors.torch.save_file(tensors, path, metadata={**meta, "__single__.__meta__": json.dumps(record)})
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="format"):
        humming.load(path)
