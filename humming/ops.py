"""humming's ``torch.library`` custom ops (``torch.ops.humming.*``), so that ``torch.compile`` sees each
entry point as one node.

| op | wraps |
|---|---|
| ``linear`` | :func:`humming.linear` (16-bit or pre-quantized activations) |
| ``linear_bound`` / ``fused_moe_bound`` | the same, traced by dynamo: a site names the weights |
| ``grouped_linear`` | :func:`humming.moe.grouped_linear` (16-bit or pre-quantized activations, gathered or not) |
| ``grouped_linear_masked`` / ``fused_moe`` / ``moe_align`` / ``topk_routing`` | :mod:`.moe` |
| ``quantize_activation`` | :func:`quantize_activation` |
| ``rmsnorm_quantize`` | :func:`humming.rmsnorm_quantize` |

A custom op takes tensors, ints and strings, not a :class:`QuantizedWeight`: a weight travels as its
tensors plus a *handle* and a *meta* string (:func:`weight_args`). The handle is an int assigned once per
weight object; the op's implementation looks the object up by it, so the dispatcher's per-weight caches
(plans, CUDA prepared layouts) keep working under ``torch.compile``. The meta string (``"int4;1,128;256x512"``:
format, group shape, shape) makes a call self-describing: when the tensors passed are not the registered
weight's (``opcheck`` passes copies) or the handle is gone, the weight is rebuilt from them.

A ``linear`` and a ``fused_moe`` call traced by dynamo pass a *site* instead (:func:`bind`: the
weights and the call's other arguments, named once at trace time) to the ``*_bound`` ops: the graph then
holds no weight tensor, and the dispatcher's trip, whose cost grows with the arguments, carries five
instead of fourteen. An exported graph outlives the process, so ``torch.export`` keeps the self-describing
ops.

Eager calls of the Python wrappers run the implementation directly (the dispatcher's trip through a
Python-registered op costs several microseconds); while dynamo traces, they call the op. The ops are for
inference: none has an autograd formula.
"""

from __future__ import annotations

import itertools
import weakref

import torch

from ._env import pass_backend
from .ir.activation import ACT_SCHEMES, ActScheme, QuantizedActivation, get_act_scheme
from .ir.activation import quantize_activation as reference_quantize_activation
from .ir.weight import QuantizedWeight, weight_by_handle

__all__ = [
    "LIBRARY",
    "act_name",
    "act_scales_shape",
    "activation_outputs",
    "bind",
    "bound",
    "eager",
    "quantize_activation",
    "register",
    "weight_args",
    "weight_from_args",
]

#: Every op of the ``humming`` namespace is defined on this library (kept alive for the process).
LIBRARY = torch.library.Library("humming", "DEF")


def _weight_schema(prefix: str = "") -> str:
    """The schema arguments of one weight (:func:`weight_args`), their names prefixed."""
    fields = (
        ("Tensor", "qweight"),
        ("Tensor?", "scales"),
        ("Tensor?", "zeros"),
        ("Tensor?", "global_scale"),
        ("Tensor?", "g_idx"),
        ("int", "handle"),
        ("str", "meta"),
    )
    return ", ".join(f"{kind} {prefix}{name}" for kind, name in fields)


_SCHEMAS = {
    "linear": f"linear(Tensor x, Tensor? x_scales, Tensor? x_global_scale, {_weight_schema()}, Tensor? bias, "
    "str? act, ScalarType out_dtype, str backend) -> Tensor",
    "linear_bound": "linear_bound(Tensor x, Tensor? x_scales, Tensor? x_global_scale, Tensor? bias, str site) "
    "-> Tensor",
    "grouped_linear": "grouped_linear(Tensor x, Tensor? x_scales, Tensor? x_global_scale, Tensor expert_ids, "
    f"int block_m, Tensor? rows, {_weight_schema()}, Tensor? bias, str? act, ScalarType out_dtype, str backend) "
    "-> Tensor",
    "grouped_linear_masked": f"grouped_linear_masked(Tensor x, Tensor masked_m, int expected_m, {_weight_schema()}, "
    "Tensor? bias, str? act, ScalarType out_dtype, str backend) -> Tensor",
    "fused_moe": f"fused_moe(Tensor x, Tensor topk_weights, Tensor topk_ids, {_weight_schema('w13_')}, "
    f"Tensor? w13_bias, {_weight_schema('w2_')}, Tensor? w2_bias, Tensor? expert_map, str activation, "
    "float? alpha, float? limit, str gate_up_layout, str? act, Tensor? w13_act_scale, Tensor? w2_act_scale, "
    "int block_m, str backend) -> Tensor",
    "fused_moe_bound": "fused_moe_bound(Tensor x, Tensor topk_weights, Tensor topk_ids, Tensor? expert_map, "
    "Tensor? w13_act_scale, Tensor? w2_act_scale, float? alpha, float? limit, int block_m, str site) -> Tensor",
    "moe_align": "moe_align(Tensor topk_ids, int num_experts, int block_m, str backend='auto') "
    "-> (Tensor, Tensor, Tensor, Tensor)",
    "topk_routing": "topk_routing(Tensor router_logits, int top_k, str scoring, bool renormalize, "
    "int? num_groups=None, int? topk_groups=None, Tensor? correction_bias=None, float routed_scaling=1., "
    "str order='score_then_topk', str backend='auto') -> (Tensor, Tensor)",
    "quantize_activation": "quantize_activation(Tensor x, str act, Tensor? scale, str backend) "
    "-> (Tensor, Tensor, Tensor)",
    "rmsnorm_quantize": "rmsnorm_quantize(Tensor x, Tensor weight, float eps, str act, Tensor? residual, "
    "Tensor? scale, str backend) -> (Tensor, Tensor, Tensor, Tensor)",
}
for _schema in _SCHEMAS.values():
    LIBRARY.define(_schema)


def eager(x) -> bool:
    """Whether a wrapper should run its implementation directly: not while dynamo traces, and only on plain
    tensors (a fake or subclass tensor goes through the op and its fake implementation)."""
    return type(x) is torch.Tensor and not torch.compiler.is_compiling()


def register(name: str, impl, fake) -> None:
    """Register op ``name``'s real implementation (every device: the dispatcher inside picks) and its fake
    one (output shapes and dtypes only, symbolic sizes allowed; no data is read)."""
    LIBRARY.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"humming::{name}", fake, lib=LIBRARY)


# ---------------------------------------------------------------------------------------- weight handles
def weight_args(qw: QuantizedWeight) -> tuple:
    """``qw`` as op arguments: ``(qweight, scales, zeros, global_scale, g_idx, handle, meta)``
    (``qw.bias`` is passed apart); ``meta`` is ``qw.signature``."""
    return (qw.held_codes, qw.scales, qw.zeros, qw.global_scale, qw.g_idx, qw.handle, qw.signature)


def weight_from_args(qweight, scales, zeros, global_scale, g_idx, handle: int, meta: str) -> QuantizedWeight:
    """The weight an op call names: the registered object when the tensors and ``meta`` are its own, else one
    rebuilt (and validated) from the tensors and ``meta`` (no bias: ops take the bias apart)."""
    qw = weight_by_handle(handle)
    if qw is not None and qw.signature == meta:
        own = qw.held_codes is qweight and qw.scales is scales and qw.zeros is zeros and qw.g_idx is g_idx
        if own and qw.global_scale is global_scale:  # the weight's own tensors, as compiled code passes them
            return qw
        tensors = (qweight, scales, zeros, global_scale, g_idx)
        if all(map(_same, (qw.held_codes, *_fields(qw)), tensors)):
            return qw
    fmt, group_shape, shape = _parse_meta(meta)
    return QuantizedWeight(
        shape=shape,
        format=fmt,
        qweight=qweight,
        scales=scales,
        group_shape=group_shape,
        zeros=zeros,
        global_scale=global_scale,
        g_idx=g_idx,
    )


# ------------------------------------------------------------------------------------------- call sites
_site_numbers = itertools.count(1)
# site -> (the call's values, weights as weak references; the positions of those weights)
_sites: dict[str, tuple[tuple, tuple[int, ...]]] = {}
_site_ids: dict[tuple, str] = {}  # the call's values, weights as handles -> site


def _forget(key: tuple) -> None:
    _sites.pop(_site_ids.pop(key, None), None)


def bind(*values) -> str:
    """The *site* of calls with ``values`` (weights and hashable arguments): a string that :func:`bound`
    turns back into them. Called while dynamo traces, it runs once, on the real weights: the site goes into
    the graph as a constant, so the op that takes it is called with a few arguments instead of every weight
    tensor, and dynamo guards the weights by identity instead of field by field. The values must be
    constants to dynamo (weights, strings, dtypes, schemes, None): numbers travel as the op's arguments,
    since dynamo may make them symbolic (``dynamic=True`` does so with a float read from a closure).

    A site holds its weights weakly and names them in this process only (an exported graph uses the
    self-describing ops instead). It spells out the values (a weight by its signature) after a number unique
    in the process: inductor's graph cache, which keys a compiled graph by its constants, then reuses one
    compiled in another process only where the site describes the same call."""
    key = tuple(("weight", v.handle) if isinstance(v, QuantizedWeight) else v for v in values)
    site = _site_ids.get(key)
    if site is None:
        described = "|".join(v.signature if isinstance(v, QuantizedWeight) else str(v) for v in values)
        site = _site_ids[key] = f"{next(_site_numbers)}:{described}"
        forget = lambda _, key=key: _forget(key)
        entry = tuple(weakref.ref(v, forget) if isinstance(v, QuantizedWeight) else v for v in values)
        _sites[site] = entry, tuple(i for i, v in enumerate(values) if isinstance(v, QuantizedWeight))
    return site


# torch._dynamo.assume_constant_result's mark, set without importing torch._dynamo (which would make every
# `import humming` import dynamo too): dynamo runs the function when it traces a call and keeps its result as
# a constant. tests/test_ops.py checks the mark against the decorator's.
bind._dynamo_marked_constant = True


def bound(site: str) -> list:
    """The values of a site of :func:`bind`; ``ValueError`` naming ``site`` when it names none (a weight of
    it is gone, or it comes from another process). Called by every compiled call: the weights are
    dereferenced at their known positions."""
    found = _sites.get(site)
    if found is None:
        raise ValueError(f"site: {site!r} names no live weights in this process (humming.ops.bind makes sites)")
    entry, weights = found
    values = list(entry)
    for i in weights:
        values[i] = entry[i]()
    return values


def _fields(qw: QuantizedWeight) -> tuple:
    return qw.scales, qw.zeros, qw.global_scale, qw.g_idx


def _parse_meta(meta) -> tuple[str, tuple[int, ...], tuple[int, ...]]:
    """``"int4;1,128;256x512"`` -> ``("int4", (1, 128), (256, 512))``; ``ValueError`` naming ``meta`` else."""
    try:
        fmt, group_shape, shape = meta.split(";")
        return fmt, tuple(int(v) for v in group_shape.split(",")), tuple(int(d) for d in shape.split("x"))
    except (AttributeError, ValueError):
        raise ValueError(
            f"meta: expected a weight signature 'format;bn,bk;NxK' (QuantizedWeight.signature), got {meta!r}"
        ) from None


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return a is None if b is None else a is not None and a.data_ptr() == b.data_ptr()


def act_name(act: ActScheme | None) -> str | None:
    """The name an op passes for ``act``; an ``ActScheme`` outside ``ACT_SCHEMES`` cannot be named."""
    if act is None:
        return None
    if ACT_SCHEMES.get(act.name) != act:
        raise ValueError(f"act: {act} is not in humming.ACT_SCHEMES, so a custom op cannot name it")
    return act.name


# ---------------------------------------------------------------------------------- activation quantization
def _quantize_activation_impl(x, scheme: ActScheme, scale, backend: str) -> QuantizedActivation:
    backend = pass_backend(backend)
    if backend == "triton" or (backend == "auto" and x.device.type == "cuda"):
        from .triton_kernels import act_quant

        reason = act_quant.unsupported(x, scheme)
        if reason is None:
            return act_quant.quantize_activation(x, scheme, scale=scale)
        if backend == "triton":
            raise ValueError(f"backend: 'triton' cannot quantize these activations: {reason}")
    return reference_quantize_activation(x, scheme, scale=scale)


def act_scales_shape(scheme: ActScheme, m, k, static: bool) -> tuple:
    """The shape of ``scheme``'s scales for activations ``[m, k]`` (sizes may be symbolic); ``static``: a
    static per-tensor scale was given."""
    if static or scheme.group == "tensor":
        return (1, 1)
    if scheme.group == "token":
        return (m, 1)
    return (m, (k + scheme.group_shape[1] - 1) // scheme.group_shape[1])


def _fake_quantize_activation(x, act, scale, backend):
    scheme = get_act_scheme(act)
    m, k = x.shape
    return (
        x.new_empty((m, k), dtype=torch.uint8),
        x.new_empty(act_scales_shape(scheme, m, k, scale is not None), dtype=scheme.scale_dtype),
        x.new_empty((), dtype=torch.float32),
    )


def activation_outputs(qa: QuantizedActivation, scale) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A custom op's ``(codes, scales, global scale)`` outputs for ``qa``, quantized with the static ``scale``
    (or None): a missing global scale is a one, and a static scale (``qa.scales`` is a view of it) is copied,
    since an op's outputs may not alias its inputs."""
    gs = qa.global_scale if qa.global_scale is not None else torch.ones((), device=qa.codes.device)
    scales = qa.scales.clone() if scale is not None else qa.scales
    return qa.codes, scales, gs.reshape(())


def _quantize_activation_op(x, act, scale, backend):
    return activation_outputs(_quantize_activation_impl(x, get_act_scheme(act), scale, backend), scale)


register("quantize_activation", _quantize_activation_op, _fake_quantize_activation)


def quantize_activation(
    x: torch.Tensor, act: str | ActScheme, *, scale: torch.Tensor | None = None, backend: str = "auto"
) -> QuantizedActivation:
    """Quantize activations ``x`` ``[M, K]`` (float16 / bfloat16 / float32) with scheme ``act``; a static
    per-tensor ``scale`` replaces the dynamic one. ``backend``: ``"reference"``
    (:func:`humming.ir.quantize_activation`, the definition), ``"triton"`` (bit-exact with it) or
    ``"auto"`` (Triton on CUDA tensors, else the reference). Returns a :class:`QuantizedActivation`."""
    scheme = get_act_scheme(act)
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.numel() == 0:
        raise ValueError(f"x: expected a non-empty [M, K], got shape {tuple(getattr(x, 'shape', ()))}")
    if eager(x):
        return _quantize_activation_impl(x, scheme, scale, backend)
    codes, scales, gs = torch.ops.humming.quantize_activation(x, act_name(scheme), scale, backend)
    return QuantizedActivation(scheme, codes, scales, gs if scheme.global_scale else None)
