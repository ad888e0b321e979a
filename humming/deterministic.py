"""Batch invariance: with it on, each output row of ``humming.linear`` is bit-identical whatever M and
whatever batch the row came in.

The dispatcher then picks only kernels whose per-row result cannot depend on the batch: the Triton GEMMs
with one tile configuration for every M (no split-K, no atomics, no dequantize-then-cuBLAS path, whose
cuBLAS algorithm varies with M) and, where they cannot run, the reference. The reference (every CPU call)
then sums each dot product in one fixed pairwise order (``humming.reference.gemm.fixed_order_matmul``)
instead of a library matmul, whose blocking follows M. It costs speed (no CUDA decode
kernel, no stream-K at small M); bench/results/<gpu>/ records how much. Activation schemes with one dynamic
scale per tensor (``fp8_tensor``, ``int8_tensor``, ``nvfp4``'s global scale) are batch-dependent by
definition, deterministic or not.
"""

from __future__ import annotations

from ._env import env

__all__ = ["is_deterministic", "set_deterministic"]

_override: bool | None = None


def set_deterministic(enabled: bool | None) -> None:
    """Turn batch invariance on or off for this process; ``None`` defers to ``HUMMING_DETERMINISTIC``."""
    global _override
    if enabled is not None and not isinstance(enabled, bool):
        raise TypeError(f"enabled: expected True, False or None, got {enabled!r}")
    _override = enabled


def is_deterministic() -> bool:
    """Whether batch invariance is on (``set_deterministic``, else ``HUMMING_DETERMINISTIC=1``)."""
    if _override is not None:
        return _override
    return env("HUMMING_DETERMINISTIC")
