"""Tuning of the FP4 GEMMs (:mod:`humming.cuda_kernels.fp4_gemm`): the speed-only knobs of the sm_120a
(:class:`Fp4Tuning`) and sm_100a (:class:`Sm100Tuning`) kernels, the sm_100a kernel's shared- and
tensor-memory layout that bounds its stages (:class:`Sm100Layout`), and the heuristics that choose them,
pure functions of M, N and the device's limits (SM count; shared memory per block for sm_100a's stages)."""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.weight import cdiv


@dataclass(frozen=True)
class Fp4Tuning:
    """Speed-only knobs: warps along M and N, m16 / n8 tiles per warp, cp.async pipeline stages."""

    warps_m: int
    warps_n: int
    m_tiles: int
    n_tiles: int
    stages: int

    @property
    def block_m(self) -> int:
        return 16 * self.m_tiles * self.warps_m

    @property
    def block_n(self) -> int:
        return 8 * self.n_tiles * self.warps_n

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n


#: Candidate tunings per token range, largest block first: up to 16 tokens one m16 tile per block (the
#: weight stream is the cost, so blocks narrow along N until every SM has one), else 64-token blocks.
SMALL_M = (Fp4Tuning(1, 4, 1, 4, 3), Fp4Tuning(1, 4, 1, 2, 3), Fp4Tuning(1, 2, 1, 2, 4))
LARGE_M = (Fp4Tuning(2, 2, 2, 8, 3), Fp4Tuning(2, 2, 2, 4, 3))
TUNINGS = SMALL_M + LARGE_M


def choose_tuning(m: int, n: int, sm_count: int) -> Fp4Tuning:
    """Tuning for ``out[m, n]`` on a device with ``sm_count`` SMs (pure function): the largest candidate block
    for this M that still gives every SM a block, else the candidate with the most blocks."""
    candidates = SMALL_M if m <= 16 else LARGE_M
    for tuning in candidates:
        if cdiv(m, tuning.block_m) * cdiv(n, tuning.block_n) >= sm_count:
            return tuning
    return candidates[-1]


#: Token block sizes of the sm_100a kernel (the UMMA's N; the weights fill its M = 128).
SM100_BLOCK_T = (32, 64, 128, 256)
_SM100_MAX_STAGES = 8


@dataclass(frozen=True)
class Sm100Layout:
    """Shared- and tensor-memory layout of ``fp4_sm100::Layout<kVec, kBlockT, kStages>`` (same names)."""

    vec: int
    block_t: int
    stages: int

    @property
    def atoms_k(self) -> int:
        return 256 // (4 * self.vec)

    @property
    def token_atoms(self) -> int:
        return cdiv(self.block_t, 128)

    @property
    def sf_row_bytes(self) -> int:
        return self.atoms_k * 512

    def region_bytes(self) -> dict[str, int]:
        """Bytes per stage of the A (weights), B (tokens), SFA and SFB regions, in shared-memory order."""
        sf = self.sf_row_bytes
        return {"a": 128 * 128, "b": self.block_t * 128, "sfa": sf, "sfb": self.token_atoms * sf}

    def offsets(self) -> dict[str, int]:
        """Offset of each region (its stage 0) and of the barriers and the tensor-memory address slot."""
        out, off = {}, 0
        for name, size in self.region_bytes().items():
            out[name], off = off, off + self.stages * size
        out["bars"] = off
        out["tmem_slot"] = off + 8 * (2 * self.stages + 1)
        return out

    @property
    def smem_bytes(self) -> int:
        return self.offsets()["tmem_slot"] + 4 + 1024

    @property
    def sfa_col(self) -> int:
        return self.block_t

    @property
    def sfb_col(self) -> int:
        return self.sfa_col + self.stages * self.atoms_k * 4

    @property
    def tmem_cols(self) -> int:
        return self.sfb_col + self.stages * self.atoms_k * self.token_atoms * 4


@dataclass(frozen=True)
class Sm100Tuning:
    """Speed-only knobs of the sm_100a kernel: tokens per block and pipeline stages."""

    block_t: int
    stages: int


def _sm100_stages(vec: int, block_t: int, smem_per_block: int) -> int:
    """The most stages (up to 8) whose shared memory fits ``smem_per_block`` bytes (the device's opt-in
    maximum per block)."""
    for stages in range(_SM100_MAX_STAGES, 0, -1):
        if Sm100Layout(vec, block_t, stages).smem_bytes <= smem_per_block:
            return stages
    raise ValueError(f"smem_per_block={smem_per_block}: no stage of the sm_100a FP4 GEMM fits for block_t={block_t}")


def choose_sm100_tuning(m: int, n: int, sm_count: int, vec: int, smem_per_block: int) -> Sm100Tuning:
    """Tuning for ``out[m, n]`` (pure function of the problem and the device's SM count and shared memory per
    block): up to 128 tokens, the smallest token block that holds them; above, 256-token blocks when they
    still give every SM one, else 128; as many stages as fit."""
    if m <= 128:
        block_t = next(t for t in SM100_BLOCK_T if t >= m)
    else:
        block_t = 256 if cdiv(n, 128) * cdiv(m, 256) >= sm_count else 128
    return Sm100Tuning(block_t, _sm100_stages(vec, block_t, smem_per_block))
