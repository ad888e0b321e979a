"""compressed-tensors checkpoints (llm-compressor, ``quant_method: compressed-tensors``).

Per-module scheme: the ``config_groups`` entry whose ``targets`` match the module (exact name, then
``re:`` regex, then a class name such as ``Linear``), minus ``ignore``. The storage format is the group's
``format`` or the top-level ``format`` (``mixed-precision`` configs set it per group). Formats:

- ``pack-quantized`` (int, 1-8 bits): ``weight_packed`` int32 ``[N, ceil(K*b/32)]``, a dense little-endian
  stream (compressed-tensors >= 0.18; the IR's canonical packing), or ``[N, ceil(K/floor(32/b))]`` with
  ``floor(32/b)`` fields per word (older releases; differs for 3, 5, 6, 7 bits). Fields hold ``q + 2^(b-1)``.
  Asymmetric ``weight_zero_point`` is packed the same way along N: ``[ceil(N*b/32), groups]``.
  ``weight_shape`` holds ``[N, K]``; ``weight_g_idx`` ``[K]`` with group act-order.
- ``int-quantized`` / ``naive-quantized`` (int): ``weight`` int8 ``[N, K]`` holding ``q``.
- ``float-quantized`` / ``naive-quantized`` (float): ``weight`` float8_e4m3fn ``[N, K]``.
- ``nvfp4-pack-quantized``: ``weight_packed`` uint8 ``[N, K/2]`` (element 2i in the low nibble),
  ``weight_scale`` float8_e4m3fn ``[N, K/16]``, ``weight_global_scale`` float32, a DIVISOR. The IR's
  global scale multiplies, so it becomes ``1 / weight_global_scale`` in fp32: ``fp32(s) * (1/g)`` may differ
  from compressed-tensors' ``fp32(s) / g`` by one ulp of the scale (exact when g is a power of two).
- ``mxfp4-pack-quantized``: ``weight_packed`` as nvfp4, ``weight_scale`` uint8 e8m0 exponents ``[N, K/32]``.

Signed ``q`` with offset-binary fields becomes two's-complement ``intN`` (symmetric) by flipping each field's
top bit, or ``uintN`` codes with uint8 zeros ``zp + 2^(b-1)`` (asymmetric): both exact.
"""

from __future__ import annotations

import re

import torch

from humming.ir.packing import msb_mask, pack_codes, packed_words, unpack_codes
from humming.ir.weight import QuantizedWeight, cdiv

from ._common import (
    bytes_to_words,
    check_shape,
    drop_trivial_g_idx,
    match_any,
    signed_if_symmetric,
)
from ._config import Config
from ._files import CheckpointFiles
from .activations import ActivationSpec, compressed_tensors_activation
from .errors import CheckpointError, MissingTensorError, ShapeMismatchError, UnsupportedFormatError

__all__ = ["CompressedTensorsReader", "config_group", "pack_fp4", "pack_int_quantized"]

_UNPACKED = ("int-quantized", "float-quantized", "naive-quantized")
_PACKED_FP4 = {"nvfp4-pack-quantized": ("e4m3", 16), "mxfp4-pack-quantized": ("e8m0", 32)}
_KERNEL_FORMATS = ("marlin-24",)
_SPARSE_FORMATS = ("sparse-24-bitmask", "sparse-bitmask", "sparse-24")


class CompressedTensorsReader:
    method = "compressed-tensors"

    def __init__(self, qconfig: dict, files: CheckpointFiles):
        self.files = files
        config = Config(qconfig, "quantization_config")
        status = config.str("quantization_status", "compressed")
        if status != "compressed":
            raise UnsupportedFormatError(
                f"compressed-tensors quantization_status {status!r}: the weights are stored unquantized "
                "(only 'compressed' checkpoints hold quantized tensors)"
            )
        sparse = config.object("sparsity_config").str("format", None)
        if sparse not in (None, "dense"):
            raise UnsupportedFormatError(
                f"compressed-tensors sparsity format {sparse!r}: sparse (2:4 / bitmask) storage is not "
                "supported; the weight IR holds dense quantized weights"
            )
        if config.object("transform_config").value.get("config_groups"):
            raise UnsupportedFormatError(
                "compressed-tensors transform_config (online rotations such as SpinQuant / QuIP Hadamards): "
                "they also transform activations, which the weight IR does not carry"
            )
        groups = config.object("config_groups")
        self.groups = {name: _config_group(groups.object(name)) for name in groups.value}
        self.format = config.str("format", None)
        self.ignore = config.strings("ignore")
        self.version = tuple(int(p) for p in re.findall(r"\d+", config.str("version", ""))[:2]) or None

    def describe(self) -> str:
        parts = []
        for name, group in self.groups.items():
            w = group.get("weights") or {}
            fmt = group.get("format") or self.format
            parts.append(f"{name}: {fmt} {w.get('type')}{w.get('num_bits')} {w.get('strategy')}")
        return "compressed-tensors " + "; ".join(parts)

    def _group(self, module: str) -> dict:
        return config_group(self.groups, module)

    def activation(self, module: str) -> ActivationSpec:
        """The module's config group ``input_activations`` as a humming activation scheme."""
        return compressed_tensors_activation(module, self._group(module).get("input_activations"), self.files)

    def modules(self) -> list[str]:
        found = self.files.modules_with("weight_packed", "weight_scale")
        return [m for m in found if not match_any(m, self.ignore)]

    def load(self, module: str) -> QuantizedWeight:
        group = self._group(module)
        w = group.get("weights") or {}
        fmt = group.get("format") or self.format
        if fmt in (None, "mixed-precision"):
            raise UnsupportedFormatError(f"{module}: no storage format in its config group nor at the top level")
        if fmt in _KERNEL_FORMATS:
            raise UnsupportedFormatError(
                f"{module}: compressed-tensors format {fmt!r} is a kernel-specific (Marlin 2:4) repacked layout"
            )
        if fmt in _SPARSE_FORMATS or fmt == "dense":
            raise UnsupportedFormatError(f"{module}: compressed-tensors format {fmt!r} holds no quantized weight")
        if w.get("dynamic"):
            raise UnsupportedFormatError(f"{module}: dynamic weight quantization stores no weight scales")
        get = lambda name: self.files.get(f"{module}.{name}", module)
        opt = lambda name: self.files.get_optional(f"{module}.{name}")
        bias = opt("bias")
        if fmt == "pack-quantized":
            if w.get("type", "int") != "int":
                raise UnsupportedFormatError(f"{module}: pack-quantized with type {w.get('type')!r} (int only)")
            return _decode_pack_quantized(
                module,
                w,
                get("weight_packed"),
                get("weight_scale"),
                opt("weight_zero_point"),
                opt("weight_shape"),
                opt("weight_g_idx"),
                bias,
                self.version,
            )
        if fmt in _UNPACKED:
            return _decode_unpacked(
                module, w, get("weight"), get("weight_scale"), opt("weight_zero_point"), opt("weight_g_idx"), bias
            )
        if fmt in _PACKED_FP4:
            scale_kind, group_size = _PACKED_FP4[fmt]
            global_scale = get("weight_global_scale") if scale_kind == "e4m3" else None
            return _decode_fp4(
                module,
                get("weight_packed"),
                get("weight_scale"),
                global_scale,
                opt("weight_shape"),
                bias,
                scale_kind,
                group_size,
            )
        raise UnsupportedFormatError(f"{module}: compressed-tensors format {fmt!r} is not supported")


def config_group(groups: dict, module: str) -> dict:
    """The entry of ``config_groups`` for ``module``: exact name beats regex beats class name (as
    compressed-tensors)."""
    best, best_rank = None, 3
    for group in groups.values():
        for target in group.get("targets", []):
            if target == module:
                rank = 0
            elif target.startswith("re:"):
                rank = 1 if re.match(target[3:], module) else 3
            else:  # a class name ("Linear"): the checkpoint cannot tell classes apart
                rank = 2 if target[:1].isupper() else 3
            if rank < best_rank:
                best, best_rank = group, rank
    if best is None:
        raise CheckpointError(f"{module}: has quantized tensors but no config_groups entry targets it")
    return best


def _config_group(group: Config) -> dict:
    """One ``config_groups`` entry, every field compressed-tensors defines for it type-checked: ``targets``,
    ``format``, and the ``weights`` / ``input_activations`` quantization arguments (``{}`` / ``None`` unset)."""
    activations = group.object("input_activations")
    return {
        "targets": group.strings("targets"),
        "format": group.str("format", None),
        "weights": _quantization_args(group.object("weights")),
        "input_activations": _quantization_args(activations) if activations.value else None,
    }


def _quantization_args(args: Config) -> dict:
    """compressed-tensors ``QuantizationArgs``: the fields humming reads, checked, absent ones left out."""
    if not args.value:
        return {}
    dynamic = args.value.get("dynamic", False)
    if not isinstance(dynamic, (bool, str)):
        raise args.error("dynamic", "true, false or 'local'", dynamic)
    fields = {
        "num_bits": args.int("num_bits", 8, minimum=1, null=True),
        "type": args.str("type", "int"),
        "strategy": args.str("strategy", None),
        "symmetric": args.bool("symmetric", True),
        "dynamic": dynamic,
        "group_size": args.int("group_size", None, minimum=1, null=True),
        "block_structure": args.int_pair("block_structure"),
    }
    return {key: value for key, value in fields.items() if value is not None}


def _group_shape(module: str, w: dict) -> tuple[int, int]:
    strategy = w.get("strategy")
    if strategy == "tensor":
        return (-1, -1)
    if strategy == "channel":
        return (1, -1)
    if strategy in ("group", "tensor_group"):
        if "group_size" not in w:
            raise CheckpointError(f"{module}: weight strategy {strategy!r} without a group_size")
        return (1, w["group_size"])
    if strategy == "block":
        if "block_structure" not in w:
            raise CheckpointError(f"{module}: weight strategy 'block' without a block_structure [bn, bk]")
        return w["block_structure"]
    raise UnsupportedFormatError(f"{module}: weight strategy {strategy!r} is not a weight layout humming reads")


def _scales(module: str, scale: torch.Tensor, n: int, k: int, group_shape, g_idx) -> torch.Tensor:
    """Scale tensor reshaped to the IR grid ``[groups along N, groups along K]`` (checked)."""
    bn, bk = group_shape
    rows = 1 if bn == -1 else cdiv(n, bn)
    if g_idx is not None:
        cols = int(scale.shape[-1])
    else:
        cols = 1 if bk == -1 else cdiv(k, bk)
    if not _same_grid(scale, rows, cols):
        raise ShapeMismatchError(
            f"{module}: tensor 'weight_scale' has shape {tuple(scale.shape)}, expected {(rows, cols)} "
            f"for a {n}x{k} weight with group shape {group_shape}"
        )
    return scale.reshape(rows, cols)


def _same_grid(t: torch.Tensor, rows: int, cols: int) -> bool:
    """Whether ``t`` holds a ``[rows, cols]`` grid in row-major order: its shape is ``(rows, cols)`` up to
    size-1 dimensions (a per-channel ``[N]`` or ``[N, 1]``, a per-tensor ``[]`` or ``[1]``). An equal element
    count is not enough: a transposed ``[cols, rows]`` tensor would reshape into a different grid."""
    return [d for d in t.shape if d != 1] == [d for d in (rows, cols) if d != 1]


def _unpack_padded(words: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """Pre-0.18 packing: ``floor(32/bits)`` fields per int32 word, field j at bit ``bits*(j % per_word)``."""
    per_word = 32 // bits
    j = torch.arange(count)
    w = words.to(torch.int64)[..., j // per_word] & 0xFFFFFFFF
    return ((w >> (bits * (j % per_word))) & ((1 << bits) - 1)).to(torch.uint8)


def _pack_padded(codes: torch.Tensor, bits: int) -> torch.Tensor:
    per_word = 32 // bits
    count = codes.shape[-1]
    codes = torch.nn.functional.pad(codes.to(torch.int64), (0, -count % per_word))
    fields = codes.reshape(*codes.shape[:-1], -1, per_word)
    words = (fields << (bits * torch.arange(per_word))).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def _layout(module: str, width: int, count: int, bits: int, version) -> str:
    """``"dense"`` or ``"padded"``: how ``count`` fields of ``bits`` bits were packed into ``width`` words."""
    dense, padded = packed_words(count, bits), cdiv(count, 32 // bits)
    same_bits = 32 % bits == 0 or count <= 32 // bits  # both packings put every field in the same place
    if width == dense and (same_bits or width != padded):
        return "dense"
    if width == padded and width != dense:
        return "padded"
    if width == dense:
        if version is None:
            raise UnsupportedFormatError(
                f"{module}: {count} {bits}-bit fields in {width} words fit both the dense (>= 0.18) and the "
                "padded (< 0.18) pack-quantized layout, and the config has no 'version' to tell them apart"
            )
        return "dense" if version >= (0, 18) else "padded"
    raise ShapeMismatchError(
        f"{module}: {width} packed words for {count} {bits}-bit fields; expected {dense} (dense packing) "
        f"or {padded} (pre-0.18 padded packing)"
    )


def _int_bits(module: str, w: dict) -> int:
    bits = w.get("num_bits", 8)
    if not 1 <= bits <= 8:
        raise UnsupportedFormatError(f"{module}: int weights of {bits} bits (humming's int formats have 1 to 8)")
    return bits


def _weight_shape(module: str, weight_shape: torch.Tensor) -> tuple[int, int]:
    """``weight_shape`` ``[N, K]`` (an integer tensor of two positive values)."""
    if weight_shape.is_floating_point() or weight_shape.numel() != 2 or int(weight_shape.min()) < 1:
        raise ShapeMismatchError(
            f"{module}: tensor 'weight_shape' must hold two positive ints [N, K], got {weight_shape.tolist()}"
        )
    n, k = (int(v) for v in weight_shape.reshape(-1).tolist())
    return n, k


def _decode_pack_quantized(module, w, packed, scale, zero_point, weight_shape, g_idx, bias, version):
    bits = _int_bits(module, w)
    if packed.dtype != torch.int32 or packed.dim() != 2:
        raise ShapeMismatchError(f"{module}: weight_packed must be 2-D int32, got {packed.dtype} {tuple(packed.shape)}")
    if weight_shape is None:
        raise MissingTensorError(f"{module}: pack-quantized needs tensor '{module}.weight_shape' to know K")
    n, k = _weight_shape(module, weight_shape)
    if packed.shape[0] != n:
        raise ShapeMismatchError(f"{module}: weight_packed has {packed.shape[0]} rows, weight_shape says {n}")
    layout = _layout(module, packed.shape[1], k, bits, version)
    qweight = packed if layout == "dense" else pack_codes(_unpack_padded(packed, bits, k), bits)
    group_shape = _group_shape(module, w)
    if g_idx is not None:
        check_shape(module, "weight_g_idx", g_idx, (k,))
    scales = _scales(module, scale, n, k, group_shape, g_idx)
    if w.get("symmetric", True) and zero_point is None:
        fmt, zeros = f"int{bits}", None
        qweight = qweight ^ msb_mask(k, bits)
    else:
        if zero_point is None:
            raise MissingTensorError(f"{module}: asymmetric scheme but tensor '{module}.weight_zero_point' is missing")
        if zero_point.dtype == torch.int32:  # packed along N like the weight
            zp_version = version or ((0, 18) if layout == "dense" else (0, 0))
            zeros = _packed_zeros(module, zero_point, bits, scales.shape, zp_version)
        else:
            zeros = _unpacked_zeros(module, zero_point, bits, scales.shape)
        fmt, qweight, zeros = signed_if_symmetric(qweight, zeros, bits, k)  # all-zero zero points
    group = k if group_shape[1] == -1 else group_shape[1]
    return QuantizedWeight(
        shape=(n, k),
        format=fmt,
        qweight=qweight,
        scales=scales,
        group_shape=group_shape,
        zeros=zeros,
        g_idx=drop_trivial_g_idx(g_idx, k, group) if group_shape[0] == 1 else g_idx,
        bias=bias,
    )


def _packed_zeros(module, zero_point, bits, grid, version) -> torch.Tensor:
    """int32 ``[words(rows), cols]`` offset-binary fields packed along N -> uint8 zeros ``zp + 2^(b-1)``."""
    rows, cols = grid
    if zero_point.dim() != 2 or zero_point.shape[1] != cols:
        raise ShapeMismatchError(
            f"{module}: tensor 'weight_zero_point' has shape {tuple(zero_point.shape)}, expected "
            f"[packed {rows} rows, {cols}]"
        )
    t = zero_point.T.contiguous()
    if _layout(module, t.shape[1], rows, bits, version) == "dense":
        return unpack_codes(t, bits, rows).T.contiguous()
    return _unpack_padded(t, bits, rows).T.contiguous()


def _unpacked_zeros(module, zero_point, bits, grid) -> torch.Tensor:
    """Signed zero points ``[rows, cols]`` -> uint8 ``zp + 2^(b-1)``."""
    rows, cols = grid
    if not _same_grid(zero_point, rows, cols) or zero_point.is_floating_point():
        raise ShapeMismatchError(
            f"{module}: tensor 'weight_zero_point' has shape {tuple(zero_point.shape)} / {zero_point.dtype}, "
            f"expected integer zero points for a {rows}x{cols} grid"
        )
    return (zero_point.reshape(rows, cols).to(torch.int16) + (1 << (bits - 1))).to(torch.uint8)


def _decode_unpacked(module, w, weight, scale, zero_point, g_idx, bias) -> QuantizedWeight:
    if weight.dim() != 2:
        raise ShapeMismatchError(f"{module}: weight must be 2-D [N, K], got {tuple(weight.shape)}")
    n, k = weight.shape
    bits = _int_bits(module, w)
    group_shape = _group_shape(module, w)
    scales = _scales(module, scale, n, k, group_shape, g_idx)
    zeros = None
    if w.get("type", "int") == "float":
        if weight.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2) or bits != 8:
            raise UnsupportedFormatError(f"{module}: float weights must be stored as fp8, got {weight.dtype}")
        fmt = "e4m3" if weight.dtype == torch.float8_e4m3fn else "e5m2"
        qweight = bytes_to_words(weight.view(torch.uint8))
    else:
        if weight.dtype != torch.int8:
            raise ShapeMismatchError(f"{module}: int-quantized weight must be int8, got {weight.dtype}")
        lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        if weight.numel() and (int(weight.min()) < lo or int(weight.max()) > hi):
            raise ShapeMismatchError(f"{module}: weight values leave the {bits}-bit range [{lo}, {hi}]")
        codes = weight.view(torch.uint8) & ((1 << bits) - 1)
        if zero_point is None or not bool(zero_point.any()):
            fmt = f"int{bits}"
        else:
            fmt = f"uint{bits}"
            codes = codes ^ (1 << (bits - 1))
            zeros = _unpacked_zeros(module, zero_point, bits, scales.shape)
        qweight = pack_codes(codes, bits)
    group = k if group_shape[1] == -1 else group_shape[1]
    if g_idx is not None:
        check_shape(module, "weight_g_idx", g_idx, (k,))
        g_idx = drop_trivial_g_idx(g_idx, k, group)
    return QuantizedWeight(
        shape=(n, k),
        format=fmt,
        qweight=qweight,
        scales=scales,
        group_shape=group_shape,
        zeros=zeros,
        g_idx=g_idx,
        bias=bias,
    )


def _decode_fp4(module, packed, scale, global_scale, weight_shape, bias, scale_kind, group_size):
    if packed.dtype != torch.uint8 or packed.dim() != 2:
        raise ShapeMismatchError(f"{module}: weight_packed must be 2-D uint8, got {packed.dtype} {tuple(packed.shape)}")
    n = packed.shape[0]
    k = _weight_shape(module, weight_shape)[1] if weight_shape is not None else packed.shape[1] * 2
    check_shape(module, "weight_packed", packed, (n, cdiv(k, 2)))
    check_shape(module, "weight_scale", scale, (n, cdiv(k, group_size)))
    if scale_kind == "e8m0":
        if scale.dtype == torch.uint8:
            scale = scale.view(torch.float8_e8m0fnu)
    elif scale.dtype != torch.float8_e4m3fn:
        raise ShapeMismatchError(f"{module}: nvfp4 weight_scale must be float8_e4m3fn, got {scale.dtype}")
    if global_scale is not None:
        if global_scale.numel() != 1:
            raise ShapeMismatchError(
                f"{module}: weight_global_scale must hold one value, got {tuple(global_scale.shape)}"
            )
        global_scale = torch.reciprocal(global_scale.to(torch.float32).reshape(()))
    return QuantizedWeight(
        shape=(n, k),
        format="e2m1",
        qweight=bytes_to_words(packed)[:, : packed_words(k, 4)],
        scales=scale,
        group_shape=(1, group_size),
        global_scale=global_scale,
        bias=bias,
    )


def pack_int_quantized(
    q: torch.Tensor,
    scales: torch.Tensor,
    zero_point: torch.Tensor | None,
    *,
    bits: int,
    padded: bool = False,
) -> dict[str, torch.Tensor]:
    """Write one module in ``pack-quantized`` layout.

    ``q`` signed integers ``[N, K]`` in ``[-2^(b-1), 2^(b-1))``; ``scales`` ``[N, groups]``; ``zero_point``
    signed ``[N, groups]`` or ``None`` (symmetric). ``padded`` writes the pre-0.18 packing
    (``floor(32/b)`` fields per word) instead of the dense stream.
    """
    offset = 1 << (bits - 1)
    pack = (lambda c: _pack_padded(c, bits)) if padded else (lambda c: pack_codes(c, bits))
    out = {
        "weight_packed": pack((q.to(torch.int64) + offset).to(torch.uint8)),
        "weight_scale": scales,
        "weight_shape": torch.tensor(list(q.shape), dtype=torch.int64),
    }
    if zero_point is not None:
        out["weight_zero_point"] = pack((zero_point.T.to(torch.int64) + offset).to(torch.uint8)).T.contiguous()
    return out


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """e2m1 codes uint8 ``[N, K]`` -> ``weight_packed`` uint8 ``[N, ceil(K/2)]``, element 2i in the low nibble."""
    codes = torch.nn.functional.pad(codes, (0, codes.shape[-1] % 2))
    return codes[..., 0::2] | (codes[..., 1::2] << 4)
