"""Run chosen Triton GEMM launches once each inside a CUDA profiler range, for Nsight Compute: the profile behind
a Triton-path target that a timing sweep shows missed (issue 26 asks for one wherever a target stays unmet).

Each point is ``case:NxK:M:config``; ``config`` is ``default`` (the chooser's tile) or a ``TileConfig.name()``
(``m16n64k128s2g8w4st3-swap``). Cases: the WnA16 formats on bf16 activations and ``w4a8-int4-g128`` /
``w8a8-fp8-channel`` on the scaled GEMM (activations quantized before the range, so only the GEMM is in it).
Every point is compiled, checked against the float64 product of what the kernel multiplies and warmed up
before the range opens; inside it each point runs once (``--profile-from-start off`` keeps everything else out).

Usage (GPU machine, repository root):
  ncu --profile-from-start off --clock-control none --set full -o $OUT/triton \\
      python bench/tools/triton_profile.py int4-g128:28672x8192:1:default mxfp4:28672x8192:16:default
  ncu --import $OUT/triton.ncu-rep --page details > $OUT/triton.details.txt
"""

from __future__ import annotations

import argparse
import math
import re
import sys

import torch

import humming
from humming.triton_kernels import scaled_mm, wna16
from humming.triton_kernels._scaled_mm_plan import call_config, compute_plan, device_capability
from humming.triton_kernels.configs import TileConfig

#: name -> (quantize arguments, activation scheme; None: the WnA16 kernel on bf16 activations)
CASES = {
    "int4-g128": (dict(weight="int4", group_size=128, scale_dtype=torch.bfloat16), None),
    "uint4-zp-g128": (dict(weight="int4", group_size=128, zero_point=True, scale_dtype=torch.bfloat16), None),
    "mxfp4": (dict(weight="mxfp4"), None),
    "nvfp4": (dict(weight="nvfp4"), None),
    "int8-channel": (dict(weight="int8", group_size=-1, scale_dtype=torch.bfloat16), None),
    "w4a8-int4-g128": (dict(weight="int4", group_size=128, scale_dtype=torch.bfloat16), "fp8"),
    "w8a8-fp8-channel": (dict(weight="e4m3", group_size=-1, scale_dtype=torch.float32), "fp8"),
}
_NAME = re.compile(r"m(\d+)n(\d+)k(\d+)s(\d+)g(\d+)w(\d+)st(\d+)((?:-dequant-first|-swap)*)$")


def parse_config(name: str) -> TileConfig:
    """The :class:`TileConfig` whose ``name()`` is ``name``."""
    match = _NAME.match(name)
    if not match:
        raise ValueError(f"config: expected 'default' or a TileConfig name like m16n64k128s2g8w4st3-swap, got {name!r}")
    bm, bn, bk, split, group, warps, stages = (int(v) for v in match.groups()[:7])
    flags = match.group(8)
    cfg = TileConfig(bm, bn, bk, split, group, warps, stages, "-dequant-first" in flags, "-swap" in flags)
    assert cfg.name() == name, (cfg.name(), name)
    return cfg


def prepare(point: str):
    """A no-argument call running ``point`` (compiled, checked and warmed up), and a line describing it."""
    case, shape, m, config = point.split(":")
    qargs, act = CASES[case]
    n, k = (int(v) for v in shape.split("x"))
    m = int(m)
    w = torch.randn(n, k, device="cuda") / math.sqrt(k)
    qw = humming.quantize(w, **qargs)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    if act is None:
        cfg = wna16.default_config(qw, x) if config == "default" else parse_config(config)
        call = lambda: wna16.linear(x, qw, None, torch.bfloat16, cfg)
        ref = x.double() @ humming.dequantize(qw, torch.float64).T
    else:
        scheme = humming.ir.activation.get_act_scheme(act)
        qa = humming.quantize_activation(x, scheme)
        plan = compute_plan(qw, scheme, scaled_mm.act_group_k(scheme, qa.scales), device_capability(x.device))
        cfg = call_config(plan, qw, m, x.device) if config == "default" else parse_config(config)
        call = lambda: scaled_mm.linear(qa, qw, None, None, torch.bfloat16, cfg)
        ref = humming.dequantize_activation(qa, torch.float64) @ humming.dequantize(qw, torch.float64).T
    out = call()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    if not err <= 1e-2:
        raise SystemExit(f"{point}: rel err {err:.2e} against float64: not profiled")
    for _ in range(3):
        call()
    return call, f"{point} -> {cfg.name()} (rel err {err:.1e})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("points", nargs="+", help="case:NxK:M:config")
    args = parser.parse_args()
    prepared = [prepare(p) for p in args.points]
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for call, _ in prepared:
        call()
        torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    for _, line in prepared:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
