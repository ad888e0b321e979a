"""vLLM's ``vllm.general_plugins`` entry point (``humming = humming.engines.vllm_plugin:register``).

vLLM calls :func:`register` in every process it starts (the API server, the engine core, each worker) before it
builds the model config or loads weights. It does two things:

- :func:`make_probe_truthful`: vLLM >= 0.33 asks ``has_humming()`` whether humming-kernels is installed, and
  that probe (``vllm.utils.import_utils._has_module("humming")``) is true for any package named ``humming``. On
  this package vLLM would then import ``humming.dtypes`` while importing its quantization configs (every quantized
  model) and rank humming-kernels ahead of Marlin on sm_90. ``has_humming`` looks ``_has_module`` up at each
  call, so replacing that function answers False for ``humming`` to every caller, also to modules that imported
  ``has_humming`` before the plugin ran. A process that reaches vLLM's probe before its plugins (a spawned
  worker unpickling its config) imports humming inside the probe, and humming's import-time check fails that
  import (``humming/_install_check.py``): the probe answers False there too.
- imports :mod:`humming.engines.vllm`, which registers the quantization method ``"humming_ir"``
  (``--quantization humming_ir``).
"""

from __future__ import annotations

__all__ = ["make_probe_truthful", "register"]


def make_probe_truthful() -> None:
    """Make vLLM's ``has_humming()`` (is humming-kernels installed?) answer False for this package."""
    from vllm.utils import import_utils

    original = import_utils._has_module
    if getattr(original, "humming_ir", False):
        return

    def _has_module(module_name: str) -> bool:
        return False if module_name == "humming" else original(module_name)

    _has_module.humming_ir = True
    _has_module.cache_clear = getattr(original, "cache_clear", lambda: None)
    import_utils._has_module = _has_module


def register() -> None:
    make_probe_truthful()
    from . import vllm  # noqa: F401  (registers "humming_ir")
