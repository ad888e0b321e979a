"""``QuantizedLinear``: a drop-in for ``torch.nn.Linear`` that runs :func:`humming.linear`."""

from __future__ import annotations

import torch
from torch import nn

from ..ir.activation import ActScheme, get_act_scheme
from ..ir.quantize import WEIGHT_SCHEMES, quantize
from ..ir.weight import QuantizedWeight
from ..linear import linear
from ..ops import quantize_activation
from ._buffers import QuantizedModule

__all__ = ["QuantizedLinear", "resolve_group_size"]


def resolve_group_size(weight: str, group_size):
    """``group_size=None``: a named scheme's own (``nvfp4``: 16, ``mxfp4``: 32...), else 128."""
    if group_size is not None:
        return group_size
    scheme = WEIGHT_SCHEMES.get(weight) if isinstance(weight, str) else None
    return scheme.group_size if scheme else 128


class QuantizedLinear(QuantizedModule):
    """``y = x @ W^T + b`` with a 2-D :class:`QuantizedWeight` ``[out_features, in_features]`` (its ``bias``
    field is the bias), run through :func:`humming.linear` (one custom op under ``torch.compile``).

    Args:
        qweight: the weight.
        act: activation scheme (``"fp8"``, ``"nvfp4"``...; ``None``: 16-bit activations).
        act_scale: a static per-tensor activation scale (one element; ``x / act_scale`` is quantized, as a
            checkpoint's ``input_scale``) for a per-token or per-tensor ``act``; ``None``: scales per call.
        out_dtype: output dtype; ``None``: the input's.
        backend: as :func:`humming.linear`.
    """

    def __init__(
        self,
        qweight: QuantizedWeight,
        *,
        act: str | ActScheme | None = None,
        act_scale: torch.Tensor | None = None,
        out_dtype: torch.dtype | None = None,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        self._set_weight("", qweight)
        if qweight.num_experts is not None:
            raise ValueError(f"qweight: expected a 2-D weight [N, K], got an expert-stacked weight {qweight.shape}")
        self.in_features, self.out_features = qweight.K, qweight.N
        self.act = None if act is None else get_act_scheme(act)
        self._set_act_scale("act_scale", act_scale, self.act, qweight.device)
        self.out_dtype = out_dtype
        self.backend = backend

    @property
    def weight(self) -> QuantizedWeight:
        return self._weight("")

    @classmethod
    def from_float(
        cls,
        linear_module: nn.Linear,
        weight: str = "int4",
        group_size=None,
        *,
        zero_point: bool = False,
        act: str | ActScheme | None = None,
        backend: str = "auto",
    ) -> QuantizedLinear:
        """Quantize ``linear_module``'s weight by round to nearest (:func:`humming.quantize`; scales in the
        weight's dtype) and keep its bias. ``group_size=None``: a named scheme's own, else 128."""
        if not isinstance(linear_module, nn.Linear):
            raise ValueError(f"linear_module: expected a torch.nn.Linear, got {type(linear_module).__name__}")
        bias = None if linear_module.bias is None else linear_module.bias.detach()
        qw = quantize(
            linear_module.weight.detach(),
            weight,
            group_size=resolve_group_size(weight, group_size),
            zero_point=zero_point,
            bias=bias,
        )
        return cls(qw, act=act, backend=backend)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.act_scale is None or (isinstance(x, torch.Tensor) and x.dim() and not x.shape[:-1].numel()):
            # no static scale, or no tokens (nothing to quantize): humming.linear as it is
            return linear(x, self.weight, act=self.act, out_dtype=self.out_dtype, backend=self.backend)
        quant_backend = self.backend if self.backend in ("reference", "triton") else "auto"
        qa = quantize_activation(x.reshape(-1, self.in_features), self.act, scale=self.act_scale, backend=quant_backend)
        y = linear(qa, self.weight, out_dtype=self.out_dtype or x.dtype, backend=self.backend)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        act = "None" if self.act is None else self.act.name + ("" if self.act_scale is None else " static")
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.weight.describe()}, act={act}"
