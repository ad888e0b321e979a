"""Read the consumer loop of the FP8 GEMM's W4A8 kernels in compiled SASS, without a GPU (issue 23): the
proxy for their speed at large M, where ncu shows them bound by instruction issue
(bench/results/h100/NOTES.md).

For each kernel it compiles the sm_90a cubin with NVRTC and reports its instructions, and those between
the first K block's last QGMMA and its wait (the next K block's conversion of codes to e4m3, which the
wgmmas hide; the K loop is unrolled by two, and both halves match), with the opcode mix there, and the
instructions one consumer warp issues per K block in the steady state (``/block``: the innermost loop that
issues wgmmas, per four QGMMA).

Usage (repository root): ``python bench/tools/fp8_sass.py --out FILE.json`` (about a minute of CPU).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from triton_sass import disassemble, loop_body, opcode, registers

from humming.cuda_kernels._fp8_tuning import Fp8Tuning

#: (weight format, scale mode, tuning): the W4A8 kernels at decode and large M, and the defaults of 128-token
#: tiles (8192 x 8192, M = 4096) with W8A8's for comparison, then the same in token halves
CASES = (
    ("int4", "rowcol", Fp8Tuning(2, 128, 4, 1)),
    ("int4", "rowcol", Fp8Tuning(1, 64, 4, 2)),
    ("int4", "rowcol", Fp8Tuning(1, 8, 4, 2)),
    ("int4", "group", Fp8Tuning(2, 128, 4, 1)),
    ("mxfp4", "group", Fp8Tuning(2, 128, 4, 1)),
    ("mxfp4", "group", Fp8Tuning(1, 8, 4, 2)),
    ("int4", "rowcol", Fp8Tuning(2, 128, 8, 1, persistent=True, promote_blocks=4)),
    ("int4", "group", Fp8Tuning(2, 128, 8, 1, persistent=True)),
    ("mxfp4", "group", Fp8Tuning(2, 128, 7, 1, persistent=True)),
    ("mxfp4", "rowcol", Fp8Tuning(2, 128, 7, 1, persistent=True, promote_blocks=4)),
    ("e4m3", "rowcol", Fp8Tuning(2, 128, 6, 1, persistent=True)),
    ("int4", "group", Fp8Tuning(2, 128, 8, 1, persistent=True, token_halves=True)),
    ("mxfp4", "group", Fp8Tuning(2, 128, 7, 1, persistent=True, token_halves=True)),
    ("e4m3", "rowcol", Fp8Tuning(2, 128, 6, 1, persistent=True, token_halves=True)),
)
_MIX = ("PRMT", "LOP3", "SHF", "IMAD", "IADD3", "FADD", "FFMA")


def conversion_window(instructions: list[str]) -> list[str]:
    """The instructions between the first K block's last QGMMA and its WARPGROUP.DEPBAR."""
    last = None
    for i, text in enumerate(instructions):
        op = opcode(text)
        if op.startswith("QGMMA"):
            last = i
        elif op.startswith("WARPGROUP.DEPBAR") and last is not None:
            return instructions[last + 1 : i]
    return []


def k_block(instructions: list[tuple[int, str]], halves: bool = False) -> float:
    """Instructions per K block of the innermost loop that issues wgmmas (four QGMMA a block; with token halves
    eight, and the loop of a group of four blocks): what one consumer warp issues per 128 of K in the steady
    state."""
    per_block = 8 if halves else 4
    body = loop_body(instructions, holding="QGMMA", innermost=True, at_least=4 * per_block if halves else 1)
    return round(per_block * len(body) / max(1, sum(opcode(text).startswith("QGMMA") for text in body)), 1)


def analyse(w_format: str, scale_mode: str, tuning: Fp8Tuning) -> dict:
    from humming.cuda_kernels import _fp8_launch
    from humming.cuda_kernels._warmup import warmup_specs

    spec = _fp8_launch.fp8_spec(w_format, scale_mode, "bf16", "bf16", tuning)
    kernel = warmup_specs([(spec, "sm_90a")], progress=False).kernels[0]
    instructions = disassemble(kernel.cubin)
    texts = [text for addr, text in instructions if addr >= 0]
    window = conversion_window(texts)
    mix = collections.Counter(opcode(text).split(".")[0] for text in window)
    return {
        "kernel": spec.name,
        "registers": registers(kernel.cubin),
        "instructions": len(texts),
        "conversion_window": len(window),
        "k_block": k_block(instructions, tuning.issues_token_halves(w_format, scale_mode)),
        "window_mix": {op: mix.get(op, 0) for op in _MIX},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the rows as JSON")
    args = parser.parse_args()
    os.environ["HUMMING_CACHE_DIR"] = tempfile.mkdtemp()  # compiled here, not read from an earlier cache
    rows = [analyse(*case) for case in CASES]
    print(f"{'kernel':64s} {'regs':>4s} {'instr':>6s} {'window':>6s} {'/block':>6s}  mix")
    for r in rows:
        mix = " ".join(f"{k}={v}" for k, v in r["window_mix"].items() if v)
        cells = f"{r['registers']!s:>4s} {r['instructions']:6d} {r['conversion_window']:6d} {r['k_block']:6.1f}"
        print(f"{r['kernel']:64s} {cells}  {mix}")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
