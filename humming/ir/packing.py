"""The canonical packing of codes: a little-endian dense bit stream along K, in int32 words.

Element k of a row occupies stream bits ``[k*bits, (k+1)*bits)``; word w holds stream bits
``[32w, 32w + 32)``, bit 0 least significant. Fields may straddle two words (3, 5, 6, 7 bits). Each row is
zero-padded to a whole word. This is compressed-tensors' modern ``pack-quantized`` order, so the common
case converts without bit shuffling, and every bit width shares one rule.

Both directions work on runs of 8 codes, which fill exactly ``bits`` bytes of the stream (the stream is
little-endian, so byte b holds stream bits ``[8b, 8b + 8)``): whole-tensor integer operations, no scatter,
so multi-GB checkpoint layers repack in seconds.
"""

from __future__ import annotations

import torch

__all__ = ["cdiv", "msb_mask", "pack_codes", "packed_words", "unpack_codes"]


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for sizes (``b > 0``): how many ``b``-sized tiles, groups or words cover ``a``."""
    return -(-a // b)


def packed_words(k: int, bits: int) -> int:
    """Number of int32 words that hold ``k`` codes of ``bits`` bits."""
    return (k * bits + 31) // 32


def _check_bits(fn: str, bits: int) -> None:
    if not 1 <= bits <= 8:
        raise ValueError(f"{fn}: bits must be in 1..8, got {bits}")


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes ``[..., K]`` (values < 2^bits) -> int32 ``[..., ceil(K*bits/32)]``."""
    _check_bits("pack_codes", bits)
    if codes.dtype not in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
        raise ValueError(f"pack_codes: codes must be an integer tensor, got {codes.dtype}")
    k = codes.shape[-1]
    values = torch.nn.functional.pad(codes.to(torch.int64) & ((1 << bits) - 1), (0, -k % 8))
    runs = values.reshape(*values.shape[:-1], values.shape[-1] // 8, 8)  # [..., K/8, 8]: 8 codes = `bits` bytes
    run = (runs << (bits * torch.arange(8, device=codes.device))).sum(-1)  # disjoint fields: sum == or
    data = (run.unsqueeze(-1) >> (8 * torch.arange(bits, device=codes.device))) & 0xFF
    data = data.to(torch.uint8).flatten(-2)
    n_bytes = 4 * packed_words(k, bits)  # whole words; the runs' last bytes beyond them are zero padding
    out = torch.zeros(*data.shape[:-1], n_bytes, dtype=torch.uint8, device=codes.device)
    used = min(n_bytes, data.shape[-1])
    out[..., :used] = data[..., :used]
    return out.view(torch.int32)


def unpack_codes(packed: torch.Tensor, bits: int, k: int) -> torch.Tensor:
    """int32 ``[..., ceil(K*bits/32)]`` -> uint8 codes ``[..., K]`` (inverse of :func:`pack_codes`)."""
    _check_bits("unpack_codes", bits)
    if packed.dtype != torch.int32:
        raise ValueError(f"unpack_codes: packed must be int32, got {packed.dtype}")
    n_words = packed.shape[-1]
    if n_words != packed_words(k, bits):
        raise ValueError(f"unpack_codes: {k} codes of {bits} bits need {packed_words(k, bits)} words, got {n_words}")
    n_runs = -(-k // 8)
    data = packed.contiguous().view(torch.uint8)
    data = torch.nn.functional.pad(data, (0, n_runs * bits - data.shape[-1]))  # whole runs
    data = data.reshape(*data.shape[:-1], n_runs, bits).to(torch.int64)
    run = (data << (8 * torch.arange(bits, device=packed.device))).sum(-1)
    codes = (run.unsqueeze(-1) >> (bits * torch.arange(8, device=packed.device))) & ((1 << bits) - 1)
    return codes.to(torch.uint8).flatten(-2)[..., :k].contiguous()


def msb_mask(k: int, bits: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """int32 ``[ceil(k*bits/32)]``: the top bit of each of ``k`` packed fields set.

    XOR with it turns offset-binary fields (``q + 2^(bits-1)``) into two's complement (``q``) and back,
    in place of unpacking and repacking.
    """
    return pack_codes(torch.full((k,), 1 << (bits - 1), dtype=torch.uint8, device=device), bits)
