"""Parallel compilation of a set of kernels ahead of use, with a progress line on stderr."""

from __future__ import annotations

import os
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass

from tqdm import tqdm

from .jit import CompiledKernel, KernelSpec, compile_kernel, compiler_unavailable_reason

__all__ = ["WarmupReport", "warmup_specs"]


@dataclass(frozen=True)
class WarmupReport:
    """What :func:`warmup_specs` did: each kernel's origin and seconds, and the wall time."""

    kernels: tuple[CompiledKernel, ...]
    wall_seconds: float

    def by_family(self) -> dict[str, dict[str, float]]:
        """Per kernel family: count and seconds of kernels ``compiled`` (cold), from ``disk`` and ``memory``."""
        table: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for k in self.kernels:
            row = table[k.spec.family]
            row[f"{k.origin}_count"] += 1
            row[f"{k.origin}_seconds"] += k.seconds
        return {family: dict(row) for family, row in table.items()}

    def summary(self) -> str:
        lines = [f"humming warmup: {len(self.kernels)} kernels in {self.wall_seconds:.2f}s wall"]
        for family, row in sorted(self.by_family().items()):
            parts = [
                f"{origin} {int(row[f'{origin}_count'])} ({row[f'{origin}_seconds']:.2f}s)"
                for origin in ("compiled", "disk", "memory")
                if f"{origin}_count" in row
            ]
            lines.append(f"  {family}: " + ", ".join(parts))
        return "\n".join(lines)


def warmup_specs(
    jobs: list[tuple[KernelSpec, str]], max_workers: int | None = None, progress: bool = True
) -> WarmupReport:
    """Compile every ``(spec, arch)`` of ``jobs`` in a thread pool (NVRTC runs without the GIL)."""
    reason = compiler_unavailable_reason()
    if reason is not None:
        raise RuntimeError(reason)
    unique = list(dict.fromkeys(jobs))
    bar = tqdm(total=len(unique), desc="humming warmup", unit="kernel", file=sys.stderr, disable=not progress)
    start = time.perf_counter()
    results: list[CompiledKernel] = []
    workers = max_workers or min(len(unique), os.cpu_count() or 1) or 1
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="humming-warmup") as pool:
        futures = [pool.submit(compile_kernel, spec, arch) for spec, arch in unique]
        for future in as_completed(futures):
            results.append(future.result())
            bar.update()
    bar.close()
    return WarmupReport(tuple(results), time.perf_counter() - start)
