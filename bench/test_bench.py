"""pytest-benchmark suite: one benchmark group per (op, case, shape, M, dtype) (op moe: per model and part of its
layer, random routing), comparing every system of
``humming.bench.registry`` (humming's dispatcher, each of its kernels, torch, gemlite when installed) on the
same inputs, after checking each result against the float32 product of the unquantized weight.

GPU (a benchmark round replays a CUDA graph of ``CALLS_PER_ROUND`` calls that rotate through weight copies
past the L2, built by ``humming.timing.capture_graph``; ``extra_info`` holds ``time_calls``' per-call us):

    pytest bench --benchmark-save=h200                                            # the baseline
    pytest bench --benchmark-compare=0001 --benchmark-compare-fail=median:10%     # the regression check

CPU (CI): tiny shapes, each system runs once through the reference or the Triton interpreter, so that the
suite cannot rot: ``pytest bench --benchmark-disable``. humming-kernels runs in a worker process (its
package is also named ``humming``), which a pytest-benchmark round cannot time: ``python -m humming bench``
compares it.
"""

from __future__ import annotations

import functools
import itertools
import os

import pytest
import torch

GPU = torch.cuda.is_available()
if not GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton decorates humming's kernels

from humming.bench import CHECK_TOLERANCE, PARTS, Group, MoeModel, Shape, copy_roof, registry, rel_err  # noqa: E402
from humming.bench.moe import Experts, MoeGroup  # noqa: E402
from humming.timing import capture_graph, time_calls  # noqa: E402

CALLS_PER_ROUND = 20


@functools.cache
def _roof() -> float:
    """The floor's roof on this device (bytes per second), read once."""
    return copy_roof("cuda" if GPU else "cpu")[0]


#: (op, cases, shapes (op moe: models), M values): decode and prefill points of the standard sweep on the GPU ...
GPU_POINTS = [
    (
        "linear",
        ["w4a16-int4-g128", "mxfp4-a16", "w8a8-fp8-channel", "w4a8-int4-g128-fp8"],
        [Shape(28672, 8192)],
        [1, 16],
    ),
    ("linear", ["w4a16-int4-g128", "w8a8-fp8-channel"], [Shape(8192, 8192)], [1024]),
    ("moe", ["w4a16-int4-g128", "w8a8-fp8-block"], [MoeModel.from_shape(Shape(2816, 2048, 64, 6), ())], [16, 256]),
]
#: ... and tiny ones on the CPU.
CPU_POINTS = [
    ("linear", ["w4a16-int4-g128", "w8a8-fp8-channel"], [Shape(64, 64)], [3]),
    ("moe", ["w4a16-int4-g128"], [MoeModel.from_shape(Shape(64, 64, 4, 2), ())], [3]),
]


def _params() -> list:
    marks = {
        "gpu": [pytest.mark.gpu, pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")],
        "cpu": [pytest.mark.skipif(GPU, reason="tiny CPU shapes; the GPU points run on this machine")],
    }
    params = []
    for kind, points in (("gpu", GPU_POINTS), ("cpu", CPU_POINTS)):
        for op, cases, shapes, m_values in points:
            wheres = shapes if op == "linear" else [(model, part) for model in shapes for part in PARTS]
            for case, where, m, system in itertools.product(cases, wheres, m_values, registry(op)):
                label = where if op == "linear" else f"{where[0].name}-{where[1]}"
                name = f"{op}-{case}-{label}-M{m}-{system}"
                params.append(pytest.param(op, case, where, m, system, marks=marks[kind], id=name))
    return params


@functools.lru_cache(maxsize=1)  # the parameters run case by case: one case's weights at a time
def _experts(model: MoeModel, case: str) -> Experts:
    return Experts(model, case, torch.bfloat16, "cuda" if GPU else "cpu")


@functools.lru_cache(maxsize=1)  # the parameters run group by group: one group's inputs at a time
def _group(op: str, case: str, where) -> Group:
    if op == "linear":
        return Group(op, case, where, torch.bfloat16, "cuda" if GPU else "cpu")
    model, part = where
    return MoeGroup(_experts(model, case), part, "random")


@pytest.mark.parametrize(("op", "case", "where", "m", "system_name"), _params())
def test_bench(benchmark, op, case, where, m, system_name):
    system = registry(op)[system_name]
    if system.prepare is None:
        pytest.skip("humming-kernels runs in a worker process: python -m humming bench compares it")
    reason = system.unavailable() or (None if system.cases is None or case in system.cases else "not this case")
    if reason is None and system.m_values is not None and m not in system.m_values:
        reason = f"runs at M in {system.m_values}"
    if reason is None and op == "moe" and system.parts is not None and where[1] not in system.parts:
        reason = f"runs the parts {system.parts}"
    if reason:
        pytest.skip(reason)
    group = _group(op, case, where)
    inp = group.inputs(m)
    prepared = system.prepare(group, inp)
    if isinstance(prepared, str):
        pytest.skip(prepared)
    err = rel_err(prepared.canonical(prepared.calls[0]()), group.reference(inp))
    assert err < CHECK_TOLERANCE, f"{system_name}: rel err {err:.3g} against the float32 product"
    benchmark.group = f"{op} {case} {group.label} M={m} bf16"
    benchmark.extra_info.update(kernel=prepared.kernel, rel_err=err, floor_us=group.floor_bytes(inp) / _roof() * 1e6)
    if not GPU:
        benchmark.pedantic(prepared.calls[0], rounds=1, iterations=1)
        return
    calls = prepared.calls
    graph = capture_graph(lambda: [calls[i % len(calls)]() for i in range(CALLS_PER_ROUND)])
    timed = {key: us / prepared.ops_per_call for key, us in time_calls(calls).items()}
    benchmark.extra_info.update(timed, calls_per_round=CALLS_PER_ROUND, ops_per_call=prepared.ops_per_call)

    def replay():
        graph.replay()
        torch.cuda.synchronize()

    benchmark.pedantic(replay, rounds=30, warmup_rounds=3)
