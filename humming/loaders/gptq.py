"""GPTQ checkpoints (AutoGPTQ / GPTQModel, ``quant_method: gptq``), v1 and v2, 2-8 bits, act-order.

Layout (per module): ``qweight`` int32 ``[K*bits/32, N]``, a little-endian dense bit stream along K
(dim 0), so ``qweight.T`` is already the IR's canonical packing; ``qzeros`` int32
``[groups, ceil(N*bits/32)]``, the same stream along N; ``scales`` ``[groups, N]``; ``g_idx`` int32 ``[K]``
(group of each input column; a real permutation with ``desc_act``); optional ``bias`` ``[N]``.

Zero points: v1 (``checkpoint_format`` absent or ``gptq``) stores ``zero - 1`` and AutoGPTQ decodes
``zero = field + 1`` without wrapping, so a zero may be ``2^bits`` (uint8 zeros, int16 for 8 bits).
v2 (``gptq_v2``) stores the zero as is. When every zero is ``2^(bits-1)`` (symmetric) the codes become
two's-complement ``intN`` and the zeros are dropped (exact). ``g_idx`` equal to ``arange(K) // group_size``
is dropped; a real act-order ``g_idx`` is kept as is (not permuted).

v1 asymmetric is ambiguous only where a zero point is 0 (an all-ones field): AutoGPTQ and GPTQModel write
it differently, so loading warns then (as vLLM does for v1 asym) and decodes as AutoGPTQ.
"""

from __future__ import annotations

import re
import warnings

import torch

from humming.ir.packing import pack_codes, packed_words, unpack_codes
from humming.ir.weight import QuantizedWeight, cdiv

from ._common import check_shape, drop_trivial_g_idx, signed_if_symmetric
from ._config import Config
from ._files import CheckpointFiles
from .errors import CheckpointError, ShapeMismatchError, UnsupportedFormatError

__all__ = ["GPTQReader", "pack_gptq"]

_KERNEL_FORMATS = {"marlin", "gptq_marlin", "bitblas", "qqq", "exllama", "exllamav2", "ipex"}


class GPTQReader:
    method = "gptq"

    def __init__(self, qconfig: dict, files: CheckpointFiles):
        self.files = files
        config = Config(qconfig, "quantization_config")
        fmt = (config.str("checkpoint_format", None) or config.str("format", None) or "gptq").lower()
        marlin = config.bool("is_marlin_format", False)
        if marlin or fmt in _KERNEL_FORMATS:
            raise UnsupportedFormatError(
                f"GPTQ checkpoint_format {fmt!r} (is_marlin_format={marlin}) is "
                "a kernel-specific repacked layout; humming reads the portable 'gptq' / 'gptq_v2' layouts. "
                "Re-export the model in GPTQ format."
            )
        if fmt not in ("gptq", "gptq_v2"):
            raise UnsupportedFormatError(f"GPTQ checkpoint_format {fmt!r} is unknown (expected 'gptq' or 'gptq_v2')")
        self.version = 2 if fmt == "gptq_v2" else 1
        self.base = _settings(config, {"bits": 4, "group_size": -1, "sym": True})
        self.dynamic = {}
        dynamic = config.object("dynamic")
        for key, overrides in dynamic.value.items():
            try:
                re.compile(key[2:] if key[:2] in ("+:", "-:") else key)
            except re.error as err:
                raise CheckpointError(f"GPTQ dynamic: invalid pattern {key!r} ({err})") from None
            self.dynamic[key] = _settings(dynamic.object(key), self.base) if overrides else dict(self.base)
        self._warned = False

    def describe(self) -> str:
        b = self.base
        return f"GPTQ v{self.version} {b['bits']}-bit group {b['group_size']} {'sym' if b['sym'] else 'asym'}"

    def _scheme(self, module: str) -> dict | None:
        """The module's settings after GPTQModel ``dynamic`` overrides; ``None`` when it is excluded."""
        for key, overrides in self.dynamic.items():
            negative = key.startswith("-:")
            pattern = key[2:] if key[:2] in ("+:", "-:") else key
            if re.match(pattern, module):
                return None if negative else dict(overrides)
        return dict(self.base)

    def modules(self) -> list[str]:
        return [m for m in self.files.modules_with("qweight") if self._scheme(m) is not None]

    def load(self, module: str) -> QuantizedWeight:
        scheme = self._scheme(module)
        bits = int(scheme["bits"])
        if bits not in (2, 3, 4, 8):
            raise UnsupportedFormatError(f"{module}: GPTQ {bits}-bit is not a GPTQ format (2, 3, 4 or 8 bits)")
        t = {name: self.files.get(f"{module}.{name}", module) for name in ("qweight", "qzeros", "scales")}
        g_idx = self.files.get_optional(f"{module}.g_idx")
        bias = self.files.get_optional(f"{module}.bias")
        qw = decode_gptq(
            module, **t, g_idx=g_idx, bias=bias, bits=bits, group_size=int(scheme["group_size"]), version=self.version
        )
        if self.version == 1 and qw.zeros is not None and not self._warned and bool((qw.zeros == 1 << bits).any()):
            self._warned = True
            warnings.warn(
                f"GPTQ v1 asymmetric checkpoint ({module} and maybe others): v1 stores zero - 1 and cannot "
                "represent a zero point of 0; this checkpoint holds such all-ones fields. AutoGPTQ writes -1 "
                "there (also setting every higher field of the word) and decodes zero = field + 1 per field, "
                "which humming reproduces. GPTQModel's v2->v1 conversion subtracts with borrows instead: for "
                "its checkpoints that zero reads as 2^bits and the next field's zero one too low. Re-export "
                "with checkpoint_format='gptq_v2' to remove the ambiguity.",
                stacklevel=3,
            )
        return qw


def _settings(config: Config, defaults: dict) -> dict:
    """GPTQ's per-module settings read from ``config`` (the quantization_config, or one ``dynamic`` override),
    ``defaults`` for those it leaves out: ``bits`` (an int), ``group_size`` (positive or -1), ``sym``."""
    return {
        "bits": config.int("bits", defaults["bits"], minimum=1),
        "group_size": config.int("group_size", defaults["group_size"], minimum=1, allowed=(-1,)),
        "sym": config.bool("sym", defaults["sym"]),
    }


def decode_gptq(module, *, qweight, qzeros, scales, g_idx, bias, bits, group_size, version) -> QuantizedWeight:
    """GPTQ tensors of one module -> ``QuantizedWeight`` (see the module docstring for the layout)."""
    if qweight.dtype != torch.int32 or qzeros.dtype != torch.int32:
        raise ShapeMismatchError(f"{module}: GPTQ qweight/qzeros must be int32, got {qweight.dtype}/{qzeros.dtype}")
    if qweight.dim() != 2:
        raise ShapeMismatchError(f"{module}: GPTQ qweight must be 2-D [K*bits/32, N], got {tuple(qweight.shape)}")
    rows, n = qweight.shape
    # GPTQ packs K * bits / 32 whole words per column (AutoGPTQ's qweight is [K // 32 * bits, N]), and
    # its kernels need whole groups (vLLM refuses K % group_size != 0): K follows from qweight alone, and
    # every other tensor (g_idx, scales, qzeros) is checked against it, so a truncated one cannot load.
    k = rows * 32 // bits
    if rows * 32 % bits or (group_size != -1 and k % group_size):
        raise ShapeMismatchError(
            f"{module}: GPTQ qweight has {rows} rows, i.e. K={rows * 32 / bits:g} ({bits}-bit), which is not a "
            f"whole number of {bits}-bit fields in whole groups of group_size {group_size}"
        )
    group = k if group_size == -1 else group_size
    groups = cdiv(k, group)
    check_shape(module, "scales", scales, (groups, n))
    check_shape(module, "qzeros", qzeros, (groups, packed_words(n, bits)))
    fields = unpack_codes(qzeros, bits, n).T
    # v1 zero = field + 1 reaches 2^bits: that only overflows uint8 for 8 bits.
    zeros = fields.to(torch.int16 if bits == 8 else torch.uint8) + 1 if version == 1 else fields.contiguous()
    fmt, codes, zeros = signed_if_symmetric(qweight.T.contiguous(), zeros, bits, k)
    if g_idx is not None:
        check_shape(module, "g_idx", g_idx, (k,))
        if int(g_idx.min()) < 0 or int(g_idx.max()) >= groups:
            raise ShapeMismatchError(f"{module}: g_idx values must lie in [0, {groups})")
    return QuantizedWeight(
        shape=(n, k),
        format=fmt,
        qweight=codes,
        scales=scales.T.contiguous(),
        group_shape=(1, group_size),
        zeros=zeros,
        g_idx=drop_trivial_g_idx(g_idx, k, group),
        bias=bias,
    )


def _pack_fields_uint32(values: torch.Tensor, bits: int) -> torch.Tensor:
    """AutoGPTQ's packing of ``values`` (int64 ``[..., M]``, possibly -1) along the last dim into int32.

    Each value is taken as uint32 and OR-ed into its word shifted left (unmasked, so -1 sets every higher
    bit of that word, as AutoGPTQ does); the part of a field that straddles into the next word is masked.
    """
    m = values.shape[-1]
    words = torch.zeros(*values.shape[:-1], packed_words(m, bits), dtype=torch.int64)
    values = values & 0xFFFFFFFF
    for j in range(m):
        word, shift = divmod(j * bits, 32)
        words[..., word] |= (values[..., j] << shift) & 0xFFFFFFFF
        if shift + bits > 32:
            words[..., word + 1] |= (values[..., j] >> (32 - shift)) & ((1 << (shift + bits - 32)) - 1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def pack_gptq(
    codes: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    *,
    bits: int,
    group_size: int,
    g_idx: torch.Tensor | None = None,
    version: int = 1,
    bias: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Write one module in GPTQ layout, as AutoGPTQ (v1) or GPTQModel (v2) save it.

    ``codes`` uint8 ``[N, K]`` unsigned; ``scales`` fp16 ``[N, groups]``; ``zeros`` integer ``[N, groups]``
    (the zero points themselves, 0..2^bits-1); ``group_size`` (-1: per channel); ``g_idx`` int32 ``[K]``
    (default ``arange(K) // group_size``, as AutoGPTQ saves without act-order). Returns tensors named as in the
    checkpoint (``qweight``, ``qzeros``, ``scales``, ``g_idx``, ``bias``), without the module prefix.
    A v1 zero of 0 is stored as -1, reproducing AutoGPTQ's overflow into the higher fields of its word.
    """
    k = codes.shape[1]
    group = k if group_size == -1 else group_size
    stored = zeros.T.to(torch.int64) - (1 if version == 1 else 0)
    out = {
        "qweight": pack_codes(codes, bits).T.contiguous(),
        "qzeros": _pack_fields_uint32(stored, bits),
        "scales": scales.T.contiguous(),
        "g_idx": g_idx.to(torch.int32) if g_idx is not None else torch.arange(k, dtype=torch.int32) // group,
    }
    if bias is not None:
        out["bias"] = bias
    return out
