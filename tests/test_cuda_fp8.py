"""The Hopper FP8 GEMM (``fp8_gemm.py``): compile, SASS and layout checks on CPU; results on an sm_90 GPU."""

from __future__ import annotations

import dataclasses
import itertools
import re
from dataclasses import dataclass

import pytest
import torch
from helpers import (
    assert_rel_close,
    capture,
    compile_fresh,
    cubin_tool,
    instructions_after_each_wait,
    instructions_before_each_wait,
    instructions_between_groups,
    instructions_between_waits,
    needs_nvrtc,
)

import humming
from humming.cuda_kernels import _fp8_launch, _fp8_layout, _fp8_tuning, fp8_gemm, jit
from humming.ir.activation import get_act_scheme
from humming.moe import expert_weight
from humming.testing import random_activation, random_weight, reference

H200 = fp8_gemm.DeviceLimits(sm_count=132, smem_per_block=232448, smem_per_sm=233472)


def _specs() -> list[jit.KernelSpec]:
    """The kernels the heuristics pick for decode, mid and large M, in both scaling modes."""
    picks = [(1, 8192, False, "bf16", "bf16"), (16, 28672, False, "f16", "f32"), (128, 8192, False, "bf16", "f16")]
    picks += [(4096, 8192, False, "bf16", "bf16"), (4096, 8192, True, "bf16", "bf16"), (64, 4096, True, "f16", "f16")]
    specs = [
        fp8_gemm.fp8_spec("e4m3", "block128" if b else "rowcol", o, bias, fp8_gemm.choose_tuning(m, n, 8192, H200))
        for m, n, b, o, bias in picks
    ]
    direct = dataclasses.replace(fp8_gemm.choose_tuning(16, 8192, 8192, H200), tma_store=False)
    specs.append(fp8_gemm.fp8_spec("e4m3", "rowcol", "bf16", "bf16", direct))
    specs.append(fp8_gemm.fp8_spec("e4m3", "block128", "f32", "f32", direct))
    for m, mode in ((1, "group"), (4096, "group"), (128, "rowcol")):  # W4A8 int4
        tuning = fp8_gemm.choose_tile_tuning(m, 8192, 8192, H200, "int4")
        specs.append(fp8_gemm.fp8_spec("int4", mode, "bf16", "f16", tuning))
    for promote in (2, 4):  # two or four K blocks summed before each promotion
        tuning = dataclasses.replace(fp8_gemm.choose_tile_tuning(4096, 8192, 8192, H200), promote_blocks=promote)
        for w in ("int4", "e4m3"):
            specs.append(fp8_gemm.fp8_spec(w, "rowcol", "bf16", "bf16", tuning))
    # W4A8 MXFP4, scales folded per K block (group) or per row (rowcol: four K blocks a promotion at 128 tokens)
    for m, n, mode in ((1, 4096, "group"), (4096, 28672, "group"), (256, 28672, "rowcol")):
        tuning = fp8_gemm.choose_tile_tuning(m, n, 8192, H200, "mxfp4")
        specs.append(fp8_gemm.fp8_spec("mxfp4", mode, "bf16", "bf16", tuning))
    for m, w, mode in ((4096, "int4", "rowcol"), (4096, "int4", "group"), (4096, "mxfp4", "rowcol")):  # codes ahead
        tuning = dataclasses.replace(fp8_gemm.choose_tile_tuning(m, 8192, 8192, H200, w), prefetch_codes=True)
        specs.append(fp8_gemm.fp8_spec(w, mode, "bf16", "bf16", tuning))
    for w, mode in (("int4", "group"), ("mxfp4", "group"), ("int4", "rowcol"), ("e4m3", "block128")):  # token halves
        tuning = dataclasses.replace(
            fp8_gemm.choose_tile_tuning(4096, 8192, 8192, H200, w), promote_blocks=1, token_halves=True
        )
        specs.append(fp8_gemm.fp8_spec(w, mode, "bf16", "bf16", tuning))
    direct_mx = dataclasses.replace(fp8_gemm.choose_tile_tuning(77, 8192, 8192, H200, "mxfp4"), tma_store=False)
    specs.append(fp8_gemm.fp8_spec("mxfp4", "group", "f32", "f32", direct_mx))
    return specs + _split_specs() + _grouped_specs()


def _split_specs() -> list[jit.KernelSpec]:
    """Split-K kernels at decode M on 8192 x 8192 / 4096 x 4096: every weight format and scale mode, bias."""
    picks = [(1, 8192, "e4m3", "rowcol", torch.bfloat16), (16, 4096, "e4m3", "block128", None)]
    picks += [(3, 8192, "int4", "group", torch.float32), (64, 4096, "mxfp4", "group", torch.float16)]
    picks += [(8, 8192, "mxfp4", "rowcol", None)]
    specs = []
    for m, n, w, mode, bias in picks:
        tuning = fp8_gemm.choose_split_tuning(m, n, n, H200, w)
        assert tuning.splits > 1, (m, n, w)
        specs.append(fp8_gemm.call_spec(w, mode, bias, torch.bfloat16, tuning))
        # the last split reads the sums back and writes the 16-bit output itself
        specs.append(fp8_gemm.call_spec(w, mode, bias, torch.bfloat16, dataclasses.replace(tuning, read_back=True)))
    return specs


def _grouped_specs() -> list[jit.KernelSpec]:
    """The grouped (MoE) kernels at E=64, N=2816: decode (block_m 16) and prefill (64, 128) segments, both
    W8A8 recipes, int4 and MXFP4 W4A8, the plain-store epilogue."""
    picks = [(16, 976, "e4m3", "rowcol", torch.bfloat16), (64, 8192, "e4m3", "block128", torch.float16)]
    picks += [(128, 16384, "e4m3", "block128", torch.float32), (32, 4096, "int4", "group", torch.bfloat16)]
    picks += [(16, 976, "mxfp4", "group", torch.bfloat16), (64, 8192, "mxfp4", "rowcol", torch.bfloat16)]
    specs = []
    for block_m, m_pad, w, mode, out in picks:
        tuning = fp8_gemm.choose_grouped_tuning(block_m, m_pad, 2816, 64, H200, w)
        specs.append(fp8_gemm.call_spec(w, mode, torch.float32, out, tuning, grouped=True))
    return specs


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    kernels = compile_fresh([(spec, "sm_90a") for spec in _specs()], tmp_path_factory.mktemp("cache"))
    return {k.spec.name: k for k in kernels}


@needs_nvrtc
def test_compiles_for_sm90a_without_spills(compiled):
    assert len(compiled) == len(_specs())
    for name, kernel in compiled.items():
        assert kernel.cubin[:4] == b"\x7fELF", name
        frames = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", kernel.log)
        assert frames and all(f == ("0", "0", "0") for f in frames), f"{name} spills or uses a stack:\n{kernel.log}"
        # setmaxnreg needs the whole per-thread cap at entry: producer + consumers fill it exactly
        used = int(re.search(r"Used (\d+) registers", kernel.log).group(1))
        threads, min_blocks = kernel.spec.threads, kernel.spec.min_blocks
        assert used == min(255, 65536 // (threads * min_blocks)) // 8 * 8, (name, used)


@needs_nvrtc
def test_no_wgmma_is_serialized(compiled):
    """ptxas reports (C751x) where it serialises wgmmas or injects waits (accumulators read while in flight,
    A registers written): none of these kernels may have it."""
    for name, kernel in compiled.items():
        assert not re.search(r"C751\d", kernel.log), f"{name}:\n{kernel.log}"


@needs_nvrtc
def test_sass_holds_qgmma_tma_and_no_local_memory(compiled, tmp_path):
    for name, kernel in compiled.items():
        sass = cubin_tool("cuobjdump", ["-sass"], kernel, tmp_path)
        block_m = int(re.search(r"_m(\d+)_", name).group(1))
        block_m //= 2 if name.endswith("_th") else 1  # token halves: wgmmas of 64 tokens
        assert f"QGMMA.64x{block_m}x32.F32.E4M3.E4M3" in sass, name
        if "_w4a8_" in name or "_wmxfp4a8_" in name:  # A from registers, fed by bulk copies and prmt lookups
            assert re.search(rf"QGMMA\.64x{block_m}x32\.F32\.E4M3\.E4M3 R\d+, R\d+, gdesc", sass), name
            # int4: 3 prmt per 4 codes, 16 groups of 4 per stage; MXFP4: 1 per 4 codes + 8 offset extractions
            assert "UBLKCP" in sass and sass.count("PRMT") >= (24 if "_wmxfp4a8_" in name else 48), name
        for op in ("UTMALDG.2D", "USETMAXREG.DEALLOC", "USETMAXREG.TRY_ALLOC"):
            assert op in sass, (name, op)
        tma_store = not re.search(r"_stg(_|$)", name)
        assert ("UTMASTG.2D" in sass) == tma_store and ("STSM.16.MT88" in sass) == tma_store, name
        # split-K: fp32 reductions in L2 (red.global.add.f32) instead of stores; nowhere else
        assert bool(re.search(r"REDG\.E\.ADD\.F32", sass)) == ("_sk_" in name), name
        # read back: the last split's exchange of the sums for zeros, after the barrier that tells it it is last
        read_back = name.endswith("_rb")
        assert ("ATOMG.E.EXCH" in sass) == read_back and ("BAR.RED.OR" in sass) == read_back, name
        assert not re.search(r"\b(LDL|STL)\b", sass), f"{name} uses local memory"


@needs_nvrtc
def test_w4a8_converts_the_next_block_while_wgmmas_run(compiled, tmp_path):
    """W4A8 (int4, MXFP4): the next K block's whole conversion of codes to e4m3 overlaps a wgmma group rather
    than waiting first: all its prmt (int4: 4 per 32-bit word of codes, 8 words; MXFP4: 2 per word and 2
    per k-step for the table offsets) come while a group runs: before the wait with 128-token tiles, before the
    next group is queued with two accumulator sets (tiles of at most 64 tokens, whose promotions then run
    while the next group does) and with several K blocks per promotion (block i + 1's conversion while block
    i's group runs, block i + 2's between the waits for the two; in token halves while both of block i's groups
    run, before the wait for the first). int4 keeps its table words in registers
    (ptxas copies a constant into a register before each of 32 prmt else)."""
    for name, kernel in compiled.items():
        prmts = 32 if "_w4a8_" in name else 24 if "_wmxfp4a8_" in name else None
        if prmts is None:
            continue
        sass = cubin_tool("cuobjdump", ["-sass"], kernel, tmp_path)
        block_m = int(re.search(r"_m(\d+)_", name).group(1))
        windows = 2  # the K loop is unrolled by two: both halves
        if block_m <= 64:
            gaps = instructions_between_groups(sass, "QGMMA", only="PRMT")
            promotions = instructions_after_each_wait(sass, "QGMMA", pending=1)
            assert len(promotions) >= 2 and min(promotions) >= block_m // 2, (name, promotions)
        elif re.search(r"_p[24](_pc)?$", name):  # block i + 2's conversion between the waits for blocks i and i + 1
            gaps, windows = instructions_between_waits(sass, pending=1, only="PRMT"), 1
        elif name.endswith("_th"):  # token halves: block i + 1's conversion before the wait for block i's h0 group
            gaps = instructions_before_each_wait(sass, "QGMMA", only="PRMT")[::2]
        else:
            gaps = instructions_before_each_wait(sass, "QGMMA", only="PRMT")
        assert len(gaps) >= windows and min(gaps[:2]) >= prmts, (name, gaps)
        if prmts == 32:
            copies = instructions_before_each_wait(sass, "QGMMA", only="IMAD")
            assert max(copies[:2], default=0) < 8, (name, copies)


def test_a_tuning_passed_to_the_dense_kernel_is_the_one_it_launches(fake_cuda_device, monkeypatch):
    """``KERNEL.run(..., tuning)`` (the tuning sweep's way in) launches that tuning; ``None`` the heuristic's."""
    from types import SimpleNamespace

    fake_cuda_device()
    made = []
    monkeypatch.setattr(fp8_gemm, "device_index", lambda device: 0)
    monkeypatch.setattr(fp8_gemm, "unsupported", lambda *args: None)
    monkeypatch.setattr(fp8_gemm, "prepare", lambda qw: SimpleNamespace(n=4096, k=4096, w_format="int4"))
    monkeypatch.setattr(fp8_gemm, "Fp8Launch", lambda prep, act, x, b, o, tuning, index: made.append(tuning))
    qw, x = humming.quantize(torch.randn(64, 128), "int4", -1), torch.randn(300, 4096)
    asked = fp8_gemm.Fp8Tuning(1, 16, 3, 2, persistent=True)
    fp8_gemm._launcher(x, qw, get_act_scheme("fp8"), None, torch.bfloat16, asked)
    fp8_gemm._launcher(x, qw, get_act_scheme("fp8"), None, torch.bfloat16, None)
    assert made == [asked, fp8_gemm.choose_tuning(300, 4096, 4096, fp8_gemm.device_info(0).limits, "int4")]


@pytest.mark.parametrize("act", [None, "fp8"])
def test_a_tuning_passed_to_the_grouped_kernel_reaches_its_launch(act, monkeypatch):
    """``cuda.grouped``'s ``KERNEL.run(..., tuning)`` hands the tuning to the GEMM that runs (the FP8 GEMM with
    an activation scheme, else the WnA16 GEMM); ``None`` leaves the choice to its heuristic."""
    from humming.cuda_kernels import _gemm_sm90, _wna16, grouped

    seen = []
    monkeypatch.setattr(grouped, "grouped_unsupported", lambda *args: None)
    monkeypatch.setattr(fp8_gemm, "prepare", lambda qw: "prepared")
    monkeypatch.setattr(_wna16, "prepare", lambda qw: "prepared")
    monkeypatch.setattr(fp8_gemm, "run_grouped", lambda prep, x, act, ids, bm, bias, o, tuning: seen.append(tuning))
    monkeypatch.setattr(
        _gemm_sm90, "run_grouped_gemm", lambda prep, x, ids, bm, b, o, tuning, **kw: seen.append(tuning)
    )
    qw = humming.quantize(torch.randn(2, 128, 256), "int4", group_size=128)
    x, ids = torch.randn(32, 256), torch.zeros(2, dtype=torch.int32)
    asked = fp8_gemm.Fp8Tuning(1, 16, 3, 2, persistent=True) if act else _gemm_sm90.GemmTuning(16, 4, 2)
    scheme = None if act is None else get_act_scheme(act)
    grouped.KERNEL.run(x, qw, ids, 16, None, scheme, torch.bfloat16, asked)
    grouped.KERNEL.run(x, qw, ids, 16, None, scheme, torch.bfloat16, None)
    assert seen == [asked, None]


def test_persistent_grid_has_a_block_per_block_slot():
    """A persistent grid: one block per block slot (SMs x blocks per SM), fewer where there are fewer tiles; one
    split only."""
    walk = fp8_gemm.Fp8Tuning(1, 64, 4, 2, persistent=True)
    assert walk.grid_blocks(1000, H200) == 264 and walk.grid_blocks(100, H200) == 100
    assert dataclasses.replace(walk, persistent=False).grid_blocks(1000, H200) == 1000
    with pytest.raises(ValueError, match="persistent"):
        fp8_gemm.Fp8Tuning(2, 128, 4, 1, splits=2, persistent=True)


def test_tuning_is_pure_and_fits_the_device():
    for m in (1, 7, 16, 100, 128, 129, 1024, 8192):
        for n in (256, 8192, 28672):
            t = fp8_gemm.choose_tuning(m, n, 8192, H200)
            assert t == fp8_gemm.choose_tuning(m, n, 8192, H200)
            assert t.block_m >= min(m, 128) and t.block_m in (8, 16, 32, 64, 128)
            smem = fp8_gemm.smem_bytes(t.wgs, t.block_m, t.stages)
            assert smem <= H200.smem_per_block and t.min_blocks * (smem + 1024) <= H200.smem_per_sm
            producer, consumer = t.registers()
            cap = min(255, 65536 // (t.threads * t.min_blocks)) // 8 * 8
            assert producer * 128 + consumer * 128 * t.wgs <= cap * t.threads and consumer >= t.block_m + 32
    assert fp8_gemm.choose_tuning(1, 8192, 8192, H200).wgs == 1  # decode: spread over every SM
    assert fp8_gemm.choose_tuning(4096, 8192, 8192, H200).wgs == 2


def test_split_k_heuristic_fills_the_empty_block_slots():
    """``splits`` = copies of the tile grid that fit in sm_count x min_blocks slots, >= 8 K blocks per split."""
    table = {  # (m, n, k) -> (tiles, splits) on the H200 (132 SMs)
        (1, 8192, 8192): (128, 2),  # 64-row tiles, two blocks per SM: 264 slots
        (16, 8192, 8192): (128, 2),
        (1, 4096, 4096): (64, 4),
        (64, 4096, 4096): (64, 4),
        (1, 4096, 1024): (64, 1),  # 8 K blocks: one split's worth
        (1, 4096, 2048): (64, 1),  # 16 K blocks: below _MIN_SPLIT_K_BLOCKS
        (3, 1000, 8192): (16, 8),  # 8 K blocks per split caps 16 copies at 8
        (1, 28672, 8192): (224, 1),  # 128-row tiles fill the 132 one-block slots
        (128, 8192, 8192): (128, 2),
        (4096, 8192, 8192): (2048, 1),
    }
    for (m, n, k), (tiles, splits) in table.items():
        for w in ("e4m3", "int4", "mxfp4"):
            t = fp8_gemm.choose_split_tuning(m, n, k, H200, w)
            assert t == fp8_gemm.choose_split_tuning(m, n, k, H200, w)  # pure
            assert dataclasses.replace(t, splits=1) == fp8_gemm.choose_tile_tuning(m, n, k, H200, w), (m, n, k, w)
            picked = fp8_gemm.choose_tuning(m, n, k, H200, w)  # 4-bit tiles are cheap to read: splits fill the grid
            assert picked == (t if w != "e4m3" else dataclasses.replace(t, splits=1)), (m, n, k, w)
            assert (-(-n // t.block_n) * -(-m // t.block_m), t.splits) == (tiles, splits), (m, n, k, w)
    for m in (1, 16, 128, 4096):  # e4m3 weights keep one split: reducing fp32 splits costs more than they fill
        assert fp8_gemm.choose_tuning(m, 8192, 8192, H200).splits == 1


@pytest.mark.parametrize("w", ["e4m3", "int4", "mxfp4"])
def test_tile_tuning_walks_128_token_tiles_past_the_block_slots(w):
    """128-token tiles run on a persistent grid where they outnumber the block slots; 4-bit weights sum four
    K blocks per promotion there (where their scales allow it: int4 per channel, MXFP4 folded per row) and up to
    1024 tokens run as two token halves (where they promote at every K block); smaller tiles keep a block per
    tile, one K block per promotion and whole tiles."""
    for m, n in itertools.product((1, 16, 64, 100, 128, 256, 1024, 4096), (4096, 8192, 28672)):
        t = fp8_gemm.choose_tile_tuning(m, n, 8192, H200, w)
        tiles = -(-n // t.block_n) * -(-m // t.block_m)
        assert t.persistent == (t.block_m == 128 and tiles > H200.sm_count * t.min_blocks), (m, n, t)
        assert t.promote_blocks == (4 if w != "e4m3" and t.block_m == 128 else 1), (m, n, t)
        halves_up_to = _fp8_tuning._TOKEN_HALVES_MAX_M
        assert t.token_halves == (w != "e4m3" and t.block_m == 128 and m <= halves_up_to), (m, n, t)
        assert t.grid_blocks(tiles, H200) == (min(tiles, H200.sm_count * t.min_blocks) if t.persistent else tiles)
    assert fp8_gemm.choose_tile_tuning(1024, 8192, 8192, H200, w).persistent  # 512 tiles of 128 x 128
    assert not fp8_gemm.choose_tile_tuning(256, 8192, 8192, H200, w).persistent  # 128 tiles: one wave


@pytest.mark.parametrize(
    "w, mode", [("e4m3", "rowcol"), ("e4m3", "block128"), ("int4", "rowcol"), ("int4", "group"), ("mxfp4", "group")]
)
def test_token_halves_apply_to_128_token_tiles_promoted_at_every_k_block(w, mode):
    """``token_halves`` takes effect (the kernel's name says so) on 128-token tiles promoted at every K block, for
    every weight format and scale mode, and nowhere else: not on smaller tiles, not with several K blocks a
    promotion, not for MXFP4 with its codes read ahead (ptxas spills there)."""
    for block_m, promote, ahead in itertools.product((64, 128), (1, 4), (False, True)):
        t = fp8_gemm.Fp8Tuning(2, block_m, 4, 1, promote_blocks=promote, prefetch_codes=ahead, token_halves=True)
        every_block = t.promotes_every(mode) == 1
        want = block_m == 128 and every_block and not (w == "mxfp4" and t.reads_codes_ahead(w))
        assert t.issues_token_halves(w, mode) == want, (block_m, promote, ahead)
        assert fp8_gemm.fp8_spec(w, mode, "bf16", "bf16", t).name.endswith("_th") == want
        assert not dataclasses.replace(t, token_halves=False).issues_token_halves(w, mode)


def test_split_k_specs_say_what_they_need():
    tuning = fp8_gemm.choose_split_tuning(1, 8192, 8192, H200)
    spec = fp8_gemm.call_spec("e4m3", "rowcol", None, torch.float16, tuning)
    assert spec == fp8_gemm.call_spec("e4m3", "rowcol", None, torch.float16, dataclasses.replace(tuning, splits=5))
    assert "_of32_bf16_" in spec.name and spec.name.endswith("_sk_stg")
    assert ", false, false, true, humming::DType::f32, " in spec.entry  # no TMA store, not grouped, split-K
    plain = fp8_gemm.call_spec("e4m3", "rowcol", None, torch.float16, dataclasses.replace(tuning, splits=1))
    assert "_sk" not in plain.name and plain.name.endswith("_m8_s12_mb2")
    with pytest.raises(ValueError, match=r"tuning: split-K .*got out='bf16'"):
        fp8_gemm.fp8_spec("e4m3", "rowcol", "bf16", "bf16", tuning)
    read_back = fp8_gemm.call_spec("e4m3", "rowcol", None, torch.float16, dataclasses.replace(tuning, read_back=True))
    assert "_of16_bf16_" in read_back.name and read_back.name.endswith("_sk_stg_rb")  # out f16, bias f16
    assert ", false, false, true, humming::DType::f16, " in read_back.entry and read_back.entry.endswith(", true>")
    with pytest.raises(ValueError, match="read_back: the read-back is split-K's"):
        dataclasses.replace(tuning, splits=1, read_back=True)
    with pytest.raises(ValueError, match=r"tuning: split-K .*grouped=True"):
        fp8_gemm.call_spec("e4m3", "rowcol", None, torch.float32, tuning, grouped=True)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="splits: expected an int >= 1"):
            dataclasses.replace(tuning, splits=bad)
    prep = fp8_gemm.prepare(_stacked("e4m3", -1))
    ids = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="tuning: the grouped FP8 GEMM has no split-K"):
        fp8_gemm.run_grouped(prep, torch.empty(16, 300), get_act_scheme("fp8"), ids, 16, None, torch.bfloat16, tuning)


def test_warmup_jobs_are_the_kernels_linear_runs():
    int4 = humming.quantize(torch.randn(256, 512), weight="int4", group_size=128)
    e4m3 = humming.quantize(torch.randn(256, 512), weight="e4m3", group_size=-1)
    fp8 = get_act_scheme("fp8")
    jobs = fp8_gemm.warmup_jobs(e4m3, fp8, (1, 16, 4096), torch.bfloat16, torch.bfloat16, H200)
    assert [arch for _, arch in jobs] == ["sm_90a"] * len(jobs) and len({spec for spec, _ in jobs}) == len(jobs)
    for m, (spec, _) in zip((1, 16, 4096), jobs, strict=False):
        tuning = fp8_gemm.choose_tuning(m, 256, 512, H200)
        assert spec == fp8_gemm.call_spec("e4m3", "rowcol", torch.bfloat16, torch.bfloat16, tuning)
    (w4, _), *_ = fp8_gemm.warmup_jobs(int4, fp8, (8,), torch.float32, None, H200)
    assert "_w4a8_group_of32_bf32_" in w4.name and w4.name.endswith("_stg")
    assert fp8_gemm.warmup_jobs(int4, get_act_scheme("fp8_g128"), (8,), torch.bfloat16, None, H200) == []
    mx = humming.quantize(torch.randn(256, 512), weight="mxfp4")
    (spec, _), *_ = fp8_gemm.warmup_jobs(mx, fp8, (300,), torch.float16, torch.float32, H200)
    tuning = fp8_gemm.choose_tuning(300, 256, 512, H200, "mxfp4")
    assert spec == fp8_gemm.call_spec("mxfp4", "rowcol", torch.float32, torch.float16, tuning)
    assert "_wmxfp4a8_rowcol_of16_bf32_" in spec.name  # scales folded per row, as prepare folds them
    exps = mx.scales.view(torch.uint8).clone()
    exps[0, 4:8] += 12  # row 0's second 128-K block twelve binades up: folded per K block
    wide = mx.replace(scales=exps.view(torch.float8_e8m0fnu))
    (spec, _), *_ = fp8_gemm.warmup_jobs(wide, fp8, (300,), torch.float16, torch.float32, H200)
    assert spec == fp8_gemm.call_spec("mxfp4", "group", torch.float32, torch.float16, tuning)
    assert fp8_gemm.prepare(wide).scale_mode == "group"


# ---- grouped (MoE) variant, CPU ----


def _stacked(weight: str, group, e: int = 3, n: int = 256, k: int = 300):
    return humming.stack([humming.quantize(torch.randn(n, k), weight=weight, group_size=group) for _ in range(e)])


def test_grouped_tuning_divides_block_m_and_fits_the_device():
    for block_m in (8, 16, 24, 32, 48, 64, 128, 256, 384):
        for m_pad in (block_m, 976, 8192, 65536):
            for w in ("e4m3", "int4"):
                t = fp8_gemm.choose_grouped_tuning(block_m, m_pad, 2816, 64, H200, w)
                assert t == fp8_gemm.choose_grouped_tuning(block_m, m_pad, 2816, 64, H200, w)
                assert block_m % t.block_m == 0 and t.block_m == max(
                    b for b in (8, 16, 32, 64, 128) if block_m % b == 0
                )
                smem = fp8_gemm.smem_bytes(t.wgs, t.block_m, t.stages, w)
                assert smem <= H200.smem_per_block and t.min_blocks * (smem + 1024) <= H200.smem_per_sm
    # 4 slots over 8 experts: at most 4 segments x 8 tiles of 128 rows in use: one warpgroup, two blocks per SM
    assert fp8_gemm.choose_grouped_tuning(16, 128, 1024, 8, H200) == fp8_gemm.Fp8Tuning(1, 16, 10, 2)
    assert fp8_gemm.choose_grouped_tuning(16, 976, 2816, 64, H200).wgs == 2  # 16 slots: 22 x 16 tiles
    assert fp8_gemm.choose_grouped_tuning(128, 16384, 2816, 64, H200).wgs == 2


@pytest.mark.parametrize(
    "weight,group", [("e4m3", -1), ("e4m3", "tensor"), ("e4m3", (128, 128)), ("int4", 128), ("mxfp4", 32)]
)
def test_grouped_weight_is_the_experts_stacked_along_n(weight, group, seed):
    """The stacked layout is each expert's 2-D layout, concatenated so that expert e's rows start at e * N."""
    from humming.moe import expert_weight

    qw = _stacked(weight, group)
    prep = fp8_gemm.prepare(qw)
    assert prep is fp8_gemm.prepare(qw) and prep.num_experts == 3 and prep.n == 256
    parts = [_fp8_layout._prepare_2d(expert_weight(qw, e)) for e in range(3)]
    for name, dim in (("weight", 0), ("w_scale", 0), ("w_block_scale", 0), ("w_group_scale", 1)):
        got, want = getattr(prep, name), [getattr(p, name) for p in parts]
        assert (got is None) == (want[0] is None), name
        if got is not None:  # expert e's slice at e * (its length along the stacked dim)
            assert got.shape[dim] == 3 * want[0].shape[dim], name
            assert all(torch.equal(g, w) for g, w in zip(got.chunk(3, dim), want, strict=True)), name
    if weight == "e4m3":  # and each slice is that expert's dequantized matrix
        values = prep.weight[:, :300].view(torch.float8_e4m3fn).to(torch.float64).view(3, 256, 300)
        for e in range(3):
            if prep.scale_mode == "block128":
                s = prep.w_block_scale.view(3, 2, -1)[e].repeat_interleave(128, 0).repeat_interleave(128, 1)[:, :300]
            else:
                s = prep.w_scale.view(3, 256)[e][:, None]
            want = humming.dequantize(expert_weight(qw, e), torch.float32)
            assert torch.equal((values[e] * s.to(torch.float64)).to(torch.float32), want)
    with pytest.raises(ValueError, match="prep: expected expert-stacked"):
        fp8_gemm.run_grouped(parts[0], torch.empty(16, 300), get_act_scheme("fp8"), None, 16, None, torch.bfloat16)


def test_grouped_unsupported_says_why():
    from humming.cuda_kernels import grouped as cuda_grouped

    x = torch.empty(32, 300, dtype=torch.bfloat16)
    fp8, g128, tensor = get_act_scheme("fp8"), get_act_scheme("fp8_g128"), get_act_scheme("fp8_tensor")
    e4m3, block, int4 = _stacked("e4m3", -1), _stacked("e4m3", (128, 128)), _stacked("int4", 128)
    for reason_of in (fp8_gemm.grouped_unsupported, cuda_grouped.grouped_unsupported):
        assert "not a CUDA device" in reason_of(e4m3, fp8, x, 16)  # every other check passes
        assert "not a CUDA device" in reason_of(block, g128, x, 16)
        assert "not a CUDA device" in reason_of(int4, fp8, x, 16)
        assert "padding rows and skipped blocks" in reason_of(e4m3, tensor, x, 16)
        assert "not a CUDA device" in reason_of(_stacked("e4m3", -1, n=192), fp8, x, 16)
        assert "block_m % 8 == 0" in reason_of(e4m3, fp8, x, 12)
        assert "1x128 activation groups" in reason_of(block, fp8, x, 16)
        assert "per-token or per-tensor" in reason_of(int4, g128, x, 16)
        assert "not a CUDA device" in reason_of(_stacked("mxfp4", 32), fp8, x, 16)
        assert "e4m3 activations" in reason_of(e4m3, get_act_scheme("int8"), x, 16)
    dense = humming.quantize(torch.randn(256, 300), weight="e4m3", group_size=-1)
    assert "expert-stacked" in fp8_gemm.grouped_unsupported(dense, fp8, x, 16)
    with pytest.raises(ValueError, match=r"humming CUDA backend: .*padding rows"):
        cuda_grouped.grouped_linear(x, e4m3, torch.zeros(2, dtype=torch.int32), 16, None, tensor, torch.bfloat16)


@pytest.mark.parametrize(("weight", "group"), [("e4m3", -1), ("e4m3", (128, 128)), ("int4", 128), ("mxfp4", 32)])
def test_stacked_experts_take_n_rounded_up_to_128_rows(weight, group, seed):
    """N = 192: each expert's part of every stacked tensor is its own 2-D preparation, 256 rows apart (e4m3:
    64 zero rows added; the 4-bit codes and every scale tensor come padded), so no weight tile straddles two
    experts."""
    qw = _stacked(weight, group, n=192)
    prep = fp8_gemm.prepare(qw)
    dims = {"weight": 0, "w_scale": 0, "w_block_scale": 0, "w_group_scale": 1}
    for e in range(3):
        one = fp8_gemm.prepare(expert_weight(qw, e))
        for name, dim in dims.items():
            stacked, part = getattr(prep, name), getattr(one, name)
            if part is None:
                assert stacked is None, name
                continue
            slot = stacked.shape[dim] // 3
            rows = {"weight": 256 if weight == "e4m3" else 4, "w_block_scale": 2}.get(name, 256)
            assert slot == rows, (name, stacked.shape)
            mine = stacked.narrow(dim, e * slot, slot)
            assert torch.equal(mine.narrow(dim, 0, part.shape[dim]), part), f"{name} of expert {e}"
            assert not mine.narrow(dim, part.shape[dim], slot - part.shape[dim]).any(), f"{name}: padding rows"


def test_grouped_warmup_jobs_are_the_kernels_run_grouped_runs():
    qw, fp8 = _stacked("e4m3", (128, 128)), get_act_scheme("fp8_g128")
    jobs = fp8_gemm.grouped_warmup_jobs(qw, fp8, (64, 4096), (16, 64), torch.bfloat16, None, H200)
    want = []
    for block_m in (16, 64):
        for m in (64, 4096):
            tuning = fp8_gemm.choose_grouped_tuning(block_m, m, 256, 3, H200)
            spec = fp8_gemm.call_spec("e4m3", "block128", None, torch.bfloat16, tuning, grouped=True)
            want += [(spec, "sm_90a")] if (spec, "sm_90a") not in want else []
    assert jobs == want and all("_grouped_w8a8_block128_" in spec.name for spec, _ in jobs)
    (w4, _), *_ = fp8_gemm.grouped_warmup_jobs(
        _stacked("int4", 128), get_act_scheme("fp8"), (64,), (32,), torch.float32, None, H200
    )
    assert "_grouped_w4a8_group_of32_" in w4.name and w4.name.endswith("_stg")
    mx = _stacked("mxfp4", 32, k=512)
    jobs = fp8_gemm.grouped_warmup_jobs(mx, get_act_scheme("fp8"), (64, 4096), (16, 64), torch.bfloat16, None, H200)
    want = []
    for block_m in (16, 64):
        for m in (64, 4096):
            tuning = fp8_gemm.choose_grouped_tuning(block_m, m, 256, 3, H200, "mxfp4")
            spec = fp8_gemm.call_spec("mxfp4", "rowcol", None, torch.bfloat16, tuning, grouped=True)
            want += [(spec, "sm_90a")] if (spec, "sm_90a") not in want else []
    assert jobs == want and fp8_gemm.prepare(mx).scale_mode == "rowcol"
    assert (
        fp8_gemm.grouped_warmup_jobs(qw, get_act_scheme("fp8_tensor"), (64,), (16,), torch.bfloat16, None, H200) == []
    )
    dense = humming.quantize(torch.randn(256, 300), weight="e4m3", group_size=-1)
    assert fp8_gemm.grouped_warmup_jobs(dense, fp8, (64,), (16,), torch.bfloat16, None, H200) == []


@pytest.mark.parametrize("group", ["tensor", -1, (128, 128), (256, 384)])
@pytest.mark.parametrize("n,k", [(130, 256), (130, 100), (130, 99), (300, 1000)])
def test_prepared_weight_is_the_e4m3_matrix(group, n, k, seed):
    qw = humming.quantize(torch.randn(n, k) * 0.1, weight="e4m3", group_size=group, scale_dtype=torch.bfloat16)
    prep = fp8_gemm.prepare(qw)
    assert prep is fp8_gemm.prepare(qw)
    assert prep.kp % 16 == 0 and prep.kp >= k
    assert torch.equal(prep.weight[:, :k], humming.ir.unpacked_codes(qw).to(torch.uint8))
    assert not prep.weight[:, k:].any()
    values = prep.weight[:, :k].view(torch.float8_e4m3fn).to(torch.float64)
    if prep.scale_mode == "block128":
        assert prep.w_scale is None and prep.w_block_scale.shape == (-(-n // 128), -(-k // 128))
        s = prep.w_block_scale.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    else:
        assert prep.w_block_scale is None and prep.w_scale.shape == (-(-n // 128) * 128,)
        assert not prep.w_scale[n:].any()
        s = prep.w_scale[:n, None]
    assert torch.equal((values * s.to(torch.float64)).to(torch.float32), humming.dequantize(qw, torch.float32))


@pytest.mark.parametrize("weight,group", [("e4m3", -1), ("int4", 128), ("mxfp4", 32)])
def test_humming_prepare_with_act_repacks_for_the_kernel_linear_runs(weight, group):
    """``humming.prepare(qw, "cuda", act=...)`` at load time is the layout linear then runs: no repack later
    (the FP8 GEMM's for e4m3 weights; the WnA16 fragment layout for int4 and MXFP4, whose small-M
    fp8-activation calls run through the WnA16 kernels)."""
    from humming import cuda_kernels
    from humming.cuda_kernels._layout import PreparedWeight

    qw = humming.quantize(torch.randn(256, 256), weight=weight, group_size=group)
    prep = humming.prepare(qw, "cuda", act="fp8")
    if weight != "e4m3":
        assert isinstance(prep, PreparedWeight) and prep is cuda_kernels.prepare(qw)
    else:
        assert isinstance(prep, fp8_gemm.PreparedFp8) and prep is fp8_gemm.prepare(qw)
    assert humming.prepare(qw, "triton", act="fp8") is qw


def _prmt(a: int, b: int, sel: int) -> int:
    """PTX prmt.b32 (default mode): byte i = byte (sel >> 4i) & 7 of {b, a}, sign-replicated if bit 3 is set."""
    pool = (b << 32) | a
    out = 0
    for i in range(4):
        nib = (sel >> (4 * i)) & 0xF
        byte = (pool >> (8 * (nib & 7))) & 0xFF
        out |= (0xFF if byte & 0x80 else 0) << (8 * i) if nib & 8 else byte << (8 * i)
    return out


def _int4x8_to_e4m3(word: int) -> tuple[int, int]:
    """The header's int4x8_to_e4m3, run on the host with its constants read from the header."""
    text = (jit.INCLUDE_DIR / "humming" / "fp8_gemm_sm90.cuh").read_text()
    table = {k: int(v, 16) for k, v in re.findall(r"(k(?:Pos|Neg)[01]) = (0x[0-9A-F]+)u", text)}
    flipped = word ^ 0x88888888

    def half(codes: int, flipped_codes: int) -> int:
        return _prmt(table["kPos0"], table["kPos1"], codes) ^ _prmt(table["kNeg0"], table["kNeg1"], flipped_codes)

    return half(word, flipped), half(word >> 16, flipped >> 16)


def test_int4_codes_turn_into_their_e4m3_values():
    """Every int4 value, written as its kernel code (_INT4_CODES) at every one of a word's eight places,
    becomes the e4m3 byte of that value; code 0 (the zero padding) is 0."""
    values = torch.tensor([v if v < 8 else v - 16 for v in range(16)], dtype=torch.float32)  # two's complement
    want = values.to(torch.float8_e4m3fn).view(torch.uint8).tolist()
    codes = _fp8_layout._INT4_CODES
    assert sorted(codes) == list(range(16)) and codes[0] == 0
    for t in range(16):
        places = [(t + 3 * i) % 16 for i in range(8)]  # raw codes at places 0 .. 7
        lo, hi = _int4x8_to_e4m3(sum(codes[c] << (4 * i) for i, c in enumerate(places)))
        got = [(lo >> (8 * j)) & 0xFF for j in range(4)] + [(hi >> (8 * j)) & 0xFF for j in range(4)]
        assert got == [want[c] for c in places], t


def _read_tiles(tiles: torch.Tensor) -> torch.Tensor:
    """Read pre-tiled 4-bit codes ``uint8 [N/64, K/128, 4096]`` back the way each consumer thread does (two
    16-byte loads, each word -> a0/a1 or a2/a3 of one k-step) into ``[N, K]`` codes at the (row, k) that the
    wgmma A fragment puts them."""
    words = tiles.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF  # [N/64, K/128, 1024 words]
    n_pad, k_pad = words.shape[0] * 64, words.shape[1] * 128
    seen = torch.full((n_pad, k_pad), -1, dtype=torch.int64)
    for warp in range(4):
        for lane in range(32):
            g, c = lane // 4, lane % 4
            for half in range(2):
                for j in range(4):  # word j of this thread's 16 bytes
                    word = words[:, :, warp * 256 + half * 128 + lane * 4 + j]  # [N/64, K/128]
                    step, q = 2 * half + j // 2, j % 2
                    for hi in range(2):  # a0 / a2 (row g) in the low half, a1 / a3 (row g + 8) in the high
                        for e in range(4):
                            rows = torch.arange(0, n_pad, 64).view(-1, 1) + 16 * warp + g + 8 * hi
                            cols = torch.arange(0, k_pad, 128).view(1, -1) + 32 * step + 16 * q + 4 * c + e
                            seen[rows, cols] = (word >> (16 * hi + 4 * e)) & 0xF
    return seen


@pytest.mark.parametrize("group", [-1, 128, 256, "tensor"])
def test_int4_tiles_are_the_wgmma_fragments(group, seed):
    n, k = 130, 300
    qw = humming.quantize(torch.randn(n, k), weight="int4", group_size=group, scale_dtype=torch.float32)
    prep = fp8_gemm.prepare(qw)
    assert prep.w_bits == 4 and prep.scale_mode == ("group" if group in (128, 256) else "rowcol")
    seen = _read_tiles(prep.weight)
    codes = torch.tensor(_fp8_layout._INT4_CODES)[humming.ir.unpacked_codes(qw).long()]
    assert torch.equal(seen[:n, :k], codes)
    assert not seen[n:].any() and not seen[:, k:].any()
    scales = qw.scales.to(torch.float32)
    if prep.scale_mode == "group":
        per_block = prep.w_group_scale[:, :n].T  # [N, K/128]
        assert torch.equal(per_block, scales.repeat_interleave(qw.group_size // 128, 1)[:, : per_block.shape[1]])
    else:
        assert torch.equal(prep.w_scale[:n], scales.expand(n, 1).reshape(n))


def _e2m1x8_to_e4m3(word: int, offset_lo: int, offset_hi: int) -> tuple[int, int]:
    """The header's mx_table and e2m1x8_to_e4m3, run on the host with the header's constants (32-bit
    multiply-adds) on a word packed as the kernel reads it."""
    text = (jit.INCLUDE_DIR / "humming" / "fp8_gemm_sm90.cuh").read_text()
    pairs = re.findall(r"offset \* (0x\w+)u \+ (0x\w+)u", text)
    (m_lo, c_lo), (m_hi, c_hi) = [(int(a, 16), int(b, 16)) for a, b in pairs]

    def table(offset: int) -> tuple[int, int]:
        return (offset * m_lo + c_lo) & 0xFFFFFFFF, (offset * m_hi + c_hi) & 0xFFFFFFFF

    magnitudes = word & 0x77777777
    lo = ((word << 4) & 0x80808080) | _prmt(*table(offset_lo), magnitudes)
    hi = (word & 0x80808080) | _prmt(*table(offset_hi), magnitudes >> 16)
    return lo, hi


_E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float64)


def _mx_word(codes: list[int]) -> int:
    """Eight e2m1 codes (places 0-3: row r, 4-7: row r + 8) as the packed word the kernel reads."""
    raw = torch.tensor([sum(c << (4 * p) for p, c in enumerate(codes))], dtype=torch.int64)
    raw = torch.where(raw >= 2**31, raw - 2**32, raw).to(torch.int32).view(torch.uint8)
    return int(_fp8_layout._pack_mx_signs(raw).view(torch.int32)) & 0xFFFFFFFF


def _e4m3_table() -> torch.Tensor:
    """uint8 [13, 16]: the kernel's e4m3 byte of e2m1 code c under table offset o = 0 .. 12 (d = o - 6; offset 0
    is that of groups of zeros), each code at every place of a word (the low half of a word under one offset,
    the high half under another)."""
    rows = []
    for offset in range(13):
        row = []
        for c in range(16):
            places = []
            for p in range(8):
                codes = [(c + 5 * q) % 16 if q != p else c for q in range(8)]
                other = (offset + 1) % 13  # the other half's offset
                lo, hi = _e2m1x8_to_e4m3(_mx_word(codes), *((offset, other) if p < 4 else (other, offset)))
                places.append(((lo if p < 4 else hi) >> (8 * (p % 4))) & 0xFF)
            assert len(set(places)) == 1, (offset, c, places)  # the same byte at every place
            row.append(places[0])
        rows.append(row)
    return torch.tensor(rows, dtype=torch.uint8)


def test_e2m1_codes_turn_into_e2m1_times_two_to_the_shift():
    """Every e2m1 code at every place of a packed word, under every table offset d + 6: e2m1 * 2^d in e4m3
    (-0 as -0); groups of zeros (offset 0) decode +-0 to +-0."""
    table = _e4m3_table()
    for d in range(-5, 7):
        want = _E2M1 * 2.0**d
        assert torch.equal(want.to(torch.float8_e4m3fn).to(torch.float64), want), d  # exact: every value is an e4m3
        got = table[d + 6].view(torch.float8_e4m3fn).to(torch.float64)
        assert torch.equal(got, want) and torch.equal(got.signbit(), want.signbit()), d
    assert table[0, 0] == 0 and table[0, 8] == 0x80


def _unpack_mx_signs(tiles: torch.Tensor) -> torch.Tensor:
    """The inverse of the layout's sign move: nibble j of a word gets the sign in bit 3 of nibble 2j, nibble
    4 + j that of nibble 2j + 1."""
    words = tiles.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    out = words & 0x77777777
    for j in range(4):
        out |= ((words >> (8 * j + 3)) & 1) << (4 * j + 3)
        out |= ((words >> (8 * j + 7)) & 1) << (16 + 4 * j + 3)
    return torch.where(out >= 2**31, out - 2**32, out).to(torch.int32).view(torch.uint8)


def _mx_weight(n: int, k: int, exps: torch.Tensor, codes: torch.Tensor | None = None):
    """An MXFP4 weight with the given e8m0 exponent bytes ``[n, ceil(k / 32)]`` and random (or given) codes."""
    from humming.ir.packing import pack_codes

    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8) if codes is None else codes
    scales = exps.to(torch.uint8).view(torch.float8_e8m0fnu)
    return humming.QuantizedWeight((n, k), "e2m1", pack_codes(codes, 4), scales, (1, 32))


@pytest.mark.parametrize("global_scale", [None, 0.37])
@pytest.mark.parametrize(
    "n,k,span,drift", [(130, 300, 12, 0), (64, 128, 1, 0), (256, 1024, 12, 0), (70, 40, 3, 0), (256, 1024, 12, 4)]
)
def test_mxfp4_tiles_decode_to_dequantize_bit_for_bit(n, k, span, drift, global_scale, seed):
    """Decode the packed tiles as the kernel does (fragment order, signs moved, table offset per row and k-step)
    and scale by the fp32 scale per row (rows whose scales span at most 12 binades: ``rowcol``, applied in the
    epilogue) or per (row, 128-K block) (``group``, here odd blocks ``drift`` binades up: rows of 16): the result
    is ``humming.dequantize`` bit for bit."""
    groups = -(-k // 32)
    exps = torch.randint(127 - 20, 127 - 20 + span, (n, groups))
    exps += drift * ((torch.arange(groups) // 4) % 2)  # K blocks 1, 3, ...: drift binades up
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8)
    codes[:, :32] &= 8  # a group of zeros (+-0): its scale must not count towards the span
    exps[:, 0] = 0
    qw = _mx_weight(n, k, exps, codes)
    if global_scale is not None:  # folded into the fp32 scale: 2^(t - 6) * g is exact in fp32
        qw = qw.replace(global_scale=torch.tensor(global_scale))
    prep = fp8_gemm.prepare(qw)
    per_row = span + drift <= 12
    assert prep.w_format == "mxfp4" and prep.scale_mode == ("rowcol" if per_row else "group")
    assert prep.weight.shape[-1] == 4096 + 256
    codes_back = _read_tiles(_unpack_mx_signs(prep.weight[..., :4096]))
    n_pad, k_pad = codes_back.shape
    assert torch.equal(codes_back[:n, :k], codes.long())
    assert not codes_back[n:].any() and not codes_back[:, k:].any()
    # offset byte of (row r, k-step g) of a tile at 4 r + g after its codes
    offsets = prep.weight[..., 4096:].reshape(n_pad // 64, k_pad // 128, 64, 4).permute(0, 2, 1, 3)
    offsets = offsets.reshape(n_pad, k_pad // 32).to(torch.int64)
    assert (offsets <= 12).all() and (offsets[:n, 1:] > 0).any()
    offset = offsets.repeat_interleave(32, 1)  # [N, K] per element
    e4m3 = _e4m3_table()[offset, codes_back]
    if per_row:
        assert prep.w_group_scale is None and prep.w_scale.shape == (n_pad,)
        scale = prep.w_scale[:, None].expand(n_pad, k_pad)  # [N, K] fp32 per row
    else:
        assert prep.w_scale is None
        scale = prep.w_group_scale.T.repeat_interleave(128, 1)  # [N, K] fp32 per row and 128-K block
    values = e4m3.view(torch.float8_e4m3fn).to(torch.float64) * scale.to(torch.float64)
    assert torch.equal(values[:n, :k].to(torch.float32), humming.dequantize(qw, torch.float32))
    assert not values[n:].any() and not values[:, k:].any()


def test_mxfp4_experts_fold_alike():
    """Expert-stacked MXFP4: the experts fold per row when every expert's rows allow it, else all per K block
    (one kernel runs them all), and the stacked parts are each expert's prepared alone."""
    e, n, k = 3, 64, 512
    exps = torch.randint(110, 122, (e, n, k // 32))
    narrow = humming.QuantizedWeight(
        (e, n, k),
        "e2m1",
        torch.randint(0, 2**31, (e, n, k // 8), dtype=torch.int32),
        exps.to(torch.uint8).view(torch.float8_e8m0fnu),
        (1, 32),
    )
    assert fp8_gemm.prepare(narrow).scale_mode == "rowcol"
    exps[1, 7, 4:8] += 6  # expert 1, row 7: K 128..255 six binades up, 18 in the row, 12 in the block
    wide = narrow.replace(scales=exps.to(torch.uint8).view(torch.float8_e8m0fnu))
    assert _fp8_layout._layout_unsupported(wide) is None
    stacked = fp8_gemm.prepare(wide)
    assert stacked.scale_mode == "group" and stacked.w_scale is None
    alone = fp8_gemm.prepare(expert_weight(wide, 2))
    assert alone.scale_mode == "rowcol"  # alone it folds per row; stacked it follows expert 1
    part = _fp8_layout._prepare_2d(expert_weight(wide, 2), mx_per_row=False)
    tiles = part.weight.shape[0]  # N rounded up to 128 rows: 2 tiles of 64
    assert part.scale_mode == "group" and torch.equal(stacked.weight[2 * tiles : 3 * tiles], part.weight)
    assert torch.equal(part.weight[..., :4096], alone.weight[..., :4096])  # the same codes, other offsets


def test_mxfp4_from_the_quantizer_is_taken():
    qw = humming.quantize(torch.randn(256, 512), weight="mxfp4")
    assert fp8_gemm.weight_unsupported(qw) is None
    x = torch.empty(4, 512, dtype=torch.bfloat16)
    assert "not a CUDA device" in fp8_gemm.unsupported(qw, get_act_scheme("fp8"), x)  # passes the weight checks


def test_mxfp4_that_cannot_be_folded_exactly_is_refused():
    n, k = 64, 256
    exps = torch.full((n, k // 32), 120)
    assert fp8_gemm.weight_unsupported(_mx_weight(n, k, exps)) is None
    exps[5, 6] = 120 - 12  # 13 binades within K 128..255 of row 5
    wide = _mx_weight(n, k, exps)
    reason = fp8_gemm.weight_unsupported(wide)
    assert "row 5, K 128..255 span 13 binades" in reason
    assert fp8_gemm.weight_unsupported(wide) is reason  # decided once per weight
    with pytest.raises(ValueError, match="qw: MXFP4 scales of row 5"):
        fp8_gemm.prepare(wide)
    exps[5, 6] = 120 - 11  # 12 binades: folded
    assert fp8_gemm.weight_unsupported(_mx_weight(n, k, exps)) is None
    exps[5, 6] = 255  # e8m0 NaN: no weight holds one
    with pytest.raises(ValueError, match=r"scales: expected finite values, got nan at index \[5, 6\]"):
        _mx_weight(n, k, exps)
    x = torch.empty(4, 256, dtype=torch.bfloat16)
    narrow = _mx_weight(n, k, torch.full((n, k // 32), 120))
    assert "per-token or per-tensor" in fp8_gemm.unsupported(narrow, get_act_scheme("fp8_g128"), x)
    stacked_nvfp4 = humming.stack([humming.quantize(torch.randn(64, 256), weight="nvfp4") for _ in range(2)])
    with pytest.raises(ValueError, match=r"qw: the W4A8 GEMM takes e2m1 weights with e8m0 scales"):
        fp8_gemm.prepare(stacked_nvfp4)
    nvfp4 = humming.quantize(torch.randn(64, 256), weight="nvfp4")
    bf16_scales = humming.quantize(torch.randn(64, 256), weight="e2m1", group_size=32, scale_dtype=torch.bfloat16)
    for qw in (nvfp4, bf16_scales):
        assert "e8m0 scales in groups of 32 (MXFP4)" in fp8_gemm.weight_unsupported(qw)


@pytest.mark.parametrize(
    ("fmt", "group", "act"),
    [
        ("e4m3", -1, "fp8"),
        ("e4m3", (128, 128), "fp8_g128"),
        ("e4m3", "tensor", "fp8_tensor"),
        ("int4", 128, "fp8"),
        ("mxfp4", 32, "fp8"),
    ],
)
def test_operand_builders_define_the_ir_product(fmt, group, act, seed):
    """The shared operands (humming.testing) are valid IR and their float64 product is the IR's own,
    ``dequantize_activation(x) @ dequantize(W)^T + bias``, within the fp32 rounding of the activations'
    ``code * scale`` (1e-6 relative)."""
    qw = random_weight(40, 300, group, "cpu", torch.float32, fmt)
    qa = random_activation(7, 300, act, "cpu")
    assert qa.codes.ne(0x7F).all() and qa.codes.ne(0xFF).all()
    ir = humming.dequantize_activation(qa, torch.float64) @ humming.dequantize(qw, torch.float64).T
    assert_rel_close(reference(qa, qw, qw.bias), ir + qw.bias.to(torch.float64), 1e-6, precision=torch.float64)


def test_unsupported_combinations_say_why():
    x = torch.empty(4, 256, dtype=torch.bfloat16)
    e4m3 = humming.quantize(torch.randn(64, 256), weight="e4m3", group_size=-1)
    block = humming.quantize(torch.randn(256, 256), weight="e4m3", group_size=(128, 128))
    block64 = humming.quantize(torch.randn(256, 256), weight="e4m3", group_size=(64, 128))
    uint4 = humming.quantize(torch.randn(64, 256), weight="uint4", group_size=128, zero_point=True)
    int4_g64 = humming.quantize(torch.randn(64, 256), weight="int4", group_size=64)
    int4 = humming.quantize(torch.randn(64, 256), weight="int4", group_size=128)
    fp8, g128 = get_act_scheme("fp8"), get_act_scheme("fp8_g128")
    assert "e4m3, int4 or MXFP4 (e2m1) weights" in fp8_gemm.unsupported(uint4, fp8, x)
    assert "128-multiple group" in fp8_gemm.unsupported(int4_g64, fp8, x)
    assert "per-token or per-tensor" in fp8_gemm.unsupported(int4, g128, x)
    assert "fp8 activations" in fp8_gemm.unsupported(e4m3, None, x)
    assert "1x128 activation groups" in fp8_gemm.unsupported(block, fp8, x)
    assert "multiples of 128 x 128" in fp8_gemm.unsupported(block64, g128, x)
    assert "per-token or per-tensor" in fp8_gemm.unsupported(e4m3, g128, x)
    assert "e4m3 activations" in fp8_gemm.unsupported(e4m3, get_act_scheme("int8"), x)
    assert "not a CUDA device" in fp8_gemm.unsupported(e4m3, fp8, x)
    with pytest.raises(ValueError, match="humming FP8 GEMM"):
        fp8_gemm.linear(x, e4m3, None, fp8, torch.bfloat16)


# ---- GPU ----


@dataclass(frozen=True)
class Case:
    m: int
    n: int
    k: int
    weight: object  # group_size: "tensor", -1 (per-channel) or a (bn, bk) block
    act: str
    out: torch.dtype = torch.bfloat16
    bias: torch.dtype | None = None
    w: str = "e4m3"  # weight format: e4m3 (W8A8), int4 or mxfp4 (W4A8; mxfp4: e8m0 scales per 32)
    mx_row_span: int = 12  # MXFP4: binades of a row's scales (above 12: folded per 128-K block)


CASES = [
    # real shapes
    Case(1, 8192, 8192, -1, "fp8"),
    Case(16, 28672, 8192, -1, "fp8", bias=torch.bfloat16),
    Case(128, 8192, 8192, "tensor", "fp8_tensor", torch.float16),
    Case(1024, 28672, 8192, -1, "fp8"),
    Case(8192, 8192, 8192, -1, "fp8", bias=torch.float32),
    Case(4096, 28672, 8192, (128, 128), "fp8_g128"),
    Case(3, 8192, 8192, (128, 128), "fp8_g128", torch.float16, torch.bfloat16),
    Case(8192, 8192, 8192, (128, 128), "fp8_g128"),
    # odd shapes: M, N, K off every tile size, K % 16 != 0, N % 8 != 0, partial 128x128 blocks
    Case(37, 333, 1000, -1, "fp8", bias=torch.float16),
    Case(130, 4100, 2056, "tensor", "fp8", torch.float16),
    Case(300, 1000, 520, -1, "fp8_tensor"),
    Case(300, 1001, 520, -1, "fp8", torch.float32, torch.float32),
    Case(5, 129, 72, -1, "fp8"),
    Case(200, 1000, 1000, (128, 128), "fp8_g128", bias=torch.float32),
    Case(1, 200, 4000, (128, 128), "fp8_g128"),
    # W4A8: int4 weights, per-channel / 128-multiple groups, per-token / per-tensor activations
    Case(1, 8192, 8192, 128, "fp8", w="int4"),
    Case(16, 28672, 8192, 128, "fp8", bias=torch.bfloat16, w="int4"),
    Case(1024, 8192, 8192, -1, "fp8_tensor", torch.float16, w="int4"),
    Case(4096, 28672, 8192, 128, "fp8", w="int4"),
    Case(37, 333, 1000, 256, "fp8", bias=torch.float32, w="int4"),
    Case(130, 100, 72, "tensor", "fp8", w="int4"),
    Case(64, 1000, 1024, 128, "fp8", torch.float32, w="int4"),
    # W4A8 MXFP4: e2m1 x e8m0 per 32 (scales over 12 binades), real shapes
    Case(1, 4096, 4096, 32, "fp8", w="mxfp4"),
    Case(16, 4096, 4096, 32, "fp8_tensor", torch.float16, w="mxfp4"),
    Case(1024, 4096, 4096, 32, "fp8", bias=torch.bfloat16, w="mxfp4"),
    Case(1, 28672, 8192, 32, "fp8", bias=torch.float32, w="mxfp4"),
    Case(16, 28672, 8192, 32, "fp8", w="mxfp4"),
    Case(1024, 28672, 8192, 32, "fp8", torch.float16, w="mxfp4"),
    # MXFP4 odd shapes: N, K off the tiles (K % 32 != 0), M = 1, 3, 77, 300, fp32 out, bias
    Case(3, 333, 1000, 32, "fp8", bias=torch.float32, w="mxfp4"),
    Case(77, 1000, 520, 32, "fp8_tensor", torch.float16, w="mxfp4"),
    Case(300, 1001, 300, 32, "fp8", torch.float32, torch.float32, w="mxfp4"),
    Case(1, 129, 72, 32, "fp8", torch.float32, w="mxfp4"),
    # MXFP4 rows over 12 binades: scales folded per 128-K block, promoted at every block
    Case(1024, 4096, 4096, 32, "fp8", bias=torch.bfloat16, w="mxfp4", mx_row_span=16),
    Case(16, 28672, 8192, 32, "fp8", w="mxfp4", mx_row_span=16),
    Case(300, 1001, 300, 32, "fp8", torch.float32, torch.float32, w="mxfp4", mx_row_span=15),
]


def _ids(case: Case) -> str:
    group = "x".join(map(str, case.weight)) if isinstance(case.weight, tuple) else case.weight
    bias = str(case.bias)[6:]
    span = f"-span{case.mx_row_span}" if case.mx_row_span != 12 else ""
    return f"{case.w}{span}-m{case.m}-n{case.n}-k{case.k}-w{group}-{case.act}-{str(case.out)[6:]}-b{bias}"


def _problem(case: Case):
    """(weight, activations, bias, float64 reference) for ``case`` on the GPU: operands built directly in the
    IR (:mod:`humming.testing`), so that the check depends on nothing but the kernel."""
    qw = random_weight(case.n, case.k, case.weight, "cuda", fmt=case.w, mx_row_span=case.mx_row_span)
    qa = random_activation(case.m, case.k, case.act, "cuda")
    bias = None if case.bias is None else torch.randn(case.n, device="cuda", dtype=case.bias)
    return qw, qa, bias, reference(qa, qw, bias)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_matches_float64_reference(case, seed, fp8_sm90):
    qw, qa, bias, ref = _problem(case)
    assert fp8_gemm.unsupported(qw, qa.scheme, qa.codes, case.out) is None
    if case.w == "mxfp4":  # the scales fold per row where the rows allow it, else per 128-K block
        assert fp8_gemm.prepare(qw).scale_mode == ("rowcol" if case.mx_row_span <= 12 else "group")
    n_pad = -(-case.n // 8) * 8
    out = torch.full((case.m, n_pad), float("nan"), device="cuda", dtype=case.out)[:, : case.n]
    fp8_gemm.run(fp8_gemm.prepare(qw), qa, qa.scheme, bias, case.out, out=out)
    assert_rel_close(out, ref, precision=torch.float64, seed=seed)


@pytest.mark.gpu
@pytest.mark.parametrize("act_name", ["fp8", "fp8_tensor", "fp8_g128"])
def test_linear_quantizes_with_the_triton_pass(act_name, seed, fp8_sm90):
    from humming.triton_kernels.act_quant import quantize_activation

    qw, _, bias, _ = _problem(Case(1, 1000, 1000, (128, 128) if act_name == "fp8_g128" else -1, act_name))
    act = get_act_scheme(act_name)
    x = torch.randn(45, 1000, device="cuda", dtype=torch.bfloat16)
    out = fp8_gemm.linear(x, qw, bias, act, torch.bfloat16)
    qa = quantize_activation(x, act)
    assert torch.equal(out, fp8_gemm.run(fp8_gemm.prepare(qw), qa, act, bias, torch.bfloat16))
    assert_rel_close(out, reference(qa, qw, bias), precision=torch.float64, seed=seed)


@pytest.mark.gpu
def test_every_tuning_computes_the_same_function(seed, fp8_sm90):
    weights = ((-1, "fp8", "e4m3"), ((128, 128), "fp8_g128", "e4m3"), (128, "fp8", "int4"), (32, "fp8", "mxfp4"))
    for weight, act_name, w in weights:
        qw, qa, _, ref = _problem(Case(77, 1000, 1000, weight, act_name, w=w))
        prep = fp8_gemm.prepare(qw)
        for wgs, block_m, stages, min_blocks, tma in ((1, 8, 2, 2, True), (1, 32, 4, 2, False), (2, 64, 3, 1, True)):
            tuning = fp8_gemm.Fp8Tuning(wgs, block_m, stages, min_blocks, group_m=2, tma_store=tma)
            assert_rel_close(
                fp8_gemm.run(prep, qa, qa.scheme, None, torch.bfloat16, tuning=tuning),
                ref,
                precision=torch.float64,
                seed=seed,
            )


def _record_grids(monkeypatch) -> list:
    """The grids of the FP8 launches made from here on."""
    grids, init = [], _fp8_launch.Fp8Launch.__init__

    def recording(self, *args, **kwargs):
        init(self, *args, **kwargs)
        grids.append(self.grid)

    monkeypatch.setattr(_fp8_launch.Fp8Launch, "__init__", recording)
    return grids


@pytest.mark.gpu
@pytest.mark.parametrize(
    "tile", [(2, 128, 4, 1), (2, 128, 3, 1), (1, 64, 4, 2), (1, 16, 3, 2)], ids=["w2m128", "w2m128s3", "w1m64", "w1m16"]
)
@pytest.mark.parametrize("k", [1000, 1152, 128])  # 8 and 9 K blocks a tile; one (epilogues back to back)
def test_persistent_grid_gives_the_bits_of_one_block_per_tile(tile, k, seed, fp8_sm90, monkeypatch):
    """A persistent grid (here 3 SMs' block slots, so that each block walks many tiles with its stage ring
    running on across them and its epilogue's store left in flight) computes every tile as a block of its own
    would: the same bits, for every weight format and scale mode, TMA-store and plain-store epilogues, K block
    counts that start tiles anywhere in the stage ring, and one-block tiles whose epilogues follow each other
    (three calls each)."""
    real = _fp8_launch.device_limits
    monkeypatch.setattr(_fp8_launch, "device_limits", lambda device=None: real(device)._replace(sm_count=3))
    grids = _record_grids(monkeypatch)
    weights = ((-1, "fp8", "e4m3"), ((128, 128), "fp8_g128", "e4m3"), (128, "fp8", "int4"), (32, "fp8", "mxfp4"))
    for weight, act_name, w in weights:
        qw, qa, bias, ref = _problem(Case(300, 1000, k, weight, act_name, bias=torch.bfloat16, w=w))
        prep = fp8_gemm.prepare(qw)
        for tma in (True, False):
            tuning = fp8_gemm.Fp8Tuning(*tile, group_m=2, tma_store=tma)
            first = len(grids)
            one = fp8_gemm.run(prep, qa, qa.scheme, bias, torch.bfloat16, tuning=tuning)
            walk = dataclasses.replace(tuning, persistent=True)
            for _ in range(3):
                walked = fp8_gemm.run(prep, qa, qa.scheme, bias, torch.bfloat16, tuning=walk)
                assert torch.equal(one, walked), (w, tma)
            assert_rel_close(walked, ref, precision=torch.float64, seed=seed)
            tiles = -(-300 // tuning.block_m) * -(-1000 // tuning.block_n)
            walks = [(3 * tuning.min_blocks, 1, 1)] * 3
            assert grids[first:] == [(tiles, 1, 1), *walks], grids[first:]  # the walk happens


@pytest.mark.gpu
@pytest.mark.parametrize("tile", [(2, 128, 4, 1), (2, 128, 3, 1), (1, 128, 4, 2)], ids=["w2s4", "w2s3", "w1s4"])
@pytest.mark.parametrize("k", [128, 1000, 1152])  # one, 8 and 9 K blocks a tile
def test_codes_read_a_block_ahead_give_the_same_bits(tile, k, seed, fp8_sm90):
    """4-bit weights on 128-token tiles whose conversions read the next K block's codes ahead: the bits of
    reading each block's codes when it is converted, for int4 (per channel, one and four K blocks per
    promotion; g128) and MXFP4, one split, split along K and persistent."""
    weights = ((-1, "int4"), (128, "int4"), (32, "mxfp4"))
    for weight, w in weights:
        qw, qa, bias, ref = _problem(Case(300, 1000, k, weight, "fp8", bias=torch.bfloat16, w=w))
        prep = fp8_gemm.prepare(qw)
        for splits, persistent, promote in ((1, False, 1), (1, False, 4), (2, False, 4), (1, True, 4)):
            tuning = fp8_gemm.Fp8Tuning(
                *tile, splits=splits, tma_store=splits == 1, persistent=persistent, promote_blocks=promote
            )
            now = fp8_gemm.run(prep, qa, qa.scheme, bias, torch.bfloat16, tuning=tuning)
            ahead = fp8_gemm.run(
                prep, qa, qa.scheme, bias, torch.bfloat16, tuning=dataclasses.replace(tuning, prefetch_codes=True)
            )
            assert torch.equal(now, ahead), (w, weight, splits, persistent)
            assert_rel_close(ahead, ref, precision=torch.float64, seed=seed)


@pytest.mark.gpu
@pytest.mark.parametrize("k", [128, 1000, 1152, 2176])  # 1, 8, 9 and 17 K blocks: groups of four and the rest
def test_token_halves_give_the_bits_of_whole_tiles(k, seed, fp8_sm90):
    """128-token tiles issuing each K block's wgmmas as two groups of 64 tokens: the bits of whole-tile wgmmas
    (the same products summed in the same order) for int4 g128 and per channel, MXFP4, and e4m3 in 128 x 128
    blocks with 1 x 128 activation groups and per channel, with codes read ahead or not, one split, split along K
    and persistent."""
    weights = ((-1, "int4", "fp8"), (128, "int4", "fp8"), (32, "mxfp4", "fp8"), ((128, 128), "e4m3", "fp8_g128"))
    weights += ((-1, "e4m3", "fp8"),)
    for weight, w, act in weights:
        qw, qa, bias, ref = _problem(Case(300, 1000, k, weight, act, bias=torch.bfloat16, w=w))
        prep = fp8_gemm.prepare(qw)
        for splits, persistent, ahead in ((1, False, False), (2, False, False), (1, True, False), (1, True, True)):
            tuning = fp8_gemm.Fp8Tuning(
                2, 128, 4, 1, splits=splits, tma_store=splits == 1, persistent=persistent, prefetch_codes=ahead
            )
            whole = fp8_gemm.run(prep, qa, qa.scheme, bias, torch.bfloat16, tuning=tuning)
            halves = fp8_gemm.run(
                prep, qa, qa.scheme, bias, torch.bfloat16, tuning=dataclasses.replace(tuning, token_halves=True)
            )
            assert torch.equal(whole, halves), (w, weight, splits, persistent, ahead)
            assert_rel_close(halves, ref, precision=torch.float64, seed=seed)


@pytest.mark.gpu
@pytest.mark.parametrize("w", ["e4m3", "int4"])
@pytest.mark.parametrize("k", [896, 1024, 8192])  # 7 (an odd last block), 8 and 64 K blocks
def test_k_blocks_per_promotion_match_one(w, k, seed, fp8_sm90):
    """128-token tiles of per-channel weights summing two or four K blocks in the tensor core before each
    promotion: against the float64 reference as closely as one block per promotion (within 5%), split along K
    and persistent too."""
    qw, qa, _, ref = _problem(Case(200, 1000, k, -1, "fp8", w=w))
    prep = fp8_gemm.prepare(qw)
    for splits, persistent in ((1, False), (2, False), (1, True)):
        errors = []
        for promote in (1, 2, 4):
            tuning = fp8_gemm.Fp8Tuning(
                2, 128, 4, 1, splits=splits, tma_store=splits == 1, persistent=persistent, promote_blocks=promote
            )
            out = fp8_gemm.run(prep, qa, qa.scheme, None, torch.bfloat16, tuning=tuning)
            assert_rel_close(out, ref, precision=torch.float64, seed=seed)
            errors.append((out.double() - ref).norm() / ref.norm())
        assert max(errors[1:]) <= 1.05 * errors[0] + 1e-4, (splits, persistent, errors)


@pytest.mark.gpu
def test_mxfp4_runs_through_humming_linear(seed, fp8_sm90):
    """``humming.linear(x, mxfp4, act="fp8")``: ``auto`` picks the CUDA backend on Hopper, ``cuda`` runs it."""
    from humming.triton_kernels.act_quant import quantize_activation

    qw, _, bias, _ = _problem(Case(45, 1000, 1000, 32, "fp8", bias=torch.bfloat16, w="mxfp4"))
    act = get_act_scheme("fp8")
    x = torch.randn(45, 1000, device="cuda", dtype=torch.bfloat16)
    assert humming.explain(qw, 45, act="fp8").backend == "cuda"
    out = humming.linear(x, qw, bias, act="fp8", backend="cuda")
    assert torch.equal(out, humming.linear(x, qw, bias, act="fp8"))
    assert_rel_close(out, reference(quantize_activation(x, act), qw, bias), precision=torch.float64, seed=seed)


@pytest.mark.gpu
def test_cuda_graph_replay(seed, fp8_sm90):
    qw, _, bias, _ = _problem(Case(16, 4096, 4096, -1, "fp8", bias=torch.bfloat16))
    act = get_act_scheme("fp8")
    x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    eager = fp8_gemm.linear(x, qw, bias, act, torch.bfloat16)
    graph, captured = capture(lambda: fp8_gemm.linear(x, qw, bias, act, torch.bfloat16))
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, fp8_gemm.linear(x, qw, bias, act, torch.bfloat16))
    assert not torch.equal(captured, eager)


SPLIT_CASES = [
    # decode M on the shapes split-K is for: every weight format and scale mode, 16- / 32-bit out, bias
    Case(1, 8192, 8192, -1, "fp8"),
    Case(16, 8192, 8192, -1, "fp8", bias=torch.bfloat16),
    Case(3, 4096, 4096, "tensor", "fp8_tensor", torch.float16),
    Case(64, 4096, 4096, (128, 128), "fp8_g128", torch.float32, torch.float32),
    Case(1, 8192, 8192, (128, 128), "fp8_g128", bias=torch.float16),
    Case(1, 8192, 8192, 128, "fp8", w="int4"),
    Case(16, 4096, 4096, 128, "fp8", torch.float32, torch.bfloat16, w="int4"),
    Case(3, 8192, 8192, 32, "fp8", bias=torch.float32, w="mxfp4"),
    Case(64, 4096, 4096, 32, "fp8_tensor", torch.float16, w="mxfp4"),
    # odd N, K: partial tiles, K % 128 != 0, fewer K blocks than splits (empty splits add zeros)
    Case(3, 333, 1000, -1, "fp8", torch.float32, torch.float16),
    Case(16, 1001, 2056, (128, 128), "fp8_g128"),
    Case(64, 1000, 1000, 256, "fp8", bias=torch.float32, w="int4"),
    Case(1, 129, 72, 32, "fp8", w="mxfp4"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", SPLIT_CASES, ids=_ids)
def test_split_k_matches_float64_reference(case, seed, fp8_sm90):
    """Each split count (the heuristic's, 3, 7) against the float64 reference into a NaN-poisoned output;
    with fp32 out also against one split, which differs only by fp32 summation order."""
    qw, qa, bias, ref = _problem(case)
    prep = fp8_gemm.prepare(qw)
    limits = fp8_gemm.device_limits(torch.cuda.current_device())
    chosen = fp8_gemm.choose_split_tuning(case.m, case.n, case.k, limits, prep.w_format)
    n_pad = -(-case.n // 8) * 8
    for splits, read_back in itertools.product(sorted({max(2, chosen.splits), 3, 7}), (False, True)):
        for _ in range(1 + read_back):  # read back twice: the first call leaves its workspace at zero
            out = torch.full((case.m, n_pad), float("nan"), device="cuda", dtype=case.out)[:, : case.n]
            tuning = dataclasses.replace(chosen, splits=splits, read_back=read_back)
            fp8_gemm.run(prep, qa, qa.scheme, bias, case.out, tuning=tuning, out=out)
            assert_rel_close(out, ref, precision=torch.float64, seed=seed)
        if case.out == torch.float32:
            single = fp8_gemm.run(prep, qa, qa.scheme, bias, case.out, tuning=dataclasses.replace(chosen, splits=1))
            rel = ((out - single).norm() / single.norm()).item()
            assert rel < 1e-5, f"splits={splits}, read_back={read_back}: {rel:.2e} from one split"


@pytest.mark.gpu
@pytest.mark.parametrize("read_back", [False, True])
def test_split_k_cuda_graph_replay(read_back, seed, fp8_sm90):
    """Split-K's workspace memset, kernel and rounding copy are captured (read back: the kernel alone, its
    workspace zero between calls); two splits add in either order to the same fp32 sum, so replay equals an
    eager call bit for bit."""
    qw, _, bias, _ = _problem(Case(16, 8192, 8192, -1, "fp8", bias=torch.bfloat16))
    prep, act = fp8_gemm.prepare(qw), get_act_scheme("fp8")
    tuning = fp8_gemm.choose_split_tuning(16, 8192, 8192, fp8_gemm.device_limits(torch.cuda.current_device()))
    assert tuning.splits == 2
    tuning = dataclasses.replace(tuning, read_back=read_back)
    x = torch.randn(16, 8192, device="cuda", dtype=torch.bfloat16)
    eager = fp8_gemm.run(prep, x, act, bias, torch.bfloat16, tuning=tuning)
    graph, captured = capture(lambda: fp8_gemm.run(prep, x, act, bias, torch.bfloat16, tuning=tuning))
    for _ in range(2):  # a second replay would double the sums if the memset were not captured
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, fp8_gemm.run(prep, x, act, bias, torch.bfloat16, tuning=tuning))
    assert not torch.equal(captured, eager)


def test_block_activation_scales_are_row_major_even_without_padding():
    """The 1x128 activation scales reach the kernel row-major ``[K / 128, M]`` also when M is a multiple of
    the token tile, where no padding copy is made (a bare transpose would keep the transposed strides)."""
    from humming.ir.activation import QuantizedActivation

    scheme = get_act_scheme("fp8_g128")
    scales = torch.rand(256, 4)
    qa = QuantizedActivation(scheme, torch.zeros(256, 512, dtype=torch.uint8), scales)
    blocks = _fp8_launch._activations(qa, scheme, 512, 128).x_block_scale
    assert blocks.is_contiguous() and torch.equal(blocks, scales.T)
