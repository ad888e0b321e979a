"""vLLM's ``has_humming()`` (is humming-kernels installed?) made to answer False for this package; why and when:
:mod:`humming.engines.vllm_plugin`."""

from __future__ import annotations

__all__ = ["make_probe_truthful"]


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
