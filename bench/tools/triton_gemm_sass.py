"""Read the K loop of the Triton GEMMs (the scaled GEMM and the WnA16 tiled kernel) in compiled SASS, without
a GPU: which matrix instruction runs (sm_90: HGMMA / QGMMA / IGMMA = wgmma bf16 / e4m3 / int8; sm_89: QMMA =
fp8 mma.sync; sm_80 / 86: HMMA.16816 / IMMA.16832), conversions before it, shared-memory
staging, the pipeline's loads, registers and spills (issue 26).

For each case and M it compiles the kernel that the chooser of each capability returns for 28672x8192
(:func:`humming.triton_kernels.scaled_mm.call_config` / :func:`~humming.triton_kernels.wna16.wna16_config`
with the capability's limits, :data:`humming.triton_kernels.configs.CAPABILITY_LIMITS`) and counts the
largest loop's instructions by opcode.

Usage (repository root, TRITON_INTERPRET unset):
  python bench/tools/triton_gemm_sass.py --arch 90 --arch 89 --arch 80 --m 256 --m 1024 --m 4096 \
      --out bench/results/cpu-sass/triton_scaled_mm.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from triton_sass import disassemble, loop_body, opcode, registers

#: label -> (kernel, quantize arguments, activation scheme or dtype)
CASES = {
    "w8a8-fp8-channel": ("scaled", dict(weight="e4m3", group_size=-1, scale_dtype=torch.float32), "fp8"),
    "w8a8-fp8-block128": ("scaled", dict(weight="fp8_block"), "fp8_g128"),
    "w4a8-int4-g128": ("scaled", dict(weight="int4", group_size=128, scale_dtype=torch.bfloat16), "fp8"),
    "w4a8-int4-channel": ("scaled", dict(weight="int4", group_size=-1, scale_dtype=torch.float32), "fp8"),
    "mxfp4-fp8": ("scaled", dict(weight="mxfp4"), "fp8"),
    "int8-int8": ("scaled", dict(weight="int8", group_size=-1, scale_dtype=torch.float32), "int8"),
    "w4a16-int4-g128": ("wna16", dict(weight="int4", group_size=128, scale_dtype=torch.bfloat16), torch.bfloat16),
    "mxfp4-bf16": ("wna16", dict(weight="mxfp4"), torch.bfloat16),
}
SHAPE = (28672, 8192)
_MMA = re.compile(r"^(HGMMA|QGMMA|IGMMA|HMMA|IMMA|QMMA)")
_CONVERSIONS = ("F2F", "I2F", "F2I", "F2FP", "I2FP", "PRMT")
_LOADS = ("LDG", "UTMALDG", "LDGSTS", "LDS", "STS", "LDSM", "STSM", "LDL", "STL")


def chosen_spec(label: str, arch: int, m: int):
    """(compile spec, config name, plan) of the kernel the choosers launch for ``label`` at M = ``m`` on
    sm_<arch>; ``None`` where that kernel is not the path (WnA16 ``dequant_first``: cuBLAS)."""
    import humming
    from humming.ir.activation import get_act_scheme
    from humming.triton_kernels import scaled_mm, wna16
    from humming.triton_kernels._scaled_mm_plan import plan_config
    from humming.triton_kernels.configs import CAPABILITY_LIMITS
    from humming.triton_kernels.wna16_configs import wna16_config

    kind, qargs, act = CASES[label]
    qw = humming.quantize(torch.ones(256, 512), **qargs)
    capability = (arch // 10, arch % 10)
    limits = CAPABILITY_LIMITS[capability]
    n, k = SHAPE
    if kind == "scaled":
        scheme = get_act_scheme(act)
        plan = scaled_mm.compute_plan(qw, scheme, scaled_mm.act_group_k(scheme), capability)
        if isinstance(plan, str):
            return None, plan, None
        cfg = plan_config(plan, qw, m, capability, limits, (n, k))
        return scaled_mm.kernel_spec(label, qw, scheme, plan, torch.bfloat16, cfg, arch), cfg.name(), plan
    group_k = max(qw.group_shape[1], 0)
    cfg = wna16_config(m, n, k, qw.bits, limits.sm_count, group_k, limits.smem_per_block)
    name = cfg.name()
    cfg = cfg.replace(dequant_first=False)  # the fused kernel, also where the chooser picks dequantize + cuBLAS
    return wna16.kernel_spec(label, qw, act, cfg, arch), name, None  # the arch's packed decode where it applies


def analyse(spec, arch: int) -> dict:
    """The compiled kernel's resources and its K loop's instructions."""
    import triton
    from triton.backends.compiler import GPUTarget

    src = triton.compiler.ASTSource(spec.kernel, spec.signature(), spec.constexprs, spec.attrs())
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=spec.options())
    instructions = disassemble(compiled.asm["cubin"])
    body = loop_body(instructions)
    ops = collections.Counter(opcode(t) for t in body)
    every = collections.Counter(opcode(t) for a, t in instructions if a >= 0)
    pick = lambda counter, prefixes: {k: v for k, v in sorted(counter.items()) if k.startswith(prefixes)}
    return {
        "kernel": spec.name,
        "arch": arch,
        "num_warps": spec.num_warps,
        "num_stages": spec.num_stages,
        "registers": registers(compiled.asm["cubin"]),
        "shared_bytes": compiled.metadata.shared,
        "spill_instructions": sum(v for k, v in every.items() if k.startswith(("LDL", "STL"))),
        "loop_instructions": len(body),
        "mma_in_loop": {k: v for k, v in sorted(ops.items()) if _MMA.match(k)},
        "conversions_in_loop": pick(ops, _CONVERSIONS),
        "memory_in_loop": pick(ops, _LOADS),
        "opcodes_in_loop": dict(ops.most_common(12)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, action="append", help="compute capability x10 (repeatable)")
    parser.add_argument("--m", type=int, action="append", help="tokens (repeatable; default 256, 1024, 4096)")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET"):
        parser.error("unset TRITON_INTERPRET: interpreted kernels cannot be compiled ahead of time")
    rows = []
    for label in args.cases.split(","):
        for arch in args.arch or (90, 89, 80):
            for m in args.m or (256, 1024, 4096):
                spec, config, plan = chosen_spec(label, arch, m)
                if spec is None:
                    rows.append({"case": label, "arch": arch, "m": m, "unsupported": config})
                    print(f"{label:18} sm_{arch} M={m}: {config}")
                    continue
                row = {"case": label, "m": m, "config": config, "plan": plan and plan.__dict__, **analyse(spec, arch)}
                rows.append(row)
                print(
                    f"{label:18} sm_{arch} M={m:<5} {config:34} {plan.mma if plan else 'bf16':5} "
                    f"mma {row['mma_in_loop']} conv {row['conversions_in_loop']} "
                    f"regs {row['registers']} spills {row['spill_instructions']} smem {row['shared_bytes']} "
                    f"mem {row['memory_in_loop']} loop {row['loop_instructions']}",
                    flush=True,
                )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
