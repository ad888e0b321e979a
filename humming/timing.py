"""The one timing module: ``python -m humming tune``, ``python -m humming bench`` and the pytest-benchmark
suite in bench/ all time through :func:`time_calls` (the suite replays :func:`capture_graph` graphs).

Each call is timed two ways: ``graph_us``, the median replay of a CUDA graph of the calls (kernel time
without launch gaps: what a serving engine's graphs see) and ``eager_us``, the same calls launched from
Python (what an eager caller pays, host work included). Callers pass several functions that read
different weight copies whose total exceeds the L2 cache, so that every call reads its weights from
device memory (:func:`copies_past_l2`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

import torch

__all__ = ["capture_graph", "copies_past_l2", "copy_bandwidth", "median_ms", "time_calls"]


def median_ms(fn: Callable[[], object], reps: int) -> float:
    """Median milliseconds of ``fn()`` over ``reps`` runs, each between two CUDA events."""
    start = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        start[i].record()
        fn()
        end[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(start, end))


def copies_past_l2(bytes_per_copy: int, device=None, factor: float = 2.0) -> int:
    """How many copies of ``bytes_per_copy`` together exceed ``factor`` times the device's L2 cache."""
    from .device import device_info

    return max(1, math.ceil(factor * device_info(device).l2_bytes / max(bytes_per_copy, 1)))


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """The current GPU's device-to-device copy bandwidth, bytes read + written per second: the median replay
    of a CUDA graph of one copy of ``nbytes`` (past the L2, so it reads and writes device memory)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    graph = capture_graph(lambda: dst.copy_(src))
    seconds = median_ms(graph.replay, 10) * 1e-3
    del graph
    return 2 * nbytes / seconds


def time_calls(calls: list[Callable[[], object]], target_ms: float = 2.0) -> dict[str, float]:
    """Median microseconds of one call of ``calls`` (run in turn): ``graph_us`` and ``eager_us``."""
    for call in calls:
        call()
    torch.cuda.synchronize()
    one = median_ms(lambda: [call() for call in calls], 3) / len(calls)
    rounds = max(1, min(50, math.ceil(target_ms / max(one, 1e-3))) // len(calls))

    def run_all():
        for _ in range(rounds):
            for call in calls:
                call()

    eager = median_ms(run_all, 5) / (rounds * len(calls))
    graph = capture_graph(run_all)
    replay = median_ms(graph.replay, 7) / (rounds * len(calls))
    del graph
    return {"graph_us": replay * 1e3, "eager_us": eager * 1e3}


def capture_graph(run: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``run()``, replayed once. ``run`` first runs on the capture stream, so that workspaces
    and lazy loads happen outside the capture."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay()
    torch.cuda.synchronize()
    return graph
