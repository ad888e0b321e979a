"""The grouped (MoE) variant of the Hopper FP8 GEMM (``fp8_gemm.run_grouped``) on an sm_90 GPU.

Operands are built directly in the IR (random non-NaN e4m3 / int4 codes, random scales), as in
``test_cuda_fp8.py``; the reference is float64 ``humming.dequantize`` of each expert times
``humming.dequantize_activation`` of the activations the kernel consumed. Padding rows of the grouped
layout hold NaN codes and infinite scales: they must not reach valid rows. Outputs are NaN-poisoned; rows of
skipped (-1) segments must stay NaN. CPU checks (compile, SASS, layout, reasons) live in ``test_cuda_fp8.py``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
import torch
from helpers import assert_rel_close, capture

import humming
from humming.cuda_kernels import fp8_gemm
from humming.cuda_kernels._warmup import warmup_specs
from humming.ir.activation import get_act_scheme
from humming.ir.layout import parse_group_size
from humming.moe import expert_weight
from humming.testing import random_codes

pytestmark = pytest.mark.gpu


@dataclass(frozen=True)
class Case:
    e: int
    n: int
    k: int
    block_m: int
    weight: object  # group_size: "tensor", -1 (per-channel), 128 (int4 groups), 32 (MXFP4) or a (bn, bk) block
    act: str
    out: torch.dtype = torch.bfloat16
    bias: torch.dtype | None = None
    w: str = "e4m3"
    mx_shift: int = 0  # MXFP4: expert 0's second 128-K block this many binades up (rows past 12: folded per block)


CASES = [
    Case(8, 4096, 7168, 64, -1, "fp8", bias=torch.bfloat16),
    Case(8, 4096, 7168, 128, (128, 128), "fp8_g128"),
    Case(64, 2816, 2048, 16, (128, 128), "fp8_g128", torch.float16, torch.float32),
    Case(64, 2816, 2048, 32, "tensor", "fp8"),
    Case(64, 4096, 2048, 128, (128, 128), "fp8_g128", torch.float32),
    Case(8, 2816, 2048, 16, 128, "fp8", w="int4"),
    Case(8, 2816, 7168, 64, -1, "fp8", torch.float16, torch.float16, w="int4"),
    Case(8, 2816, 2048, 16, 32, "fp8", w="mxfp4"),
    Case(4, 5760, 2880, 64, 32, "fp8", torch.float16, torch.bfloat16, w="mxfp4"),  # gpt-oss-120b's up projection
    # N % 128 != 0: experts stacked N rounded up to 128 rows apart (gpt-oss-120b's down projection, N = 2880)
    Case(4, 2880, 2880, 64, 32, "fp8", bias=torch.bfloat16, w="mxfp4"),
    Case(4, 2880, 2880, 64, 32, "fp8", torch.float16, w="mxfp4", mx_shift=12),
    Case(8, 592, 2048, 16, -1, "fp8", bias=torch.bfloat16),
    Case(8, 1040, 2048, 32, 128, "fp8", torch.float16, w="int4"),
]


def _ids(c: Case) -> str:
    group = "x".join(map(str, c.weight)) if isinstance(c.weight, tuple) else c.weight
    shift = f"-shift{c.mx_shift}" if c.mx_shift else ""
    return f"{c.w}{shift}-E{c.e}-n{c.n}-k{c.k}-bm{c.block_m}-w{group}-{c.act}-{str(c.out)[6:]}-b{str(c.bias)[6:]}"


def _weight(c: Case):
    """An expert-stacked ``[E, N, K]`` weight with random codes and scales in ``[1, 2) * 2e-3`` (MXFP4: the
    e8m0 scales humming.quantize gives a normal matrix of scale 2e-3, ``mx_shift`` applied)."""
    if c.w == "mxfp4":
        qw = humming.quantize(torch.randn(c.e, c.n, c.k, device="cuda") * 2e-3, weight="mxfp4")
        exps = qw.scales.view(torch.uint8).clone()
        exps[0, :, 4:8] += c.mx_shift
        return qw.replace(scales=exps.view(torch.float8_e8m0fnu))
    if c.w == "int4":
        nibbles = torch.randint(0, 16, (c.e * c.n, c.k), device="cuda")
        qweight = (nibbles[:, 0::2] | nibbles[:, 1::2] << 4).to(torch.uint8).view(torch.int32)
    else:
        qweight = random_codes(c.e * c.n, c.k, "cuda").view(torch.int32)
    qweight = qweight.view(c.e, c.n, -1)
    probe = humming.QuantizedWeight((c.e, c.n, c.k), c.w, qweight, None, parse_group_size(c.weight))
    return probe.replace(scales=(1 + torch.rand(c.e, *probe.scale_grid, device="cuda")) * 2e-3)


def _routing(counts: list[int], block_m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(expert_ids [M_pad / block_m], row expert [M_pad] (-1 past the used segments), valid rows [M_pad])
    of the contiguous grouped layout; M_pad is the worst case of ``sum(counts)`` slots, as moe_align's."""
    e = len(counts)
    m_pad = -(-(sum(counts) + e * (block_m - 1)) // block_m) * block_m
    ids, valid = [], []
    for i, c in enumerate(counts):
        segments = -(-c // block_m)
        ids += [i] * segments
        valid += [True] * c + [False] * (segments * block_m - c)
    ids += [-1] * (m_pad // block_m - len(ids))
    valid += [False] * (m_pad - len(valid))
    expert_ids = torch.tensor(ids, dtype=torch.int32, device="cuda")
    return expert_ids, expert_ids.repeat_interleave(block_m), torch.tensor(valid, device="cuda")


def _counts(e: int) -> list[int]:
    """Rows per expert in 0 .. 300, experts 1 and e - 1 empty, one expert of exactly a few segments."""
    counts = torch.randint(0, 301, (e,)).tolist()
    counts[1] = counts[-1] = 0
    counts[2] = 256
    return counts


def _reference(qa, qw, row_expert: torch.Tensor, valid: torch.Tensor, bias) -> torch.Tensor:
    """float64 ``[M_pad, N]``: valid rows ``dequant(x) @ dequant(W_e)^T + bias_e``, zero elsewhere."""
    rows = valid.nonzero()[:, 0]
    xd = humming.dequantize_activation(humming.QuantizedActivation(qa.scheme, qa.codes[rows], qa.scales[rows]))
    ref = torch.zeros(qa.codes.shape[0], qw.N, dtype=torch.float64, device="cuda")
    for e in row_expert[rows].unique().tolist():
        mine = row_expert[rows] == e
        w = humming.dequantize(expert_weight(qw, e), torch.float64)
        ref[rows[mine]] = xd[mine].to(torch.float64) @ w.T + (0 if bias is None else bias[e].to(torch.float64))
    return ref


def _check_skipped_unwritten(out: torch.Tensor, row_expert: torch.Tensor) -> None:
    skipped = out[row_expert < 0]
    assert skipped.numel() and torch.isnan(skipped.float()).all(), "a skipped (-1) segment was written"


#: Tunings timed against each other in test_every_grouped_tuning_computes_the_same_function.
TUNINGS = [(1, 8, 2, 2, True), (1, 32, 4, 2, False), (2, 64, 3, 1, True)]
_MODE = {"tensor": "rowcol", -1: "rowcol", 128: "group"}


def _mode(c: Case) -> str:
    """The scale mode ``prepare`` gives the case's weight (MXFP4: folded per row unless shifted past 12)."""
    if isinstance(c.weight, tuple):
        return "block128"
    return ("group" if c.mx_shift else "rowcol") if c.w == "mxfp4" else _MODE[c.weight]


@pytest.fixture(scope="module")
def compiled(fp8_sm90):
    """The kernels of every test compiled in parallel once (the tests then load them from the disk cache):
    the default tunings of CASES and of the routing / fused-MoE cases with one and two warpgroups."""
    limits = fp8_gemm.device_limits(torch.cuda.current_device())
    extra = [Case(8, 2816, 2048, 32, (128, 128), "fp8_g128", bias=torch.bfloat16), Case(8, 2816, 2048, 16, -1, "fp8")]
    jobs = []
    for c in [*CASES, *extra, Case(8, 2048, 1408, 16, -1, "fp8")]:
        mode = _mode(c)
        for m in (c.block_m, 1 << 20):  # few segments in use: one warpgroup; many: two
            tuning = fp8_gemm.choose_grouped_tuning(c.block_m, m, c.n, c.e, limits, c.w)
            jobs.append((fp8_gemm.call_spec(c.w, mode, c.bias, c.out, tuning, grouped=True), "sm_90a"))
    for t in TUNINGS:
        tuning = fp8_gemm.Fp8Tuning(*t[:4], group_m=2, tma_store=t[4])
        jobs.append((fp8_gemm.call_spec("e4m3", "block128", None, torch.bfloat16, tuning, grouped=True), "sm_90a"))
    return warmup_specs(list(dict.fromkeys(jobs)), progress=False)


def _activations(c: Case, valid: torch.Tensor):
    """Random e4m3 activations ``[M_pad, K]`` whose padding rows hold NaN codes and infinite scales."""
    scheme = get_act_scheme(c.act)
    m = valid.shape[0]
    codes = random_codes(m, c.k, "cuda")
    codes[~valid] = 0x7F
    grid = (m, 1) if scheme.group == "token" else (m, -(-c.k // scheme.group))
    scales = (1 + torch.rand(grid, device="cuda")) * 1e-2
    scales[~valid] = float("inf")
    return humming.QuantizedActivation(scheme, codes, scales)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_grouped_matches_float64_reference(case, compiled, seed):
    qw = _weight(case)
    expert_ids, row_expert, valid = _routing(_counts(case.e), case.block_m)
    qa = _activations(case, valid)
    x = torch.empty(valid.shape[0], case.k, device="cuda", dtype=torch.bfloat16)
    assert fp8_gemm.grouped_unsupported(qw, qa.scheme, x, case.block_m, case.out) is None
    bias = None if case.bias is None else torch.randn(case.e, case.n, device="cuda", dtype=case.bias)
    out = torch.full((valid.shape[0], case.n), float("nan"), device="cuda", dtype=case.out)
    prep = fp8_gemm.prepare(qw)
    assert prep.scale_mode == _mode(case)
    fp8_gemm.run_grouped(prep, qa, qa.scheme, expert_ids, case.block_m, bias, case.out, out=out)
    assert_rel_close(out[valid], _reference(qa, qw, row_expert, valid, bias)[valid], precision=torch.float64, seed=seed)
    _check_skipped_unwritten(out, row_expert)


def test_every_grouped_tuning_computes_the_same_function(compiled, seed):
    """Token tiles of 8 .. 64 within block_m = 64, one or two warpgroups, both epilogues."""
    c = Case(8, 1024, 1000, 64, (128, 128), "fp8_g128")
    qw = _weight(c)
    expert_ids, row_expert, valid = _routing(_counts(c.e), c.block_m)
    qa = _activations(c, valid)
    ref = _reference(qa, qw, row_expert, valid, None)
    for t in TUNINGS:
        tuning = fp8_gemm.Fp8Tuning(*t[:4], group_m=2, tma_store=t[4])
        out = torch.full((valid.shape[0], c.n), float("nan"), device="cuda", dtype=torch.bfloat16)
        fp8_gemm.run_grouped(fp8_gemm.prepare(qw), qa, qa.scheme, expert_ids, 64, None, torch.bfloat16, tuning, out)
        assert_rel_close(out[valid], ref[valid], precision=torch.float64, seed=seed)
        _check_skipped_unwritten(out, row_expert)


@pytest.mark.parametrize(
    "case",
    [
        Case(4, 1024, 1024, 128, -1, "fp8", w="int4"),  # per channel: four K blocks a promotion
        Case(4, 1024, 1024, 128, 128, "fp8", bias=torch.bfloat16, w="int4"),  # groups: token halves
        Case(4, 1024, 1024, 128, 32, "fp8", w="mxfp4"),  # folded per row: four K blocks a promotion
        Case(4, 1024, 1024, 128, 32, "fp8", torch.float16, w="mxfp4", mx_shift=12),  # per K block: token halves
    ],
    ids=_ids,
)
def test_grouped_4bit_variants_match_the_default(case, seed):
    """The variants fp8_grouped_sweep times on 128-token tiles of 4-bit experts: codes read ahead and token
    halves give the default's bits (the same products summed in the same order), four K blocks a promotion (per
    channel / per-row MXFP4 folds) matches float64; each on a persistent grid too."""
    qw = _weight(case)
    expert_ids, row_expert, valid = _routing(_counts(case.e), case.block_m)
    qa = _activations(case, valid)
    bias = None if case.bias is None else torch.randn(case.e, case.n, device="cuda", dtype=case.bias)
    prep = fp8_gemm.prepare(qw)
    assert prep.scale_mode == _mode(case)
    limits = fp8_gemm.device_limits(torch.cuda.current_device())
    default = fp8_gemm.choose_grouped_tuning(case.block_m, valid.shape[0], case.n, case.e, limits, prep.w_format)
    assert default.block_m == 128

    def run(tuning):
        out = torch.full((valid.shape[0], case.n), float("nan"), device="cuda", dtype=case.out)
        fp8_gemm.run_grouped(prep, qa, qa.scheme, expert_ids, case.block_m, bias, case.out, tuning, out)
        _check_skipped_unwritten(out, row_expert)
        return out

    ref = _reference(qa, qw, row_expert, valid, bias)
    for grid in (default, dataclasses.replace(default, persistent=True)):
        want = run(grid)
        assert_rel_close(want[valid], ref[valid], precision=torch.float64, seed=seed)
        same = [dataclasses.replace(grid, prefetch_codes=True), dataclasses.replace(grid, token_halves=True)]
        for tuning in same:
            assert torch.equal(run(tuning)[valid], want[valid]), tuning
        if prep.scale_mode == "rowcol":
            promoted = run(dataclasses.replace(grid, promote_blocks=4))
            assert_rel_close(promoted[valid], ref[valid], precision=torch.float64, seed=seed)


def test_persistent_grouped_grid_gives_the_bits_of_one_block_per_tile(compiled, seed, monkeypatch):
    """A persistent grid over grouped tiles (3 SMs' block slots: each block walks many tiles and skips those of
    unused segments without touching its stage ring) computes each used tile as a block of its own would, and
    leaves the rows of unused segments unwritten."""
    from humming.cuda_kernels import _fp8_launch

    real = _fp8_launch.device_limits
    monkeypatch.setattr(_fp8_launch, "device_limits", lambda device=None: real(device)._replace(sm_count=3))
    grids, init = [], _fp8_launch.Fp8Launch.__init__
    monkeypatch.setattr(
        _fp8_launch.Fp8Launch, "__init__", lambda self, *a, **k: init(self, *a, **k) or grids.append(self.grid)
    )
    c = Case(8, 1024, 1000, 64, (128, 128), "fp8_g128")
    qw = _weight(c)
    expert_ids, row_expert, valid = _routing(_counts(c.e), c.block_m)
    qa = _activations(c, valid)
    prep = fp8_gemm.prepare(qw)
    for t in TUNINGS:
        tuning = fp8_gemm.Fp8Tuning(*t[:4], group_m=2, tma_store=t[4])
        outs = []
        for persistent in (False, True):
            out = torch.full((valid.shape[0], c.n), float("nan"), device="cuda", dtype=torch.bfloat16)
            walk = dataclasses.replace(tuning, persistent=persistent)
            fp8_gemm.run_grouped(prep, qa, qa.scheme, expert_ids, 64, None, torch.bfloat16, walk, out)
            _check_skipped_unwritten(out, row_expert)
            outs.append(out)
        assert torch.equal(outs[0][valid], outs[1][valid]), t
        assert grids[-1][0] == 3 * tuning.min_blocks < grids[-2][0], grids[-2:]  # the walk happens


def test_humming_moe_grouped_linear_runs_it(compiled, seed):
    """``humming.moe.grouped_linear(act="fp8_g128", backend="cuda")``: the Triton act pass quantizes the whole
    ``[M_pad, K]`` (padding rows NaN / inf here); valid rows match the float64 reference of the same
    activations and the reference backend; ``auto`` takes the Triton grouped GEMM first for these fp8 blocks
    (the measured order, :func:`humming.dispatch.plan.grouped_heuristic_order`), ``backend="cuda"`` this one."""
    from humming.triton_kernels.act_quant import quantize_activation

    c = Case(8, 2816, 2048, 32, (128, 128), "fp8_g128", bias=torch.bfloat16)
    qw = _weight(c)
    expert_ids, row_expert, valid = _routing(_counts(c.e), c.block_m)
    x = torch.randn(valid.shape[0], c.k, device="cuda", dtype=torch.bfloat16)
    x[~valid] = float("nan")
    x[~valid & (torch.arange(x.shape[0], device="cuda") % 2 == 0)] = float("inf")
    bias = torch.randn(c.e, c.n, device="cuda", dtype=torch.bfloat16)
    act = get_act_scheme(c.act)
    assert humming.dispatch.plan.plan_grouped(qw, act, x, c.block_m).kernel == "triton.grouped"
    assert humming.dispatch.plan.plan_grouped(qw, act, x, c.block_m, "cuda").kernel == "cuda.grouped"
    out = humming.moe.grouped_linear(x, qw, expert_ids, c.block_m, bias, act=c.act, backend="cuda")
    ref = _reference(quantize_activation(x, act), qw, row_expert, valid, bias)
    assert_rel_close(out[valid], ref[valid], precision=torch.float64, seed=seed)
    x[~valid] = 0  # the reference backend computes padding rows as well: keep them finite there
    slow = humming.moe.grouped_linear(x, qw, expert_ids, c.block_m, bias, act=c.act, backend="reference")
    diff = (out[valid].double() - slow[valid].double()).norm() / slow[valid].double().norm()
    assert diff < 1e-2, f"seed {seed}: cuda vs reference backend rel err {diff:.3e}"


def test_calls_of_one_kind_reuse_their_launch(compiled, seed):
    """A grouped call finds the launch made for its kind of call (shape, dtypes, act, tuning, block_m) and
    gives what a fresh launch gives, bit for bit, on new activations; another M makes another launch."""
    c = Case(8, 2816, 2048, 16, -1, "fp8")
    qw, act = _weight(c), get_act_scheme(c.act)
    prep = fp8_gemm.prepare(qw)
    expert_ids, _, valid = _routing(_counts(c.e), c.block_m)
    outs = []
    for _ in range(2):
        x = torch.randn(valid.shape[0], c.k, device="cuda", dtype=torch.bfloat16)
        kept = fp8_gemm.run_grouped(prep, x, act, expert_ids, c.block_m, None, torch.bfloat16)
        fresh = fp8_gemm.Fp8Launch(prep, act, x, None, torch.bfloat16, _tuning_of(prep, c, x), 0, c.block_m)
        outs.append((kept, fresh(x, None, None, expert_ids)))
    assert len(fp8_gemm._grouped_launches.kinds[prep]) == 1
    for kept, fresh in outs:
        assert torch.equal(kept[valid], fresh[valid])
    x = torch.randn(valid.shape[0] - c.block_m, c.k, device="cuda", dtype=torch.bfloat16)
    fp8_gemm.run_grouped(prep, x, act, expert_ids[:-1], c.block_m, None, torch.bfloat16)
    assert len(fp8_gemm._grouped_launches.kinds[prep]) == 2


def _tuning_of(prep, c: Case, x: torch.Tensor):
    limits = fp8_gemm.device_limits(torch.cuda.current_device())
    return fp8_gemm.choose_grouped_tuning(c.block_m, x.shape[0], prep.n, prep.num_experts, limits, prep.w_format)


def test_fused_moe_fp8_matches_the_reference_backend(compiled, seed):
    """``fused_moe(act="fp8")`` on e4m3 per-channel experts: both grouped GEMMs on the CUDA backend."""
    e, hidden, inter, tokens, topk = 8, 2048, 1408, 40, 2
    w13 = _weight(Case(e, 2 * inter, hidden, 16, -1, "fp8"))
    w2 = _weight(Case(e, hidden, inter, 16, -1, "fp8"))
    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    logits = torch.randn(tokens, e, device="cuda")
    topk_weights, topk_ids = logits.softmax(-1).topk(topk, dim=-1)
    fast = humming.moe.fused_moe(x, w13, w2, topk_weights, topk_ids, act="fp8", block_m=16, backend="cuda")
    slow = humming.moe.fused_moe(x, w13, w2, topk_weights, topk_ids, act="fp8", block_m=16, backend="reference")
    assert not torch.isnan(fast).any()
    rel = ((fast.double() - slow.double()).norm() / slow.double().norm()).item()
    assert rel < 2e-2, f"seed {seed}: fused_moe cuda vs reference rel err {rel:.3e}"


def test_warmup_then_cuda_graph_capture(seed, fp8_sm90):
    """``warmup`` compiles the grouped FP8 kernels of an expert-stacked layer and the CUDA pass quantizing its
    16-bit rows, so capture never compiles."""
    from humming.cuda_kernels import grouped as cuda_grouped

    c = Case(8, 1024, 512, 16, -1, "fp8", bias=torch.bfloat16)
    qw = _weight(c)
    expert_ids, _, valid = _routing(_counts(c.e), c.block_m)
    m_pad = valid.shape[0]
    report = humming.warmup([qw], m_values=(m_pad,), act="fp8", bias_dtype=torch.bfloat16, block_ms=(16,))
    pass_, gemm = sorted(k.spec.name for k in report.kernels)
    assert pass_.startswith("humming_act_quant_e4m3_xbf16_g0_u8_") and "_grouped_w8a8_rowcol_" in gemm
    x = torch.randn(m_pad, c.k, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(c.e, c.n, device="cuda", dtype=torch.bfloat16)

    def call():
        return cuda_grouped.grouped_linear(x, qw, expert_ids, 16, bias, get_act_scheme("fp8"), torch.bfloat16)

    graph, captured = capture(call)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured[valid], call()[valid])
