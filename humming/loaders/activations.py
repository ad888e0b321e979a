"""How a checkpoint's quantized linears expect their activations: the config's activation settings as a
humming ``act=`` scheme, and the static scale when the checkpoint stores one.

The weight IR holds no activation settings (a weight runs with any scheme the support matrix allows); this
reads what the producer meant. Per format:

- GPTQ, AWQ, bitsandbytes, gpt-oss MXFP4: 16-bit activations (``None``).
- compressed-tensors ``input_activations`` (per config group): int8 / fp8 per token (``int8``, ``fp8``),
  per tensor, dynamic or with a static ``input_scale`` (``int8_tensor``, ``fp8_tensor``), fp8 per 1x128 group
  (``fp8_g128``), int4 per token (``int4``), NVFP4 (``nvfp4``), MXFP4 (``mxfp4``).
- ModelOpt: ``NVFP4`` -> ``nvfp4``; ``FP8`` -> ``fp8_tensor`` with the static ``input_scale``;
  ``FP8_PER_CHANNEL_PER_TOKEN`` -> ``fp8``.
- ``fp8`` (``activation_scheme``): block weights -> ``fp8_g128`` (dynamic 1x128 groups, as DeepSeek-V3); other
  weights -> ``fp8`` per token when dynamic, ``fp8_tensor`` with the static ``input_scale`` when static.

Stacked experts run on one scale per GEMM input: their per-expert static ``input_scale`` tensors are all kept
(:class:`ActivationSpec`'s ``scale_tensor`` a tuple) and :func:`static_scale` takes their max.

NVFP4 activations keep a per-tensor second-level scale: ModelOpt's ``input_scale`` and compressed-tensors'
``input_global_scale`` are calibrated static values, while humming's ``nvfp4`` scheme computes it from each
call's absmax (at least as accurate: no block scale saturates). Asymmetric (zero-point) activations are
refused.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from .errors import MissingTensorError, UnsupportedFormatError

__all__ = [
    "ActivationSpec",
    "compressed_tensors_activation",
    "expert_activation",
    "merged_activation",
    "reader_activation",
    "static_scale",
]


@dataclass(frozen=True)
class ActivationSpec:
    """A module's activation settings: ``act`` (a name in ``humming.ACT_SCHEMES``, ``None`` for 16-bit
    activations) and ``scale_tensor``, the checkpoint tensor holding a static per-tensor scale (``x / scale``
    is quantized; a tuple of them for modules merged into one, such as stacked experts, the scale being their
    max: :func:`static_scale`), or ``None`` for scales computed per call."""

    act: str | None = None
    scale_tensor: str | tuple[str, ...] | None = None


def static_scale(files, spec: ActivationSpec, device="cpu") -> torch.Tensor | None:
    """The static activation scale ``spec`` names, float32 on ``device``, or ``None``. Several scale tensors
    (merged modules): their max, one element, as vLLM takes for its MoE layers (the kernels take one
    per-tensor scale per GEMM input, and the largest lets no module's calibrated range clip)."""
    if spec.scale_tensor is None:
        return None
    if isinstance(spec.scale_tensor, str):
        return files.get(spec.scale_tensor).to(device, torch.float32)
    scales = [files.get(key).to(device, torch.float32).reshape(()) for key in spec.scale_tensor]
    return torch.stack(scales).amax().reshape(1)


def merged_activation(name: str, specs: Iterable[ActivationSpec]) -> ActivationSpec:
    """The activation settings of modules that run as one (stacked experts; an expert's gate and up
    projections, which read the same input): one scheme, and static scales on all or none of them, every
    scale tensor kept (:func:`static_scale` takes their max)."""
    specs = list(specs)
    acts = {s.act for s in specs}
    if len(acts) > 1:
        raise UnsupportedFormatError(f"{name}: modules with different activation schemes {sorted(map(str, acts))}")
    static = [s.scale_tensor for s in specs if s.scale_tensor is not None]
    if static and len(static) != len(specs):
        raise UnsupportedFormatError(
            f"{name}: {len(static)} of {len(specs)} modules have static activation scales, the others scale per call"
        )
    keys = tuple(key for tensors in static for key in ((tensors,) if isinstance(tensors, str) else tensors))
    return ActivationSpec(acts.pop() if acts else None, keys or None)


WEIGHT_ONLY = ActivationSpec()


def reader_activation(reader, module: str) -> ActivationSpec:
    """What ``reader``'s checkpoint says about ``module``'s activations (formats without activation
    settings: 16-bit)."""
    method = getattr(reader, "activation", None)
    return WEIGHT_ONLY if method is None else method(module)


def _static(module: str, files, name: str) -> str:
    key = f"{module}.{name}"
    if key not in files:
        raise MissingTensorError(f"{module}: static activation quantization but tensor {key!r} is missing")
    return key


def compressed_tensors_activation(module: str, ia: dict | None, files) -> ActivationSpec:
    """compressed-tensors ``input_activations`` (one config group) -> :class:`ActivationSpec`."""
    if not ia:
        return WEIGHT_ONLY
    kind, bits = ia.get("type", "int"), int(ia.get("num_bits", 8))
    strategy, dynamic = ia.get("strategy"), ia.get("dynamic")
    desc = f"{module}: input_activations {kind}{bits} strategy {strategy!r} dynamic {dynamic!r}"
    if not ia.get("symmetric", True):
        raise UnsupportedFormatError(f"{desc}: asymmetric (zero-point) activations are not supported")
    if (kind, bits) in (("int", 8), ("float", 8)):
        name = "int8" if kind == "int" else "fp8"
        if strategy == "token" and dynamic is True:
            return ActivationSpec(name)
        if strategy == "tensor":
            if dynamic is True:
                return ActivationSpec(f"{name}_tensor")
            return ActivationSpec(f"{name}_tensor", _static(module, files, "input_scale"))
        if kind == "float" and strategy == "group" and dynamic is True and int(ia.get("group_size") or 0) == 128:
            return ActivationSpec("fp8_g128")
    if (kind, bits, strategy) == ("int", 4, "token") and dynamic is True:
        return ActivationSpec("int4")
    if (kind, bits) == ("float", 4) and strategy in ("tensor_group", "group"):
        group = int(ia.get("group_size") or 0)
        if group == 16 and strategy == "tensor_group":
            return ActivationSpec("nvfp4")  # the static input_global_scale is replaced by a per-call one
        if group == 32 and dynamic is True:
            return ActivationSpec("mxfp4")
    raise UnsupportedFormatError(f"{desc}: no humming activation scheme matches")


def expert_activation(reader, name: str, parts: list[str | None]) -> ActivationSpec:
    """The activation settings of one output module: a single module's, or those of stacked experts merged
    (:func:`merged_activation`: one scheme, static scales on every expert or none)."""
    specs = [reader_activation(reader, p) for p in parts if p is not None]
    if len(parts) == 1 and len(specs) == 1:
        return specs[0]
    return merged_activation(name, specs)
