"""``quantize_model``: replace a float model's ``nn.Linear`` layers with :class:`QuantizedLinear` and its
transformers experts modules with :class:`QuantizedExperts`, in place."""

from __future__ import annotations

import fnmatch
import re
import warnings

from torch import nn
from tqdm.auto import tqdm

from ..ir.activation import ActScheme
from ..ir.quantize import quantize
from .hf import _expert_activation
from .linear import QuantizedLinear, resolve_group_size
from .moe import QuantizedExperts

__all__ = ["DEFAULT_IGNORE", "is_experts_module", "quantize_model"]

#: Modules :func:`quantize_model` leaves in float by default: the output embedding and MoE router gates (an
#: ``nn.Linear`` named ``gate`` / ``router`` in older transformers and custom models, Qwen2-MoE's
#: ``shared_expert_gate`` of one output). Transformers 5's routers (``*TopKRouter``) are no ``nn.Linear``.
DEFAULT_IGNORE = ("lm_head", "*.gate", "*.router", "*.shared_expert_gate")


def matches(name: str, patterns) -> str | None:
    """The first of ``patterns`` that module ``name`` matches, or ``None``: an exact name or an ``fnmatch``
    pattern (``"*.mlp.*"``), or ``"re:<regex>"`` (``re.fullmatch``, as compressed-tensors' ``ignore``)."""
    for pattern in patterns:
        if pattern.startswith("re:"):
            if re.fullmatch(pattern[3:], name):
                return pattern
        elif fnmatch.fnmatchcase(name, pattern):
            return pattern
    return None


def _patterns(arg: str, patterns) -> list[str] | None:
    if patterns is None:
        return None
    if isinstance(patterns, str):
        patterns = [patterns]
    patterns = list(patterns)
    if not all(isinstance(p, str) for p in patterns):
        raise ValueError(f"{arg}: expected module names or patterns (strings), got {patterns!r}")
    return patterns


def is_experts_module(module: nn.Module) -> bool:
    """Whether ``module`` is a transformers 5 experts module: fused 3-D ``gate_up_proj`` and ``down_proj``
    parameters (Mixtral, Qwen2/3-MoE, DeepSeek-V2/V3, OLMoE, gpt-oss...)."""
    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    return isinstance(gate_up, nn.Parameter) and isinstance(down, nn.Parameter) and gate_up.dim() == down.dim() == 3


def quantize_model(
    model: nn.Module,
    weight: str = "int4",
    group_size=None,
    act: str | ActScheme | None = None,
    modules=None,
    *,
    ignore=DEFAULT_IGNORE,
    zero_point: bool = False,
    backend: str = "auto",
    progress: bool = True,
) -> nn.Module:
    """Quantize ``model`` in place by round to nearest (:func:`humming.quantize`, on each layer's device) and
    return it.

    Every ``nn.Linear`` becomes a :class:`QuantizedLinear`; every transformers experts module (fused 3-D
    ``gate_up_proj`` / ``down_proj``: Mixtral, Qwen2/3-MoE, DeepSeek-V2/V3, OLMoE, gpt-oss) becomes a
    :class:`QuantizedExperts` running the module's activation in its gate / up layout, with its biases.

    Args:
        weight, group_size, zero_point: as :func:`humming.quantize`; ``group_size=None``: a named scheme's own
            (``nvfp4``: 16, ``mxfp4``: 32, ``fp8_block``: 128x128), else 128.
        act: the activation scheme the modules run (``None``: 16-bit activations).
        modules: names or patterns (``fnmatch``, or ``"re:<regex>"``) of the modules to quantize; ``None``:
            every one.
        ignore: names or patterns of modules to leave in float, applied after ``modules``; the default,
            :data:`DEFAULT_IGNORE`, leaves ``lm_head`` and router gates (pass ``()`` to quantize them too).
        backend: as :func:`humming.linear`.
        progress: show a progress bar.

    One ``UserWarning`` lists every ``nn.Linear`` and experts module left in float, with the reason.
    """
    if not isinstance(model, nn.Module):
        raise ValueError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    modules, ignore = _patterns("modules", modules), _patterns("ignore", ignore) or []
    # Every name, a module registered under several (shared or tied) included: each gets the one quantized module.
    candidates = [
        (name, module)
        for name, module in model.named_modules(remove_duplicate=False)
        if name and (isinstance(module, nn.Linear) or is_experts_module(module))
    ]
    selected, skipped = [], []
    for name, module in candidates:
        if modules is not None and matches(name, modules) is None:
            skipped.append((name, "not in modules="))
        elif (pattern := matches(name, ignore)) is not None:
            skipped.append((name, f"ignore={pattern!r}"))
        elif isinstance(module, nn.Linear):
            selected.append((name, module))
        elif isinstance(activation := _expert_activation(module), str):
            skipped.append((name, f"{type(module).__name__}: {activation}"))
        else:
            selected.append((name, module))
    if modules is not None and not selected:
        raise ValueError(f"modules: no nn.Linear or experts module of the model matches {modules}")
    quantized: dict[int, tuple[nn.Module, nn.Module]] = {}  # id(module) -> (module, its quantized module)
    for name, module in tqdm(selected, desc=f"quantizing to {weight}", disable=not progress):
        parent_name, _, child = name.rpartition(".")
        if id(module) not in quantized and isinstance(module, nn.Linear):
            layer = QuantizedLinear.from_float(
                module, weight, group_size, zero_point=zero_point, act=act, backend=backend
            )
            quantized[id(module)] = (module, layer)
        elif id(module) not in quantized:
            quantized[id(module)] = (module, _quantize_experts(module, weight, group_size, zero_point, act, backend))
        setattr(model.get_submodule(parent_name), child, quantized[id(module)][1])
    if skipped:
        warnings.warn(
            f"quantize_model: {len(skipped)} of {len(candidates)} modules left unquantized: {_listing(skipped)}",
            UserWarning,
            stacklevel=2,
        )
    return model


def _quantize_experts(module: nn.Module, weight, group_size, zero_point, act, backend) -> QuantizedExperts:
    """A transformers experts module as :class:`QuantizedExperts`: ``w13 [E, 2I, H]`` in the module's gate / up
    layout and ``w2 [E, H, I]`` (parameters stored ``[E, in, out]`` when ``is_transposed``), biases kept."""
    transposed = getattr(module, "is_transposed", False)
    group_size = resolve_group_size(weight, group_size)

    def q(name: str) -> object:
        w = getattr(module, name).detach()
        bias = getattr(module, f"{name}_bias", None)
        w = w.transpose(1, 2).contiguous() if transposed else w
        bias = None if bias is None else bias.detach()
        return quantize(w, weight, group_size=group_size, zero_point=zero_point, bias=bias)

    return QuantizedExperts(q("gate_up_proj"), q("down_proj"), **_expert_activation(module), act=act, backend=backend)


def _listing(skipped: list[tuple[str, str]]) -> str:
    """``name (reason)``, names that differ only in their layer indices folded into one ``layers.*`` entry
    with their count."""
    folded: dict[tuple[str, str], int] = {}
    for name, reason in skipped:
        key = (re.sub(r"(?<=\.)\d+(?=\.|$)", "*", name), reason)
        folded[key] = folded.get(key, 0) + 1
    return "; ".join(
        f"{name}{f' (x{count})' if count > 1 else ''} ({reason})" for (name, reason), count in folded.items()
    )
