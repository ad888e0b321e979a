"""The one place that reads device properties: the dispatcher, every kernel's tuning and the tests ask here.

Read once per device index (``functools.cache``): a property query costs microseconds, a decode kernel a
few more, and the properties never change while the process runs. :data:`KNOWN_LIMITS` holds the limits of
the devices that code without such a device at hand is written against (the compile checks' representative
problems).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import torch

__all__ = [
    "CPU_LIMITS",
    "KNOWN_LIMITS",
    "DeviceInfo",
    "DeviceLimits",
    "device_index",
    "device_info",
    "device_limits",
    "resident_blocks",
]


class DeviceLimits(NamedTuple):
    """What tile heuristics read: multiprocessors and shared memory (bytes) per block (the opt-in maximum
    a kernel can ask for) and per multiprocessor. A tuple, so heuristics take it as positional arguments."""

    sm_count: int
    smem_per_block: int
    smem_per_sm: int


#: What tile heuristics read for a CPU device (the Triton interpreter): no shared-memory limit (0) and one
#: multiprocessor, which keeps split-K exercised on small shapes.
CPU_LIMITS = DeviceLimits(sm_count=1, smem_per_block=0, smem_per_sm=0)
#: Device name -> its limits as :func:`device_info` reads them, for code that works without the device at
#: hand (the compile checks' representative problems).
KNOWN_LIMITS = {"NVIDIA H200": DeviceLimits(sm_count=132, smem_per_block=232448, smem_per_sm=233472)}


@dataclass(frozen=True)
class DeviceInfo:
    """A CUDA device as the dispatcher sees it."""

    index: int
    name: str
    capability: tuple[int, int]
    limits: DeviceLimits
    l2_bytes: int

    @property
    def sm_count(self) -> int:
        return self.limits.sm_count

    @property
    def arch(self) -> int:
        """Compute capability x10 (90 for sm_90)."""
        return self.capability[0] * 10 + self.capability[1]


def device_index(device: torch.device | str | int | None = None) -> int:
    """The CUDA device index of ``device`` (``None`` or an index-less ``"cuda"``: the current device)."""
    if isinstance(device, bool) or not isinstance(device, (int, str, torch.device, type(None))):
        raise TypeError(f"device: expected a CUDA device (index, str or torch.device), got {device!r}")
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"device: expected a CUDA device index >= 0, got {device}")
        return device
    try:
        device = torch.device("cuda") if device is None else torch.device(device)
    except RuntimeError as err:  # torch's parser: "Invalid device string"
        raise ValueError(f"device: expected a CUDA device, got {device!r} ({err})") from None
    if device.type != "cuda":
        raise ValueError(f"device: expected a CUDA device, got {device}")
    return torch.cuda.current_device() if device.index is None else device.index


@functools.cache
def _info(index: int) -> DeviceInfo:
    props = torch.cuda.get_device_properties(index)
    return DeviceInfo(
        index=index,
        name=props.name,
        capability=(props.major, props.minor),
        limits=DeviceLimits(
            props.multi_processor_count, props.shared_memory_per_block_optin, props.shared_memory_per_multiprocessor
        ),
        l2_bytes=props.L2_cache_size,
    )


def device_info(device: torch.device | str | int | None = None) -> DeviceInfo:
    """Properties of a CUDA device (an index, a ``torch.device``, or ``None`` for the current one)."""
    return _info(device_index(device))


def device_limits(device: torch.device | str | int | None = None) -> DeviceLimits:
    """The limits tile heuristics read (:attr:`DeviceInfo.limits`) of a CUDA device, or :data:`CPU_LIMITS`
    for a CPU device (tensors the Triton interpreter runs)."""
    if isinstance(device, (str, torch.device)) and torch.device(device).type == "cpu":
        return CPU_LIMITS
    return device_info(device).limits


#: Shared memory the hardware reserves per resident block (sm_80 and later; sm_75 reserves none: one more
#: KiB per block only makes the count conservative there).
_SMEM_PER_BLOCK_RESERVED = 1024


def resident_blocks(device: torch.device | str | int | None, num_warps: int, regs_per_thread: int, smem: int) -> int:
    """How many blocks of one kernel (``num_warps`` warps, ``regs_per_thread`` registers, ``smem`` bytes of
    shared memory per block) one multiprocessor of CUDA ``device`` holds at once: the least that its
    registers (allocated per warp in units of 256), threads, shared memory and block slots allow, at least 1.
    What a persistent kernel sizes its grid by."""
    props = torch.cuda.get_device_properties(device_index(device))
    warp_regs = -(-regs_per_thread * 32 // 256) * 256
    counts = [16, props.max_threads_per_multi_processor // (32 * num_warps)]
    if warp_regs:
        counts.append(props.regs_per_multiprocessor // warp_regs // num_warps)
    if smem:
        counts.append(props.shared_memory_per_multiprocessor // (smem + _SMEM_PER_BLOCK_RESERVED))
    return max(1, min(counts))
