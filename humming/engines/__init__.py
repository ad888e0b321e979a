"""Engine adapters: ``humming.engines.vllm`` (a vLLM quantization method, ``"humming_ir"``; importing it needs
vLLM), ``humming.engines.vllm_plugin`` (vLLM's ``vllm.general_plugins`` entry point: registers that method and
keeps vLLM's probe for humming-kernels truthful), ``humming.engines.sglang`` (an SGLang quantization method;
importing it needs SGLang)."""

from .. import _install_check  # noqa: F401  (its import is the check)
