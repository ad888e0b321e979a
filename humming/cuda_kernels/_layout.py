"""The weight layout shared by humming's CUDA kernels ("fragment layout"), and ``prepare_weight``.

Both the decode kernel (mma.sync, A = weights) and the Hopper GEMM (wgmma with A from registers) read the
weights as m16n8k16 A fragments, so one re-tiling of a ``QuantizedWeight`` serves both:

- rows are cut into 16-row tiles, tiles into blocks of ``tile_group`` tiles (8 when N % 128 == 0, so a
  128-row GEMM tile is one contiguous run, else 1); K into 64-column chunks;
- ``qweight`` int32 ``[N/16/TG, K/64, TG, 32 lanes, 4 words]`` (4-bit) or ``[N/16/TG, K/64, TG, 2, 32, 4]``
  (8-bit): one 16-row x 64-column chunk is 512 (1024) contiguous bytes, lane ``l = 4 g + c`` holds its A
  fragments of the four k16 steps: step ``j``, fragment element ``a`` (0..7) is row ``g + 8 * (a // 2 % 2)``,
  column ``16 j + 8 * (a // 4) + 2 c + a % 2``. 4-bit: word ``j``, element ``a`` in nibble
  ``a // 2 + 4 * (a % 2)`` (a 16-bit pair per nibble pair ``i, i + 4``); 8-bit: words ``2 j`` (a0..a3) and
  ``2 j + 1`` (a4..a7), one byte each, in order;
- codes are offset binary (signed codes XOR ``2^(bits-1)``), so value = code - zero with a constant zero
  (``2^(bits-1)`` for signed formats, 0 for unsigned) or per-group zero points;
- ``scales`` ``[N/16/TG, groups, TG, 8, 2]``: per 16-row tile, rows ``g`` and ``g + 8`` side by side (f32,
  bf16 or f16; fp8 / e8m0 scales and a global scale are folded into exact f32); ``zeros`` the same, int16;
  integer codes in groups of 32 with 16-bit scales (scale ``"bf16_halves"`` / ``"f16_halves"``, no zero
  points): ``[N/16/TG, K/64, TG, 8, 2 halves, 2 rows]``, each chunk's two groups side by side, as MXFP4's;
- MXFP4 (``codes="e2m1"``, scale ``"e8m0"``): the e2m1 codes in the 4-bit fragments' words, each
  register's two codes at the bit positions of :data:`E2M1_BITS` (+ 16 for the high half) instead of in
  nibbles, so that the kernel turns most of them into bf16 bits with one shift and one mask; the e8m0
  scale bytes of the groups of 32 (scale ``"e8m0_any"`` when some code is 0 or 255, which the kernel
  then decodes exactly at some cost), ``[N/16/TG, K/64, TG, 8, 2, 2]`` uint8: per chunk, the (row ``g``,
  row ``g + 8``) pair of its first 32 columns, then that of its last 32 (``groups`` = K/64, one chunk per
  group);
- expert-stacked weights ``[E, N, K]`` are ``E * N`` rows, expert after expert: expert ``e``'s tile block
  ``b`` is block ``e * N / (16 TG) + b`` of every tensor above, exactly the dense layout of that expert.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..ir.dtypes import HALF_DTYPES

__all__ = [
    "CPP_DTYPE",
    "DTYPE_CODE",
    "E2M1_BITS",
    "GATED_ACTS",
    "PreparedWeight",
    "WeightLayout",
    "aligned_rows",
    "check_out",
    "gate_up_rows",
    "half_chunk_groups",
    "layout_unsupported",
    "prepare_weight",
    "rows_aligned",
    "tile_group",
    "weight_layout",
    "weight_unsupported",
    "x_scale_args",
    "x_scale_stride",
]

DTYPE_CODE = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
#: Dtype codes -> the ``humming::DType`` values (types.cuh) kernel specs are instantiated with.
CPP_DTYPE = {
    code: f"humming::DType::{code}" for code in ("f32", "bf16", "f16", "e8m0", "e8m0_any", "bf16_halves", "f16_halves")
}
#: The gated activations of the grouped kernels' fused w13 epilogues, by name -> ``humming::Act`` (common.cuh).
GATED_ACTS = {"silu": 1, "gelu": 2, "gelu_tanh": 3, "swiglu_oai": 4}


@dataclass(frozen=True)
class WeightLayout:
    """What the prepared weights are: ``bits`` (4 or 8), ``zero`` (the constant zero point in code units,
    or ``-1`` for per-group zero points), ``scale`` dtype code, ``codes``: ``"int"`` (offset-binary
    integers) or ``"e2m1"`` (MXFP4, scales per 32 columns)."""

    bits: int
    zero: int
    scale: str
    codes: str = "int"

    @property
    def tag(self) -> str:
        """The codes in kernel names: ``e2m1``, or ``u<bits>`` with ``zp`` (zero points) or ``z<zero>``."""
        if self.codes == "e2m1":
            return "e2m1"
        return f"u{self.bits}" + ("zp" if self.zero < 0 else f"z{self.zero}")


@dataclass(frozen=True)
class PreparedWeight:
    """A ``QuantizedWeight`` in the fragment layout (module docstring); built once per weight. ``n`` is the
    rows of one expert; ``num_experts`` is 1 for a dense weight."""

    layout: WeightLayout
    n: int
    k: int
    groups: int
    chunks_per_group: int
    tile_group: int
    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    num_experts: int = 1

    @property
    def nbytes(self) -> int:
        tensors = [self.qweight, self.scales] + ([self.zeros] if self.zeros is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors)


def x_scale_stride(count: int, m: int) -> int:
    """The kernels' ``x_scale_stride`` for ``count`` activation scales of ``m`` tokens: 1 per token, 0 per tensor."""
    return 1 if count == m and m > 1 else 0


def x_scale_args(x_scale: torch.Tensor | None, m: int) -> tuple[int | None, int]:
    """(pointer, stride) of the kernels' ``x_scale`` parameter: fp32 activation scales, one per token
    (``[M]`` or ``[M, 1]``) or one per tensor (any single element), or ``None``."""
    if x_scale is None:
        return None, 0
    if x_scale.dtype != torch.float32 or x_scale.numel() not in (1, m) or not x_scale.is_contiguous():
        raise ValueError(
            f"x_scale: expected a contiguous float32 tensor of {m} or 1 elements, got {x_scale.dtype} "
            f"{tuple(x_scale.shape)}"
        )
    return x_scale.data_ptr(), x_scale_stride(x_scale.numel(), m)


def check_out(out: torch.Tensor, m: int, n: int, dtype: torch.dtype) -> None:
    """Raise ValueError unless ``out`` is what the weight-only kernels write: ``[m, n]`` of ``dtype`` with unit
    column stride."""
    if tuple(out.shape) != (m, n) or out.dtype != dtype or out.stride(1) != 1:
        raise ValueError(
            f"out: expected a [{m}, {n}] {dtype} tensor with unit column stride, got {out.dtype}"
            f" {tuple(out.shape)} with strides {out.stride()}"
        )


def rows_aligned(x: torch.Tensor) -> bool:
    """Whether ``x [M, K]`` (16-bit) is as the kernels read activations: unit column stride, rows a multiple
    of 16 bytes apart from a 16-byte aligned start."""
    return x.stride(1) == 1 and x.stride(0) % 8 == 0 and x.data_ptr() % 16 == 0


def aligned_rows(x: torch.Tensor) -> torch.Tensor:
    """``x``, or a contiguous copy when :func:`rows_aligned` is false (``contiguous()`` would keep a
    misaligned start)."""
    return x if rows_aligned(x) else x.clone(memory_format=torch.contiguous_format)


def tile_group(n: int) -> int:
    """16-row tiles per contiguous block: 8 when ``n % 128 == 0``, else 1."""
    return 8 if n % 128 == 0 else 1


def _tile_rows(t: torch.Tensor, tg: int) -> torch.Tensor:
    """``[N, G]`` -> ``[N/16/TG, G, TG, 8, 2]``."""
    n, g = t.shape
    return t.reshape(n // (16 * tg), tg, 2, 8, g).permute(0, 4, 1, 3, 2).contiguous()


def _tile_rows_halves(t: torch.Tensor, tg: int) -> torch.Tensor:
    """``[N, K/32]`` (two groups per 64-column chunk) -> ``[N/16/TG, K/64, TG, 8, 2 halves, 2 rows]``."""
    n, g = t.shape
    return t.reshape(n // (16 * tg), tg, 2, 8, g // 2, 2).permute(0, 4, 1, 3, 5, 2).contiguous()


#: Word bit of bit b (mantissa, exponent low, exponent high, sign) of the low-half code of register i;
#: registers 0-2 are the bf16 positions (6, 7, 8, 15) shifted down by 0, 3 and 6, register 3 takes the rest.
E2M1_BITS = ((6, 7, 8, 15), (3, 4, 5, 12), (0, 1, 2, 9), (10, 11, 13, 14))


def _e2m1_placed() -> torch.Tensor:
    """int64 [4 registers, 16 codes]: the low-half word bits of each code in each register."""
    codes = torch.arange(16)
    return torch.stack([sum(((codes >> b) & 1) << pos for b, pos in enumerate(bits)) for bits in E2M1_BITS])


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    return (words - ((words >= 2**31).to(torch.int64) << 32)).to(torch.int32)


def _pack_4bit(u: torch.Tensor, tg: int, e2m1: bool = False) -> torch.Tensor:
    n, k = u.shape
    # n = blk*16TG + t*16 + h*8 + g;  k = chunk*64 + j*16 + hk*8 + c*2 + e
    v = u.to(torch.int64).reshape(n // (16 * tg), tg, 2, 8, k // 64, 4, 2, 4, 2)
    v = v.permute(0, 4, 1, 3, 7, 5, 6, 2, 8)  # [blk, chunk, t, g, c, j, hk, h, e]; register i = 2 hk + h
    ar = torch.arange(2, device=u.device)
    if e2m1:
        half = 16 * ar.view(1, 1, 2)  # [hk, h, e]
        reg = 2 * ar.view(2, 1, 1) + ar.view(1, 2, 1)  # [hk, h, 1]
        words = (_e2m1_placed().to(u.device).flatten()[16 * reg + v] << half).sum(dim=(-3, -2, -1))
    else:
        nibble = ar.view(2, 1, 1) * 2 + ar.view(1, 2, 1) + 4 * ar.view(1, 1, 2)  # [hk, h, e]
        words = (v << (4 * nibble)).sum(dim=(-3, -2, -1))  # [blk, chunk, t, g, c, j]
    return _to_int32(words.reshape(n // (16 * tg), k // 64, tg, 32, 4))


def _pack_8bit(u: torch.Tensor, tg: int) -> torch.Tensor:
    n, k = u.shape
    v = u.to(torch.int64).reshape(n // (16 * tg), tg, 2, 8, k // 64, 2, 2, 2, 4, 2)
    v = v.permute(0, 4, 1, 5, 3, 8, 6, 7, 2, 9)  # [blk, chunk, t, jh, g, c, jl, hk, h, e]
    ar = torch.arange(2, device=u.device)
    byte = ar.view(2, 1) * 2 + ar.view(1, 2)  # [h, e]
    words = (v << (8 * byte)).sum(dim=(-2, -1))  # [blk, chunk, t, jh, g, c, jl, hk]
    return _to_int32(words.reshape(n // (16 * tg), k // 64, tg, 2, 32, 4))


#: Codes re-tiled per step: the unpacked codes and the packers' int64 temporaries (about 30 bytes per code in
#: all) stay near a quarter of a gigabyte whatever the weight, under a tenth of a DeepSeek-V3 w2's int4 bytes
#: (1.8 GB), so that preparing a whole MoE layer needs little more memory than its result, in steps few enough
#: that their torch ops' launches do not dominate.
_CODES_PER_STEP = 1 << 23


def _step_rows(k: int, tg: int) -> int:
    """Rows per step of :func:`_retile_codes` and :func:`restore_codes`: whole tile blocks (the row blocks are
    independent), about :data:`_CODES_PER_STEP` codes."""
    return max(1, _CODES_PER_STEP // (k * 16 * tg)) * 16 * tg


def _retile_codes(qw, tg: int, pack, flip: int = 0, rows: torch.Tensor | None = None) -> torch.Tensor:
    """``pack`` (``_pack_4bit`` / ``_pack_8bit`` / MXFP4) of every row of ``qw`` (experts stacked along rows),
    ``flip`` XOR-ed into each code, one step of rows at a time into one preallocated result; ``rows``: each
    expert's rows in this order (:func:`prepare_weight`), gathered step by step."""
    from humming.ir import unpack_codes

    rows_total, k = (qw.num_experts or 1) * qw.N, qw.K
    words = qw.qweight.reshape(rows_total, -1)
    step = _step_rows(k, tg)
    out = None
    for r0 in range(0, rows_total, step):
        count = min(step, rows_total - r0)
        part = words[r0 : r0 + count] if rows is None else words[_source_rows(r0, count, qw.N, rows)]
        codes = unpack_codes(part, qw.bits, k)
        part = pack(codes ^ flip if flip else codes, tg)
        if out is None:
            out = torch.empty(rows_total // (16 * tg), *part.shape[1:], dtype=part.dtype, device=part.device)
        out[r0 // (16 * tg) : r0 // (16 * tg) + part.shape[0]] = part
    return out


def _source_rows(r0: int, count: int, n: int, rows: torch.Tensor) -> torch.Tensor:
    """Rows ``r0 .. r0 + count`` (experts stacked, ``n`` rows each) of the weight whose experts are reordered
    by ``rows``: their rows in the stacked weight."""
    at = torch.arange(r0, r0 + count, device=rows.device)
    return rows[at % n] + at // n * n


def _unpack_4bit(words: torch.Tensor, tg: int, e2m1: bool = False) -> torch.Tensor:
    """Inverse of :func:`_pack_4bit`: int32 ``[blocks, K/64, TG, 32, 4]`` -> codes ``[blocks * 16 TG, K]``."""
    blocks, chunks = words.shape[:2]
    w = (words.to(torch.int64) & 0xFFFFFFFF).reshape(blocks, chunks, tg, 8, 4, 4)  # [blk, chunk, t, g, c, j]
    ar = torch.arange(2, device=words.device)
    if e2m1:  # code bit b of register 2 hk + h, half e: word bit E2M1_BITS[2 hk + h][b] + 16 e
        at = torch.tensor(E2M1_BITS, device=words.device).view(2, 2, 1, 4) + 16 * ar.view(1, 1, 2, 1)
        placed = (w[..., None, None, None, None] >> at) & 1  # [..., hk, h, e, b]
        codes = (placed << torch.arange(4, device=words.device)).sum(-1)
    else:
        nibble = ar.view(2, 1, 1) * 2 + ar.view(1, 2, 1) + 4 * ar.view(1, 1, 2)  # [hk, h, e]
        codes = (w[..., None, None, None] >> (4 * nibble)) & 15
    # [blk, chunk, t, g, c, j, hk, h, e] -> [blk, t, h, g, chunk, j, hk, c, e]
    codes = codes.permute(0, 2, 7, 3, 1, 5, 6, 4, 8)
    return codes.reshape(blocks * 16 * tg, chunks * 64).to(torch.uint8)


def _unpack_8bit(words: torch.Tensor, tg: int) -> torch.Tensor:
    """Inverse of :func:`_pack_8bit`: int32 ``[blocks, K/64, TG, 2, 32, 4]`` -> codes ``[blocks * 16 TG, K]``."""
    blocks, chunks = words.shape[:2]
    w = (words.to(torch.int64) & 0xFFFFFFFF).reshape(blocks, chunks, tg, 2, 8, 4, 2, 2)
    ar = torch.arange(2, device=words.device)
    byte = ar.view(2, 1) * 2 + ar.view(1, 2)  # [h, e]
    codes = (w[..., None, None] >> (8 * byte)) & 0xFF  # [blk, chunk, t, jh, g, c, jl, hk, h, e]
    # -> [blk, t, h, g, chunk, jh, jl, hk, c, e]
    codes = codes.permute(0, 2, 8, 4, 1, 3, 6, 7, 5, 9)
    return codes.reshape(blocks * 16 * tg, chunks * 64).to(torch.uint8)


def restore_codes(prep: PreparedWeight, rows: torch.Tensor | None = None) -> torch.Tensor:
    """The IR's packed codes (int32 ``[E * N, words]``, experts stacked) of the weight ``prep`` was made
    from: :func:`prepare_weight`'s re-tiling undone, exact, a step of rows at a time; ``rows``: the row order
    ``prep`` was made with."""
    from humming.ir import pack_codes, packed_words

    bits, tg, k = prep.layout.bits, prep.tile_group, prep.k
    rows_total = prep.num_experts * prep.n
    e2m1 = prep.layout.codes == "e2m1"
    flip = max(prep.layout.zero, 0) if not e2m1 else 0  # signed codes were stored offset binary
    out = torch.empty(rows_total, packed_words(k, bits), dtype=torch.int32, device=prep.qweight.device)
    step = _step_rows(k, tg) // (16 * tg)  # tile blocks
    for b0 in range(0, prep.qweight.shape[0], step):
        part = prep.qweight[b0 : b0 + step]
        codes = _unpack_4bit(part, tg, e2m1) if bits == 4 else _unpack_8bit(part, tg)
        r0 = b0 * 16 * tg
        target = slice(r0, r0 + codes.shape[0]) if rows is None else _source_rows(r0, codes.shape[0], prep.n, rows)
        out[target] = pack_codes(codes ^ flip if flip else codes, bits)
    return out


def weight_layout(qw) -> WeightLayout:
    """The :class:`WeightLayout` :func:`prepare_weight` gives ``qw`` (what the kernels are specialised on),
    without re-tiling it: codes, constant or per-group zero point, and the scales' dtype in the kernel
    (fp32 for fp8 / e8m0 scales and with a global scale; MXFP4: e8m0, or ``e8m0_any`` where a scale code
    is 0 (2^-127) or 255 (NaN), which need the kernel's exact decode)."""
    reason = layout_unsupported(qw)
    if reason is not None:
        raise ValueError(f"qweight: {reason}")
    if qw.format.name == "e2m1":
        codes = qw.scales.view(torch.uint8)
        special = bool(((codes == 0) | (codes == 255)).any())
        return WeightLayout(4, 0, "e8m0_any" if special else "e8m0", "e2m1")
    if qw.zeros is not None:
        zero = -1
    else:
        zero = 1 << (qw.bits - 1) if qw.format.signed else 0
    if half_chunk_groups(qw):
        return WeightLayout(qw.bits, zero, DTYPE_CODE[qw.scales.dtype] + "_halves")
    if qw.scales is None or qw.global_scale is not None or qw.scales.dtype not in DTYPE_CODE:
        return WeightLayout(qw.bits, zero, "f32")
    return WeightLayout(qw.bits, zero, DTYPE_CODE[qw.scales.dtype])


def prepare_weight(qw, rows: torch.Tensor | None = None) -> PreparedWeight:
    """Re-tile an int4 / uint4 / int8 / uint8 / MXFP4 ``QuantizedWeight`` ``[N, K]`` or ``[E, N, K]`` with
    N % 16 == 0 and K % 64 == 0, a step of rows at a time (:data:`_CODES_PER_STEP`); any other weight is a
    ``ValueError`` saying why (:func:`layout_unsupported`). ``rows``: a permutation of ``range(N)``, row ``j``
    of each expert's result being its row ``rows[j]`` (gathered step by step: no reordered copy of the
    weight is made)."""
    layout = weight_layout(qw)
    n, k, bits = qw.N, qw.K, qw.bits
    experts = qw.num_experts or 1
    tg = tile_group(n)
    if rows is not None:
        rows = rows.to(device=qw.device, dtype=torch.long)

    def per_row(t: torch.Tensor, cols: int) -> torch.Tensor:  # [*lead, N or 1, cols] -> [*lead, N, cols], by rows
        t = t.expand(*qw.lead, n, cols)
        return t if rows is None else t[..., rows, :]

    if qw.format.name == "e2m1":
        scales = per_row(qw.scales, k // 32).reshape(experts * n, k // 32).view(torch.uint8)
        packed = _retile_codes(qw, tg, lambda codes, tg: _pack_4bit(codes, tg, e2m1=True), rows=rows)
        return PreparedWeight(layout, n, k, k // 64, 1, tg, packed, _tile_rows_halves(scales, tg), None, experts)
    flip = 1 << (bits - 1) if qw.format.signed else 0  # two's complement -> offset binary: code' - 2^(bits-1)
    if half_chunk_groups(qw):  # 16-bit scales of 32-column groups, each chunk's two side by side
        scales = per_row(qw.scales, k // 32).reshape(experts * n, k // 32)
        packed = _retile_codes(qw, tg, _pack_4bit if bits == 4 else _pack_8bit, flip, rows)
        return PreparedWeight(layout, n, k, k // 64, 1, tg, packed, _tile_rows_halves(scales, tg), None, experts)
    groups = 1 if qw.scales is None else qw.scales.shape[-1]
    zeros = None
    if qw.zeros is not None:
        zeros = per_row(qw.zeros.to(torch.int32), groups).reshape(experts * n, groups)
        zeros = _tile_rows(zeros.to(torch.int16), tg)
    if qw.scales is None:
        scales = torch.ones(experts * n, 1, dtype=torch.float32, device=qw.device)
    else:
        scales = per_row(qw.scales, groups)
        if qw.global_scale is not None or scales.dtype not in DTYPE_CODE:
            scales = scales.to(torch.float32)  # fp8 / e8m0 scales are exact in fp32
            if qw.global_scale is not None:
                g = qw.global_scale.to(torch.float32)
                scales = scales * (g.reshape(*g.shape, 1, 1) if g.dim() else g)
        scales = scales.reshape(experts * n, groups)
    packed = _retile_codes(qw, tg, _pack_4bit if bits == 4 else _pack_8bit, flip, rows)
    chunks_per_group = (qw.group_size if qw.layout == "group" else k) // 64
    return PreparedWeight(layout, n, k, groups, chunks_per_group, tg, packed, _tile_rows(scales, tg), zeros, experts)


def gate_up_rows(two_i: int, gate_up_layout: str) -> torch.Tensor:
    """The row order of w13 ``[E, 2I, K]`` for the grouped GEMM's gated epilogue: row ``j`` of the reordered
    weight is row ``rows[j]`` of w13. In each 16-row tile (a consumer warp's rows) rows ``g < 8`` are the
    gates and rows ``8 + g`` the ups of 8 consecutive features, so one thread holds a feature's gate and up;
    features ``f`` of 128-row block ``b`` are ``64 b .. 64 b + 63``. ``gate_up_layout``: ``"concat"`` (gate
    ``f`` at row ``f``, up at ``I + f``) or ``"interleaved"`` (``2f`` and ``2f + 1``). ``2I % 128 == 0``."""
    if two_i % 128:
        raise ValueError(f"w13: the gated epilogue needs 2I % 128 == 0, got 2I={two_i}")
    inter = two_i // 2
    features = torch.arange(inter).reshape(-1, 8)
    if gate_up_layout == "interleaved":
        gate, up = 2 * features, 2 * features + 1
    else:
        gate, up = features, inter + features
    return torch.stack((gate, up), dim=1).reshape(-1)


def half_chunk_groups(qw) -> bool:
    """Whether ``qw`` has integer codes in groups of 32 columns (two scales per 64-column chunk: scale codes
    ``bf16_halves`` / ``f16_halves``, in the layout the decode kernel and the sm_90a GEMM read)."""
    return qw.format.name != "e2m1" and qw.layout == "group" and qw.group_size == 32


def weight_unsupported(qw, x: torch.Tensor) -> str | None:
    """``None`` when the fragment layout holds ``qw`` and the kernels take ``x``'s dtype, else why not."""
    if x.dtype not in HALF_DTYPES:
        return f"the CUDA kernels take bfloat16 or float16 activations, not {x.dtype}"
    return layout_unsupported(qw)


def layout_unsupported(qw) -> str | None:
    """``None`` when the fragment layout holds ``qw``, else why not."""
    if qw.format.name not in ("int4", "uint4", "int8", "uint8", "e2m1"):
        return f"the CUDA kernels take int4/uint4/int8/uint8/MXFP4 weights, not {qw.format.name}"
    if qw.N % 16 or qw.K % 64:
        return f"the CUDA kernels need N % 16 == 0 and K % 64 == 0, got N={qw.N}, K={qw.K}"
    if qw.g_idx is not None:
        return "the CUDA kernels have no act-order (g_idx) support"
    if qw.format.name == "e2m1":
        mx = qw.layout == "group" and qw.group_size == 32 and qw.scales.dtype == torch.float8_e8m0fnu
        if not mx or qw.global_scale is not None or qw.zeros is not None:
            return f"the CUDA kernels take e2m1 weights as MXFP4 (e8m0 scales per 32), not {qw.describe()}"
        return None
    if qw.layout == "block":
        return f"the CUDA kernels take per-tensor, per-channel or per-group scales, not {qw.describe()}"
    if qw.layout == "group" and qw.group_size == 32:
        if qw.scales.dtype not in HALF_DTYPES or qw.global_scale is not None or qw.zeros is not None:
            detail = "16-bit scales, no global scale or zero points"
            return f"the CUDA kernels take groups of 32 with {detail}, not {qw.describe()}"
        return None
    if qw.layout == "group" and (qw.group_size % 64 or (qw.group_size // 64) & (qw.group_size // 64 - 1)):
        return f"the CUDA kernels need a group size of 32, or 64 times a power of two, got {qw.group_size}"
    if qw.zeros is not None and qw.zeros.is_floating_point():
        return "the CUDA kernels take integer zero points only"
    return None
