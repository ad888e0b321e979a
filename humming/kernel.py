"""What a kernel is: the object each kernel module exports (``KERNEL``) and the dispatcher lists
(:mod:`humming.dispatch.kernels`), so that the dispatcher, ``humming.warmup``, the tuner and the benchmarks
ask the kernel itself what it supports, how it is tuned and how it runs, never a switch on its name.

A dense kernel takes ``(qweight, act, x)``, ``x`` the 2-D activation ``[M, K]`` (a QuantizedActivation's
codes for pre-quantized input); a grouped (MoE) kernel takes ``(qweight, act, x, block_m)``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["Kernel", "LaunchesByWeight", "always_gathers", "never_gates", "never_gathers", "no_jobs", "no_tuning"]


def no_tuning(*args) -> None:
    """The tuning of a kernel that picks its own at launch (or has none)."""
    return None


def no_jobs(*args, **kwargs) -> list:
    """The ahead-of-time compile jobs of a kernel that compiles nothing through NVRTC."""
    return []


def never_gathers(qweight, act, tokens, m_pad) -> bool:
    """The ``gathers`` of a kernel that reads grouped rows only (and of every dense kernel)."""
    return False


def never_gates(qweight, x, activation) -> bool:
    """The ``gates`` of a kernel without a fused gated activation (every dense kernel, most grouped ones)."""
    return False


def always_gathers(qweight, act, tokens, m_pad) -> bool:
    """The ``gathers`` of a grouped kernel that reads token rows through an index for every call it runs."""
    return True


@dataclass(frozen=True)
class Kernel:
    """One kernel of one backend.

    - ``unsupported(qweight, act, x)`` (grouped: ``(..., block_m)``): ``None`` when the kernel runs the call,
      else why not; cheap, computed once per weight and call shape (the dispatcher keeps the answer).
    - ``run(x, qweight, bias, act, out_dtype, tuning)`` (grouped: ``run(x, qweight, expert_ids, block_m,
      bias, act, out_dtype, tuning)``, plus ``rows=`` where ``gathers``): launch, on a call ``unsupported``
      accepted.
    - ``tuning(qweight, act, x)``: the launch configuration the kernel's own pure heuristic picks (``None``
      where the kernel decides at launch).
    - ``deterministic_tuning(qweight, act, x)``: the one tuning of deterministic mode, for a kernel whose
      result for a row does not depend on the batch; ``None`` for the other kernels.
    - ``warmup_jobs(qweight, act, m, *, act_dtype, out_dtype, bias_dtype, device, block_m)``: the ``(spec,
      arch)`` NVRTC jobs a call of ``m`` rows compiles (``humming.warmup`` compiles them in parallel first).
      Grouped kernels also take ``gather`` (the call reads token rows through an index, grouped rows, or
      ``None``: either) and ``gated`` (as ``gates``: the variant with that activation in the epilogue), which
      ``humming.warmup`` passes for each GEMM of a fused_moe call.
    - ``layout`` names the prepared weight layout the kernel reads (``"ir"``: the QuantizedWeight as it is)
      and ``prepare(qweight, act)`` makes it for activation scheme ``act`` (``None``: 16-bit).
    - ``gathers(qweight, act, tokens, m_pad)``: whether the grouped kernel reads token rows through an index
      for this weight and activation scheme, ``tokens`` token rows and ``m_pad`` grouped rows
      (``humming.moe.grouped_linear``'s ``rows``); where it does not, the caller copies the rows into grouped
      order (one Triton pass on CUDA) and the kernel reads those.
    - ``gates(qweight, x, activation)``: whether the grouped kernel applies fused_moe's gated activation
      (a ``humming.reference.moe_layer.Activation``) to ``w13`` = ``qweight`` in its epilogue for 16-bit
      ``x``; it then runs with ``gated=activation`` and returns ``[M_pad, N / 2]``.
    - ``launcher(x, qweight, act, bias_dtype, out_dtype, tuning)`` (dense kernels): a callable ``(x, bias) ->
      out`` that runs what ``run`` runs for every call shaped as ``x`` (dtype, shape, strides, 16-byte
      alignment, device) with a bias of ``bias_dtype`` (``None``: no bias), everything that depends only on
      that shape done once when it is made; ``None`` where the kernel has no such split (``run`` is called).
      Grouped kernels: ``launcher(x, qweight, act, block_m, m_pad, bias_dtype, out_dtype, tuning, gather,
      gated, programmatic)`` -> ``(x, expert_ids, bias, rows) -> out`` for calls of ``m_pad`` grouped rows shaped
      as ``x`` (``gather``: through ``rows``; ``gated``: as ``gates``; ``programmatic``: launched
      programmatically, or plainly), or ``None`` for a call it does not split so.
    - ``pass_launcher(quantize, x, qweight, act, bias_dtype, out_dtype, tuning)`` (dense kernels that quantize
      16-bit ``x`` themselves first): ``launcher`` with the activation pass ``quantize`` (``x -> (codes,
      scales, global_scale)`` for calls shaped as ``x``) chosen by the caller, since the cheapest pass to
      launch on a device may be another backend's; ``None`` where the kernel picks its own.
    """

    name: str
    backend: str
    layout: str
    unsupported: Callable[..., str | None]
    run: Callable[..., torch.Tensor]
    tuning: Callable[..., object] = no_tuning
    deterministic_tuning: Callable[..., object] | None = None
    warmup_jobs: Callable[..., list] = no_jobs
    prepare: Callable[..., object] = lambda qweight, act=None: qweight
    gathers: Callable[..., bool] = never_gathers
    gates: Callable[..., bool] = never_gates
    launcher: Callable[..., Callable] | None = None
    pass_launcher: Callable[..., Callable] | None = None


class LaunchesByWeight:
    """Prepared launches per weight object (held weakly: they go with it) and kind of call, at most ``keep`` per
    weight (then they start over: serving sees many M)."""

    def __init__(self, keep: int = 1024) -> None:
        self.keep = keep
        self.kinds: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def get(self, qweight, key, make):
        """The launch kept for ``qweight`` and ``key``, made by ``make()`` the first time."""
        kinds = self.kinds.get(qweight)
        if kinds is None:
            kinds = self.kinds[qweight] = {}
        ready = kinds.get(key)
        if ready is None:
            ready = make()
            if len(kinds) >= self.keep:
                kinds.clear()
            kinds[key] = ready
        return ready
