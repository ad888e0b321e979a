"""The base of humming's modules: each :class:`QuantizedWeight` is held as buffers, so that
``state_dict``, ``.to(device)`` and ``torch.compile`` see its tensors, while kernels get one weight object
(which the dispatcher's plan and prepared-layout caches are keyed on)."""

from __future__ import annotations

from torch import nn

from ..ir.weight import QuantizedWeight

_TENSORS = ("qweight", "scales", "zeros", "global_scale", "g_idx", "bias")


class QuantizedModule(nn.Module):
    """A module holding quantized weights under name prefixes (``""`` for one weight, ``"w13_"``...)."""

    def __init__(self) -> None:
        super().__init__()
        self._weights: dict[str, QuantizedWeight] = {}

    def _set_weight(self, prefix: str, qw: QuantizedWeight) -> None:
        """Register ``qw``'s tensors as buffers ``{prefix}qweight``, ``{prefix}scales``... (``None`` where
        unset)."""
        if not isinstance(qw, QuantizedWeight):
            raise ValueError(f"{prefix or 'qweight'}: expected a humming.QuantizedWeight, got {type(qw).__name__}")
        for name in _TENSORS:
            self.register_buffer(prefix + name, getattr(qw, name))
        self._weights[prefix] = qw

    def _apply(self, fn, recurse=True):
        """Device moves apply to the weights; dtype casts (``.half()``, ``.to(torch.bfloat16)``) do not, as
        codes, scales and global scales have the dtypes their format defines. The weights are rebuilt on
        the new tensors (new objects: their plans are made again)."""
        super()._apply(fn, recurse)
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
