"""``cuda.grouped_decode``: the MoE grouped GEMM of the decode regime (routing blocks of 8 and 16 rows, which
``humming.moe.default_block_m`` takes while experts average at most 16 rows) on the decode kernel's grouped
variant (``include/humming/decode.cuh``, kGrouped), compute capability 8.0 and newer.

There the GEMM streams the used experts' weights once and the tokens are few, so it is the dense decode
kernel per used segment: a block takes ``r`` row tiles of one expert for one ``block_m``-row segment, its
warps split K, and the activations are read through the routing's row index in place (no copy of x). The
grid covers the segments a routing of this many rows can use at most (``moe_align`` puts the used ones
first), not the worst case's hundreds, and each block finds its used segments with one ballot per 32.
fused_moe's gated activation of w13 (SiLU, GELU, gpt-oss's clamped SwiGLU with bias, concatenated or
interleaved gate / up) runs in the epilogue. int4 / uint4 (+ zero points) / int8 / uint8 experts (groups of
32 with 16-bit scales too: Kimi-K2) and MXFP4, 16-bit activations.
"""

from __future__ import annotations

import weakref

import torch

from ..device import device_index, device_info, device_limits
from ..kernel import Kernel, LaunchesByWeight, always_gathers
from ..reference.align import max_slots
from . import _wna16
from ._decode_launch import DECODE_CCS, _Params, decode_spec
from ._decode_tuning import DecodeTuning
from ._driver import PackedLaunch, current_stream, get_kernel
from ._layout import DTYPE_CODE, PreparedWeight, aligned_rows, check_out, weight_layout, weight_unsupported
from ._support import runtime_unavailable
from .grouped import gated_unsupported
from .jit import per_call_cache

__all__ = [
    "BLOCK_MS",
    "KERNEL",
    "GroupedDecodeLaunch",
    "gated_decode_unsupported",
    "grouped_decode_tuning",
    "grouped_linear",
    "segment_grid",
    "unsupported",
]

#: The routing blocks the kernel takes: one unit of ``block_m`` rows is its token tile (``mt = block_m / 8``);
#: from 32 rows on, the sm_90a grouped GEMM's tiles.
BLOCK_MS = (8, 16)

#: Launches made ready, per weight and kind of call (shape, dtypes, gather, gate).
_launches = LaunchesByWeight()


def unsupported(qweight, act, x: torch.Tensor, block_m: int) -> str | None:
    """``None`` when the kernel runs ``grouped_linear(x, qweight, ..., block_m, act=act)``, else why not.
    ``x``: the grouped rows ``[M_pad, K]``, or the tokens a gathering call reads."""
    if act is not None:
        return f"the grouped decode kernel takes 16-bit activations, not act={act.name}"
    if qweight.num_experts is None:
        return "the grouped decode kernel needs expert-stacked weights [E, N, K]"
    if x.device.type != "cuda":
        return f"x is on {x.device}, not a CUDA device"
    cc = device_info(x.device).capability
    if cc not in DECODE_CCS:
        return f"the CUDA kernels are built for compute capabilities {DECODE_CCS}, not {cc}"
    if block_m not in BLOCK_MS:
        return f"the grouped decode kernel takes routing blocks of {BLOCK_MS} rows (decode), got block_m={block_m}"
    return weight_unsupported(qweight, x)


@per_call_cache
def grouped_decode_tuning(block_m: int, n: int, k: int, segments: int, sm_count: int) -> DecodeTuning:
    """One token tile per routing block; 4 row tiles and 2 warps per block, or 4 warps where the grid's
    ``segments`` would give the GPU fewer than 16 warps per SM, and 2 row tiles where even that gives fewer
    than 6; 3 stages (4 with two token tiles). Fewer warps per block let more blocks share an SM, each
    splitting K less; the rule follows the best variants of the sweep over row tiles, warps and stages on
    the MoE presets' decode shapes (bench/results/h200/grouped_decode.json, ``default`` marks its choice)."""
    r = next((r for r in (4, 2) if n % (16 * r) == 0), 1)
    warps = 2 if (n // (16 * r)) * segments * 2 >= 16 * sm_count else 4
    if r == 4 and (n // 64) * segments * warps < 6 * sm_count:
        r = 2
    return DecodeTuning(block_m // 8, r, warps, 3 if block_m == 8 else 4, 1)


def segment_grid(m_pad: int, block_m: int, num_experts: int) -> int:
    """Segments the grid covers (its y extent): how many a ``moe_align`` routing of ``m_pad`` grouped rows
    uses at most (its routed slots are at most ``max_slots``, each used expert pads its last segment); at
    most 65535 (the kernel loops over the rest)."""
    slots = max_slots(m_pad, num_experts, block_m)
    segments = min(m_pad // block_m, -(-(slots + min(num_experts, slots) * (block_m - 1)) // block_m))
    return max(1, min(segments, 65535))


class GroupedDecodeLaunch:
    """One kind of grouped call made ready: ``m_pad`` grouped rows in routing blocks of ``block_m``, x of
    ``x_dtype`` with rows ``x_stride`` elements apart (16-byte aligned), ``gather`` (x is the tokens, read
    through the call's ``rows``) or not, ``gated`` (a ``humming.reference.moe_layer.Activation``: ``prep``
    holds w13 in gate-up order and the result is ``[m_pad, N / 2]``) or not, a bias of ``bias_dtype``
    (``None``: none). Holds the loaded kernel, the grid and the parameter struct."""

    def __init__(
        self,
        prep: PreparedWeight,
        m_pad: int,
        x_dtype: torch.dtype,
        x_stride: int,
        bias_dtype: torch.dtype | None,
        out_dtype: torch.dtype,
        tuning: DecodeTuning | None,
        device: int,
        block_m: int,
        gather: bool,
        gated=None,
        programmatic: bool = True,
    ) -> None:
        n, k = prep.n, prep.k
        segments = segment_grid(m_pad, block_m, prep.num_experts)
        if tuning is None:
            tuning = grouped_decode_tuning(block_m, n, k, segments, device_limits(device).sm_count)
        if tuning.mt * 8 != block_m or n % (16 * tuning.r) or tuning.splits != 1 or tuning.stream_k:
            raise ValueError(
                f"tuning: expected mt = block_m / 8 = {block_m // 8}, r dividing N / 16, one split, got {tuning}"
            )
        bias_code = DTYPE_CODE[bias_dtype if bias_dtype is not None else x_dtype]
        codes = DTYPE_CODE[x_dtype], DTYPE_CODE[out_dtype], bias_code
        spec = decode_spec(prep.layout, *codes, tuning, True, None if gated is None else gated.name)
        self.kernel = get_kernel(spec, device)
        self.prep = prep  # the parameter struct holds its tensors' addresses
        self.m, self.out_dtype, self.device, self.gather = m_pad, out_dtype, device, gather
        self.n = n // 2 if gated is not None else n  # the output's columns
        self.torch_device = torch.device("cuda", device)
        self.grid = (n // (16 * tuning.r), segments, 1)
        self.packed = PackedLaunch(
            self.kernel,
            self.grid,
            tuning.smem_bytes(prep.layout.bits),
            _Params(
                qweight=prep.qweight.data_ptr(),
                scales=prep.scales.data_ptr(),
                zeros=prep.zeros.data_ptr() if prep.zeros is not None else None,
                M=m_pad,
                N=n,
                K=k,
                x_stride=x_stride,
                groups=prep.groups,
                group_shift=31 if prep.groups == 1 else prep.chunks_per_group.bit_length() - 1,
                chunks_per_split=k // 64,
                tile_group=prep.tile_group,
                block_m=block_m,
                act_alpha=1.0 if gated is None or gated.alpha is None else gated.alpha,
                act_limit=1.0 if gated is None or gated.limit is None else gated.limit,
                gate_up_interleaved=int(gated is not None and gated.gate_up_layout == "interleaved"),
                num_experts=prep.num_experts,
            ),
            programmatic,  # the kernel waits for the one before it before reading anything
        )

    def __call__(
        self,
        x: torch.Tensor,
        bias: torch.Tensor | None,
        expert_ids: torch.Tensor,
        rows: torch.Tensor | None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The grouped GEMM of ``x`` (grouped rows, or the tokens read through ``rows``), ``expert_ids`` and
        ``rows`` int32 contiguous, ``bias`` ``[E, N]`` contiguous or ``None``, into ``out`` (``[M_pad, N]`` of
        the output dtype, unit column stride) or a new tensor; rows of unused segments are not written."""
        if out is None:
            out = torch.empty((self.m, self.n), dtype=self.out_dtype, device=self.torch_device)
        else:
            check_out(out, self.m, self.n, self.out_dtype)
        if self.m == 0:
            return out
        packed = self.packed
        with packed.lock:
            params = packed.params
            params.x, params.out, params.out_stride = x.data_ptr(), out.data_ptr(), out.stride(0)
            params.rows = rows.data_ptr() if self.gather else None
            params.expert_ids = expert_ids.data_ptr()
            params.bias = None if bias is None else bias.data_ptr()
            packed(current_stream(self.device))
        return out


def gated_decode_unsupported(qweight, activation) -> str | None:
    """``None`` when the kernel applies ``activation`` to w13 = ``qweight`` in its epilogue (as the sm_90a
    grouped GEMM: :func:`~.grouped.gated_unsupported`; w13's rows reordered in 128-row blocks)."""
    if qweight.N % 128:
        return f"the gated epilogue reorders w13's rows in blocks of 128: it needs 2I % 128 == 0, got {qweight.N}"
    return gated_unsupported(qweight, activation)


def _prepared(qweight, gated) -> PreparedWeight:
    return _wna16.prepare(qweight) if gated is None else _wna16.prepare_gate_up(qweight, gated.gate_up_layout)


def launcher(
    x,
    qweight,
    act,
    block_m: int,
    m_pad: int,
    bias_dtype,
    out_dtype,
    tuning,
    gather: bool,
    gated=None,
    programmatic=True,
):
    """The kernel's :attr:`humming.kernel.Kernel.launcher`: ``(x, expert_ids, bias, rows) -> out`` for every
    call of :func:`grouped_linear` shaped as this one, checked once, its launch made ready. ``expert_ids``
    and ``rows`` contiguous, ``bias`` contiguous or ``None``."""
    reason = unsupported(qweight, act, x, block_m)
    if reason is None and gated is not None:
        reason = gated_decode_unsupported(qweight, gated)
    if reason is not None:
        raise ValueError(f"humming CUDA backend: {reason}")
    if gather and x.shape[0] == 0:  # no token to read: the general path (the weight held weakly, as launches are)
        weight = weakref.ref(qweight)
        return lambda x, ids, bias, rows: grouped_linear(x, weight(), ids, block_m, bias, out_dtype, rows, gated)
    prep = _prepared(qweight, gated)
    aligned = aligned_rows(x)  # the rows the kernel reads (a copy of unaligned ones)
    copy, stride, device = aligned is not x, aligned.stride(0), device_index(x.device)
    kind = (m_pad, x.dtype, stride, bias_dtype, out_dtype, tuning, device, block_m, gather, gated, programmatic)
    launch = _launches.get(qweight, kind, lambda: GroupedDecodeLaunch(prep, *kind))

    def run(x, expert_ids, bias, rows):
        bias = None if bias is None else bias.contiguous()
        return launch(aligned_rows(x) if copy else x, bias, expert_ids, rows)

    return run


def grouped_linear(
    x: torch.Tensor,
    qweight,
    expert_ids: torch.Tensor,
    block_m: int,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    rows: torch.Tensor | None = None,
    gated=None,
    tuning: DecodeTuning | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x [M_pad, K]`` grouped by expert (or, with ``rows``, the tokens ``[T, K]`` read through the int32
    ``[M_pad]`` row index, -1 = padding) -> ``[M_pad, N]`` of ``out_dtype``: row ``r`` is ``x[r] @
    dequantize(qweight)[e]^T + bias[e]``, ``e = expert_ids[r // block_m]``; rows of segments whose id is outside
    ``[0, E)`` are not written. Ids and rows are not checked on the GPU. ``gated``: fused_moe's activation of w13 =
    ``qweight``, the result ``[M_pad, N / 2]``. ``out``: where to write it (unit column stride), or ``None``."""
    reason = unsupported(qweight, None, x, block_m)
    if reason is None and gated is not None:
        reason = gated_decode_unsupported(qweight, gated)
    if reason is not None:
        raise ValueError(f"humming CUDA backend: {reason}")
    m_pad = x.shape[0] if rows is None else rows.shape[0]
    e, n, device = qweight.num_experts, qweight.N, x.device
    for name, t, shape in (("expert_ids", expert_ids, (m_pad // block_m,)), ("rows", rows, (m_pad,))):
        if t is not None and (t.dtype != torch.int32 or tuple(t.shape) != shape or t.device != device):
            raise ValueError(
                f"{name}: expected int32 {shape} on {device}, got {t.dtype} {tuple(t.shape)} on {t.device}"
            )
    if m_pad % block_m:
        raise ValueError(f"x: M_pad={m_pad} grouped rows are not a multiple of block_m={block_m}")
    if bias is not None and (tuple(bias.shape) != (e, n) or bias.device != device):
        raise ValueError(f"bias: expected shape ({e}, {n}) on {device}, got {tuple(bias.shape)} on {bias.device}")
    if rows is not None and x.shape[0] == 0:  # no token to read: every grouped row is padding
        x, rows = x.new_zeros(m_pad, x.shape[1]), None
    x = aligned_rows(x)
    bias = None if bias is None else bias.contiguous()
    rows = None if rows is None else rows.contiguous()
    bias_dtype = None if bias is None else bias.dtype
    kind = (m_pad, x.dtype, x.stride(0), bias_dtype, out_dtype, tuning, device_index(device), block_m)
    kind += (rows is not None, gated)
    launch = _launches.get(qweight, kind, lambda: GroupedDecodeLaunch(_prepared(qweight, gated), *kind))
    return launch(x, bias, expert_ids.contiguous(), rows, out)


def _warmup_jobs(
    qweight, act, m, *, act_dtype, out_dtype, bias_dtype, device, block_m, gather=None, gated=None
) -> list:
    """The compile jobs of ``m`` grouped rows in routing blocks of ``block_m``: one kernel reads grouped rows
    and gathers token rows alike (``gather`` does not matter); ``gated``: its variant with fused_moe's
    activation of w13 = ``qweight`` in the epilogue (the rows reordered keep the weight's layout and N)."""
    from .jit import device_arch

    segments = segment_grid(m, block_m, qweight.num_experts)
    tuning = grouped_decode_tuning(block_m, qweight.N, qweight.K, segments, device_info(device).limits.sm_count)
    codes = DTYPE_CODE[act_dtype], DTYPE_CODE[out_dtype], DTYPE_CODE[bias_dtype or act_dtype]
    spec = decode_spec(weight_layout(qweight), *codes, tuning, True, None if gated is None else gated.name)
    return [(spec, device_arch(spec, device_info(device).capability))]


def _run(x, qweight, expert_ids, block_m, bias, act, out_dtype, tuning, rows=None, gated=None):
    if act is not None:
        raise ValueError(f"humming CUDA backend: {unsupported(qweight, act, x, block_m)}")
    return grouped_linear(x, qweight, expert_ids, block_m, bias, out_dtype, rows, gated, tuning)


#: ``cuda.grouped_decode``: the decode regime's grouped GEMM (routing blocks of 8 and 16 rows, sm_80+).
KERNEL = Kernel(
    "cuda.grouped_decode",
    "cuda",
    "fragment",
    lambda qweight, act, x, block_m: runtime_unavailable() or unsupported(qweight, act, x, block_m),
    _run,
    warmup_jobs=_warmup_jobs,
    prepare=lambda qweight, act=None: _wna16.prepare(qweight),
    gathers=always_gathers,
    gates=lambda qweight, x, activation: gated_decode_unsupported(qweight, activation) is None,
    launcher=launcher,
)
