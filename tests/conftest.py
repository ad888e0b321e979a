"""Test plumbing shared by every test module.

- ``gpu`` marker: the test needs CUDA and is skipped (with the reason) without it.
- Without a GPU, Triton kernels run under the interpreter: ``TRITON_INTERPRET=1`` must be set before
  Triton decorates any kernel, so it is set here, at collection, before humming's kernels import.
  The interpreter's known gaps are worked around in ``humming/triton_kernels/interpreter.py``.
- ``seed`` fixture: every test draws fresh random inputs from a seed it prints on failure.
- ``fp8_sm90`` fixture: skips (with the reason) unless the CUDA FP8 GEMM runs here.
- GPU memory: each ``gpu`` test starts on an empty allocator cache and leaves it empty, so that parallel
  workers hold only what their running test needs. Three tiers, so that ``bench/tools/h200_checks.sh``
  can size each parallel group from the card's memory: an unmarked test peaks at ``LIGHT_MEMORY_GIB``
  at most, a ``heavy_memory`` one at ``GPU_MEMORY_LIMIT_GIB``, and a ``big_memory`` one runs alone.
  ``HUMMING_TEST_MEMORY_LOG`` names a file that gets each gpu test's peak.
"""

from __future__ import annotations

import gc
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


#: The most GPU memory (allocator reserve, GiB) an unmarked ``gpu`` test may take.
LIGHT_MEMORY_GIB = 12
#: The most a ``heavy_memory`` test may take; beyond it a test is ``big_memory``.
GPU_MEMORY_LIMIT_GIB = 24


@pytest.fixture(autouse=True)
def _gpu_memory(request):
    if not HAS_CUDA or "gpu" not in request.keywords:
        yield
        return
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    yield
    peak = torch.cuda.max_memory_reserved() / 2**30
    gc.collect()
    torch.cuda.empty_cache()
    log = os.environ.get("HUMMING_TEST_MEMORY_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{peak:8.2f} GiB  {request.node.nodeid}\n")
    if "big_memory" in request.keywords:
        return
    limit, marker = (
        (GPU_MEMORY_LIMIT_GIB, "big_memory (run alone)")
        if "heavy_memory" in request.keywords or peak > GPU_MEMORY_LIMIT_GIB
        else (LIGHT_MEMORY_GIB, "heavy_memory (run in a smaller parallel group)")
    )
    if peak > limit:
        pytest.fail(f"peak GPU memory {peak:.1f} GiB > {limit} GiB: mark the test {marker} or size it down")


@pytest.fixture
def seed(request) -> int:
    """A per-test seed (stable across runs, different between tests), set on torch's generator."""
    value = int.from_bytes(request.node.nodeid.encode()[-8:].ljust(8, b"\0"), "little") % (2**31)
    torch.manual_seed(value)
    return value


@pytest.fixture(params=[pytest.param("cuda", marks=pytest.mark.gpu)] if HAS_CUDA else ["cpu"])
def device(request) -> str:
    """Where a test that runs anywhere runs: the interpreter on CPU, the GPU where there is one; there it is a
    ``gpu`` test, so that the GPU suite (``-m gpu``) runs it."""
    return request.param


@pytest.fixture
def fake_cuda_device(monkeypatch):
    """Make ``humming.device`` describe any device (CPU tensors included) as a fake CUDA device, for
    dispatch and heuristic tests on CPU; returns a function that sets its compute capability."""
    from humming import device

    def fake(capability=(9, 0), sm_count=132, smem_per_block=232448, smem_per_sm=233472, name="fake"):
        info = device.DeviceInfo(
            0, name, capability, device.DeviceLimits(sm_count, smem_per_block, smem_per_sm), 50 << 20
        )
        monkeypatch.setattr(device, "device_index", lambda d=None: 0)
        monkeypatch.setattr(device, "_info", lambda index: info)
        return info

    return fake


@pytest.fixture(scope="session")
def fp8_sm90() -> None:
    """Skip unless the CUDA FP8 GEMM runs here: NVRTC and cuda-core importable, an sm_90 GPU."""
    from humming.cuda_kernels import fp8_gemm, jit

    reason = jit.compiler_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    cc = torch.cuda.get_device_capability()
    if cc not in fp8_gemm.FP8_CCS:
        pytest.skip(f"the FP8 GEMM needs compute capability {fp8_gemm.FP8_CCS}, this GPU is {cc}")
