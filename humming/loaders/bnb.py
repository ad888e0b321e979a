"""bitsandbytes 4-bit NF4 checkpoints (``quant_method: bitsandbytes``, ``load_in_4bit``, ``nf4``).

Per module (transformers' serialization of ``Params4bit``): ``weight`` uint8 ``[ceil(N*K/2), 1]``, the
row-major flattened codes two per byte with the FIRST element in the HIGH nibble; ``weight.absmax``
float32 ``[N*K/blocksize]`` (or uint8 with double quantization: ``absmax = nested_quant_map[code] *
nested_absmax[i // nested_blocksize] + nested_offset`` in fp32, as bitsandbytes computes it);
``weight.quant_map`` float32 ``[16]`` (the NF4 table); ``weight.quant_state.bitsandbytes__nf4`` a uint8
JSON blob with ``shape``, ``blocksize``, ``dtype`` and the nested settings.

``w = nf4[q] * absmax[block]`` in fp32, rounded once: the IR's ``nf4`` codes with float32 scales in groups
of ``blocksize`` along K. Blocks run over the flattened weight, so K must be a multiple of ``blocksize``
(blocks would straddle rows otherwise). FP4 (bitsandbytes' own 4-bit float table, not OCP e2m1) and
8-bit LLM.int8 (``q * SCB / 127``, a division, plus run-time outlier decomposition) are refused.
"""

from __future__ import annotations

import json

import torch

from humming.ir.formats import get_format
from humming.ir.weight import QuantizedWeight, cdiv

from ._common import bytes_to_words, check_shape
from ._config import Config
from ._files import CheckpointFiles
from .errors import CheckpointError, ShapeMismatchError, UnsupportedFormatError

__all__ = ["BitsAndBytesReader", "pack_bnb_nf4"]

_STATE = "weight.quant_state.bitsandbytes__"


class BitsAndBytesReader:
    method = "bitsandbytes"

    def __init__(self, qconfig: dict, files: CheckpointFiles):
        self.files = files
        config = Config(qconfig, "quantization_config")
        if config.bool("load_in_8bit", False):
            raise UnsupportedFormatError(
                "bitsandbytes 8-bit (LLM.int8): it dequantizes as q * SCB / 127 (a division, not q * scale) and "
                "splits outlier columns at run time; neither fits the weight IR exactly"
            )
        quant_type = config.str("bnb_4bit_quant_type", "fp4", lower=True)
        if quant_type != "nf4":
            raise UnsupportedFormatError(
                f"bitsandbytes 4-bit quant_type {quant_type!r}: only nf4 is read (bitsandbytes' fp4 table is "
                "not the OCP e2m1 format)"
            )
        self.skip = config.strings("llm_int8_skip_modules")

    def describe(self) -> str:
        return "bitsandbytes NF4"

    def modules(self) -> list[str]:
        found = {k.partition("." + _STATE)[0] for k in self.files.names() if "." + _STATE in k}
        return sorted(m for m in found if not any(s in m for s in self.skip))

    def load(self, module: str) -> QuantizedWeight:
        def get(name):
            return self.files.get(f"{module}.{name}", module)

        quant_type = "fp4" if f"{module}.{_STATE}fp4" in self.files else "nf4"
        try:
            state = json.loads(bytes(get(_STATE + quant_type).to(torch.uint8).tolist()).decode())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise CheckpointError(
                f"{module}: tensor {_STATE + quant_type!r} is not a JSON quant state ({err})"
            ) from None
        state = Config(state, f"{module}.{_STATE}{quant_type}")
        nested = None
        if "nested_blocksize" in state:
            nested = (get("weight.nested_absmax"), get("weight.nested_quant_map"))
        return decode_bnb_nf4(
            module,
            get("weight"),
            get("weight.absmax"),
            get("weight.quant_map"),
            state,
            nested,
            bias=self.files.get_optional(f"{module}.bias"),
        )


def decode_bnb_nf4(module, weight, absmax, quant_map, state, nested, *, bias=None) -> QuantizedWeight:
    """bitsandbytes NF4 tensors of one module -> ``nf4`` weight with float32 scales.

    ``state`` is the decoded quant_state JSON (a dict, or its :class:`Config`); ``nested`` is
    ``(nested_absmax, nested_quant_map)`` with double quantization (``absmax`` then holds uint8 codes), else
    ``None``.
    """
    if not isinstance(state, Config):
        state = Config(state, f"{module}: quant_state")
    quant_type = state.str("quant_type", None)
    if quant_type != "nf4":
        raise UnsupportedFormatError(f"{module}: bitsandbytes quant_type {quant_type!r} (nf4 only)")
    n, k = state.int_pair("shape") or (0, 0)
    block = state.int("blocksize", minimum=1)
    if k % block:
        raise UnsupportedFormatError(
            f"{module}: K={k} is not a multiple of the bitsandbytes blocksize {block}: its blocks run over the "
            "flattened weight and would straddle rows, which no group layout expresses"
        )
    table = torch.tensor(get_format("nf4").table, dtype=torch.float32)
    if not torch.equal(quant_map.to(torch.float32), table):
        raise CheckpointError(f"{module}: weight.quant_map is not the standard NF4 table")
    if weight.dtype != torch.uint8 or weight.numel() != (n * k + 1) // 2:
        raise ShapeMismatchError(
            f"{module}: weight must hold {(n * k + 1) // 2} uint8 bytes, got {weight.dtype} {tuple(weight.shape)}"
        )
    if nested is not None:
        nested_absmax, nested_map = nested
        nested_block = state.int("nested_blocksize", minimum=1)
        if absmax.dtype != torch.uint8:
            raise ShapeMismatchError(
                f"{module}: double-quantized weight.absmax must be uint8 codes, got {absmax.dtype}"
            )
        check_shape(module, "weight.nested_quant_map", nested_map, (256,))
        check_shape(module, "weight.nested_absmax", nested_absmax.reshape(-1), (cdiv(absmax.numel(), nested_block),))
        idx = torch.arange(absmax.numel()) // nested_block
        absmax = nested_map.to(torch.float32)[absmax.long()] * nested_absmax.reshape(-1).to(torch.float32)[idx]
        absmax = absmax + torch.tensor(state.number("nested_offset"), dtype=torch.float32)
    check_shape(module, "weight.absmax", absmax.reshape(-1), (n * k // block,))
    swapped = ((weight.reshape(n, k // 2) & 0x0F) << 4) | (weight.reshape(n, k // 2) >> 4)
    return QuantizedWeight(
        shape=(n, k),
        format="nf4",
        qweight=bytes_to_words(swapped),
        scales=absmax.to(torch.float32).reshape(n, k // block),
        group_shape=(1, block),
        bias=bias,
    )


def pack_bnb_nf4(codes: torch.Tensor, absmax: torch.Tensor, *, blocksize: int = 64, nested=None, dtype="bfloat16"):
    """Write one module as transformers saves a bitsandbytes NF4 ``Params4bit`` (tensor names without prefix).

    ``codes`` uint8 ``[N, K]``; ``absmax`` float32 ``[N*K/blocksize]``, or with ``nested=(absmax_codes,
    nested_absmax, nested_quant_map, offset, nested_blocksize)`` the double-quantized absmax instead.
    """
    n, k = codes.shape
    flat = codes.reshape(-1)
    state = {"quant_type": "nf4", "blocksize": blocksize, "dtype": dtype, "shape": [n, k]}
    out = {
        "weight": ((flat[0::2] << 4) | flat[1::2]).reshape(-1, 1),
        "weight.absmax": absmax,
        "weight.quant_map": torch.tensor(get_format("nf4").table, dtype=torch.float32),
    }
    if nested is not None:
        absmax_codes, nested_absmax, nested_map, offset, nested_block = nested
        out["weight.absmax"] = absmax_codes
        out["weight.nested_absmax"] = nested_absmax
        out["weight.nested_quant_map"] = nested_map
        state.update(nested_blocksize=nested_block, nested_dtype="float32", nested_offset=offset)
    out[_STATE + "nf4"] = torch.tensor(list(json.dumps(state).encode()), dtype=torch.uint8)
    return out
