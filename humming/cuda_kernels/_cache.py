"""On-disk cache of compiled cubins, shared by threads and processes.

An entry is one file ``<dir>/<name>-<arch>-<key>.cubin`` holding a small header (with the full cache key
the entry was built for and a SHA-256 of the payload), the cubin and the compiler's log. Writers take a
lock on ``<entry>.lock`` (``filelock``), write a temporary file in the same folder and ``os.replace`` it over
the entry, so a reader sees either no entry or a whole one; a reader that finds a truncated or corrupted
entry (bad magic, wrong lengths, checksum mismatch) or one built for another key (a file name collision,
a copied file) treats it as missing and the entry is rebuilt.

The lock is waited for at most ``HUMMING_CACHE_LOCK_TIMEOUT`` seconds (default 600): past that, a holder
that hangs is presumed dead and the entry is built without the lock (the atomic rename keeps that safe;
at worst two processes compile the same kernel). A cache folder that cannot be written (read-only file
system, no permission) is replaced, with one warning, by a private temporary folder for this process.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import struct
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import filelock
import platformdirs

from .._env import env

__all__ = ["CacheEntry", "cache_dir", "get_or_build", "read_entry"]

_MAGIC = b"HMCUBIN2"
_HEADER = struct.Struct("<8s32sQQ32s")  # magic, key (sha256), cubin length, log length, sha256(cubin + log)
_UNWRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


@dataclass(frozen=True)
class CacheEntry:
    """A compiled cubin, the compiler log, and where it came from (``"compiled"`` or ``"disk"``)."""

    cubin: bytes
    log: str
    origin: str


def cache_dir() -> Path:
    """``$HUMMING_CACHE_DIR/cuda``, default the user cache folder's ``humming/cuda`` (``platformdirs``:
    ``$XDG_CACHE_HOME/humming/cuda``, else ``~/.cache/humming/cuda`` on Linux)."""
    root = env("HUMMING_CACHE_DIR") or platformdirs.user_cache_dir("humming", appauthor=False)
    return Path(root) / "cuda"


def _encode(key: str, cubin: bytes, log: str) -> bytes:
    log_bytes = log.encode()
    digest = hashlib.sha256(cubin + log_bytes).digest()
    return _HEADER.pack(_MAGIC, bytes.fromhex(key), len(cubin), len(log_bytes), digest) + cubin + log_bytes


def read_entry(path: Path, key: str) -> CacheEntry | None:
    """The entry at ``path`` built for ``key`` (hex SHA-256), or ``None`` when it is missing, truncated,
    corrupted or was built for another key."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, PermissionError):
        return None
    if len(data) < _HEADER.size:
        return None
    magic, entry_key, n_cubin, n_log, digest = _HEADER.unpack_from(data)
    body = data[_HEADER.size :]
    if magic != _MAGIC or entry_key != bytes.fromhex(key) or len(body) != n_cubin + n_log:
        return None
    if hashlib.sha256(body).digest() != digest:
        return None
    return CacheEntry(body[:n_cubin], body[n_cubin:].decode(), "disk")


def lock_timeout_s() -> float:
    """Seconds to wait for another process's lock on an entry (``HUMMING_CACHE_LOCK_TIMEOUT``, finite)."""
    return env("HUMMING_CACHE_LOCK_TIMEOUT")


@contextlib.contextmanager
def _file_lock(path: Path, timeout_s: float) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` across processes; after ``timeout_s`` without it, warn and go on
    unlocked."""
    lock = filelock.FileLock(path)
    try:
        lock.acquire(timeout=timeout_s, poll_interval=0.05)
    except filelock.Timeout:
        warnings.warn(
            f"{path}: held by another process for more than {timeout_s:g} s (HUMMING_CACHE_LOCK_TIMEOUT); "
            "building without the lock",
            RuntimeWarning,
            stacklevel=4,
        )
        yield
        return
    try:
        yield
    finally:
        lock.release()


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


_fallback: Path | None = None


def _fallback_dir(unwritable: Path, err: OSError) -> Path:
    """This process's private cache folder, made (with one warning) the first time a folder is unwritable."""
    global _fallback
    if _fallback is None:
        _fallback = Path(tempfile.mkdtemp(prefix="humming-cuda-"))
        warnings.warn(
            f"humming CUDA cache: {unwritable} cannot be written ({err.strerror}); this process caches kernels "
            f"in {_fallback} instead (set HUMMING_CACHE_DIR to a writable folder to share them)",
            RuntimeWarning,
            stacklevel=4,
        )
    return _fallback


def get_or_build(path: Path, key: str, build: Callable[[], tuple[bytes, str]]) -> CacheEntry:
    """The entry at ``path`` for cache key ``key``; ``build()`` -> ``(cubin, log)`` makes it, once across
    processes. An unwritable folder falls back to a private temporary one."""
    entry = read_entry(path, key)
    if entry is not None:
        return entry
    try:
        return _build_locked(path, key, build)
    except OSError as err:
        if err.errno not in _UNWRITABLE:
            raise
        fallback = _fallback_dir(path.parent, err) / path.name
        return read_entry(fallback, key) or _build_locked(fallback, key, build)


def _build_locked(path: Path, key: str, build: Callable[[], tuple[bytes, str]]) -> CacheEntry:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError, FileNotFoundError) as err:  # a file on the way, no such root
        raise ValueError(
            f"HUMMING_CACHE_DIR: the CUDA kernel cache folder {path.parent} cannot be made ({err.strerror}); "
            "set HUMMING_CACHE_DIR to a folder that can"
        ) from None
    with _file_lock(path.with_name(path.name + ".lock"), lock_timeout_s()):
        entry = read_entry(path, key)  # another process may have built it while this one waited
        if entry is not None:
            return entry
        cubin, log = build()
        _write_atomic(path, _encode(key, cubin, log))
        return CacheEntry(cubin, log, "compiled")
