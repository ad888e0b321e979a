"""The compile-check registry: every Triton kernel declares representative specialisations here.

A kernel module calls :func:`register` at import with a factory of :class:`CompileSpec` records;
tests/test_compile_triton.py compiles each of them ahead of time for every architecture in :data:`ARCHS`
(``triton.compile`` with a ``GPUTarget``: no GPU needed) and checks the PTX for the matrix instructions
that the architecture should use. Run it by hand with ``python -m humming.triton_kernels --arch 90``
(``TRITON_INTERPRET`` must be unset: interpreted kernels cannot be compiled).
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .._env import env

__all__ = [
    "ARCHS",
    "BEST_MMA",
    "FULL_ARCHS",
    "TENSOR_CORE_OPS",
    "CompileSpec",
    "compile_spec",
    "compile_specs",
    "disassemble",
    "register",
    "specs_for_arch",
]

#: Architectures (compute capability x10) every kernel must compile for.
ARCHS = (75, 80, 86, 89, 90, 100, 120)
#: PTX matrix instructions that count as tensor-core use, per architecture.
TENSOR_CORE_OPS = {
    75: (),  # Triton 3.6 lowers dots on Turing to FMA: compile only
    80: ("mma.sync",),
    86: ("mma.sync",),
    89: ("mma.sync",),
    90: ("mma.sync", "wgmma.mma_async"),
    100: ("mma.sync", "tcgen05.mma"),
    120: ("mma.sync",),
}
#: The architecture's own large-tile instruction, required of specs with ``mma="best"``.
BEST_MMA = {90: "wgmma.mma_async", 100: "tcgen05.mma"}
#: Architectures that compile every specialisation (the H200's); the others compile one per kernel family
#: and minimum architecture (:func:`specs_for_arch`), which covers each code path that differs by arch.
FULL_ARCHS = (90,)


@dataclass(frozen=True)
class CompileSpec:
    """One specialisation of a kernel to compile ahead of time.

    ``pointers`` maps pointer arguments to Triton types (``"*bf16"``), ``scalars`` other scalar arguments
    (``"fp32"``); arguments in none of ``pointers``, ``scalars`` and ``constexprs`` are ``i32``. Pointers and
    the ``aligned`` arguments are declared multiples of 16, as Triton's launcher specialises them on real
    shapes. ``mma``: ``"none"`` (no dot), ``"any"`` (some tensor-core instruction), ``"best"`` (wgmma on
    sm_90, tcgen05 on sm_100, mma.sync elsewhere). ``min_arch``: the oldest architecture it targets (bf16
    tensor cores need sm_80).
    """

    name: str
    kernel: object
    pointers: dict[str, str]
    constexprs: dict[str, object]
    num_warps: int = 4
    num_stages: int = 3
    mma: str = "none"
    min_arch: int = 75
    aligned: tuple[str, ...] = field(default_factory=tuple)
    scalars: dict[str, str] = field(default_factory=dict)

    @property
    def family(self) -> str:
        """The kernel this specialises (``wna16``, ``scaled_mm-grouped``...): the name up to the first '-',
        plus ``-grouped`` for the MoE variant and ``-gather`` for its gathering one, which compile different
        paths."""
        base = self.name.split("-")[0] + ("-grouped" if "-grouped-" in self.name else "")
        return base + ("-gather" if "-gather-" in self.name else "")

    def signature(self) -> dict[str, str]:
        sig = {}
        for arg in self.kernel.arg_names:
            if arg in self.constexprs:
                sig[arg] = "constexpr"
            else:
                sig[arg] = self.pointers.get(arg) or self.scalars.get(arg, "i32")
        return sig

    def options(self) -> dict[str, object]:
        """``triton.compile``'s options for this spec, as :class:`~._launch.CompiledLaunches` launches it
        (floating-point contraction on, whatever the Triton version's default)."""
        return {"num_warps": self.num_warps, "num_stages": self.num_stages, "enable_fp_fusion": True}

    def attrs(self) -> dict[tuple[int, ...], list]:
        hinted = set(self.pointers) | set(self.aligned)
        return {(i,): [["tt.divisibility", 16]] for i, arg in enumerate(self.kernel.arg_names) if arg in hinted}


_FACTORIES: dict[str, Callable[[], list[CompileSpec]]] = {}


def register(kernel_name: str, factory: Callable[[], list[CompileSpec]]) -> None:
    """Declare a kernel's representative specialisations (called by the kernel's module at import)."""
    _FACTORIES[kernel_name] = factory


def compile_specs() -> list[CompileSpec]:
    """Every registered specialisation, after importing each public module of humming.triton_kernels."""
    package = importlib.import_module("humming.triton_kernels")
    for info in pkgutil.iter_modules(package.__path__):
        if not info.name.startswith("_") and info.name != "registry":
            importlib.import_module(f"{package.__name__}.{info.name}")
    return [spec for factory in _FACTORIES.values() for spec in factory()]


def specs_for_arch(specs: list[CompileSpec], arch: int) -> list[CompileSpec]:
    """What to compile for ``sm_<arch>``: every spec on :data:`FULL_ARCHS`, else one per (family, minimum
    architecture), preferring specs that must use the best matrix instruction, then any tensor-core one."""
    if arch in FULL_ARCHS:
        return list(specs)
    rank = {"best": 0, "any": 1, "none": 2}
    chosen: dict[tuple[str, int], CompileSpec] = {}
    for spec in specs:
        key = (spec.family, spec.min_arch)
        if key not in chosen or rank[spec.mma] < rank[chosen[key].mma]:
            chosen[key] = spec
    return list(chosen.values())


_INSTR = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"^(\.L_x_\d+):")


def disassemble(cubin: bytes) -> list[tuple[int, str]]:
    """(address, instruction) of every SASS instruction of ``cubin`` (Triton's own ``nvdisasm``); labels as
    (-1, name)."""
    import triton

    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(nvdisasm), "-c", f.name], capture_output=True, text=True, check=True).stdout
    out = []
    for line in text.splitlines():
        if m := _INSTR.match(line):
            out.append((int(m.group(1), 16), m.group(2)))
        elif m := _LABEL.match(line):
            out.append((-1, m.group(1)))
    return out


def compile_spec(spec: CompileSpec, arch: int, local_memory: bool = False) -> dict:
    """Compile ``spec`` for ``sm_<arch>``; returns the matrix instructions found and any problem, and with
    ``local_memory`` the count of local-memory instructions in its SASS (``LDL`` / ``STL``: register spills)."""
    import triton
    from triton.backends.compiler import GPUTarget

    result = {"name": spec.name, "arch": arch, "ok": False, "problem": None, "mma_ops": {}}
    if arch < spec.min_arch:
        result.update(ok=True, problem=f"skipped: targets sm_{spec.min_arch}+")
        return result
    src = triton.compiler.ASTSource(spec.kernel, spec.signature(), spec.constexprs, spec.attrs())
    try:
        compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=spec.options())
    except Exception as err:  # report every compiler failure as data: the test prints them all
        result["problem"] = f"{type(err).__name__}: {str(err).strip().splitlines()[-1] if str(err).strip() else ''}"
        return result
    ptx = compiled.asm["ptx"]
    found = {op: ptx.count(op) for op in TENSOR_CORE_OPS[arch] if op in ptx}
    result["mma_ops"] = found
    result["shared_bytes"] = compiled.metadata.shared
    if local_memory:
        sass = disassemble(compiled.asm["cubin"])
        result["local_memory_instructions"] = sum(text.startswith(("LDL", "STL")) for _, text in sass)
    if not TENSOR_CORE_OPS[arch] or spec.mma == "none":
        pass
    elif spec.mma == "any" and not found:
        result["problem"] = f"no tensor-core instruction ({', '.join(TENSOR_CORE_OPS[arch])}) in the PTX"
    elif spec.mma == "best" and arch in BEST_MMA and BEST_MMA[arch] not in found:
        result["problem"] = f"expected {BEST_MMA[arch]} in the PTX, found {found or 'none'}"
    elif not found:
        result["problem"] = f"no tensor-core instruction ({', '.join(TENSOR_CORE_OPS[arch])}) in the PTX"
    result["ok"] = result["problem"] is None
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, action="append", help="compute capability x10 (repeatable)")
    parser.add_argument("--only", default=None, help="compile only specs whose name contains this")
    parser.add_argument("--all-specs", action="store_true", help="every spec on every arch (see specs_for_arch)")
    args = parser.parse_args(argv)
    if env("TRITON_INTERPRET"):
        parser.error("unset TRITON_INTERPRET: interpreted kernels cannot be compiled ahead of time")
    specs = [s for s in compile_specs() if args.only is None or args.only in s.name]
    results = [
        compile_spec(s, arch)
        for arch in (args.arch or ARCHS)
        for s in (specs if args.all_specs else specs_for_arch(specs, arch))
    ]
    json.dump(results, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0 if all(r["ok"] for r in results) else 1
