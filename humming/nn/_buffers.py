"""The base of humming's modules: each :class:`QuantizedWeight` is held as buffers, so that
``state_dict``, ``.to(device)`` and ``torch.compile`` see its tensors, while kernels get one weight object
(which the dispatcher's plan and prepared-layout caches are keyed on)."""

from __future__ import annotations

import torch
from torch import nn

from ..ir.activation import ActScheme
from ..ir.weight import TENSOR_FIELDS, QuantizedWeight


def _held(qw: QuantizedWeight, name: str) -> torch.Tensor | None:
    """The tensor the module's buffer ``name`` holds for ``qw``: its field, or the stand-in of released
    codes (:meth:`~humming.ir.QuantizedWeight.release_codes`)."""
    return qw.held_codes if name == "qweight" else getattr(qw, name)


class QuantizedModule(nn.Module):
    """A module holding quantized weights under name prefixes (``""`` for one weight, ``"w13_"``...)."""

    def __init__(self) -> None:
        super().__init__()
        self._weights: dict[str, QuantizedWeight] = {}
        self._act_scales: list[str] = []

    def _weight(self, prefix: str) -> QuantizedWeight:
        """The weight held under ``prefix``, made again from the buffers (and validated) where one was replaced
        since (an assignment such as ``module.scales = t``; ``load_state_dict`` rebuilds the weights itself), so
        that the module never serves a weight its buffers no longer hold."""
        qw = self._weights[prefix]
        buffers = self._buffers
        released = qw.released_codes
        if released is not None and buffers[prefix + "qweight"] is released.source():
            buffers[prefix + "qweight"] = released.stand_in  # the codes the weight freed: the module lets go too
        changed = buffers[prefix + "qweight"] is not qw.held_codes
        if changed or any(buffers[prefix + name] is not getattr(qw, name) for name in TENSOR_FIELDS[1:]):
            tensors = {name: buffers[prefix + name] for name in TENSOR_FIELDS}
            if released is not None and tensors["qweight"] is released.stand_in:
                tensors["qweight"] = qw.qweight  # another field replaced: the new weight takes the codes, rebuilt
            qw = self._weights[prefix] = qw.replace(**tensors)
            buffers[prefix + "qweight"] = qw.qweight
        return qw

    def _set_weight(self, prefix: str, qw: QuantizedWeight) -> None:
        """Register ``qw``'s tensors as buffers ``{prefix}qweight``, ``{prefix}scales``... (``None`` where
        unset)."""
        if not isinstance(qw, QuantizedWeight):
            raise ValueError(f"{prefix or 'qweight'}: expected a humming.QuantizedWeight, got {type(qw).__name__}")
        for name in TENSOR_FIELDS:
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

    def get_extra_state(self) -> dict:
        """What each weight's tensors mean, which they do not say themselves (int4 and e2m1 codes pack alike):
        ``{prefix: {"format", "group_shape", "shape"}}``, in the ``state_dict`` as ``<module>._extra_state``."""
        return {
            prefix: dict(format=qw.format.name, group_shape=list(qw.group_shape), shape=list(qw.shape))
            for prefix, qw in self._weights.items()
        }

    def set_extra_state(self, state) -> None:
        """Checked against this module's weights before any tensor loads (:meth:`_load_from_state_dict`)."""

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing, unexpected, errors):
        """Refuse a state whose weights differ in format, group shape or shape (``ValueError`` naming the
        field), then load and rebuild each weight on the loaded tensors (new objects: plans and prepared
        layouts are made again)."""
        extra = state_dict.get(prefix + "_extra_state")
        if isinstance(extra, dict):
            for name, held in self.get_extra_state().items():
                theirs = extra.get(name)
                if theirs is None:
                    raise ValueError(f"load_state_dict: {prefix}{name or 'weight'}: the state holds no such weight")
                for field, value in held.items():
                    got = theirs.get(field)
                    if (list(got) if isinstance(got, (list, tuple)) else got) != value:
                        raise ValueError(
                            f"load_state_dict: {prefix}{name}{field}: the state has {got!r}, this "
                            f"module holds {value!r}"
                        )
        loaded = any(key.startswith(prefix) for key in state_dict)
        if loaded:
            for name in self._weights:  # released codes: rebuilt into the buffer the state loads into
                if self._weight(name).released_codes is not None:
                    self._buffers[name + "qweight"] = self._weights[name].qweight
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing, unexpected, errors)
        if loaded:
            for name, qw in self._weights.items():
                self._weights[name] = qw.replace(**{t: self._buffers[name + t] for t in TENSOR_FIELDS})

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
            for name in TENSOR_FIELDS:
                old, new = _held(qw, name), self._buffers[prefix + name]
                if new is not None and new.dtype != old.dtype:
                    new = self._buffers[prefix + name] = old.to(new.device)
                tensors[name] = new
            if any(tensors[name] is not _held(qw, name) for name in TENSOR_FIELDS):
                if qw.released_codes is not None:  # released codes move as the rebuilt codes
                    moved = tensors["qweight"]
                    tensors["qweight"] = self._buffers[prefix + "qweight"] = qw.qweight.to(moved.device)
                self._weights[prefix] = qw.replace(**tensors)
        return self

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        """Buffers as ``nn.Module`` saves them, with a released weight's codes rebuilt (a state holds the
        IR's codes, never a stand-in)."""
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name in self._weights:
            qw = self._weight(name)
            if qw.released_codes is not None:
                destination[prefix + name + "qweight"] = qw.qweight
