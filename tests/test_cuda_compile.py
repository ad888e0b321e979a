"""CI compile check (no GPU): every CUDA kernel compiles through NVRTC for each of its targets, with no
register spills or stack (cuobjdump -res-usage); the sm_90 SASS holds the instructions the design needs."""

from __future__ import annotations

import re

import pytest
from helpers import compile_fresh, cubin_tool, instructions_after_each_wait, needs_nvrtc

from humming.cuda_kernels import _decode_launch, _gemm_sm90, _wgmma_source, act_quant, jit, moe_combine, wna16_decode
from humming.cuda_kernels._layout import WeightLayout

pytestmark = needs_nvrtc


def _decode_specs() -> list[jit.KernelSpec]:
    L, T = WeightLayout, wna16_decode.DecodeTuning
    return [
        wna16_decode.decode_spec(L(4, 8, "bf16"), "bf16", "bf16", "bf16", T(1, 1, 8, 4, 1)),
        wna16_decode.decode_spec(L(4, -1, "f16"), "f16", "f16", "f16", T(2, 2, 8, 3, 1)),
        wna16_decode.decode_spec(L(8, 128, "f32"), "bf16", "f32", "bf16", T(8, 1, 8, 2, 1)),
        wna16_decode.decode_spec(L(8, -1, "bf16"), "f16", "f16", "f32", T(1, 1, 8, 4, 4)),
        # split-K with two token tiles read back by the tile's last block (DecodeTuning.read_back)
        wna16_decode.decode_spec(L(4, 8, "bf16"), "bf16", "bf16", "bf16", T(2, 2, 4, 3, 4, read_back=True)),
        wna16_decode.decode_spec(L(4, 0, "e8m0", "e2m1"), "bf16", "bf16", "bf16", T(1, 2, 8, 3, 1)),
        wna16_decode.decode_spec(L(4, 0, "e8m0_any", "e2m1"), "f16", "f32", "f16", T(2, 2, 8, 3, 1, 2)),
        # the grouped variant (cuda.grouped_decode) at its default tunings: blocks of 8 and 16, gated, and 16-bit
        # scales of 32-column groups (Kimi-K2's experts)
        wna16_decode.decode_spec(L(4, 8, "bf16"), "bf16", "bf16", "bf16", T(1, 4, 2, 3, 1), grouped=True),
        wna16_decode.decode_spec(
            L(4, 0, "e8m0", "e2m1"), "bf16", "bf16", "bf16", T(2, 4, 2, 4, 1), grouped=True, gated="swiglu_oai"
        ),
        wna16_decode.decode_spec(L(4, 8, "f16_halves"), "f16", "f16", "f16", T(1, 4, 4, 3, 1), grouped=True),
    ]


def _gemm_specs() -> list[jit.KernelSpec]:
    L, T = WeightLayout, _gemm_sm90.GemmTuning
    return [
        _gemm_sm90.gemm_spec(L(4, 8, "bf16"), "bf16", "bf16", "bf16", T(128, 6)),
        _gemm_sm90.gemm_spec(L(4, 8, "bf16"), "bf16", "bf16", "bf16", T(256, 5)),
        _gemm_sm90.gemm_spec(L(4, -1, "f16"), "f16", "f16", "f16", T(256, 5)),
        _gemm_sm90.gemm_spec(L(8, 128, "f32"), "bf16", "f32", "bf16", T(256, 4)),
        _gemm_sm90.gemm_spec(L(4, 0, "e8m0", "e2m1"), "bf16", "bf16", "bf16", T(128, 6)),
        _gemm_sm90.gemm_spec(L(4, 0, "e8m0_any", "e2m1"), "bf16", "f32", "bf16", T(64, 8, 2)),
        _gemm_sm90.gemm_spec(L(4, 8, "bf16"), "bf16", "bf16", "bf16", T(128, 6, persistent=True)),
        # N % 128 != 0: 16-row tiles copied one by one
        _gemm_sm90.gemm_spec(L(4, -1, "f16"), "f16", "f16", "f16", T(128, 6), tile_group=1),
        _gemm_sm90.gemm_spec(L(4, 0, "e8m0", "e2m1"), "bf16", "bf16", "bf16", T(256, 5), tile_group=1),
        # groups of 32: two 16-bit scales per row and chunk
        _gemm_sm90.gemm_spec(L(4, 8, "bf16_halves"), "bf16", "bf16", "bf16", T(128, 6)),
        _gemm_sm90.gemm_spec(L(8, 128, "f16_halves"), "f16", "f16", "f16", T(64, 8, 2)),
        *_split_specs(),
    ]


def _split_specs() -> list[jit.KernelSpec]:
    """Split-K at the tiles its heuristic takes (two blocks of 64 tokens, one of 128 or 256)."""
    L, T = WeightLayout, _gemm_sm90.GemmTuning
    return [
        _gemm_sm90.gemm_spec(L(4, 8, "bf16"), "bf16", "bf16", "bf16", T(64, 8, 2, 4)),
        _gemm_sm90.gemm_spec(L(4, -1, "f16"), "f16", "f16", "f16", T(128, 8, 1, 2)),
        _gemm_sm90.gemm_spec(L(4, 0, "e8m0", "e2m1"), "bf16", "bf16", "f32", T(256, 5, 1, 7)),
        _gemm_sm90.gemm_spec(L(8, 128, "f32"), "bf16", "f32", "bf16", T(64, 8, 2, 4), tile_group=1),
    ]


def _grouped_specs() -> list[jit.KernelSpec]:
    """The grouped (MoE) variant at the small token tiles MoE decode uses, and one dense-sized tile."""
    L, T = WeightLayout, _gemm_sm90.GemmTuning
    return [
        _gemm_sm90.gemm_spec(L(4, 8, "bf16"), "bf16", "bf16", "bf16", T(16, 8), grouped=True),
        _gemm_sm90.gemm_spec(L(4, -1, "f16"), "f16", "f16", "f32", T(32, 8), grouped=True),
        # a token tile sized to the tokens per expert (wgmma N = 144, fused_moe's routing block at 256 +- 16 rows)
        _gemm_sm90.gemm_spec(L(8, 128, "bf16"), "bf16", "f32", "bf16", T(144, 8), grouped=True),
        _gemm_sm90.gemm_spec(L(4, 0, "e8m0", "e2m1"), "bf16", "bf16", "bf16", T(16, 8), grouped=True),
        _gemm_sm90.gemm_spec(L(4, -1, "bf16"), "bf16", "bf16", "bf16", T(16, 8, 2, persistent=True), grouped=True),
        _gemm_sm90.gemm_spec(
            L(4, 8, "bf16_halves"), "bf16", "bf16", "bf16", T(64, 8, 2, persistent=True), grouped=True
        ),
        # gpt-oss's w2 (N = 2880): MXFP4 experts of N % 128 != 0
        _gemm_sm90.gemm_spec(
            L(4, 0, "e8m0", "e2m1"), "bf16", "bf16", "bf16", T(64, 8, 2, persistent=True), grouped=True, tile_group=1
        ),
        _gemm_sm90.gemm_spec(L(4, 8, "bf16"), "bf16", "bf16", "bf16", T(128, 6), grouped=True),
    ]


def _gather_specs() -> list[jit.KernelSpec]:
    """The grouped variant reading token rows through an index, at every token tile and blocks-per-SM choice."""
    L, T = WeightLayout, _gemm_sm90.GemmTuning
    g = dict(grouped=True, gather=True)
    return [
        _gemm_sm90.gemm_spec(L(4, 8, "bf16"), "bf16", "bf16", "bf16", T(16, 8, 2), **g),
        _gemm_sm90.gemm_spec(L(4, -1, "f16"), "f16", "f16", "f32", T(32, 8, 2), **g),
        _gemm_sm90.gemm_spec(L(4, 0, "e8m0", "e2m1"), "bf16", "bf16", "bf16", T(64, 8, 2), **g),
        _gemm_sm90.gemm_spec(L(8, 128, "bf16"), "bf16", "f32", "bf16", T(128, 6), **g),
        _gemm_sm90.gemm_spec(L(4, 8, "bf16"), "bf16", "bf16", "bf16", T(256, 4), **g),
        _gemm_sm90.gemm_spec(
            L(4, 0, "e8m0", "e2m1"), "bf16", "bf16", "bf16", T(128, 6, persistent=True), **g, tile_group=1
        ),
        # fused_moe's w13 with its activation in the epilogue (the GPU tests compile the other activations)
        _gemm_sm90.gemm_spec(L(4, 8, "bf16"), "bf16", "bf16", "bf16", T(48, 8, 2, persistent=True), **g, gated="silu"),
        _gemm_sm90.gemm_spec(
            L(4, 0, "e8m0", "e2m1"), "bf16", "bf16", "bf16", T(16, 8, 2, persistent=True), **g, gated="swiglu_oai"
        ),
    ]


def _lag_specs() -> list[jit.KernelSpec]:
    """The gathering variant whose producer threads fence and arrive for the copies of an earlier step."""
    L, T = WeightLayout, _gemm_sm90.GemmTuning
    g = dict(grouped=True, gather=True)
    return [
        _gemm_sm90.gemm_spec(L(4, 8, "bf16"), "bf16", "bf16", "bf16", T(128, 8, persistent=True, arrive_lag=2), **g),
        _gemm_sm90.gemm_spec(L(4, 0, "e8m0", "e2m1"), "bf16", "bf16", "bf16", T(64, 8, 2, arrive_lag=1), **g),
    ]


def _act_quant_specs() -> list[jit.KernelSpec]:
    """Per token into codes, 1x128 groups into codes, per token into f16 values (a small row's block)."""
    return [
        act_quant.act_quant_spec("bf16", 0, "u8", 256),
        act_quant.act_quant_spec("bf16", 128, "u8", 256),
        act_quant.act_quant_spec("f16", 0, "f16", 64),
    ]


def _combine_specs() -> list[jit.KernelSpec]:
    return [moe_combine.combine_spec("bf16", "f32", "bf16"), moe_combine.combine_spec("f16", "bf16", "f16")]


def _all_jobs() -> list[tuple[jit.KernelSpec, str]]:
    specs = _decode_specs() + _gemm_specs() + _grouped_specs() + _gather_specs() + _lag_specs()
    specs += _act_quant_specs() + _combine_specs()
    return [(spec, arch) for spec in specs for arch in spec.targets()]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    kernels = compile_fresh(_all_jobs(), tmp_path_factory.mktemp("cache"))
    return {(k.spec.name, k.arch): k for k in kernels}


def test_no_lambda_takes_auto_parameters():
    """NVRTC 13.0 (the GPU image's; CI gets the newest) takes a lambda with ``auto`` parameters in device code
    for a host function and refuses the kernel: the headers write their generic helpers as templates."""
    generic = re.compile(r"\]\s*\(\s*(const\s+)?auto\b")
    found = [
        f"{path.name}:{number}: {line.strip()}"
        for path in sorted(jit.INCLUDE_DIR.rglob("*.cuh"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if generic.search(line)
    ]
    assert not found, "\n".join(found)


def test_wgmma_header_is_its_generators_output():
    regenerate = "run python -m humming.cuda_kernels._wgmma_source"
    assert _wgmma_source.HEADER.read_text() == _wgmma_source.render(), regenerate


def test_every_target_compiles(compiled):
    assert len(compiled) == len(_all_jobs())
    for (name, arch), kernel in compiled.items():
        assert kernel.cubin[:4] == b"\x7fELF", (name, arch)
        assert "warning" not in kernel.log.lower(), f"{name} {arch}:\n{kernel.log}"
        # ptxas's notes where it serialises wgmmas or injects waits (C7514, C7515, C7517...)
        assert not re.search(r"C751\d", kernel.log), f"{name} {arch}:\n{kernel.log}"


def test_no_spills_no_stack(compiled, tmp_path):
    """cuobjdump's resource report: no stack frame and no local memory (where spills go) anywhere; the sm_90a
    GEMMs' static shared memory stays the 1 KiB the host's shared-memory budget reserves (smem_bytes)."""
    for (name, arch), kernel in compiled.items():
        report = cubin_tool("cuobjdump", ["-res-usage"], kernel, tmp_path)
        usage = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", report)
        assert usage, report
        assert usage.group(2) == "0" and usage.group(4) == "0", f"{name} {arch}: {usage.group(0)}"
        if kernel.spec.family == "gemm_sm90":
            assert int(usage.group(3)) <= 1024, f"{name} {arch}: {usage.group(0)}"


def test_decode_sass_uses_tensor_cores_and_16_byte_async_loads(compiled, tmp_path):
    for spec in _decode_specs():
        sass = cubin_tool("cuobjdump", ["-sass"], compiled[(spec.name, "sm_90")], tmp_path)
        assert "HMMA.16816.F32" in sass, spec.name
        assert "LDGSTS.E.BYPASS.128" in sass, f"{spec.name}: weights are not streamed with 16-byte cp.async"
        assert "LDL" not in sass and "STL" not in sass, f"{spec.name} uses local memory"


def _sass_lines(kernel, tmp_path) -> list[str]:
    return [line for line in cubin_tool("cuobjdump", ["-sass"], kernel, tmp_path).splitlines() if "/*" in line]


def test_decode_loads_its_first_weights_before_the_grid_dependency_wait(compiled, tmp_path):
    """Behind the activation pass (programmatic launch) the dense decode kernel streams its first chunks'
    weights (16-byte L2-only copies) before griddepcontrol.wait (SASS ACQBULK), and the activations (cached
    copies) only after it; the grouped one (launched so behind any kernel) waits before any global load. On
    sm_80 the wait does not exist."""
    for spec in _decode_specs():
        if "_sk" in spec.name:  # stream-K waits before its first copies: its warps' first chunks vary
            continue
        lines = _sass_lines(compiled[(spec.name, "sm_90")], tmp_path)
        wait = next(i for i, line in enumerate(lines) if "ACQBULK" in line)
        first_weight = next(i for i, line in enumerate(lines) if "LDGSTS.E.BYPASS.128" in line)
        first_x = next(i for i, line in enumerate(lines) if re.search(r"LDGSTS\.E\.128\b", line))
        if "_grouped" in spec.name:
            first_load = next(i for i, line in enumerate(lines) if re.search(r"\bLDG(STS)?\.", line))
            assert wait < first_load, (spec.name, wait, first_load)
        else:
            assert first_weight < wait < first_x, (spec.name, first_weight, wait, first_x)
        assert not any("ACQBULK" in line for line in _sass_lines(compiled[(spec.name, "sm_80")], tmp_path))


def test_act_quant_lets_its_dependents_start_and_the_gemms_wait(compiled, tmp_path):
    """The activation pass and the sm_90a GEMM start their dependents at once (griddepcontrol.launch_dependents:
    SASS PREEXIT); the GEMM waits for the kernel before it (ACQBULK), the grouped one before any global load."""
    for spec in _act_quant_specs():
        assert any("PREEXIT" in line for line in _sass_lines(compiled[(spec.name, "sm_90")], tmp_path)), spec.name
    for spec in _combine_specs():  # launched programmatically behind w2: it waits before reading y
        lines = _sass_lines(compiled[(spec.name, "sm_90")], tmp_path)
        wait = next(i for i, line in enumerate(lines) if "ACQBULK" in line)
        assert wait < next(i for i, line in enumerate(lines) if re.search(r"\bLDG\.", line)), spec.name
    for spec in _gemm_specs() + _grouped_specs() + _gather_specs():
        lines = _sass_lines(compiled[(spec.name, "sm_90a")], tmp_path)
        wait = next((i for i, line in enumerate(lines) if "ACQBULK" in line), None)
        assert wait is not None and any("PREEXIT" in line for line in lines), spec.name
        if spec.name.startswith("humming_gemm_sm90_grouped"):
            first_load = next(i for i, line in enumerate(lines) if re.search(r"\bLDG(STS)?\.|UTMALDG|UBLKCP", line))
            assert wait < first_load, (spec.name, wait, first_load)


def test_act_quant_reads_16_bytes_at_once_and_stays_in_fp32(compiled, tmp_path):
    """One 16-byte load per 8 elements, and no float64 instruction: the element arithmetic settles the rounding
    in float32 (the Triton pass's float64 step is for NVFP4 scales only)."""
    for spec in _act_quant_specs():
        sass = cubin_tool("cuobjdump", ["-sass"], compiled[(spec.name, "sm_90")], tmp_path)
        assert "LDG.E.128" in sass, spec.name
        assert not re.search(r"\b(DADD|DMUL|DFMA|F2F\.F64)", sass), spec.name


def test_combine_sums_each_slot_with_fused_multiply_adds(compiled, tmp_path):
    """One 16-byte load of y per slot and 8 FFMA per slot and thread (the Triton combine's contraction)."""
    for spec in _combine_specs():
        sass = cubin_tool("cuobjdump", ["-sass"], compiled[(spec.name, "sm_90")], tmp_path)
        assert "LDG.E.128.CONSTANT" in sass or "LDG.E.128" in sass, spec.name
        assert sass.count("FFMA") >= 8 and "FMUL" not in sass.replace("FMUL.FTZ", ""), spec.name


def test_gemm_sm90_sass_uses_wgmma_tma_and_setmaxnreg(compiled, tmp_path):
    for spec in _gemm_specs() + _grouped_specs():
        assert spec.targets() == ("sm_90a",)
        sass = cubin_tool("cuobjdump", ["-sass"], compiled[(spec.name, "sm_90a")], tmp_path)
        bm = spec.name.split("_bm")[1].split("_")[0]
        assert re.search(rf"HGMMA\.64x{bm}x16\.F32(\.BF16)? R\d+, R\d+, gdesc", sass), spec.name  # A in registers
        assert "UTMALDG.2D" in sass, f"{spec.name}: activations are not loaded by TMA"
        if spec.name.endswith("_tg1"):  # ungrouped 16-row tiles: weights and scales as TMA boxes of 8 tile rows
            assert "UBLKCP" not in sass and sass.count("UTMALDG.2D") >= 3, f"{spec.name}: weights not by TMA"
        else:
            assert "UBLKCP" in sass, f"{spec.name}: weights are not loaded by bulk copies"
        assert "USETMAXREG" in sass, f"{spec.name}: setmaxnreg was dropped"
        assert "LDL" not in sass and "STL" not in sass, f"{spec.name} uses local memory"


def test_gemm_sm90_keeps_a_wgmma_group_in_flight_while_it_dequantizes(compiled, tmp_path):
    """The consumer loop queues each chunk's wgmmas behind the previous chunk's and waits for that one alone
    (one group left in flight), then dequantizes the chunk after next (its weight fragment unpacked, zero
    point and scale applied: 80+ instructions) while the queued group runs: both waits of the unrolled loop
    leave a group in flight, and the one followed by a wgmma in the code's order (the other's is across the
    loop's back edge) has a whole dequantization before it."""
    for spec in _combine_specs():  # launched programmatically behind w2: it waits before reading y
        lines = _sass_lines(compiled[(spec.name, "sm_90")], tmp_path)
        wait = next(i for i, line in enumerate(lines) if "ACQBULK" in line)
        assert wait < next(i for i, line in enumerate(lines) if re.search(r"\bLDG\.", line)), spec.name
    for spec in _gemm_specs() + _grouped_specs() + _gather_specs():
        sass = cubin_tool("cuobjdump", ["-sass"], compiled[(spec.name, "sm_90a")], tmp_path)
        assert sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x1") >= 2, spec.name
        gaps = instructions_after_each_wait(sass, "HGMMA", pending=1)
        assert gaps and min(gaps) >= 80, f"{spec.name}: {gaps}"


def test_gather_gemm_copies_rows_with_cp_async_not_tma(compiled, tmp_path):
    """The gathering variant: the tokens' rows by 16-byte cp.async (L2 only) from the whole producer
    warpgroup, each thread's copies arriving on the chunk's barrier, the weights still by bulk copies, no
    activation TMA."""
    for spec in _gather_specs():
        assert spec.targets() == ("sm_90a",) and "_grouped_gather_" in spec.name
        sass = cubin_tool("cuobjdump", ["-sass"], compiled[(spec.name, "sm_90a")], tmp_path)
        bm = spec.name.split("_bm")[1].split("_")[0]
        assert re.search(rf"HGMMA\.64x{bm}x16\.F32(\.BF16)? R\d+, R\d+, gdesc", sass), spec.name
        assert "LDGSTS.E.BYPASS.128" in sass, f"{spec.name}: rows are not copied with 16-byte cp.async"
        # Each copy arrives on its chunk's barrier by itself: no commit groups the producer would wait on.
        assert "ARRIVES.LDGSTSBAR.64" in sass, f"{spec.name}: the copies do not arrive on the full barrier"
        assert "LDGDEPBAR" not in sass, f"{spec.name}: the producer waits on its own copies"
        tile_rows = spec.name.endswith("_tg1")  # ungrouped 16-row tiles: the weights by TMA, the rows not
        assert ("UTMALDG" in sass) == tile_rows, f"{spec.name}: an activation TMA load is left"
        assert ("UBLKCP" in sass) != tile_rows and "USETMAXREG" in sass, spec.name
        assert "LDL" not in sass and "STL" not in sass, f"{spec.name} uses local memory"


def test_arrive_lag_moves_the_proxy_fence_to_the_producer(compiled, tmp_path):
    """With an arrival lag the producer commits its row copies in groups and waits for an earlier group
    (LDGDEPBAR / DEPBAR), fences and arrives itself; the consumers' per-chunk fence (MEMBAR.ALL.CTA) is gone."""
    for spec in _lag_specs():
        assert spec.name.endswith(f"_lag{spec.entry.split(', ')[-2]}")
        sass = cubin_tool("cuobjdump", ["-sass"], compiled[(spec.name, "sm_90a")], tmp_path)
        assert "LDGDEPBAR" in sass and "ARRIVES.LDGSTSBAR" not in sass, spec.name
        plain = sass.count("MEMBAR.ALL.CTA")
        assert 0 < plain <= 2, f"{spec.name}: {plain} proxy fences (the producer's two expected)"
    for bad in (dict(stages=4, arrive_lag=3), dict(stages=4, arrive_lag=4), dict(stages=4, arrive_lag=-1)):
        with pytest.raises(ValueError, match="arrive_lag"):
            _gemm_sm90.GemmTuning(128, **bad)
    with pytest.raises(ValueError, match="tile_group"):
        tuning = _gemm_sm90.GemmTuning(16, 8, 2, persistent=True)
        _gemm_sm90.gemm_spec(WeightLayout(4, 8, "bf16"), "bf16", "bf16", "bf16", tuning, True, True, "silu", 1)
    with pytest.raises(ValueError, match="without gather"):
        tuning = _gemm_sm90.GemmTuning(128, 6, arrive_lag=1)
        _gemm_sm90.gemm_spec(WeightLayout(4, 8, "bf16"), "bf16", "bf16", "bf16", tuning, grouped=True)


def test_split_k_sums_with_reductions_and_reads_back_with_exchanges(compiled, tmp_path):
    """Split-K: the partial sums go to the workspace as fp32 reductions (no return value), the last block
    reads them back with atomic exchanges (leaving zeros); one name for every split count."""
    for spec in _split_specs():
        tile_group = 1 if spec.name.endswith("_tg1") else 8
        assert spec.name.removesuffix("_tg1").endswith("_splitk") and spec.entry.endswith(
            f", false, false, true, {spec.min_blocks}, false, 0, 0, {tile_group}>"
        )
        sass = cubin_tool("cuobjdump", ["-sass"], compiled[(spec.name, "sm_90a")], tmp_path)
        assert "REDG.E.ADD.F32" in sass, f"{spec.name}: partial sums are not reduced in L2"
        assert "ATOMG.E.EXCH" in sass, f"{spec.name}: totals are not read back with exchanges"
    dense = _gemm_sm90.gemm_spec(WeightLayout(4, 8, "bf16"), "bf16", "bf16", "bf16", _gemm_sm90.GemmTuning(64, 8, 2))
    split = _gemm_sm90.gemm_spec(WeightLayout(4, 8, "bf16"), "bf16", "bf16", "bf16", _gemm_sm90.GemmTuning(64, 8, 2, 3))
    assert split.name == _split_specs()[0].name and split.name != dense.name
    with pytest.raises(ValueError, match="does not split K"):
        _gemm_sm90.gemm_spec(
            WeightLayout(4, 8, "bf16"), "bf16", "bf16", "bf16", _gemm_sm90.GemmTuning(64, 8, 2, 2), grouped=True
        )


def test_persistent_is_a_variant_of_its_own():
    """A persistent grid is its own kernel (name and template argument), and never splits K."""
    layout = WeightLayout(4, 8, "bf16")
    plain = _gemm_sm90.gemm_spec(layout, "bf16", "bf16", "bf16", _gemm_sm90.GemmTuning(16, 8, 2), grouped=True)
    tuning = _gemm_sm90.GemmTuning(16, 8, 2, persistent=True)
    persistent = _gemm_sm90.gemm_spec(layout, "bf16", "bf16", "bf16", tuning, grouped=True)
    assert persistent.name == plain.name + "_p" and persistent.entry.endswith(", 2, true, 0, 0, 8>")
    assert plain.entry.endswith(", 2, false, 0, 0, 8>")
    with pytest.raises(ValueError, match="persistent grid does not split K"):
        _gemm_sm90.GemmTuning(64, 8, 2, 2, persistent=True)


def test_gated_is_a_grouped_variant_with_a_16_bit_output():
    layout, tuning = WeightLayout(4, 8, "bf16"), _gemm_sm90.GemmTuning(16, 8, 2)
    spec = _gemm_sm90.gemm_spec(layout, "bf16", "bf16", "bf16", tuning, grouped=True, gated="swiglu_oai")
    assert spec.name.endswith("_swiglu_oai") and spec.entry.endswith(", false, 4, 0, 8>")
    for bad in (dict(grouped=False, gated="silu"), dict(grouped=True, gated="relu")):
        with pytest.raises(ValueError, match="gated: a grouped variant"):
            _gemm_sm90.gemm_spec(layout, "bf16", "bf16", "bf16", tuning, **bad)
    with pytest.raises(ValueError, match="16-bit output"):
        _gemm_sm90.gemm_spec(layout, "bf16", "f32", "bf16", tuning, grouped=True, gated="silu")


def test_gather_is_a_grouped_variant():
    with pytest.raises(ValueError, match="grouped variant"):
        _gemm_sm90.gemm_spec(
            WeightLayout(4, 8, "bf16"), "bf16", "bf16", "bf16", _gemm_sm90.GemmTuning(128, 6), gather=True
        )


def test_grouped_gemm_reads_expert_ids_and_differs_from_dense(compiled, tmp_path):
    """The grouped flag is compiled in: a global load of the segment's expert id ahead of the first
    barrier (the early exit), which the dense kernel of the same tuning does not have."""
    grouped = _grouped_specs()[-1]
    dense = _gemm_sm90.gemm_spec(WeightLayout(4, 8, "bf16"), "bf16", "bf16", "bf16", _gemm_sm90.GemmTuning(128, 6))
    assert (
        grouped.name != dense.name
        and ", true, false, false, 1, false, 0, 0, 8>" in grouped.entry
        and ", false, false, false, 1, false, 0, 0, 8>" in dense.entry
    )
    sass = {
        spec.name: cubin_tool("cuobjdump", ["-sass"], compiled[(spec.name, "sm_90a")], tmp_path)
        for spec in (grouped, dense)
    }
    before_barrier = {name: text[: text.index("BAR.SYNC")] for name, text in sass.items()}
    assert "LDG.E" in before_barrier[grouped.name], "no expert id load before the first barrier"
    assert "LDG.E" not in before_barrier[dense.name]


def _mirrors():
    from humming.cuda_kernels import _fp4_launch, _fp8_launch

    return [  # (ctypes mirror, header, C++ type, arch)
        (_decode_launch._Params, "decode.cuh", "humming::decode::Params", "sm_80"),
        (_gemm_sm90._Params, "gemm_sm90.cuh", "humming::gemm_sm90::Params", "sm_90a"),
        (_fp8_launch._Params, "fp8_gemm_sm90.cuh", "humming::fp8_sm90::Params", "sm_90a"),
        (_fp4_launch._Params, "fp4_gemm_sm120.cuh", "humming::fp4_sm120::Params", "sm_120a"),
        (_fp4_launch._ProbeParams, "fp4_mma_probe_sm120.cuh", "humming::fp4_sm120::ProbeParams", "sm_120a"),
        (_fp4_launch._Sm100Params, "fp4_gemm_sm100.cuh", "humming::fp4_sm100::Params", "sm_100a"),
        (_fp4_launch._Sm100ProbeParams, "fp4_mma_probe_sm100.cuh", "humming::fp4_sm100::ProbeParams", "sm_100a"),
        (act_quant._Params, "act_quant.cuh", "humming::act_quant::Params", "sm_80"),
        (moe_combine._Params, "moe_combine.cuh", "humming::moe_combine::Params", "sm_80"),
    ]


@pytest.mark.parametrize("mirror", range(len(_mirrors())))
def test_host_param_structs_mirror_the_kernels(mirror):
    """Every ctypes ``Params`` mirror has the C++ struct's size and each field's offset (NVRTC checks
    static_asserts on __builtin_offsetof): a drifted mirror would pass garbage to a kernel."""
    import ctypes
    import types

    struct, header, cpp, arch = _mirrors()[mirror]
    asserts = [f'static_assert(sizeof({cpp}) == {ctypes.sizeof(struct)}, "sizeof");']
    for name, _ in struct._fields_:
        if not name.startswith("_"):  # padding
            offset = getattr(struct, name).offset
            asserts.append(f'static_assert(__builtin_offsetof({cpp}, {name}) == {offset}, "{name} at {offset}");')
    source = jit._flatten(f'#include "humming/{header}"\n' + "\n".join(asserts), "<mirror>", jit.INCLUDE_DIR, set())
    jit._nvrtc_compile(types.SimpleNamespace(name=f"mirror_{mirror}"), arch, source)  # raises on a mismatch
