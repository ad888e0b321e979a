"""Engine adapters: ``humming.engines.vllm`` (a vLLM quantization method; importing it needs vLLM).

SGLang: no adapter. Its quantization base classes do not import on a CPU-only machine with a CPU torch
(``sglang.srt.layers.quantization`` imports ``torchvision`` unconditionally, whose PyPI wheel links the CUDA
torch libraries), so an adapter could not be tested here; the README's "Engines" section shows its shape.
"""
