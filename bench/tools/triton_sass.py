"""Read the inner loop of the Triton WnA16 decode kernels in compiled SASS, without a GPU: the proxy for
their speed where no GPU is at hand (issue 26).

For each case it compiles the kernel ``humming.triton_kernels.wna16`` launches at M = 1 (or the config
given) ahead of time for each architecture, disassembles the cubin with Triton's ``nvdisasm``, finds the
K loop (the backward branch) and counts its instructions by opcode: instructions per weight (a thread's
loop body over the weights it holds per iteration), weight load widths, local memory traffic, shared
memory round trips and conversion instructions (I2F / F2I).

Usage (repository root, TRITON_INTERPRET unset):
  python bench/tools/triton_sass.py --arch 90 --arch 80 --out bench/results/cpu-sass/triton_gemv.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from humming.triton_kernels.registry import disassemble

#: label -> (quantize arguments, activation dtype)
CASES = {
    "int4-g128": (dict(weight="int4", group_size=128, scale_dtype=torch.bfloat16), torch.bfloat16),
    "uint4-zp-g128": (dict(weight="int4", group_size=128, zero_point=True, scale_dtype=torch.bfloat16), torch.bfloat16),
    "mxfp4": (dict(weight="mxfp4"), torch.bfloat16),
    "nvfp4": (dict(weight="nvfp4"), torch.bfloat16),
    "int8-channel": (dict(weight="int8", group_size=-1, scale_dtype=torch.bfloat16), torch.bfloat16),
}
SHAPE = (28672, 8192)


def registers(cubin: bytes) -> int | None:
    """Registers per thread of the cubin's kernel (``cuobjdump -res-usage``)."""
    import triton

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(cuobjdump), "-res-usage", f.name], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+)", text)
    return int(m.group(1)) if m else None


def loop_body(
    instructions: list[tuple[int, str]], holding: str = "", innermost: bool = False, at_least: int = 1
) -> list[str]:
    """The instructions of the largest loop (from a backward branch's target to the branch), or of the smallest
    (``innermost``), among the loops with at least ``at_least`` instructions whose opcode starts with ``holding``."""
    labels, pending = {}, []
    for addr, text in instructions:
        if addr < 0:
            pending.append(text)
        else:
            labels.update({name: addr for name in pending})
            pending = []
    loops = []
    for addr, text in instructions:
        target = re.search(r"BRA\s+`?\(?(\.L_x_\d+)", text)
        if addr >= 0 and target and labels.get(target.group(1), addr + 1) <= addr:
            loops.append((labels[target.group(1)], addr))
    body = lambda lo, hi: [text for addr, text in instructions if lo <= addr <= hi]
    loops = [r for r in loops if sum(opcode(text).startswith(holding) for text in body(*r)) >= at_least]
    if not loops:
        return []
    return body(*(min if innermost else max)(loops, key=lambda r: r[1] - r[0]))


def opcode(text: str) -> str:
    return re.sub(r"^@!?U?P[T\d]+\s+", "", text).split()[0]


def analyse(spec, arch: int, weights_per_iteration: int) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget

    src = triton.compiler.ASTSource(spec.kernel, spec.signature(), spec.constexprs, spec.attrs())
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=spec.options())
    instructions = disassemble(compiled.asm["cubin"])
    body = loop_body(instructions)
    ops = collections.Counter(opcode(t) for t in body)
    every = collections.Counter(opcode(t) for a, t in instructions if a >= 0)
    threads = 32 * spec.num_warps
    per_thread = weights_per_iteration / threads
    count = lambda counter, prefix: sum(v for k, v in counter.items() if k.startswith(prefix))
    return {
        "kernel": spec.name,
        "arch": arch,
        "registers": registers(compiled.asm["cubin"]),
        "shared_bytes": compiled.metadata.shared,
        "loop_instructions": len(body),
        "weights_per_thread_per_iteration": per_thread,
        "instructions_per_weight": round(len(body) / per_thread, 3) if body else None,
        "loads_in_loop": {k: v for k, v in sorted(ops.items()) if k.startswith("LDG")},
        "local_memory": count(every, "LDL") + count(every, "STL"),
        "shared_round_trips_in_loop": count(ops, "STS") + count(ops, "LDS") + count(ops, "STSM") + count(ops, "LDSM"),
        "barriers_in_loop": count(ops, "BAR"),
        "conversions_in_loop": {k: v for k, v in ops.items() if k.startswith(("I2F", "F2I", "F2F", "I2FP"))},
        "opcodes_in_loop": dict(ops.most_common()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, action="append", help="compute capability x10 (repeatable)")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--m", type=int, default=1, help="tokens (picks the config the chooser returns)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET"):
        parser.error("unset TRITON_INTERPRET: interpreted kernels cannot be compiled ahead of time")
    import humming
    from humming.device import KNOWN_LIMITS
    from humming.triton_kernels import wna16
    from humming.triton_kernels._dequant16 import dequant16_applies
    from humming.triton_kernels._weight_tile import KIND_FLOAT, weight_spec

    h200 = KNOWN_LIMITS["NVIDIA H200"]
    rows = []
    for label in args.cases.split(","):
        qargs, dtype = CASES[label]
        qw = humming.quantize(torch.ones(256, 512), **qargs)
        n, k = SHAPE
        group_k = 0 if qw.group_shape[1] < 0 else qw.group_shape[1]
        packed = ""  # the kind of codes the packed 16-bit decode reads, as wna16.default_config finds it
        if dequant16_applies(qw, dtype, 128, (9, 0), global_scale_after=True):
            packed = "float" if weight_spec(qw).W_KIND == KIND_FLOAT else "int"
        cfg = wna16.wna16_config(args.m, n, k, qw.bits, h200.sm_count, group_k, h200.smem_per_block, packed=packed)
        spec = wna16.kernel_spec(label, qw, dtype, cfg, 80 if dtype == torch.bfloat16 else 75)
        for arch in args.arch or (90, 80):
            row = analyse(spec, arch, cfg.block_n * cfg.block_k)
            row.update(case=label, m=args.m, config=cfg.name())
            rows.append(row)
            print(
                f"{label:14} sm_{arch} {cfg.name():28} {row['instructions_per_weight']!s:>6} instr/weight, "
                f"loads {row['loads_in_loop']}, local {row['local_memory']}, "
                f"smem ops {row['shared_round_trips_in_loop']}, "
                f"conv {row['conversions_in_loop']}, regs {row['registers']}"
            )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
