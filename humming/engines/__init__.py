"""Engine adapters, the quantization method ``"humming_ir"``: :mod:`humming.engines.vllm` (vLLM >= 0.33; its
``vllm.general_plugins`` entry point is :mod:`humming.engines.vllm_plugin`, which also keeps vLLM's probe for
humming-kernels truthful) and :mod:`humming.engines.sglang` (SGLang 0.5; its ``sglang.srt.plugins`` entry point
is :func:`humming.engines.sglang.register`). Importing either needs its engine; both share :mod:`._core`."""

from .. import _install_check  # noqa: F401  (its import is the check)
