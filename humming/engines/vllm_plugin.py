"""vLLM's ``vllm.general_plugins`` entry point (``humming = humming.engines.vllm_plugin:register``).

vLLM calls :func:`register` in every process it starts (the API server, the engine core, each worker) before it
builds the model config or loads weights. It does two things:

- ``make_probe_truthful``: vLLM >= 0.33 asks ``has_humming()`` whether humming-kernels is installed, and that
  probe (``vllm.utils.import_utils._has_module("humming")``) is true for any package named ``humming``. On this
  package vLLM would then import ``humming.dtypes`` while importing its quantization configs (every quantized
  model) and rank humming-kernels ahead of Marlin on sm_90. ``has_humming`` looks ``_has_module`` up at each
  call, so replacing that function answers False for ``humming`` to every caller, also to modules that imported
  ``has_humming`` before the plugin ran. A process that reaches vLLM's probe before its plugins (a spawned
  worker unpickling its config) imports humming inside the probe, and humming's import-time check fails that
  import (``humming/_install_check.py``): the probe answers False there too.
- imports :mod:`humming.engines.vllm`, which registers the quantization method ``"humming_ir"``
  (``--quantization humming_ir``).
"""

from __future__ import annotations

from ._vllm_probe import make_probe_truthful

__all__ = ["register"]


def register() -> None:
    """vLLM's plugin hook: make its humming-kernels probe truthful, then register ``"humming_ir"``."""
    make_probe_truthful()
    from . import vllm  # noqa: F401  (registers "humming_ir")
