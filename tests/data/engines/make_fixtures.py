"""Writes this folder's compressed-tensors fixtures for the engine tests, formats the real-producer fixtures of
``tests/data/checkpoints`` do not cover: ``ct_nvfp4`` (``nvfp4-pack-quantized``) and
``ct_mxfp4`` (``mxfp4-pack-quantized``), weight-only, each a random one-layer Llama (hidden 256, 8 heads
of 32, 2 KV heads, intermediate 448) quantized by ``humming.nn.quantize_model`` and written by
``humming.nn.save_pretrained`` (which ``tests/test_nn.py`` checks loads back bit for bit). Run from the
repository root: ``python tests/data/engines/make_fixtures.py`` (needs transformers)."""

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from humming.nn import quantize_model, save_pretrained

HERE = Path(__file__).parent
SCHEMES = {"ct_nvfp4": "nvfp4", "ct_mxfp4": "mxfp4"}


def main() -> None:
    for name, weight in SCHEMES.items():
        torch.manual_seed(29)
        config = LlamaConfig(
            vocab_size=256,
            hidden_size=256,
            intermediate_size=448,
            num_hidden_layers=1,
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=32,
            tie_word_embeddings=False,
        )
        model = LlamaForCausalLM(config).to(torch.bfloat16)
        quantize_model(model, weight, progress=False)
        save_pretrained(model, HERE / name, format="compressed-tensors")


if __name__ == "__main__":
    main()
