"""The canonical packing of codes: a little-endian dense bit stream along K, in int32 words.

Element k of a row occupies stream bits ``[k*bits, (k+1)*bits)``; word w holds stream bits
``[32w, 32w + 32)``, bit 0 least significant. Fields may straddle two words (3, 5, 6, 7 bits). Each row is
zero-padded to a whole word. This is compressed-tensors' modern ``pack-quantized`` order, so the common
case converts without bit shuffling, and every bit width shares one rule.
"""

from __future__ import annotations

import torch

__all__ = ["pack_codes", "packed_words", "unpack_codes"]


def packed_words(k: int, bits: int) -> int:
    """Number of int32 words that hold ``k`` codes of ``bits`` bits."""
    return (k * bits + 31) // 32


def _field_positions(k: int, bits: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    start = torch.arange(k, device=device, dtype=torch.int64) * bits
    return start // 32, start % 32


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes ``[..., K]`` (values < 2^bits) -> int32 ``[..., ceil(K*bits/32)]``."""
    if not 1 <= bits <= 8:
        raise ValueError(f"pack_codes: bits must be in 1..8, got {bits}")
    if codes.dtype not in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
        raise ValueError(f"pack_codes: codes must be an integer tensor, got {codes.dtype}")
    k = codes.shape[-1]
    lead = codes.shape[:-1]
    if 8 % bits == 0:
        return _pack_bytes(codes, bits)
    values = codes.reshape(-1, k).to(torch.int64) & ((1 << bits) - 1)
    word, shift = _field_positions(k, bits, codes.device)
    n_words = packed_words(k, bits)
    # One spare word takes the high part of fields that straddle the last boundary; it is always zero.
    acc = torch.zeros(values.shape[0], n_words + 1, dtype=torch.int64, device=codes.device)
    shifted = values << shift  # < 2^40: the low 32 bits go to `word`, the rest to `word + 1`
    acc.index_add_(1, word, shifted & 0xFFFFFFFF)
    acc.index_add_(1, word + 1, shifted >> 32)
    packed = acc[:, :n_words]
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    return packed.reshape(*lead, n_words)


def unpack_codes(packed: torch.Tensor, bits: int, k: int) -> torch.Tensor:
    """int32 ``[..., ceil(K*bits/32)]`` -> uint8 codes ``[..., K]`` (inverse of :func:`pack_codes`)."""
    if not 1 <= bits <= 8:
        raise ValueError(f"unpack_codes: bits must be in 1..8, got {bits}")
    if packed.dtype != torch.int32:
        raise ValueError(f"unpack_codes: packed must be int32, got {packed.dtype}")
    n_words = packed.shape[-1]
    if n_words != packed_words(k, bits):
        raise ValueError(f"unpack_codes: {k} codes of {bits} bits need {packed_words(k, bits)} words, got {n_words}")
    lead = packed.shape[:-1]
    if 8 % bits == 0:
        return _unpack_bytes(packed, bits, k)
    words = packed.reshape(-1, n_words).to(torch.int64) & 0xFFFFFFFF
    words = torch.nn.functional.pad(words, (0, 1))
    word, shift = _field_positions(k, bits, packed.device)
    pair = words[:, word] | (words[:, word + 1] << 32)  # 64-bit window; bits above 40 are never read
    codes = (pair >> shift) & ((1 << bits) - 1)
    return codes.to(torch.uint8).reshape(*lead, k)


# Fast paths for 1, 2, 4 and 8 bits: fields never straddle a byte, and the little-endian stream's byte b is
# stream bits [8b, 8b + 8), so whole-byte operations suffice (multi-GB checkpoint layers repack in seconds).
def _pack_bytes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    per_byte = 8 // bits
    k = codes.shape[-1]
    codes = (codes.to(torch.uint8) & ((1 << bits) - 1)) if bits < 8 else codes.to(torch.uint8)
    codes = torch.nn.functional.pad(codes, (0, -k % per_byte))
    data = codes[..., 0::per_byte].clone()
    for i in range(1, per_byte):
        data |= codes[..., i::per_byte] << (bits * i)
    data = torch.nn.functional.pad(data, (0, -data.shape[-1] % 4))
    return data.contiguous().view(torch.int32)


def _unpack_bytes(packed: torch.Tensor, bits: int, k: int) -> torch.Tensor:
    per_byte = 8 // bits
    data = packed.contiguous().view(torch.uint8)
    fields = [(data >> (bits * i)) & ((1 << bits) - 1) for i in range(per_byte)]
    codes = torch.stack(fields, dim=-1).flatten(-2) if per_byte > 1 else data
    return codes[..., :k].contiguous()
