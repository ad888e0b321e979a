"""Run-time compilation of humming's CUDA kernels with NVRTC (through cuda-core), cached by content.

A kernel is described by a :class:`KernelSpec`: the header that holds its template, the template
instance to run, the parameter struct it takes by value, its block size and the compute capabilities it
targets. :func:`compile_kernel` turns a spec into a cubin for one architecture:

1. the generated wrapper and every ``#include "..."`` it reaches under ``include/`` are inlined into one
   translation unit (each header once), so the cache key below covers every header's contents;
2. key = SHA-256 of that source, the compiler options, the target architecture, the NVRTC version and
   the cuda-core version;
3. lookups go to an in-process dictionary, then to the on-disk cache (``_cache``: atomic writes, a file
   lock shared by processes, checksummed entries), and only then to NVRTC.

``_driver.get_kernel`` loads the cubin on a device (driver API) and returns a launchable
:class:`~humming.cuda_kernels._driver.LoadedKernel`; while the current stream captures a CUDA graph it
never compiles or loads: an unprepared kernel raises :class:`KernelNotReadyError` instead.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from . import _cache

__all__ = [
    "INCLUDE_DIR",
    "CompiledKernel",
    "KernelNotReadyError",
    "KernelSpec",
    "NvrtcCompileError",
    "clear_memory_cache",
    "compile_kernel",
    "compiler_unavailable_reason",
    "device_arch",
    "nvrtc_version",
    "per_call_cache",
]

INCLUDE_DIR = Path(__file__).parent / "include"
_COMPILE_OPTIONS = (("std", "c++17"), ("ptxas_options", ("-v",)))
_INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"[ \t]*$', re.MULTILINE)
_CACHE_FORMAT = "humming-cuda-jit-1"

#: For the pure functions every kernel call runs (tuning heuristics, spec builders): their arguments and
#: results are small frozen values, and recomputing them costs tens of microseconds of Python per call,
#: as much as a decode kernel takes. Bounded, since serving sees many distinct M.
per_call_cache = functools.lru_cache(maxsize=4096)


class KernelNotReadyError(RuntimeError):
    """A kernel was needed while a CUDA graph was being captured, but was never compiled and loaded."""


class NvrtcCompileError(RuntimeError):
    """NVRTC rejected a kernel; the message holds the compiler log."""


@dataclass(frozen=True)
class KernelSpec:
    """One specialised kernel.

    ``name`` is the C symbol of the generated ``extern "C"`` wrapper and lists every specialisation
    (e.g. ``humming_decode_u4_bf16_mt1_zp0_w8``). The wrapper takes one ``params`` struct by value
    (``__grid_constant__``) and calls ``entry`` (a template instance declared in ``header``) with it.
    ``ccs`` are the compute capabilities the kernel is built for; ``arch_specific`` kernels use
    instructions of one architecture only (wgmma, setmaxnreg) and are built for ``sm_XYa``.
    """

    family: str
    name: str
    header: str
    entry: str
    params: str
    threads: int
    ccs: tuple[tuple[int, int], ...]
    min_blocks: int = 1
    arch_specific: bool = False
    include_root: Path = INCLUDE_DIR

    def wrapper_source(self) -> str:
        return (
            f'#include "{self.header}"\n'
            f'extern "C" __global__ void __launch_bounds__({self.threads}, {self.min_blocks})\n'
            f"{self.name}(const __grid_constant__ {self.params} p) {{ {self.entry}(p); }}\n"
        )

    def targets(self) -> tuple[str, ...]:
        """Every architecture this kernel is compiled for (``sm_80``, ``sm_90a``, ...)."""
        return tuple(_arch_name(cc, self.arch_specific) for cc in self.ccs)

    def full_source(self) -> str:
        """The wrapper with every quoted include inlined once (what NVRTC compiles and the key hashes)."""
        return _flatten(self.wrapper_source(), "<wrapper>", self.include_root, set())


@dataclass(frozen=True)
class CompiledKernel:
    """A cubin for one (spec, arch); ``origin`` is ``"compiled"``, ``"disk"`` or ``"memory"``."""

    spec: KernelSpec
    arch: str
    key: str
    cubin: bytes
    log: str
    origin: str
    seconds: float


def _arch_name(cc: tuple[int, int], arch_specific: bool) -> str:
    return f"sm_{cc[0]}{cc[1]}" + ("a" if arch_specific else "")


def _flatten(text: str, origin: str, root: Path, seen: set[str]) -> str:
    def include(match: re.Match) -> str:
        rel = match.group(1)
        if rel in seen:
            return f"// {rel}: already included"
        seen.add(rel)
        path = root / rel
        if not path.is_file():
            raise FileNotFoundError(f"{origin} includes {rel!r}, which is not under {root}")
        body = _flatten(path.read_text(), rel, root, seen)
        resume = text.count("\n", 0, match.start()) + 2  # the line after the include
        return f'#line 1 "{rel}"\n{body}\n#line {resume} "{origin}"'

    return _INCLUDE_RE.sub(include, text)


_import_lock = threading.Lock()


def compiler_unavailable_reason() -> str | None:
    """``None`` when cuda-core and NVRTC can compile, else why not (what is missing or fails to load).

    Checked once per process without importing cuda-core (a slow import): a start whose kernels
    all come from the disk cache never needs it. NVRTC itself is loaded (cheap) to check it works.
    """
    with _import_lock:
        return _probe_compiler()


@functools.cache
def _probe_compiler() -> str | None:
    try:
        if importlib.util.find_spec("cuda.core") is None:
            raise ModuleNotFoundError("No module named 'cuda.core'")
        _cuda_core_version()
    except Exception as exc:  # not installed, or installed without its metadata
        return f"cuda-core is not installed ({type(exc).__name__}: {exc}); install humming[cuda]"
    try:
        nvrtc_version()
    except Exception as exc:
        return f"NVRTC cannot be loaded ({type(exc).__name__}: {exc}); install nvidia-cuda-nvrtc"
    return None


@functools.cache
def _cuda_core_version() -> str:
    from importlib.metadata import version

    return version("cuda-core")


def _import_cuda_core():
    """cuda-core's ``Program`` and ``ProgramOptions``, imported under a lock: its first import is not safe
    to run from several threads at once (it picks its versioned submodule at import time)."""
    with _import_lock:
        from cuda.core import Program, ProgramOptions

    return Program, ProgramOptions


@functools.cache
def nvrtc_version() -> tuple[int, int]:
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"nvrtcVersion failed: {err}")
    return major, minor


@functools.cache
def _toolchain_id() -> str:
    return f"{_CACHE_FORMAT};nvrtc={nvrtc_version()};cuda-core={_cuda_core_version()}"


def cache_key(spec: KernelSpec, arch: str) -> str:
    """Hex SHA-256 of the full source (headers included), options, arch and toolchain versions."""
    h = hashlib.sha256()
    for part in (spec.full_source(), repr(_COMPILE_OPTIONS), arch, _toolchain_id()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _nvrtc_compile(spec: KernelSpec, arch: str, source: str) -> tuple[bytes, str]:
    Program, ProgramOptions = _import_cuda_core()

    class _Log:
        def __init__(self) -> None:
            self.parts: list[str] = []

        def write(self, text: str) -> None:
            self.parts.append(text)

    log = _Log()
    options = ProgramOptions(name=f"{spec.name}.cu", arch=arch, **dict(_COMPILE_OPTIONS))
    try:
        obj = Program(source, "c++", options).compile("cubin", logs=log)
    except Exception as exc:  # cuda-core's NVRTCError (its module moves between versions), re-raised
        raise NvrtcCompileError(f"NVRTC failed on {spec.name} for {arch}:\n{exc}") from exc
    return bytes(obj.code), "".join(log.parts).rstrip("\0")


_memory: dict[tuple[KernelSpec, str], CompiledKernel] = {}
_key_locks: dict[tuple[KernelSpec, str], threading.Lock] = {}
_locks_guard = threading.Lock()


def compile_kernel(spec: KernelSpec, arch: str) -> CompiledKernel:
    """The cubin of ``spec`` for ``arch`` (e.g. ``"sm_90a"``), from memory, disk, or NVRTC."""
    if arch not in spec.targets():
        raise ValueError(f"{spec.name} is not built for {arch}; its targets are {spec.targets()}")
    reason = compiler_unavailable_reason()
    if reason is not None:
        raise RuntimeError(reason)
    with _locks_guard:
        lock = _key_locks.setdefault((spec, arch), threading.Lock())
    with lock:
        hit = _memory.get((spec, arch))
        if hit is not None:
            return CompiledKernel(spec, arch, hit.key, hit.cubin, hit.log, "memory", 0.0)
        start = time.perf_counter()
        source = spec.full_source()
        key = cache_key(spec, arch)
        path = _cache.cache_dir() / f"{spec.name}-{arch}-{key[:40]}.cubin"
        entry = _cache.get_or_build(path, key, lambda: _nvrtc_compile(spec, arch, source))
        compiled = CompiledKernel(spec, arch, key, entry.cubin, entry.log, entry.origin, time.perf_counter() - start)
        _memory[(spec, arch)] = compiled
        return compiled


def clear_memory_cache() -> None:
    """Forget the in-process cubins (the disk cache and loaded modules stay)."""
    with _locks_guard:
        _memory.clear()


def device_arch(spec: KernelSpec, cc: tuple[int, int]) -> str | None:
    """The architecture to build ``spec`` for on a device of compute capability ``cc``, or ``None``."""
    return _arch_name(cc, spec.arch_specific) if cc in spec.ccs else None
