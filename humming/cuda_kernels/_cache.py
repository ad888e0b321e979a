"""On-disk cache of compiled cubins, shared by threads and processes.

An entry is one file ``<dir>/<name>-<arch>-<key>.cubin`` holding a small header, a SHA-256 of the
payload, the cubin and the compiler's log. Writers take an ``fcntl`` lock on ``<entry>.lock``, write a
temporary file in the same folder and ``os.replace`` it over the entry, so a reader sees either no
entry or a whole one; a reader that finds a truncated or corrupted entry (bad magic, wrong lengths,
checksum mismatch) treats it as missing and the entry is rebuilt.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import struct
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CacheEntry", "cache_dir", "get_or_build", "read_entry"]

_MAGIC = b"HMCUBIN1"
_HEADER = struct.Struct("<8sQQ32s")  # magic, cubin length, log length, sha256(cubin + log)


@dataclass(frozen=True)
class CacheEntry:
    """A compiled cubin, the compiler log, and where it came from (``"compiled"`` or ``"disk"``)."""

    cubin: bytes
    log: str
    origin: str


def cache_dir() -> Path:
    """``$HUMMING_CACHE_DIR/cuda``, default ``~/.cache/humming/cuda``."""
    root = os.environ.get("HUMMING_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "humming")
    return Path(root) / "cuda"


def _encode(cubin: bytes, log: str) -> bytes:
    log_bytes = log.encode()
    digest = hashlib.sha256(cubin + log_bytes).digest()
    return _HEADER.pack(_MAGIC, len(cubin), len(log_bytes), digest) + cubin + log_bytes


def read_entry(path: Path) -> CacheEntry | None:
    """The entry at ``path``, or ``None`` when it is missing, truncated or corrupted."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if len(data) < _HEADER.size:
        return None
    magic, n_cubin, n_log, digest = _HEADER.unpack_from(data)
    body = data[_HEADER.size :]
    if magic != _MAGIC or len(body) != n_cubin + n_log or hashlib.sha256(body).digest() != digest:
        return None
    return CacheEntry(body[:n_cubin], body[n_cubin:].decode(), "disk")


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def get_or_build(path: Path, build: Callable[[], tuple[bytes, str]]) -> CacheEntry:
    """The entry at ``path``; ``build()`` -> ``(cubin, log)`` makes it, once across processes."""
    entry = read_entry(path)
    if entry is not None:
        return entry
    path.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(path.with_name(path.name + ".lock")):
        entry = read_entry(path)  # another process may have built it while this one waited
        if entry is not None:
            return entry
        cubin, log = build()
        _write_atomic(path, _encode(cubin, log))
        return CacheEntry(cubin, log, "compiled")
