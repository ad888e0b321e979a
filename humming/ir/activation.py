"""Activation quantization (reference): dynamic per-token, per-tensor and per-group, or static scales.

Activations ``[M, K]`` are quantized with the same rules as weights (:func:`humming.quantize`, one code
path): per-token is the per-channel layout of ``x``, 1x128 groups are groups along K. Kernels that fuse
activation quantization are checked against :func:`quantize_activation`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ._checks import data_readable
from .formats import NumberFormat, get_format
from .layout import expand_groups, group_reduce, parse_group_size
from .quantize import DEQUANTIZED_DTYPES, GLOBAL_SCALE_DTYPES, quantize, unpacked_codes
from .weight import SCALE_DTYPES

__all__ = ["ACT_SCHEMES", "ActScheme", "QuantizedActivation", "dequantize_activation", "quantize_activation"]


@dataclass(frozen=True)
class ActScheme:
    """How activations are quantized: element format, grouping, scale dtype, global scale."""

    name: str
    format: str
    group: object  # "token", "tensor" or a group size along K
    scale_dtype: torch.dtype = torch.float32
    global_scale: bool = False

    def __post_init__(self) -> None:
        """Check every field, so that a scheme no quantizer can run is refused where it is made."""
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name: expected a non-empty str, got {self.name!r}")
        try:
            fmt = get_format(self.format)
        except ValueError as err:
            raise ValueError(f"format: ActScheme {self.name!r}: {err}") from None
        if fmt.kind == "e8m0" or (fmt.is_int and not fmt.signed) or (fmt.is_int and fmt.bits == 1):
            raise ValueError(
                f"format: ActScheme {self.name!r}: activations take a signed element format (int2..int8, eXmY, "
                f"nf4) without zero points, got {fmt.name}"
            )
        group = self.group
        if group not in ("token", "tensor") and (isinstance(group, bool) or not isinstance(group, int) or group < 1):
            raise ValueError(
                f"group: ActScheme {self.name!r}: expected 'token', 'tensor' or a positive group size along K, "
                f"got {group!r}"
            )
        if self.scale_dtype not in SCALE_DTYPES:
            raise ValueError(
                f"scale_dtype: ActScheme {self.name!r}: expected one of {SCALE_DTYPES}, got {self.scale_dtype!r}"
            )
        if not isinstance(self.global_scale, bool):
            raise ValueError(f"global_scale: ActScheme {self.name!r}: expected a bool, got {self.global_scale!r}")
        if self.global_scale and self.scale_dtype not in GLOBAL_SCALE_DTYPES:
            raise ValueError(
                f"global_scale: ActScheme {self.name!r}: a second-level scale is for 8-bit scales "
                f"({GLOBAL_SCALE_DTYPES}), got scale_dtype {self.scale_dtype}"
            )

    @property
    def element_format(self) -> NumberFormat:
        return get_format(self.format)

    @functools.cached_property  # read on every linear call; the instance is frozen
    def group_shape(self) -> tuple[int, int]:
        return {"token": (1, -1), "tensor": (-1, -1)}.get(self.group) or parse_group_size(self.group)


#: Named activation schemes accepted by ``humming.linear(act=...)``.
ACT_SCHEMES = {
    s.name: s
    for s in (
        ActScheme("int8", "int8", "token"),
        ActScheme("int8_tensor", "int8", "tensor"),
        ActScheme("fp8", "e4m3", "token"),
        ActScheme("fp8_tensor", "e4m3", "tensor"),
        ActScheme("fp8_g128", "e4m3", 128),
        ActScheme("fp8_e5m2", "e5m2", "token"),
        ActScheme("int4", "int4", "token"),
        ActScheme("nvfp4", "e2m1", 16, torch.float8_e4m3fn, global_scale=True),
        ActScheme("mxfp4", "e2m1", 32, torch.float8_e8m0fnu),
        ActScheme("mxfp8", "e4m3", 32, torch.float8_e8m0fnu),
    )
}


def get_act_scheme(act: str | ActScheme) -> ActScheme:
    if isinstance(act, ActScheme):
        return act
    if act not in ACT_SCHEMES:
        raise ValueError(f"act: unknown activation scheme {act!r}; expected one of {sorted(ACT_SCHEMES)}")
    return ACT_SCHEMES[act]


@dataclass(frozen=True, eq=False)
class QuantizedActivation:
    """Quantized activations: ``codes`` uint8 ``[M, K]`` (one code per byte), ``scales`` ``[gM, gK]``
    (per-token ``[M, 1]``, per-tensor ``[1, 1]``, groups ``[M, K/g]``), optional fp32 global scale."""

    scheme: ActScheme
    codes: torch.Tensor
    scales: torch.Tensor
    global_scale: torch.Tensor | None = None

    def __post_init__(self) -> None:
        """Check every field against the scheme, so that wrong shapes or dtypes never reach a kernel."""
        if isinstance(self.scheme, str):
            object.__setattr__(self, "scheme", get_act_scheme(self.scheme))
        if not isinstance(self.scheme, ActScheme):
            raise TypeError(f"scheme: expected an ActScheme or a name in ACT_SCHEMES, got {type(self.scheme).__name__}")
        name = self.scheme.name
        codes = self.codes
        if not isinstance(codes, torch.Tensor) or codes.dtype != torch.uint8 or codes.dim() != 2:
            raise ValueError(f"codes: expected a uint8 tensor [M, K] (one code per byte), got {_describe(codes)}")
        m, k = codes.shape
        if not isinstance(self.scales, torch.Tensor):
            raise ValueError(f"scales: expected a torch.Tensor, got {type(self.scales).__name__}")
        scale_dtype = self.scheme.scale_dtype
        if self.scales.dtype != scale_dtype:
            raise ValueError(f"scales: scheme {name} stores {scale_dtype} scales, got {self.scales.dtype}")
        grid = {"token": (m, 1), "tensor": (1, 1)}.get(self.scheme.group) or (m, -(-k // self.scheme.group_shape[1]))
        # A static per-tensor scale (quantize_activation(scale=...)) is [1, 1] for any float32 scheme. The grid
        # is compared first, without hashing: under torch.compile M is symbolic, and comparing it with 1 (or
        # hashing it) would specialise it.
        static = scale_dtype == torch.float32 and not self.scheme.global_scale
        shape = tuple(self.scales.shape)
        if shape != grid and not (static and shape == (1, 1)):
            allowed = sorted({grid, (1, 1)} if static else {grid})
            raise ValueError(
                f"scales: scheme {name} with codes [{m}, {k}] needs scales of shape "
                f"{' or '.join(map(str, allowed))}, got {shape}"
            )
        gs = self.global_scale
        if self.scheme.global_scale and gs is None:
            raise ValueError(f"global_scale: scheme {name} needs a float32 global scale, got None")
        if gs is not None:
            if not self.scheme.global_scale:
                raise ValueError(f"global_scale: scheme {name} has no global scale, got one")
            if not isinstance(gs, torch.Tensor) or gs.dtype != torch.float32 or gs.numel() != 1:
                raise ValueError(f"global_scale: expected a one-element float32 tensor, got {_describe(gs)}")
        for field, t in (("scales", self.scales), ("global_scale", gs)):
            if t is not None and t.device != codes.device:
                raise ValueError(f"{field}: on {t.device}, but codes are on {codes.device}; use one device")

    @classmethod
    def from_kernel(cls, scheme: ActScheme, codes, scales, global_scale=None) -> QuantizedActivation:
        """The activations a humming kernel wrote into buffers it allocated to ``scheme``'s shapes and dtypes,
        without the field checks (a kernel's per-call output: the checks would cost more host time than its
        launch)."""
        qa = object.__new__(cls)
        for name, value in (("scheme", scheme), ("codes", codes), ("scales", scales), ("global_scale", global_scale)):
            object.__setattr__(qa, name, value)
        return qa

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)

    def check_codes(self) -> None:
        """``ValueError`` unless every code lies in ``[0, 2^bits)`` (formats under 8 bits fill the low bits of
        their byte). Checked by the entry points that read a caller's activations (``humming.linear``,
        ``grouped_linear``, :func:`dequantize_activation`) where the values can be read without a host sync,
        on CPU tensors, as MoE routing ids are; the padding rows a kernel leaves unwritten are not read."""
        fmt, codes = self.scheme.element_format, self.codes
        if fmt.bits < 8 and data_readable(codes) and codes.device.type == "cpu" and codes.numel():
            top = int(codes.max())
            if top >= fmt.num_codes:
                raise ValueError(f"codes: {fmt.name} codes lie in [0, {fmt.num_codes}), got {top}")

    def checked_scheme(self, act) -> ActScheme:
        """This input's scheme, its codes checked (:meth:`check_codes`), for an op called with ``act`` (``None``,
        or a name of the same scheme): what ``humming.linear`` and ``grouped_linear`` run a pre-quantized x as."""
        if act is not None and get_act_scheme(act) != self.scheme:
            raise ValueError(f"act: x is already quantized with {self.scheme.name}, but act={act!r}")
        self.check_codes()
        return self.scheme

    def data(self) -> torch.Tensor:
        """The codes as the torch dtype that holds them (int8, float8_e4m3fn...), a view, where one exists."""
        dtype = self.scheme.element_format.torch_dtype
        if dtype is None:
            raise ValueError(f"format {self.scheme.format} has no torch dtype; use .codes")
        return self.codes.view(dtype)


def _describe(t) -> str:
    if isinstance(t, torch.Tensor):
        return f"{str(t.dtype).replace('torch.', '')} {tuple(t.shape)}"
    return type(t).__name__


def quantize_activation(
    x: torch.Tensor,
    act: str | ActScheme,
    *,
    scale: torch.Tensor | None = None,
    global_scale: torch.Tensor | None = None,
) -> QuantizedActivation:
    """Quantize ``x`` ``[M, K]`` with scheme ``act``; a given ``scale`` (per-tensor, static) or
    ``global_scale`` (NVFP4 static second-level scale) replaces the dynamic one."""
    scheme = get_act_scheme(act)
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() != 2 or x.numel() == 0:
        raise ValueError(f"x: expected a non-empty [M, K] float tensor, got {_describe(x)}")
    fmt = scheme.element_format
    # NaN / Inf are left out of every absmax (README, "Non-finite activations"): quantized as zeros first.
    finite = torch.isfinite(x)
    x = torch.where(finite, x, torch.zeros((), dtype=x.dtype, device=x.device))
    if scale is not None:
        if scheme.scale_dtype != torch.float32 or scheme.global_scale:
            raise ValueError(
                f"scale: a static per-tensor scale needs a scheme with float32 scales and no global scale (int8, fp8, "
                f"fp8_tensor...), got {scheme.name}"
            )
        if not isinstance(scale, torch.Tensor) or scale.numel() != 1:
            raise ValueError(f"scale: expected a one-element static per-tensor scale, got {_describe(scale)}")
        scale = scale.to(device=x.device, dtype=torch.float32).reshape(1, 1)
        if not bool(torch.isfinite(scale).all() & (scale > 0).all()):
            raise ValueError(f"scale: a static scale must be positive and finite, got {float(scale)}")
        codes = fmt.encode(x.to(torch.float64) / scale.to(torch.float64))
        return QuantizedActivation(scheme, *_mark_non_finite(codes, scale, finite, scheme, static=True))
    if global_scale is not None:
        raise ValueError("global_scale: a static global scale needs the per-group scales too; pass scale")
    qx = quantize(
        x,
        fmt,
        group_size=scheme.group_shape,
        scale_dtype=scheme.scale_dtype,
        global_scale=scheme.global_scale,
    )
    codes, scales = _mark_non_finite(unpacked_codes(qx), qx.scales, finite, scheme, static=False)
    return QuantizedActivation(scheme, codes, scales, qx.global_scale)


def _mark_non_finite(codes, scales, finite, scheme: ActScheme, static: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule for NaN / Inf activations, on every backend: such an element gets the format's NaN code (code 0
    where the format has none: int, e2m1), and a per-token or per-group scale whose span holds one is NaN (an
    e8m0 or e4m3 NaN code), so that the output row of every GEMM is NaN. A per-tensor scale (dynamic or static)
    spans the other rows too: it stays finite, and only the NaN codes mark the row."""
    if bool(finite.all()):
        return codes, scales
    bad = ~finite
    codes = codes.masked_fill(bad, scheme.element_format.nan_code or 0)
    if static or scheme.group == "tensor":
        return codes, scales
    spans = group_reduce(bad.to(torch.float32), scheme.group_shape, "amax") > 0
    if scales.dtype == torch.float32:
        return codes, scales.masked_fill(spans, float("nan"))
    nan_code = get_format(scales.dtype).nan_code
    return codes, scales.view(torch.uint8).masked_fill(spans, nan_code).view(scales.dtype)


def dequantize_activation(qa: QuantizedActivation, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``decode(codes) * float32(scale) * global_scale``, rounded once to ``dtype``."""
    if not isinstance(qa, QuantizedActivation):
        raise TypeError(f"qa: expected a humming.QuantizedActivation, got {type(qa).__name__}")
    if dtype not in DEQUANTIZED_DTYPES:
        raise ValueError(f"dtype: expected a float dtype {DEQUANTIZED_DTYPES}, got {dtype!r}")
    qa.check_codes()
    m, k = qa.shape
    s = qa.scales.to(torch.float32)
    if qa.global_scale is not None:
        s = s * qa.global_scale
    group_shape = qa.scheme.group_shape if qa.scales.numel() > 1 else (-1, -1)
    x = qa.scheme.element_format.decode(qa.codes) * expand_groups(s, m, k, group_shape)
    return x.to(dtype)
