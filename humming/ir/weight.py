"""``QuantizedWeight``: the one standard representation of a quantized linear (or MoE) weight.

docs/ir.md gives the contract; :func:`humming.dequantize` defines the meaning. Instances are immutable:
:meth:`QuantizedWeight.replace` returns a new, re-validated instance.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ._checks import as_index, non_finite_error
from .formats import NumberFormat, get_format
from .packing import cdiv, packed_words
from .shard import shard as _shard

__all__ = [
    "SCALE_DTYPES",
    "TENSOR_FIELDS",
    "QuantizedWeight",
    "ReleasedCodes",
    "cdiv",
    "expert_weight",
    "layout_name",
    "normalized_group_shape",
    "weight_by_handle",
]

#: dtypes a scale tensor may have.
SCALE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e8m0fnu)
_FLOAT_ZERO_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INT_ZERO_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32)
_BIAS_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


#: The tensor fields of a weight, in order.
TENSOR_FIELDS = ("qweight", "scales", "zeros", "global_scale", "g_idx", "bias")
_handles = itertools.count(1)
_live: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # handle -> QuantizedWeight


def weight_by_handle(handle: int) -> QuantizedWeight | None:
    """The live weight whose :attr:`QuantizedWeight.handle` is ``handle``, or None once it is gone."""
    return _live.get(handle)


def layout_name(group_shape: tuple[int, int]) -> str:
    """``"tensor"``, ``"channel"``, ``"group"`` or ``"block"`` for a ``(bn, bk)`` group shape."""
    bn, bk = group_shape
    if bn == -1 and bk == -1:
        return "tensor"
    if bn == 1 and bk == -1:
        return "channel"
    if bn == 1:
        return "group"
    return "block"


@dataclass(frozen=True)
class ReleasedCodes:
    """What stands for the packed codes of a weight once :meth:`QuantizedWeight.release_codes` freed them:
    their shape, dtype and device, ``restore`` (rebuilds them, exactly, from the kernel layout that holds them),
    ``stand_in``, a zero-element tensor on their device that ops and modules hold in their place, and
    ``source``, a weak reference to the freed tensor."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    restore: Callable[[], torch.Tensor]
    stand_in: torch.Tensor
    source: weakref.ref  # the freed codes tensor, while something else (a module's buffer) still holds it


@dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """A quantized weight ``[E?, N, K]``: packed codes, scales, zero points, global scale, group layout.

    Fields are described in docs/ir.md. Construction validates every field and raises ``ValueError``
    naming the field and what was expected.
    """

    shape: tuple[int, ...]
    format: NumberFormat
    qweight: torch.Tensor
    scales: torch.Tensor | None = None
    group_shape: tuple[int, int] = (-1, -1)
    zeros: torch.Tensor | None = None
    global_scale: torch.Tensor | None = None
    g_idx: torch.Tensor | None = None
    bias: torch.Tensor | None = None

    def __post_init__(self) -> None:
        set_ = lambda name, value: object.__setattr__(self, name, value)
        set_("format", _as_format(self.format))
        set_("shape", _as_shape(self.shape))
        set_("group_shape", _as_group_shape(self.group_shape, self.shape))
        self._validate()
        # Kernels index g_idx and a per-expert global scale by position (g_idx[k] at offset k), so both are
        # stored contiguous; a strided view would otherwise be read as a different weight.
        for name in ("g_idx", "global_scale"):
            t = getattr(self, name)
            if t is not None and not t.is_contiguous():
                set_(name, t.contiguous())
        # A process-unique int naming this object and a string describing its layout: custom ops
        # (humming.ops) pass both instead of the object. torch.compile reads them as attributes (no call on
        # the object is traced); a string is never made symbolic, as ints read from attributes may be.
        bn, bk = self.group_shape
        set_("handle", next(_handles))
        set_("signature", f"{self.format.name};{bn},{bk};{'x'.join(str(d) for d in self.shape)}")
        _live[self.handle] = self

    # --------------------------------------------------------------------------------------- geometry
    @property
    def N(self) -> int:
        return self.shape[-2]

    @property
    def K(self) -> int:
        return self.shape[-1]

    @property
    def num_experts(self) -> int | None:
        return self.shape[0] if len(self.shape) == 3 else None

    @property
    def lead(self) -> tuple[int, ...]:
        """``(E,)`` for MoE weights, ``()`` otherwise."""
        return self.shape[:-2]

    @property
    def bits(self) -> int:
        return self.format.bits

    @property
    def layout(self) -> str:
        return layout_name(self.group_shape)

    @property
    def group_size(self) -> int | None:
        """Group size along K for per-group layouts (``K`` for per-channel), else ``None``."""
        bn, bk = self.group_shape
        if bn != 1:
            return None
        return self.K if bk == -1 else bk

    @property
    def block_shape(self) -> tuple[int, int]:
        """``group_shape`` with ``-1`` replaced by the dimension it covers."""
        bn, bk = self.group_shape
        return (self.N if bn == -1 else bn, self.K if bk == -1 else bk)

    @property
    def scale_grid(self) -> tuple[int, int]:
        """Shape ``(groups along N, groups along K)`` of the scale tensor (without the expert dim)."""
        if self.g_idx is not None and self.scales is not None:
            return (self.N, self.scales.shape[-1])
        bn, bk = self.block_shape
        return (cdiv(self.N, bn), cdiv(self.K, bk))

    @property
    def device(self) -> torch.device:
        released = self.released_codes
        return self.qweight.device if released is None else released.device

    @property
    def has_zeros(self) -> bool:
        return self.zeros is not None

    @property
    def nbytes(self) -> int:
        """Bytes of every tensor of the weight (what a kernel reads from memory for the whole weight); released
        codes count at their size, which the kernel layout holding them takes."""
        released = self.released_codes
        names = TENSOR_FIELDS if released is None else TENSOR_FIELDS[1:]
        held = sum(t.numel() * t.element_size() for t in (getattr(self, n) for n in names) if t is not None)
        return held + (0 if released is None else math.prod(released.shape) * released.dtype.itemsize)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The tensor fields that are set, by name (released codes rebuilt)."""
        return {n: getattr(self, n) for n in TENSOR_FIELDS if getattr(self, n) is not None}

    # ---------------------------------------------------------------------------------- released codes
    def release_codes(self, restore: Callable[[], torch.Tensor]) -> None:
        """Free the packed codes (``qweight``), which a kernel layout prepared from them also holds, so that a
        served weight does not take its memory twice. ``restore()`` must rebuild them exactly from that layout
        (:func:`humming.warmup` with ``keep_codes=False`` passes it). Reading ``qweight`` afterwards returns a
        freshly rebuilt copy each time, for what reads the IR's codes (``humming.dequantize``, the Triton
        kernels, preparing another kernel layout); the prepared kernels never read them."""
        if self.released_codes is not None:
            return
        codes = self.qweight
        stand_in = codes.new_empty(0)
        released = ReleasedCodes(tuple(codes.shape), codes.dtype, codes.device, restore, stand_in, weakref.ref(codes))
        object.__setattr__(self, "_released", released)
        object.__delattr__(self, "qweight")

    @property
    def released_codes(self) -> ReleasedCodes | None:
        """What stands for the codes after :meth:`release_codes`, else ``None``."""
        return self.__dict__.get("_released")

    @property
    def held_codes(self) -> torch.Tensor:
        """``qweight``, or after :meth:`release_codes` its zero-element stand-in (what ops pass: the kernels
        they reach find the prepared layout through the weight's handle)."""
        released = self.released_codes
        return self.qweight if released is None else released.stand_in

    def __getstate__(self) -> dict:
        """What pickle and ``copy`` keep: the fields, with released codes rebuilt (a copy holds its codes)."""
        state = dict(self.__dict__)
        released = state.pop("_released", None)
        if released is not None:
            state["qweight"] = released.restore()
        return state

    def __getattr__(self, name: str):
        # Reached only for attributes not found the usual way: ``qweight`` after release_codes.
        released = self.__dict__.get("_released")
        if name == "qweight" and released is not None:
            return released.restore()
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # ------------------------------------------------------------------------------------- transforms
    def replace(self, **changes) -> QuantizedWeight:
        """A copy with some fields changed, validated again."""
        return dataclasses.replace(self, **changes)

    def to(self, device: torch.device | str) -> QuantizedWeight:
        """The same weight with every tensor on ``device`` (dtypes stay: they are the format's)."""
        if isinstance(device, torch.dtype):
            raise TypeError(f"device: expected a device such as 'cuda' or 'cpu', got the dtype {device}")
        try:
            device = torch.device(device)
            tensors = {n: t.to(device) for n, t in self.tensors().items()}
        except (RuntimeError, TypeError, AssertionError) as err:  # torch asserts for a CUDA it was built without
            raise ValueError(
                f"device: expected an available device such as 'cuda:0' or 'cpu', got {device!r} ({err})"
            ) from None
        return self.replace(**tensors)

    def shard(self, dim: int, rank: int, world_size: int) -> QuantizedWeight:
        """Rank ``rank``'s equal part along ``dim`` (0 = N, column-parallel; 1 = K, row-parallel; with a
        leading expert dim, 0 = experts); raises ``ValueError`` when a split cannot be exact."""
        return _shard(self, dim, rank, world_size)

    def describe(self) -> str:
        """A short name such as ``int4 g128 bf16-scales`` or ``uint4 g128 zp act-order``."""
        parts = [self.format.name]
        bk = self.group_shape[1]
        parts.append({"tensor": "per-tensor", "channel": "per-channel", "group": f"g{bk}"}.get(self.layout, ""))
        if self.layout == "block":
            parts[-1] = f"block{self.block_shape[0]}x{self.block_shape[1]}"
        if self.scales is not None:
            parts.append(f"{_dtype_name(self.scales.dtype)}-scales")
        if self.zeros is not None:
            parts.append("zp" if not self.zeros.is_floating_point() else "float-zp")
        if self.global_scale is not None:
            parts.append("global-scale")
        if self.g_idx is not None:
            parts.append("act-order")
        if self.num_experts is not None:
            parts.append(f"E={self.num_experts}")
        return " ".join(parts)

    def __repr__(self) -> str:
        return f"QuantizedWeight(shape={self.shape}, {self.describe()}, {self.nbytes} bytes, device={self.device})"

    # ------------------------------------------------------------------------------------- validation
    def _validate(self) -> None:
        lead, n, k = self.lead, self.N, self.K
        fmt = self.format
        device = self.qweight.device if isinstance(self.qweight, torch.Tensor) else None
        if fmt.kind == "e8m0":
            raise ValueError("format: e8m0 is a scale format, not a weight element format")
        _check_tensor("qweight", self.qweight, (torch.int32,), (*lead, n, packed_words(k, fmt.bits)), device)

        if self.g_idx is not None:
            if self.group_shape[0] != 1:
                raise ValueError(
                    f"g_idx: act-order needs a per-group layout (1, g), got group_shape {self.group_shape}"
                )
            if self.scales is None:
                raise ValueError("g_idx: act-order needs scales")
            _check_tensor("g_idx", self.g_idx, (torch.int32,), None, device)
            if tuple(self.g_idx.shape) not in ((k,), (*lead, k)):
                raise ValueError(f"g_idx: expected shape ({k},) or {(*lead, k)}, got {tuple(self.g_idx.shape)}")
            n_groups = self.scales.shape[-1]
            if self.g_idx.numel() and (int(self.g_idx.min()) < 0 or int(self.g_idx.max()) >= n_groups):
                raise ValueError(f"g_idx: values must lie in [0, {n_groups}) (the scales' group count)")

        grid = (*lead, *self.scale_grid)
        if self.scales is not None:
            _check_tensor("scales", self.scales, SCALE_DTYPES, grid, device)
            _check_finite("scales", self.scales)
        if self.zeros is not None:
            if self.scales is None:
                raise ValueError("zeros: zero points need scales")
            _check_tensor("zeros", self.zeros, _INT_ZERO_DTYPES + _FLOAT_ZERO_DTYPES, grid, device)
            if self.zeros.is_floating_point():
                _check_finite("zeros", self.zeros)
            if not self.zeros.is_floating_point() and not (fmt.is_int and not fmt.signed):
                raise ValueError(
                    f"zeros: integer zero points need an unsigned int format (uintN), got {fmt.name}; "
                    "use float zeros or a uint format"
                )
        if self.global_scale is not None:
            if self.scales is None:
                raise ValueError("global_scale: a global scale multiplies the scales, so it needs scales")
            _check_tensor("global_scale", self.global_scale, (torch.float32,), None, device)
            if tuple(self.global_scale.shape) not in ((), tuple(lead)):
                raise ValueError(
                    f"global_scale: expected shape () or {tuple(lead)}, got {tuple(self.global_scale.shape)}"
                )
            _check_finite("global_scale", self.global_scale)
        if self.bias is not None:
            _check_tensor("bias", self.bias, _BIAS_DTYPES, (*lead, n), device)


def _dtype_name(dtype: torch.dtype) -> str:
    return {
        torch.float32: "fp32",
        torch.float16: "fp16",
        torch.bfloat16: "bf16",
        torch.float8_e4m3fn: "e4m3",
        torch.float8_e8m0fnu: "e8m0",
    }.get(dtype, str(dtype).replace("torch.", ""))


def _as_format(fmt) -> NumberFormat:
    try:
        return get_format(fmt)
    except ValueError as err:
        raise ValueError(f"format: {err}") from None


def _as_shape(shape) -> tuple[int, ...]:
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__len__"):
        raise ValueError(f"shape: expected (N, K) or (E, N, K), got {shape!r}")
    shape = tuple(as_index("shape", d) for d in shape)
    if len(shape) not in (2, 3) or any(d <= 0 for d in shape):
        raise ValueError(f"shape: expected (N, K) or (E, N, K) with positive sizes, got {shape}")
    return shape


def _as_group_shape(group_shape, shape) -> tuple[int, int]:
    if isinstance(group_shape, (str, bytes)) or not hasattr(group_shape, "__len__") or len(group_shape) != 2:
        raise ValueError(f"group_shape: expected a pair (bn, bk), got {group_shape!r}")
    bn, bk = (as_index("group_shape", v) for v in group_shape)
    if bn == 0 or bk == 0 or bn < -1 or bk < -1:
        raise ValueError(f"group_shape: each entry must be positive or -1 (whole dimension), got {(bn, bk)}")
    return normalized_group_shape((bn, bk), shape)


def normalized_group_shape(group_shape: tuple[int, int], shape) -> tuple[int, int]:
    """``(bn, bk)`` with a block covering a whole dimension written as that dimension's -1 (the one form)."""
    bn, bk = group_shape
    n, k = shape[-2], shape[-1]
    return (-1 if bn >= n and bn != 1 else bn, -1 if bk >= k else bk)


def _check_tensor(name, t, dtypes, shape, device) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise ValueError(f"{name}: expected dtype in ({allowed}), got {str(t.dtype).replace('torch.', '')}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: on {t.device}, but qweight is on {device}; every tensor must share one device")


def _check_finite(name: str, t: torch.Tensor) -> None:
    """Scales, float zero points and global scales are finite: a NaN or Inf there makes whole groups of the
    weight NaN, which no checkpoint means."""
    reason = non_finite_error(name, t)
    if reason is not None:
        raise ValueError(reason)


def expert_weight(qweight: QuantizedWeight, expert: int) -> QuantizedWeight:
    """Expert ``expert`` of an expert-stacked weight, as a 2-D ``[N, K]`` weight (views, no copy)."""
    if qweight.num_experts is None:
        raise ValueError(f"qweight: expected an expert-stacked weight [E, N, K], got {qweight.shape}")
    if not 0 <= expert < qweight.num_experts:
        raise ValueError(f"expert: expected 0 <= expert < {qweight.num_experts}, got {expert}")
    pick = lambda t, stacked_dims: t[expert] if t is not None and t.dim() == stacked_dims else t
    return QuantizedWeight(
        shape=qweight.shape[1:],
        format=qweight.format,
        qweight=qweight.qweight[expert],
        scales=pick(qweight.scales, 3),
        group_shape=qweight.group_shape,
        zeros=pick(qweight.zeros, 3),
        global_scale=pick(qweight.global_scale, 1),
        g_idx=pick(qweight.g_idx, 2),
        bias=pick(qweight.bias, 2),
    )
