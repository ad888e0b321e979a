"""The zero-between-calls fp32 workspaces of the kernels that sum partial tiles with atomics (the decode
kernel's stream-K, the sm_90a GEMM's split-K, the Triton GEMMs' split-K): the last contributor to a tile reads
the sums back with an atomic exchange, which leaves zeros, so no call needs a memset."""

from __future__ import annotations

import threading

import torch

__all__ = ["WORKSPACES", "Workspaces"]


class Workspaces:
    """The workspaces: one zero-filled int32 buffer per (device, stream) holding ``M * N`` fp32
    sums then the arrival counters, plus per device one spare that a stream first seen during CUDA
    graph capture takes (without one, a capture takes a temporary zeroed by a captured memset on every
    replay). A buffer a graph captured is never freed."""

    def __init__(self) -> None:
        self.by_stream: dict[tuple[int, int], torch.Tensor] = {}
        self.spare: dict[int, torch.Tensor] = {}
        self.captured: list[torch.Tensor] = []
        self.lock = threading.Lock()

    def get(self, numel: int, device: int, stream: int) -> torch.Tensor:
        """The workspace of at least ``numel`` words for ``stream`` (a ``cudaStream_t``) on ``device``."""
        key = (device, stream)
        with self.lock:
            buf = self.by_stream.get(key)
            capturing = torch.cuda.is_current_stream_capturing()
            if buf is None or buf.numel() < numel:
                if capturing:
                    spare = self.spare.get(device)
                    if spare is None or spare.numel() < numel:
                        # A temporary from the graph's pool, zeroed by a memset node on every replay; not
                        # kept for eager calls, which would find it unzeroed before the first replay.
                        return torch.zeros(numel, dtype=torch.int32, device=f"cuda:{device}")
                    del self.spare[device]
                    new = spare
                else:
                    size = max(numel, 2 * buf.numel()) if buf is not None else numel
                    new = torch.zeros(size, dtype=torch.int32, device=f"cuda:{device}")
                # A replaced buffer stays alive in self.captured if a graph uses it; otherwise it is freed
                # to the caching allocator on the stream it was allocated and used on, so reuse is ordered.
                buf = self.by_stream[key] = new
            if capturing and not any(buf is t for t in self.captured):
                self.captured.append(buf)
            return buf

    def on(self, numel: int, device: torch.device) -> torch.Tensor:
        """:meth:`get` for the current stream of CUDA ``device``; on a CPU ``device`` (Triton's interpreter) one
        zero-filled buffer per device."""
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            return self.get(numel, index, torch._C._cuda_getCurrentRawStream(index))
        key = (device, None)
        buf = self.by_stream.get(key)
        if buf is None or buf.numel() < numel:
            buf = self.by_stream[key] = torch.zeros(numel, dtype=torch.int32, device=device)
        return buf

    def reserve(self, numel: int, device: int) -> None:
        stream = torch.cuda.current_stream(device)
        self.get(numel, device, stream.cuda_stream)
        with self.lock:
            spare = self.spare.get(device)
            if spare is None or spare.numel() < numel:
                self.spare[device] = torch.zeros(numel, dtype=torch.int32, device=f"cuda:{device}")
                stream.synchronize()  # zeroed before a capture on another stream uses it


#: The process's workspaces, shared by the decode kernel's stream-K, the sm_90a GEMM's and the Triton GEMMs' split-K.
WORKSPACES = Workspaces()
