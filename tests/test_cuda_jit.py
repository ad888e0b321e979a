"""The CUDA JIT (NVRTC through cuda-core) and its caches. Compiles only: no GPU needed."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import shutil
import sys
import threading
import warnings
from pathlib import Path

import pytest

from humming.cuda_kernels import _cache, jit
from humming.cuda_kernels._warmup import warmup_specs

pytestmark = pytest.mark.skipif(
    jit.compiler_unavailable_reason() is not None, reason=f"{jit.compiler_unavailable_reason()}"
)

_HEADER = """#include "tiny/inner.cuh"
namespace tiny {
struct Params { float* out; int n; };
template <int kScale>
__device__ void run(const Params& p) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < p.n) p.out[i] = kScale * value();
}
}  // namespace tiny
"""
_INNER = "namespace tiny { __device__ inline float value() { return 2.0f; } }\n"


def _tiny_spec(root, scale: int = 3) -> jit.KernelSpec:
    return jit.KernelSpec(
        family="tiny",
        name=f"humming_test_tiny_s{scale}",
        header="tiny/kernel.cuh",
        entry=f"tiny::run<{scale}>",
        params="tiny::Params",
        threads=64,
        ccs=((8, 0), (9, 0)),
        include_root=root,
    )


@pytest.fixture
def include_root(tmp_path):
    root = tmp_path / "include"
    (root / "tiny").mkdir(parents=True)
    (root / "tiny" / "kernel.cuh").write_text(_HEADER)
    (root / "tiny" / "inner.cuh").write_text(_INNER)
    return root


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HUMMING_CACHE_DIR", str(tmp_path / "cache"))
    jit.clear_memory_cache()
    yield tmp_path / "cache" / "cuda"
    jit.clear_memory_cache()


def _entries(cache_dir):
    return sorted(cache_dir.glob("*.cubin"))


def test_compile_memory_then_disk(include_root, cache_dir):
    spec = _tiny_spec(include_root)
    first = jit.compile_kernel(spec, "sm_80")
    assert first.origin == "compiled" and first.cubin[:4] == b"\x7fELF"
    assert "0 bytes spill stores" in first.log
    assert jit.compile_kernel(spec, "sm_80").origin == "memory"
    jit.clear_memory_cache()
    again = jit.compile_kernel(spec, "sm_80")
    assert again.origin == "disk" and again.cubin == first.cubin and again.log == first.log
    assert len(_entries(cache_dir)) == 1


def test_key_covers_options_arch_and_template_args(include_root):
    spec = _tiny_spec(include_root)
    keys = {
        jit.cache_key(spec, "sm_80"),
        jit.cache_key(spec, "sm_90"),
        jit.cache_key(_tiny_spec(include_root, 5), "sm_80"),
    }
    assert len(keys) == 3


def test_unknown_arch_is_an_error(include_root):
    with pytest.raises(ValueError, match="not built for sm_75"):
        jit.compile_kernel(_tiny_spec(include_root), "sm_75")


def test_compile_error_carries_the_log(include_root):
    (include_root / "tiny" / "inner.cuh").write_text("namespace tiny { this is not C++ }\n")
    with pytest.raises(jit.NvrtcCompileError, match=r"tiny/inner\.cuh"):
        jit.compile_kernel(_tiny_spec(include_root), "sm_80")


def test_header_change_invalidates(include_root, cache_dir):
    spec = _tiny_spec(include_root)
    before = jit.compile_kernel(spec, "sm_80")
    (include_root / "tiny" / "inner.cuh").write_text(_INNER.replace("2.0f", "4.0f"))
    jit.clear_memory_cache()
    after = jit.compile_kernel(spec, "sm_80")
    assert after.origin == "compiled" and after.key != before.key
    assert len(_entries(cache_dir)) == 2


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty"])
def test_corrupted_entry_is_rebuilt(include_root, cache_dir, damage):
    spec = _tiny_spec(include_root)
    good = jit.compile_kernel(spec, "sm_80")
    (path,) = _entries(cache_dir)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":
        data[-40] ^= 0xFF
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    assert _cache.read_entry(path, good.key) is None
    jit.clear_memory_cache()
    rebuilt = jit.compile_kernel(spec, "sm_80")
    assert rebuilt.origin == "compiled" and rebuilt.cubin == good.cubin
    assert _cache.read_entry(path, good.key) is not None


def _compile_in_process(root, barrier, queue):
    barrier.wait()
    compiled = jit.compile_kernel(_tiny_spec(root), "sm_90")
    queue.put((compiled.origin, compiled.key))


def test_concurrent_processes_compile_once(include_root, cache_dir):
    ctx = multiprocessing.get_context("spawn")  # the environment (HUMMING_CACHE_DIR) is inherited
    workers = 4
    barrier, queue = ctx.Barrier(workers), ctx.Queue()
    procs = [ctx.Process(target=_compile_in_process, args=(include_root, barrier, queue)) for _ in range(workers)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    origins = sorted(origin for origin, _ in results)
    assert origins == ["compiled"] + ["disk"] * (workers - 1), origins
    assert len({key for _, key in results}) == 1
    assert len(_entries(cache_dir)) == 1
    assert not list(cache_dir.glob("*.tmp"))


def test_warmup_reports_cold_then_warm(include_root, capsys):
    jobs = [(_tiny_spec(include_root, s), arch) for s in (1, 2, 3) for arch in ("sm_80", "sm_90")]
    cold = warmup_specs(jobs, max_workers=2)
    assert sorted(k.origin for k in cold.kernels) == ["compiled"] * 6
    assert "6/6" in capsys.readouterr().err
    warm = warmup_specs(jobs + jobs, progress=False)  # duplicates are compiled once
    assert [k.origin for k in warm.kernels] == ["memory"] * 6
    assert warm.by_family()["tiny"]["memory_count"] == 6
    assert "tiny: memory 6" in warm.summary()


def test_unavailable_reason_names_the_missing_package(monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "cuda.core" else find_spec(name))
    reason = jit._probe_compiler.__wrapped__()
    assert reason is not None and "cuda-core is not installed" in reason and "ModuleNotFoundError" in reason


def test_probe_does_not_import_cuda_core():
    """A start whose kernels all come from the disk cache never imports cuda-core (a slow import)."""
    import subprocess

    probe = (
        "import sys; from humming.cuda_kernels import jit; "
        "assert jit.compiler_unavailable_reason() is None and jit._toolchain_id(); "
        "assert 'cuda.core' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", probe], check=True)


def test_entry_for_another_key_is_never_used(include_root, cache_dir):
    """An entry copied over another kernel's file name (as a hash-prefix collision would place it) is not
    run: the entry records the full key it was built for, and a mismatch rebuilds."""
    three, five = _tiny_spec(include_root, 3), _tiny_spec(include_root, 5)
    built_three = jit.compile_kernel(three, "sm_80")
    key_five = jit.cache_key(five, "sm_80")
    path_five = cache_dir / f"{five.name}-sm_80-{key_five[:40]}.cubin"
    shutil.copy(cache_dir / f"{three.name}-sm_80-{built_three.key[:40]}.cubin", path_five)
    built_five = jit.compile_kernel(five, "sm_80")
    assert built_five.origin == "compiled" and built_five.cubin != built_three.cubin
    assert _cache.read_entry(path_five, key_five).cubin == built_five.cubin


def _unwritable_folder(tmp_path) -> Path:
    """A folder this process cannot create files in: a read-only one, or (for root, whom permissions do not
    stop) one under /sys, where mkdir fails with EPERM."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    if os.access(folder, os.W_OK):
        folder = Path("/sys/humming-cache-test")
        if not Path("/sys").is_dir():
            pytest.skip("running as root without /sys: no folder here refuses writes")
    return folder


def test_read_only_cache_falls_back_to_a_private_folder(include_root, tmp_path, monkeypatch):
    monkeypatch.setenv("HUMMING_CACHE_DIR", str(_unwritable_folder(tmp_path)))
    monkeypatch.setattr(_cache, "_fallback", None, raising=False)  # a fresh process: no fallback folder yet
    with pytest.warns(RuntimeWarning, match="cannot be written") as caught:
        first = jit.compile_kernel(_tiny_spec(include_root, 3), "sm_80")
        jit.compile_kernel(_tiny_spec(include_root, 5), "sm_80")
    assert len(caught) == 1, [str(w.message) for w in caught]  # one warning per process
    assert first.origin == "compiled"
    jit.clear_memory_cache()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert jit.compile_kernel(_tiny_spec(include_root, 3), "sm_80").origin == "disk"  # the private folder


def test_lock_held_by_a_hung_process_times_out(include_root, cache_dir, monkeypatch):
    """A holder that never releases the entry's lock delays a compile by the timeout, not forever."""
    monkeypatch.setenv("HUMMING_CACHE_LOCK_TIMEOUT", "0.5")
    spec = _tiny_spec(include_root)
    path = cache_dir / f"{spec.name}-sm_80-{jit.cache_key(spec, 'sm_80')[:40]}.cubin"
    cache_dir.mkdir(parents=True)
    result = {}

    def compile_() -> None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result["origin"] = jit.compile_kernel(spec, "sm_80").origin
        result["warnings"] = [str(w.message) for w in caught]

    with open(path.with_name(path.name + ".lock"), "a+b") as holder:  # another open file: a separate lock
        fcntl.flock(holder, fcntl.LOCK_EX)
        worker = threading.Thread(target=compile_, daemon=True)
        worker.start()
        worker.join(timeout=60)
        hung = worker.is_alive()
        fcntl.flock(holder, fcntl.LOCK_UN)
    worker.join(timeout=60)
    assert not hung, "compile_kernel waited for the lock past the timeout"
    assert result["origin"] == "compiled"
    assert any("HUMMING_CACHE_LOCK_TIMEOUT" in m for m in result["warnings"]), result["warnings"]


def test_cache_folder_follows_xdg_cache_home(tmp_path, monkeypatch):
    monkeypatch.delenv("HUMMING_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _cache.cache_dir() == tmp_path / "xdg" / "humming" / "cuda"
    monkeypatch.setenv("HUMMING_CACHE_DIR", str(tmp_path / "mine"))
    assert _cache.cache_dir() == tmp_path / "mine" / "cuda"
