"""Round-to-nearest weight quantizers and :func:`dequantize`, THE definition of a quantized weight."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ._checks import non_finite_error
from .dtypes import DEQUANTIZED_DTYPES, FLOAT_DTYPES, HALF_DTYPES
from .formats import NumberFormat, exact_pow2, floor_log2, get_format
from .layout import expand_groups, group_reduce, parse_group_size
from .packing import pack_codes, unpack_codes
from .weight import SCALE_DTYPES, QuantizedWeight, normalized_group_shape

__all__ = ["WEIGHT_SCHEMES", "WeightScheme", "dequantize", "live_exponents", "quantize", "unpacked_codes"]


@dataclass(frozen=True)
class WeightScheme:
    """A named recipe: element format, group layout, scale dtype, global scale (e.g. ``"nvfp4"``)."""

    format: str
    group_size: object
    scale_dtype: torch.dtype
    global_scale: bool = False


#: Named recipes accepted by ``quantize(weight=...)``; explicit arguments override their fields.
WEIGHT_SCHEMES = {
    "mxfp4": WeightScheme("e2m1", 32, torch.float8_e8m0fnu),
    "mxfp6_e2m3": WeightScheme("e2m3", 32, torch.float8_e8m0fnu),
    "mxfp6_e3m2": WeightScheme("e3m2", 32, torch.float8_e8m0fnu),
    "mxfp8": WeightScheme("e4m3", 32, torch.float8_e8m0fnu),
    "nvfp4": WeightScheme("e2m1", 16, torch.float8_e4m3fn, global_scale=True),
    "fp8_block": WeightScheme("e4m3", (128, 128), torch.float32),
}

_UNSET = object()
#: Scale dtypes that ``quantize(global_scale=True)`` accepts: the 8-bit ones, whose range an fp32 global scale
#: moves to where the weights are (NVFP4's e4m3).
GLOBAL_SCALE_DTYPES = (torch.float8_e4m3fn, torch.float8_e8m0fnu)


def _default_scale_dtype(w: torch.Tensor) -> torch.dtype:
    return w.dtype if w.dtype in HALF_DTYPES else torch.float32


def quantize(
    w: torch.Tensor,
    weight: str | NumberFormat = "int4",
    group_size=_UNSET,
    zero_point: bool | str = False,
    scale_dtype: torch.dtype | None = None,
    *,
    global_scale: bool | None = None,
    g_idx: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> QuantizedWeight:
    """Quantize a float weight ``[N, K]`` or ``[E, N, K]`` by round to nearest.

    Args:
        weight: element format (``"int4"``, ``"uint8"``, ``"e2m1"``, ``"e4m3"``, ``"nf4"``, any ``"eXmY"``)
            or a scheme of :data:`WEIGHT_SCHEMES` (``"nvfp4"``, ``"mxfp4"``, ...).
        group_size: ``g`` (groups of g along K), ``-1`` (per-channel), ``"tensor"``, or ``(bn, bk)`` blocks.
            Default: 128, or the scheme's.
        zero_point: ``False`` (symmetric), ``True`` (integer zero points: int formats become uintN) or
            ``"float"`` (float zero points in the scale dtype).
        scale_dtype: float32, float16, bfloat16, float8_e4m3fn or float8_e8m0fnu. Default: ``w``'s dtype
            if fp16/bf16, else float32, or the scheme's.
        global_scale: add an fp32 second-level scale (per tensor, per expert for 3-D ``w``) so that
            8-bit scales (``scale_dtype`` float8_e4m3fn or float8_e8m0fnu) use their full range (NVFP4).
        g_idx: act-order: int32 ``[K]`` group of each input column (groups need not be contiguous).
        bias: optional float ``[*E, N]`` carried with the weight.
    """
    if not isinstance(w, torch.Tensor) or not w.is_floating_point() or w.dim() not in (2, 3) or not w.numel():
        raise ValueError(f"w: expected a non-empty floating-point tensor [N, K] or [E, N, K], got {_describe(w)}")
    reason = non_finite_error("w", w)
    if reason is not None:
        raise ValueError(f"{reason}: a quantized weight holds finite values only")
    scheme = WEIGHT_SCHEMES.get(weight) if isinstance(weight, str) else None
    try:
        fmt = get_format(scheme.format if scheme else weight)
    except ValueError as err:
        raise ValueError(f"weight: {err}") from None
    if group_size is _UNSET:
        group_size = scheme.group_size if scheme else 128
    if scale_dtype is None:
        scale_dtype = scheme.scale_dtype if scheme else _default_scale_dtype(w)
    if global_scale is None:
        global_scale = scheme.global_scale if scheme else False
    if scale_dtype not in SCALE_DTYPES:
        raise ValueError(f"scale_dtype: expected one of {SCALE_DTYPES}, got {scale_dtype}")
    if fmt.kind == "e8m0":
        raise ValueError("weight: e8m0 is a scale format, not a weight element format")
    if zero_point not in (False, True, "float"):
        raise ValueError(f"zero_point: expected False, True or 'float', got {zero_point!r}")
    if zero_point:
        if not fmt.is_int:
            raise ValueError(f"zero_point={zero_point!r}: zero points need an int format, got {fmt.name}")
        fmt = get_format(f"uint{fmt.bits}")
    elif fmt.is_int and fmt.bits == 1:
        # The symmetric step is amax / (2^(bits-1) - 1): one bit leaves no nonzero level to scale to.
        raise ValueError(f"weight: symmetric {fmt.name} has no nonzero level to scale; use zero_point=True (uint1)")
    if zero_point == "float" and scale_dtype not in FLOAT_DTYPES:
        raise ValueError("zero_point='float': float zeros are stored in the scale dtype, which must be fp32/fp16/bf16")

    if global_scale and zero_point:
        raise ValueError("global_scale: a global scale is only supported with symmetric quantization")
    # The global scale, amax / (elem_max * scale_max), maps the largest group scale to the scale dtype's max:
    # with fp32's own range (fp32, bf16 scales) it underflows fp32 and the scales divided by it overflow to inf,
    # and a 16-bit or wider scale needs no second level.
    if global_scale and scale_dtype not in GLOBAL_SCALE_DTYPES:
        raise ValueError(
            f"global_scale=True: a second-level scale is for 8-bit scales (scale_dtype one of "
            f"{GLOBAL_SCALE_DTYPES}), got scale_dtype {scale_dtype}"
        )
    group_shape = normalized_group_shape(parse_group_size(group_size), w.shape)
    if g_idx is not None and group_shape[0] != 1:
        raise ValueError(f"g_idx: act-order needs a per-group layout along K, got group_size {group_size!r}")
    if g_idx is not None:
        g_idx = _act_order_groups(g_idx, w)

    x = w.detach().to(torch.float64)
    n_groups = None if g_idx is None else math.ceil(w.shape[-1] / group_shape[1])
    if g_idx is not None and g_idx.numel():
        n_groups = max(n_groups, int(g_idx.max()) + 1)
    reduce = lambda t, op: group_reduce(t, group_shape, op, g_idx, n_groups)
    expand = lambda t: expand_groups(t, w.shape[-2], w.shape[-1], group_shape, g_idx)

    zeros = None
    gscale = None
    if zero_point:
        lo = reduce(x, "amin").clamp(max=0.0)
        hi = reduce(x, "amax").clamp(min=0.0)
        qmax = float((1 << fmt.bits) - 1)
        scale = _round_scale((hi - lo) / qmax, scale_dtype, fmt, ceil=True)
        _check_representable((hi - lo) / qmax, scale)
        s = _decode_scale(scale)
        s_safe = torch.where(s == 0, torch.ones_like(s), s)
        if zero_point is True:
            zeros = torch.round(-lo / s_safe).clamp(0, qmax).to(torch.uint8)
            z = zeros.to(torch.float64)
        else:
            zeros = (-lo / s_safe).to(scale_dtype)
            z = zeros.to(torch.float64)
        codes = torch.round(x / expand(s_safe) + expand(z)).clamp(0, qmax).to(torch.uint8)
    else:
        amax = reduce(x.abs(), "amax")
        elem_max = float((1 << (fmt.bits - 1)) - 1) if fmt.is_int else fmt.max_value
        if global_scale:
            scale_max = _scale_dtype_max(scale_dtype)
            tensor_amax = x.abs().flatten(-2).amax(-1) if x.dim() == 3 else x.abs().amax()
            # The reciprocal of an fp32 divisor, as compressed-tensors defines its global scale, so that the
            # weight exports there exactly (its divisor d with fp32(1 / d) == gscale); the direct quotient
            # where that divisor overflows fp32.
            divisor = ((elem_max * scale_max) / tensor_amax).to(torch.float32)
            direct = (tensor_amax / (elem_max * scale_max)).to(torch.float32)
            gscale = torch.where(torch.isfinite(divisor), torch.reciprocal(divisor), direct)
            gscale = torch.where(gscale == 0, torch.ones_like(gscale), gscale)
            g = gscale.to(torch.float64).reshape(*gscale.shape, 1, 1)
            scale = _round_scale(amax / elem_max / g, scale_dtype, fmt, ceil=False, amax=amax / g)
            s = _decode_scale(scale) * g
        else:
            scale = _round_scale(amax / elem_max, scale_dtype, fmt, ceil=fmt.is_int, amax=amax)
            _check_representable(amax / elem_max, scale)
            s = _decode_scale(scale)
        s_elem = expand(s)
        scaled = torch.where(s_elem == 0, torch.zeros_like(x), x / torch.where(s_elem == 0, 1.0, s_elem))
        codes = fmt.encode(scaled)

    return QuantizedWeight(
        shape=tuple(w.shape),
        format=fmt,
        qweight=pack_codes(codes, fmt.bits),
        scales=scale,
        group_shape=group_shape,
        zeros=zeros,
        global_scale=gscale,
        g_idx=g_idx,
        bias=bias,
    )


def _describe(t) -> str:
    if isinstance(t, torch.Tensor):
        return f"{str(t.dtype).removeprefix('torch.')} {tuple(t.shape)}"
    return type(t).__name__


def _act_order_groups(g_idx, w: torch.Tensor) -> torch.Tensor:
    """``g_idx`` checked (an integer ``[K]`` tensor, values in ``[0, K)``: no more groups than columns), as the
    int32 tensor on ``w``'s device that the weight stores."""
    k = w.shape[-1]
    if (
        not isinstance(g_idx, torch.Tensor)
        or g_idx.is_floating_point()
        or g_idx.is_complex()
        or g_idx.dtype == torch.bool
    ):
        raise ValueError(
            f"g_idx: expected an integer tensor [{k}] (the group of each input column), got {_describe(g_idx)}"
        )
    if tuple(g_idx.shape) != (k,):
        raise ValueError(f"g_idx: expected shape ({k},), got {tuple(g_idx.shape)}")
    if g_idx.numel() and (int(g_idx.min()) < 0 or int(g_idx.max()) >= k):
        raise ValueError(f"g_idx: values must lie in [0, {k}) (K), got [{int(g_idx.min())}, {int(g_idx.max())}]")
    return g_idx.to(device=w.device, dtype=torch.int32)


def _check_representable(ideal: torch.Tensor, scale: torch.Tensor) -> None:
    """``ValueError`` naming ``scale_dtype`` where a group's ideal scale (float64) does not survive the cast to
    the scale dtype: it overflows (to inf, or above the largest value, where e4m3 saturates: every code of the
    group would clip), or it underflows (to 0, or, deep in the subnormals, to a value more than twice off, where
    the group's codes round to zero or clip). float32 and e8m0 scales hold float32's range: they only underflow
    for groups of subnormal values, below its resolution."""
    dtype = scale.dtype
    info = torch.finfo(dtype)
    decoded = scale.to(torch.float64)
    over = ~torch.isfinite(decoded) | (ideal > info.max)
    if dtype in (torch.float32, torch.float8_e8m0fnu):
        under = torch.zeros_like(over)
    else:
        under = (ideal > 0) & ((decoded == 0) | (decoded > 2 * ideal) | (decoded < ideal / 2))
    if not bool((over | under).any()):
        return
    bad = ideal[over | under]
    kind = "overflow" if bool(over.any()) else "underflow to 0"
    raise ValueError(
        f"scale_dtype: {str(dtype).removeprefix('torch.')} cannot hold the scales of these values: {bad.numel()} "
        f"group scales in [{float(bad.min()):.3g}, {float(bad.max()):.3g}] {kind} (it holds "
        f"[{info.tiny * info.eps:.3g}, {info.max:.3g}]); use a wider scale_dtype, or global_scale=True with "
        "8-bit scales"
    )


def _scale_dtype_max(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).max


def _decode_scale(scale: torch.Tensor) -> torch.Tensor:
    return scale.to(torch.float32).to(torch.float64)


def _round_scale(
    s: torch.Tensor, dtype: torch.dtype, fmt: NumberFormat, ceil: bool, amax: torch.Tensor | None = None
) -> torch.Tensor:
    """Cast ideal scales to ``dtype``. With ``ceil`` (integer grids) the scale never rounds down, so no code
    clips; otherwise round to nearest, and e8m0 follows the OCP MX rule ``2^(floor(log2 amax) - emax_elem)``
    (elements may then saturate, as the spec says)."""
    if dtype == torch.float8_e8m0fnu:
        s = s.clamp(min=2.0**-127)
        if ceil:
            not_pow2 = (s.view(torch.int64) & ((1 << 52) - 1)) != 0
            exp = floor_log2(s) + not_pow2.to(torch.int64)
        else:
            # OCP MX: floor(log2(amax)) - emax(element format), read off amax's exponent bits
            emax_elem = math.floor(math.log2(fmt.max_value))
            exp = floor_log2(amax.clamp(min=2.0**-127)) - emax_elem
        return exact_pow2(exp.clamp(-127, 127)).to(torch.float32).to(dtype)
    if dtype == torch.float8_e4m3fn:
        return s.clamp(max=448.0).to(torch.float32).to(dtype)
    rounded = s.to(dtype)
    if ceil:  # never round an integer grid's step down: the extreme codes would clip
        up = torch.nextafter(rounded, torch.full_like(rounded, float("inf")))
        rounded = torch.where(rounded.to(torch.float64) < s, up, rounded)
    return rounded


def unpacked_codes(qw: QuantizedWeight) -> torch.Tensor:
    """uint8 codes ``[*E, N, K]`` of a quantized weight."""
    return unpack_codes(qw.qweight, qw.bits, qw.K)


def live_exponents(qw: QuantizedWeight, dead: int) -> torch.Tensor:
    """int32 ``[*E, N, G]``: the exponent ``e`` of each scale group's e8m0 scale ``2^e`` (groups of
    ``qw.group_size`` along K; the weight has e8m0 scales, one row of scales per row) where the group holds a
    nonzero code, ``dead`` where it does not (its scale multiplies only zeros, so it constrains no fold of the
    scales into the codes). Unpacks one expert's codes at a time."""
    g, n, k = qw.group_size, qw.N, qw.K
    groups = qw.scales.shape[-1]
    sign_magnitude = qw.format.kind == "float" and qw.format.signed  # -0 is a zero
    packed = qw.qweight.reshape(-1, *qw.qweight.shape[-2:])
    exps = qw.scales.view(torch.uint8).reshape(-1, n, groups).to(torch.int32) - 127
    for i in range(packed.shape[0]):
        codes = unpack_codes(packed[i], qw.bits, k)
        magnitudes = codes & ((1 << (qw.bits - 1)) - 1) if sign_magnitude else codes
        if groups * g != k:
            magnitudes = F.pad(magnitudes, (0, groups * g - k))
        exps[i].masked_fill_(~magnitudes.view(n, groups, g).any(-1).bool(), dead)
    return exps.view(*qw.shape[:-2], n, groups)


def dequantize(qw: QuantizedWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The float weight ``[*E, N, K]`` that ``qw`` stands for (docs/ir.md), rounded once to ``dtype``.

    Computes ``(decode(q) - zero) * (float32(scale) * global_scale)`` in float32 (float64 if asked for).
    """
    if not isinstance(qw, QuantizedWeight):
        raise ValueError(f"qw: expected a QuantizedWeight, got {type(qw).__name__}")
    if dtype not in DEQUANTIZED_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in DEQUANTIZED_DTYPES)
        raise ValueError(f"dtype: expected a float dtype ({names}), got {dtype!r}")
    work = torch.float64 if dtype == torch.float64 else torch.float32
    n, k = qw.N, qw.K
    w = qw.format.decode(unpacked_codes(qw)).to(work)
    if qw.zeros is not None:
        w = w - expand_groups(qw.zeros.to(work), n, k, qw.group_shape, qw.g_idx)
    if qw.scales is not None:
        s = qw.scales.to(torch.float32)
        if qw.global_scale is not None:
            g = qw.global_scale
            s = s * (g.reshape(*g.shape, 1, 1) if g.dim() else g)
        w = w * expand_groups(s.to(work), n, k, qw.group_shape, qw.g_idx)
    return w.to(dtype)
