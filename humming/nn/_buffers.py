"""The base of humming's modules: each :class:`QuantizedWeight` is held as buffers, so that
``state_dict``, ``.to(device)`` and ``torch.compile`` see its tensors, while kernels get one weight object
(which the dispatcher's plan and prepared-layout caches are keyed on)."""

from __future__ import annotations

import torch
from torch import nn

from ..ir.activation import ActScheme
from ..ir.weight import QuantizedWeight

_TENSORS = ("qweight", "scales", "zeros", "global_scale", "g_idx", "bias")


def _rebuild_weights(module: QuantizedModule, incompatible_keys) -> None:
    """After ``load_state_dict``: every weight made again from its buffers, whose values were copied in place
    (or replaced): validated, and a new object, so that plans and prepared layouts cached per weight are made
    for the values loaded."""
    for prefix, qw in module._weights.items():
        module._weights[prefix] = qw.replace(**{name: module._buffers[prefix + name] for name in _TENSORS})


class QuantizedModule(nn.Module):
    """A module holding quantized weights under name prefixes (``""`` for one weight, ``"w13_"``...)."""

    def __init__(self) -> None:
        super().__init__()
        self._weights: dict[str, QuantizedWeight] = {}
        self._act_scales: list[str] = []
        self.register_load_state_dict_post_hook(_rebuild_weights)

    def _weight(self, prefix: str) -> QuantizedWeight:
        """The weight held under ``prefix``, made again from the buffers (and validated) where one was replaced
        (an assignment such as ``module.scales = t``, ``load_state_dict(..., assign=True)``), so that the module
        never serves a weight its buffers no longer hold."""
        qw = self._weights[prefix]
        buffers = self._buffers
        if any(buffers[prefix + name] is not getattr(qw, name) for name in _TENSORS):
            qw = self._weights[prefix] = qw.replace(**{name: buffers[prefix + name] for name in _TENSORS})
        return qw

    def _set_weight(self, prefix: str, qw: QuantizedWeight) -> None:
        """Register ``qw``'s tensors as buffers ``{prefix}qweight``, ``{prefix}scales``... (``None`` where
        unset)."""
        if not isinstance(qw, QuantizedWeight):
            raise ValueError(f"{prefix or 'qweight'}: expected a humming.QuantizedWeight, got {type(qw).__name__}")
        for name in _TENSORS:
            self.register_buffer(prefix + name, getattr(qw, name))
        self._weights[prefix] = qw

    def _set_act_scale(self, name: str, scale, act: ActScheme | None, device: torch.device) -> None:
        """Register a static per-tensor activation scale (``x / scale`` is quantized, as a checkpoint's
        ``input_scale``) as the buffer ``name``: float32 ``[1, 1]`` on ``device``, or ``None``. It needs an
        ``act`` with float32 scales and no global scale (per token, per group or per tensor)."""
        if scale is not None:
            if act is None or act.scale_dtype != torch.float32 or act.global_scale:
                got = None if act is None else act.name
                raise ValueError(f"{name}: a static scale needs a per-token or per-tensor act, got act={got!r}")
            if not isinstance(scale, torch.Tensor) or scale.numel() != 1:
                raise ValueError(f"{name}: expected a one-element tensor, got {scale!r}")
            scale = scale.detach().to(device, torch.float32).reshape(1, 1)
        self.register_buffer(name, scale)
        self._act_scales.append(name)

    def _apply(self, fn, recurse=True):
        """Device moves apply to the weights; dtype casts (``.half()``, ``.to(torch.bfloat16)``) do not, as
        codes, scales and global scales have the dtypes their format defines, nor to the float32 static
        activation scales. The weights are rebuilt on the new tensors (new objects: their plans are made
        again)."""
        scales = {name: self._buffers[name] for name in self._act_scales}
        super()._apply(fn, recurse)
        for name, old in scales.items():
            new = self._buffers[name]
            if new is not None and new.dtype != torch.float32:
                self._buffers[name] = old.to(new.device)
        for prefix, qw in self._weights.items():
            tensors = {}
            for name in _TENSORS:
                old, new = getattr(qw, name), self._buffers[prefix + name]
                if new is not None and new.dtype != old.dtype:
                    new = self._buffers[prefix + name] = old.to(new.device)
                tensors[name] = new
            if any(tensors[name] is not getattr(qw, name) for name in _TENSORS):
                self._weights[prefix] = qw.replace(**tensors)
        return self
