"""The host side of an eager call (humming.linear's cost on the CPU, issue #13): what is made once per weight
and call shape and then only read: environment reads, Triton's compiled kernels kept per launch key, TMA
descriptor encoders, the CUDA launchers; the CPU harness of bench/tools/host_overhead.py; and on the GPU,
repeated calls with fresh activations on every route, then a CUDA graph captured after them."""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import pytest
import torch
from triton.compiler import CompiledKernel

import humming
from humming._env import env
from humming.ir.activation import get_act_scheme
from humming.triton_kernels._launch import CompiledLaunches, LaunchesByWeight, PreparedLaunch

ROOT = Path(__file__).resolve().parents[1]


def test_env_sees_changes_at_once(monkeypatch):
    monkeypatch.delenv("HUMMING_BACKEND", raising=False)
    assert env("HUMMING_BACKEND") == "auto"
    monkeypatch.setenv("HUMMING_BACKEND", "triton")
    assert env("HUMMING_BACKEND") == "triton"
    monkeypatch.setenv("HUMMING_BACKEND", "reference")
    assert env("HUMMING_BACKEND") == "reference"
    monkeypatch.setenv("HUMMING_BACKEND", "")
    assert env("HUMMING_BACKEND") == "auto"


class _Compiled(CompiledKernel):
    """A compiled kernel whose launches are recorded."""

    def __init__(self) -> None:
        self.module, self.launches = None, []

    def __getitem__(self, grid):
        return lambda *args, stream: self.launches.append((grid, args, stream))


class _JitFunction:
    """A JIT function: ``fn[grid](*args, num_warps=...)`` "compiles" one kernel per call and launches it."""

    def __init__(self) -> None:
        self.runs = []

    def __getitem__(self, grid):
        def run(*args, num_warps, **options):
            self.runs.append((grid, args, num_warps, options))
            return _Compiled()

        return run


def test_compiled_launches_go_to_the_kept_kernel(monkeypatch):
    """The first launch of a key goes through the JIT function; later ones to the kernel it returned, on the
    device's current stream; another key is another first launch."""
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1000 + device, raising=False)
    fn = _JitFunction()
    launches = CompiledLaunches(fn)
    launches.launch(("a",), (1, 2, 1), ("x", 1), 4, 0)
    launches.launch(("a",), (3, 1, 1), ("y", 2), 4, 0)
    launches.launch(("b",), (1, 1, 1), ("z", 3), 8, 1)
    launches.launch(("b",), (1, 1, 1), ("w", 4), 8, 1)
    launches.launch(("c",), (1, 1, 1), ("v", 5), 4, 0, num_stages=3)
    assert [run[1] for run in fn.runs] == [("x", 1), ("z", 3), ("v", 5)]
    # launch options reach the JIT function, with floating-point contraction asked for (the module docstring)
    assert fn.runs[-1][2:] == (4, {"enable_fp_fusion": True, "num_stages": 3})
    kept = {key[0]: kernel for key, kernel in launches.compiled.items()}
    assert kept[("a",)].launches == [((3, 1, 1), ("y", 2), 1000)]
    assert kept[("b",)].launches == [((1, 1, 1), ("w", 4), 1001)]


def test_compiled_launches_key_on_constexprs_and_warps(monkeypatch):
    """Calls whose caller key is the same but whose constexpr arguments (a tile size) or warps differ are
    other kernels: each compiles on its first launch; the non-constexpr arguments do not split the key."""
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1000 + device, raising=False)
    fn = _JitFunction()
    fn.params = [types.SimpleNamespace(num=i, is_constexpr=i == 1) for i in range(3)]  # (x, BLOCK: constexpr, n)
    launches = CompiledLaunches(fn)
    for args, warps in [(("x", 512, 7), 4), (("y", 512, 9), 4), (("z", 2048, 7), 4), (("w", 2048, 7), 8)]:
        launches.launch(("k",), (1, 1, 1), args, warps, 0)
    assert [run[1] for run in fn.runs] == [("x", 512, 7), ("z", 2048, 7), ("w", 2048, 7)]
    assert [kernel.launches for kernel in launches.compiled.values()] == [[((1, 1, 1), ("y", 512, 9), 1000)], [], []]
    assert launches.kept(("k",), ("v", 512, 1), 4) and not launches.kept(("k",), ("v", 1024, 1), 4)


def test_compiled_launches_keep_nothing_under_the_interpreter():
    """An interpreted function returns no compiled kernel: every launch goes through it."""

    class Interpreted:
        calls = 0

        def __getitem__(self, grid):
            def run(*args, num_warps, enable_fp_fusion):
                Interpreted.calls += 1

            return run

    launches = CompiledLaunches(Interpreted())
    for _ in range(3):
        launches.launch(("a",), (1, 1, 1), (), 4, 0)
    assert Interpreted.calls == 3 and not launches.compiled


def test_prepared_launch_keys_on_each_tensors_dtype_and_alignment(monkeypatch):
    """A prepared launch fills in its per-call tensors among the kept arguments, in the kernel's order; a tensor
    of another dtype or 16-byte alignment is another compiled kernel, the same ones launch the kept one."""
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1000 + device, raising=False)
    fn = _JitFunction()
    fn.arg_names, fn.__name__ = ["a_ptr", "N", "out_ptr", "BLOCK"], "kernel"
    with pytest.raises(ValueError, match=r"no value for \['BLOCK'\]"):
        PreparedLaunch(fn, (2,), {"N": 7}, ("a_ptr", "out_ptr"), 4)
    launch = PreparedLaunch(fn, (2,), {"N": 7, "BLOCK": 64}, ("a_ptr", "out_ptr"), 4, num_stages=2)
    a, out = torch.zeros(8), torch.zeros(8)
    launch(0, a, out)
    launch(0, torch.zeros(8), torch.zeros(8))  # fresh tensors, same dtypes and alignment
    launch(0, a, out.double())
    launch(0, a[1:], out)
    assert [(run[0], run[1][1:2], run[1][3], run[3]) for run in fn.runs] == [
        ((2, 1, 1), (7,), 64, {"enable_fp_fusion": True, "num_stages": 2})
    ] * 3
    assert fn.runs[0][1][0] is a and fn.runs[0][1][2] is out
    assert len(launch.launches.compiled) == 3
    (kept,) = [k for key, k in launch.launches.compiled.items() if key[0][1:] == (torch.float32, 0, torch.float32, 0)]
    assert len(kept.launches) == 1 and kept.launches[0][2] == 1000


def test_prepared_launch_writes_only_addresses_once_its_kernel_has_a_direct_launch(monkeypatch):
    """The first call of a prepared launch compiles; the direct launch of its kernel then gets the template's
    parameters once, and each later call writes only the per-call tensors' addresses before launching."""
    from humming.triton_kernels import _launch

    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1000 + device, raising=False)
    events = []

    class Direct:
        lock = contextlib.nullcontext()

        def __init__(self) -> None:
            self.values = types.SimpleNamespace()

        def set(self, args):
            events.append(("set", args[1], args[3]))

        def field(self, i):
            return f"p{i}"

        def __call__(self, grid, stream):
            events.append(("launch", grid, stream))

    monkeypatch.setattr(_launch.DirectLaunch, "of", classmethod(lambda cls, kernel: Direct()))
    fn = _JitFunction()
    fn.arg_names, fn.__name__ = ["a_ptr", "N", "out_ptr", "BLOCK"], "kernel"
    fn.params = [types.SimpleNamespace(num=i, is_constexpr=i == 3) for i in range(4)]
    launch = PreparedLaunch(fn, (2,), {"N": 7, "BLOCK": 64}, ("a_ptr", "out_ptr"), 4)
    a, out = torch.zeros(8), torch.zeros(8)
    for _ in range(3):
        launch(0, a, out)
    assert len(fn.runs) == 1
    assert events == [("set", 7, 64), ("launch", (2, 1, 1), 1000), ("launch", (2, 1, 1), 1000)]
    ((direct, fields),) = launch.direct.values()
    assert fields == ("p0", "p2") and (direct.values.p0, direct.values.p2) == (a.data_ptr(), out.data_ptr())


_DIRECT_CHECK = """
import json, re, sys, triton
from triton.backends.compiler import GPUTarget
from humming.triton_kernels import registry
from humming.triton_kernels._launch import DirectLaunch
rows = {}
for spec in registry.compile_specs():
    if spec.name not in sys.argv[1:]:
        continue
    src = triton.compiler.ASTSource(spec.kernel, spec.signature(), spec.constexprs, spec.attrs())
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=spec.options())
    kernel.function = 0  # as if loaded
    launch = DirectLaunch.of(kernel)
    entry = re.search(r"\\.entry\\s+\\w+\\s*\\(([^)]*)\\)", kernel.asm["ptx"]).group(1)
    fields = None if launch is None else [name for name, _ in type(launch.values)._fields_]
    rows[spec.name] = {"signature": list(spec.signature().values()), "fields": fields, "ptx": entry.count(".param")}
print(json.dumps(rows))
"""


def test_direct_launch_packs_the_non_constexpr_arguments_in_order():
    """Kernels compiled for sm_90 by this Triton (no GPU; in a subprocess, outside the interpreter): the direct
    launch has a field per non-constexpr argument in the kernel's order, then Triton's scratch pointers, as
    many as the PTX entry's parameters (the ABI of Triton's launcher, which a Triton release could change)."""
    pytest.importorskip("cuda.bindings.driver")
    names = ["act_quant-absmax-bf16", "scaled_mm-int8-channel-int8-int8-fp16-m16n64k128s4g8w4st4"]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", _DIRECT_CHECK, *names], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads(run.stdout)
    assert sorted(rows) == sorted(names)
    for name, row in rows.items():
        plain = [f"p{i}" for i, ty in enumerate(row["signature"]) if ty != "constexpr"]
        assert row["fields"] is not None, name
        assert row["fields"][: len(plain)] == plain and len(row["fields"]) == row["ptx"], (name, row)
        assert all(field.startswith("s") for field in row["fields"][len(plain) :]), (name, row)


def _kernel_like(signature: dict, ptx_params: list[str], **meta):
    """What :meth:`DirectLaunch.of` reads of a compiled kernel: its source's signature and argument names, its
    metadata, its PTX entry, its function handle."""
    fn = types.SimpleNamespace(arg_names=list(signature))
    metadata = {"num_warps": 4, "shared": 0, "num_ctas": 1, "global_scratch_size": 0, "profile_scratch_size": 0}
    ptx = ".visible .entry k(" + ", ".join(f".param .{ty} p{i}" for i, ty in enumerate(ptx_params)) + ")"
    return types.SimpleNamespace(
        src=types.SimpleNamespace(signature=signature, fn=fn),
        metadata=types.SimpleNamespace(**{**metadata, **meta}),
        asm={"ptx": ptx},
        function=0,
    )


def test_direct_launch_leaves_what_it_cannot_launch_to_triton(monkeypatch):
    """No direct launch where Triton's launcher does more than pass the parameters: scratch memory, clusters,
    programmatic dependent launch, a PTX entry whose parameters differ from the signature's, an argument type it
    does not pack, a kernel not loaded; and no launch while a launch hook (a profiler) is installed. ``set``
    writes the arguments."""
    pytest.importorskip("cuda.bindings.driver")
    from triton import knobs

    from humming.triton_kernels import _launch
    from humming.triton_kernels._launch import DirectLaunch

    signature = {"x_ptr": "*bf16", "M": "i32", "scale": "fp32", "BLOCK": "constexpr", "out_ptr": "*fp32"}
    ptx = ["u64 .ptr .global .align 16", "u32", "f32", "u64 .ptr .global .align 16", "u64", "u64"]
    launch = DirectLaunch.of(_kernel_like(signature, ptx))
    assert [name for name, _ in type(launch.values)._fields_] == ["p0", "p1", "p2", "p4", "s0", "s1"]
    x, out = torch.empty(4), torch.empty(4)
    launch.set([x, 7, 0.5, 64, out])
    values = launch.values
    assert (values.p0, values.p1, values.p2, values.p4) == (x.data_ptr(), 7, 0.5, out.data_ptr())
    with pytest.raises(ValueError, match="argument 1: 2147483648 does not fit"):  # an i64 to Triton: another kernel
        launch.set([x, 2**31, 0.5, 64, out])
    for meta in [{"global_scratch_size": 64}, {"profile_scratch_size": 64}, {"num_ctas": 2}, {"launch_pdl": True}]:
        assert DirectLaunch.of(_kernel_like(signature, ptx, **meta)) is None, meta
    assert DirectLaunch.of(_kernel_like(signature, [*ptx, "u64"])) is None  # a parameter it cannot account for
    assert DirectLaunch.of(_kernel_like(signature, ["u64", "u64", *ptx[2:]])) is None  # i32 declared 64-bit
    assert DirectLaunch.of(_kernel_like({**signature, "h": "fp16"}, [*ptx[:4], "u16", "u64", "u64"])) is None
    kernel = _kernel_like(signature, ptx)
    kernel.function = None
    assert DirectLaunch.of(kernel) is None
    assert not _launch.launch_hook_set()
    hook = knobs.runtime.launch_enter_hook
    if hasattr(hook, "calls"):  # a chain of hooks (later Tritons)
        monkeypatch.setattr(hook, "calls", [lambda *args: None])
    else:
        monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda *args: None)
    assert _launch.launch_hook_set()  # every launch goes through Triton's launcher meanwhile


def test_launches_go_through_triton_while_a_launch_hook_is_installed(monkeypatch):
    """With a launch hook installed (a profiler), a kept kernel with a direct launch is launched by Triton, which
    calls the hook; without, directly."""
    from triton import knobs

    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1000 + device, raising=False)
    direct = []

    class Direct:
        lock = contextlib.nullcontext()

        def set(self, args):
            direct.append(("set", args))

        def __call__(self, grid, stream):
            direct.append(("launch", grid, stream))

    fn = _JitFunction()
    launches = CompiledLaunches(fn)
    launches.launch(("a",), (1, 1, 1), ("x", 1), 4, 0)
    (key,) = launches.direct  # the caller's key, the warps, the constexprs
    launches.direct[key] = Direct()
    launches.launch(("a",), (2, 1, 1), ("y", 2), 4, 0)
    assert direct == [("set", ("y", 2)), ("launch", (2, 1, 1), 1000)] and not launches.compiled[key].launches
    hook = knobs.runtime.launch_enter_hook
    if hasattr(hook, "calls"):
        monkeypatch.setattr(hook, "calls", [lambda *args: None])
    else:
        monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda *args: None)
    launches.launch(("a",), (3, 1, 1), ("z", 3), 4, 0)
    assert len(direct) == 2 and launches.compiled[key].launches == [((3, 1, 1), ("z", 3), 1000)]


def test_launches_by_weight_make_each_once_and_start_over_past_keep():
    """One launch made per weight and key; another weight or key is another; past ``keep`` per weight they
    start over (made again), and a weight's entries go with it."""

    class Weight:
        pass

    made = []
    cache = LaunchesByWeight(keep=2)
    make = lambda name: lambda: made.append(name) or name
    a, b = Weight(), Weight()
    assert [cache.get(a, 1, make("a1")), cache.get(a, 1, make("again")), cache.get(b, 1, make("b1"))] == ["a1"] * 2 + [
        "b1"
    ]
    cache.get(a, 2, make("a2"))
    cache.get(a, 3, make("a3"))  # a third key for a: a's first two are dropped
    assert cache.get(a, 1, make("a1 again")) == "a1 again" and made == ["a1", "b1", "a2", "a3", "a1 again"]
    del b
    gc.collect()
    assert list(cache.kinds.keys()) == [a]


def _int8_linear_reference(x, qw):
    """float64 ``dequantize_activation(quantize_activation(x, "int8")) @ dequantize(qw)^T``."""
    a = humming.dequantize_activation(humming.quantize_activation(x, "int8")).double()
    return a @ humming.dequantize(qw).double().T


def test_scaled_mm_launches_made_ready_once_per_kind_of_call(seed, monkeypatch):
    """The Triton scaled GEMM keeps what a kind of call launches per weight object: a repeat with fresh
    activations finds its entry (and gives what a launch made ready anew gives, bit for bit); another M, output
    dtype, bias, codes row stride or weight object makes a new one; an entry goes with its weight. Within an
    entry, a pointer of another 16-byte alignment is another compiled kernel's launch key."""
    from humming.triton_kernels import _scaled_mm_launch as launch_module
    from humming.triton_kernels import scaled_mm

    keys = []
    launch = CompiledLaunches.launch
    monkeypatch.setattr(
        CompiledLaunches, "launch", lambda self, key, *a, **o: keys.append(key) or launch(self, key, *a, **o)
    )
    qw = humming.quantize(torch.randn(64, 128), "int8", -1, scale_dtype=torch.float32)
    kinds = lambda: launch_module._ready.kinds.get(qw, {})
    call = lambda x, bias=None, out_dtype=torch.float16: scaled_mm.linear(x, qw, bias, "int8", out_dtype)
    x = torch.randn(3, 128, dtype=torch.float16)
    first = call(x)
    (ready,) = kinds().values()
    x = torch.randn(3, 128, dtype=torch.float16)
    again = call(x)
    assert list(kinds().values()) == [ready]
    torch.testing.assert_close(again.double(), _int8_linear_reference(x, qw), rtol=2e-3, atol=2e-3)
    assert not torch.equal(first, again)  # fresh activations, not a kept output
    launch_module._ready.kinds.pop(qw)
    assert torch.equal(call(x), again)  # made ready anew: the same bits

    call(torch.randn(5, 128, dtype=torch.float16))
    call(x, out_dtype=torch.float32)
    bias = torch.randn(64, dtype=torch.float16)
    keys.clear()
    with_bias = call(x, bias=bias)
    assert torch.equal(call(x, bias=bias.float()), with_bias)  # bias added in fp32 either way
    assert keys[1][7] == torch.float16 and keys[3][7] == torch.float32  # the GEMM's bias pointer: its dtype
    qa = humming.quantize_activation(x, "int8")
    wide = torch.zeros(3, 256, dtype=torch.uint8)
    wide[:, :128] = qa.codes
    strided = humming.QuantizedActivation(qa.scheme, wide[:, :128], qa.scales)
    out = scaled_mm.linear(strided, qw, None, None, torch.float16)
    assert torch.equal(out, again)
    assert len(kinds()) == 5

    keys.clear()
    scaled_mm.linear(qa, qw, None, None, torch.float16)
    shifted = torch.zeros(3 * 128 + 1, dtype=torch.uint8)[1:].view(3, 128)
    shifted.copy_(qa.codes)
    assert torch.equal(
        scaled_mm.linear(humming.QuantizedActivation(qa.scheme, shifted, qa.scales), qw, None, None, torch.float16),
        again,
    )
    assert len(kinds()) == 5 and keys[0][2] == 0 and keys[1][2] == 1  # same entry, the codes' alignment in the key

    held = len(launch_module._ready.kinds)
    other = humming.quantize(torch.randn(64, 128), "int8", -1, scale_dtype=torch.float32)
    scaled_mm.linear(x, other, None, "int8", torch.float16)
    assert len(launch_module._ready.kinds) == held + 1
    del other
    gc.collect()
    assert len(launch_module._ready.kinds) == held


@pytest.mark.parametrize("m", [1, 24])
def test_wna16_launches_made_ready_once_per_kind_of_call(m, seed):
    """The Triton WnA16 kernels (GEMV for M = 1, tiled for 24) keep their launches per weight object and kind of
    call: fresh activations reuse the entry and give what a launch made ready anew gives; another M or a bias
    is a new entry."""
    from humming.triton_kernels import _wna16_launch as launch_module
    from humming.triton_kernels import wna16

    qw = humming.quantize(torch.randn(64, 256), "int4", 128, scale_dtype=torch.float16)
    call = lambda x, bias=None: wna16.linear(x, qw, bias)
    kinds = lambda: launch_module._ready.kinds.get(qw, {})
    call(torch.randn(m, 256, dtype=torch.float16))
    (ready,) = kinds().values()
    x = torch.randn(m, 256, dtype=torch.float16)
    again = call(x)
    assert list(kinds().values()) == [ready]
    reference = x.double() @ humming.dequantize(qw).double().T
    torch.testing.assert_close(again.double(), reference, rtol=2e-3, atol=2e-2)
    launch_module._ready.kinds.pop(qw)
    assert torch.equal(call(x), again)
    call(torch.randn(m + 1, 256, dtype=torch.float16))
    call(x, bias=torch.randn(64, dtype=torch.float16))
    assert len(kinds()) == 3


def test_triton_launchers_make_a_kind_of_call_ready_once(seed, monkeypatch):
    """humming.linear's prepared calls hold the Triton kernels' launches (WnA16, and the scaled GEMM with its
    quantization pass): a repeat with fresh activations makes nothing new and gives the bits of the kernels'
    own entry points; another M is another kind of call."""
    from humming.triton_kernels import _scaled_mm_launch, _wna16_launch, scaled_mm, wna16

    made = []
    for module in (_wna16_launch, _scaled_mm_launch):
        ready = module._Ready
        monkeypatch.setattr(module, "_Ready", lambda *a, ready=ready: made.append(ready) or ready(*a))
    int4 = humming.quantize(torch.randn(64, 256), "int4", 128, scale_dtype=torch.float16)
    int8 = humming.quantize(torch.randn(64, 256), "int8", -1, scale_dtype=torch.float32)
    for qw, act, direct in (
        (int4, None, lambda x: wna16.linear(x, int4)),
        (int8, "int8", lambda x: scaled_mm.linear(x, int8, None, "int8", torch.float16)),
    ):
        for m in (1, 24):
            count = len(made)
            humming.linear(torch.randn(m, 256, dtype=torch.float16), qw, act=act, backend="triton")
            assert len(made) == count + 1
            count += 1
            x = torch.randn(m, 256, dtype=torch.float16)
            out = humming.linear(x, qw, act=act, backend="triton")
            assert len(made) == count, "a repeat made its launch ready again"
            assert torch.equal(out, direct(x))


def test_tensor_map_encoder_keeps_recent_descriptors(monkeypatch):
    """One encoder per geometry; the driver is asked once per address (what it is asked: the old
    tensor_map_2d's dims, strides and box), later calls of that address read the kept descriptor."""
    driver = pytest.importorskip("cuda.bindings.driver")
    from humming.cuda_kernels import _driver

    asked = []

    def encode(dtype, rank, address, dims, strides, box, elem, *rest):
        asked.append((address, [int(d) for d in dims], [int(s) for s in strides], [int(b) for b in box]))
        tmap = driver.CUtensorMap()
        tmap.opaque = [address] + [0] * 15
        return driver.CUresult.CUDA_SUCCESS, tmap

    monkeypatch.setattr(driver, "cuTensorMapEncodeTiled", encode)
    _driver.tensor_map.cache_clear()
    encoder = _driver.tensor_map(torch.bfloat16, 40, 4096, 4104, 64, 128)
    assert _driver.tensor_map(torch.bfloat16, 40, 4096, 4104, 64, 128) is encoder
    first = encoder.encode(1 << 20)
    assert encoder.encode(1 << 20) == first and int.from_bytes(first[:8], "little") == 1 << 20
    encoder.encode(2 << 20)
    assert asked == [(1 << 20, [4096, 40], [8208], [64, 128]), (2 << 20, [4096, 40], [8208], [64, 128])]
    with pytest.raises(ValueError, match="box_inner"):
        _driver.tensor_map(torch.uint8, 40, 4096, 4096, 64, 128)
    _driver.tensor_map.cache_clear()


def test_host_overhead_harness_runs():
    """bench/tools/host_overhead.py at a small shape: a row per combination, M and backend, each with its
    kernel and its launches (one CUDA / Triton launch, two with an activation pass). A CUDA kernel behind the
    CUDA activation pass allocates twice: the pass's one buffer (codes or values, and scales) and the output."""
    pytest.importorskip("cuda.bindings.driver")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench/tools/host_overhead.py"), "--n", "256", "--k", "512", "--iters", "2"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [line.split() for line in run.stdout.splitlines() if line[:1].isalpha() and line.split()[-1].isdigit()]
    kinds = {"W4A16", "W8A16", "MXFP4", "W8A8", "W4A8", "NVFP4"}
    assert len(rows) >= 18 and {row[0] for row in rows} == kinds, run.stdout
    for row in rows:
        activation_passes = 0 if "bf16" in row or row[0] in ("W4A16", "W8A16") else 2 if "nvfp4" in row else 1
        assert int(row[-2]) == 1 + activation_passes, row  # nvfp4: the global scale's absmax pass first
    fp8_on_cuda = [row for row in rows if "fp8" in row and row[-3].startswith("cuda.") and row[0] in ("W4A8", "MXFP4")]
    assert {row[-3] for row in fp8_on_cuda} == {"cuda.wna16_decode", "cuda.fp8_gemm"}, run.stdout
    assert all(row[-1] == "2" for row in fp8_on_cuda), run.stdout


def test_host_overhead_harness_runs_fused_moe():
    """bench/tools/host_overhead.py --moe at a small shape, the faked H200 running fused_moe's prepared call on
    the CUDA path, repeated calls included. At 16 tokens four launches (the alignment, w13 with its gated
    activation, w2, the combine) and four aten ops (the alignment's buffer, both GEMMs' outputs, the result); at
    one token the slot route leaves the alignment and its buffer out: three of each."""
    pytest.importorskip("cuda.bindings.driver")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = str(ROOT / "bench/tools/host_overhead.py")
    command = [sys.executable, script, "--moe", "--iters", "2", "--experts", "8", "--topk", "2", "--moe-inter", "128"]
    run = subprocess.run([*command, "--moe-k", "256"], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [line.split() for line in run.stdout.splitlines() if line.split()[:1] in (["1"], ["16"])]
    assert [(row[0], row[2], row[3]) for row in rows] == [("1", "3", "3"), ("16", "4", "4")], run.stdout


WEIGHTS = {
    "int4-g128": dict(weight="int4", group_size=128),
    "mxfp4": dict(weight="mxfp4"),
    "e4m3-channel": dict(weight="e4m3", group_size=-1),
    "e4m3-block": dict(weight="e4m3", group_size=(128, 128)),
}
ROUTES = [
    ("int4-g128", None, "cuda"),
    ("mxfp4", None, "cuda"),
    ("int4-g128", "fp8", "cuda"),
    ("int4-g128", "fp8_tensor", "cuda"),
    ("mxfp4", "fp8", "cuda"),
    ("e4m3-channel", "fp8", "cuda"),
    ("e4m3-channel", "fp8_tensor", "cuda"),
    ("e4m3-block", "fp8_g128", "cuda"),
    ("e4m3-channel", "fp8", "auto"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("weight,act,backend", ROUTES, ids=lambda v: str(v))
@pytest.mark.parametrize("m", [1, 5, 16, 40])
def test_repeated_calls_then_a_captured_graph(weight, act, backend, m, seed):
    """Each route's launcher (made on the first call, then only read) on fresh activations, biases and
    output dtypes call after call, against the reference; then a CUDA graph captured after those eager calls
    replays on new inputs (the launchers, the kept Triton kernels and TMA descriptors hold no call's tensor)."""
    n, k = 512, 1024
    qw = humming.quantize(torch.randn(n, k, device="cuda") * 0.05, **WEIGHTS[weight])
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    for b, out_dtype in [(None, None), (bias, None), (None, torch.float32), (bias, None), (None, None)]:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        out = humming.linear(x, qw, b, act=act, out_dtype=out_dtype, backend=backend)
        ref = humming.linear(x, qw, b, act=act, out_dtype=out_dtype, backend="reference")
        assert out.dtype == ref.dtype
        assert (out.float() - ref.float()).norm() <= 1e-2 * ref.float().norm(), (weight, act, m, seed)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    humming.linear(x, qw, bias, act=act, backend=backend)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = humming.linear(x, qw, bias, act=act, backend=backend)
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = humming.linear(x, qw, bias, act=act, backend="reference")
        assert (out.float() - ref.float()).norm() <= 1e-2 * ref.float().norm(), (weight, act, m, seed)


def test_prepared_calls_hit_miss_and_go_with_their_weight(seed, monkeypatch):
    """humming.linear and the custom op find a kind of call's prepared call in one lookup: a repeat with fresh
    activations is a hit (no new plan, the same bits as the unprepared path); another M, dtype, bias dtype,
    act, out_dtype or HUMMING_BACKEND is a miss; the entries go with their weight."""
    from humming import ops

    linear_module = sys.modules["humming.linear"]

    made = []
    make = linear_module._make_call
    monkeypatch.setattr(linear_module, "_make_call", lambda *a: made.append(a[0].shape) or make(*a))
    qw = humming.quantize(torch.randn(32, 64), "int4", 32)
    bias = torch.randn(32)
    x = torch.randn(3, 64)
    out = humming.linear(x, qw, bias)
    x = torch.randn(3, 64)
    again = humming.linear(x, qw, bias)
    op = torch.ops.humming.linear(x, None, None, *ops.weight_args(qw), bias, None, torch.float32, "auto")
    assert len(made) == 1 and not torch.equal(out, again)
    unprepared = linear_module.run_linear(x, qw, bias, None, torch.float32, "auto")
    assert torch.equal(again, unprepared) and torch.equal(op, unprepared)
    humming.linear(torch.randn(2, 5, 64), qw, bias)  # another shape (rank 3)
    humming.linear(x.bfloat16(), qw, bias)
    humming.linear(x, qw, bias.bfloat16())
    humming.linear(x, qw, bias, act="fp8")
    humming.linear(x, qw, bias, out_dtype=torch.bfloat16)
    monkeypatch.setenv("HUMMING_BACKEND", "reference")
    humming.linear(x, qw, bias)
    monkeypatch.delenv("HUMMING_BACKEND")
    assert len(made) == 7 and len(linear_module._calls[qw]) == 7
    assert humming.linear(torch.randn(2, 5, 64), qw, bias).shape == (2, 5, 32) and len(made) == 7
    with pytest.raises(ValueError, match="bias: expected a float tensor of shape"):
        humming.linear(x, qw, torch.randn(31))
    assert len(linear_module._calls[qw]) == 7  # a refused call is not kept
    held = len(linear_module._calls)
    del qw
    gc.collect()
    assert len(linear_module._calls) == held - 1


def test_triton_split_k_workspace_is_zero_between_calls(seed, monkeypatch):
    """Split along K, the Triton GEMMs sum in the shared workspace and the last program of each tile writes
    the output with the bias and leaves the workspace zero: no per-call memset (no ``zeros``) and no finishing
    pass; the result within the fp32 tolerance of the reference."""
    from humming.triton_kernels import wna16
    from humming.triton_kernels.configs import TileConfig
    from humming.workspaces import WORKSPACES

    qw = humming.quantize(torch.randn(64, 256), "int4", 128, scale_dtype=torch.float16)
    x = torch.randn(20, 256, dtype=torch.float16)
    bias = torch.randn(64, dtype=torch.float16)
    cfg = TileConfig(16, 32, 32, split_k=4, num_stages=1)
    wna16.linear(x, qw, bias, config=cfg)  # the first call makes the launch and the workspace
    workspace = WORKSPACES.by_stream[(x.device, None)]
    workspace.fill_(0)  # other tests' calls may have grown it: the next one must not
    zeros = torch.zeros
    monkeypatch.setattr(torch, "zeros", lambda *a, **k: pytest.fail("a per-call zeros") or zeros(*a, **k))
    out = wna16.linear(x, qw, bias, config=cfg, out=torch.full((20, 64), float("nan"), dtype=torch.float16))
    monkeypatch.setattr(torch, "zeros", zeros)
    reference = x.double() @ humming.dequantize(qw).double().T + bias.double()
    torch.testing.assert_close(out.double(), reference, rtol=2e-3, atol=2e-2)
    assert WORKSPACES.by_stream[(x.device, None)] is workspace and not workspace.any()  # sums and counts zero
    assert torch.equal(wna16.linear(x, qw, bias, config=cfg), out)


def _host_h200(*args: str) -> list[dict]:
    """The rows bench/tools/host_h200.py writes with ``--dry-run --m 1`` and ``args``."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "host.json"
        script = str(ROOT / "bench/tools/host_h200.py")
        command = [sys.executable, script, "--dry-run", "--m", "1", "--out", str(out), *args]
        run = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        return json.loads(out.read_text())["rows"]


def test_host_h200_benchmark_dry_run():
    """bench/tools/host_h200.py (the GPU host-time benchmark) on the CPU: a linear row and its chain row (eager
    and compiled), the torch reference rows (compiled too) and a fused_moe row reach the JSON it writes."""
    rows = _host_h200("--only", "qwen3,int4 x fp8", "--chain", "3")
    names = [(r["name"], r["kind"]) for r in rows]
    assert ("torch matmul bf16", "reference") in names and ("fused_moe qwen3-30b-a3b int4 g128", "fused_moe") in names
    assert ("torch matmul bf16", "chain") in names and ("int4 x fp8", "chain") in names, names
    assert [r["name"] for r in rows if r["kind"] not in ("reference", "fused_moe", "chain")] == ["int4 x fp8"], names
    assert all(r["eager_us"] > 0 and r["compiled_us"] > 0 and "error" not in r for r in rows), rows
    chains = [r for r in rows if r["kind"] == "chain"]
    diff = lambda r: r["compiled_minus_eager_us"] - (r["compiled_us"] - r["eager_us"])  # each rounded to 0.01
    assert chains and all(r["linears"] == 3 and abs(diff(r)) <= 0.015 for r in chains), chains


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_fused_moe_prepared_calls_hit_miss_and_go_with_their_weights(backend, seed, monkeypatch):
    """fused_moe and its custom op find a kind of call's prepared call in one lookup per weight: a repeat with
    fresh tokens and routing is a hit (the same bits as the unprepared path); another T, topk_weights dtype,
    activation, block_m, expert map or HUMMING_BACKEND is a miss; ids out of range still raise on a hit; a
    refused call raises and is not kept; the entries go with either weight."""
    from humming import moe, ops
    from humming.reference.moe_layer import check_activation

    fused = sys.modules["humming.moe.fused"]
    made = []
    make = fused._make_call
    monkeypatch.setattr(fused, "_make_call", lambda *a: made.append(a[0].shape) or make(*a))
    e, k, inter, topk = 4, 64, 32, 2
    w13 = humming.quantize(torch.randn(e, 2 * inter, k), "int4", 32)
    w2 = humming.quantize(torch.randn(e, k, inter), "int4", 32)
    dtype = torch.float32 if backend == "reference" else torch.float16
    tokens = lambda t: (
        torch.randn(t, k).to(dtype),
        torch.softmax(torch.randn(t, topk), -1),
        torch.stack([torch.randperm(e)[:topk] for _ in range(t)]).to(torch.int32),
    )
    entries = lambda a, b: len(fused._calls[a][b])
    out = moe.fused_moe(*tokens(3)[:1], w13, w2, *tokens(3)[1:], backend=backend)
    x, weights, ids = tokens(3)
    again = moe.fused_moe(x, w13, w2, weights, ids, backend=backend)
    op_args = (x, weights, ids, *ops.weight_args(w13), None, *ops.weight_args(w2), None, None)
    op = torch.ops.humming.fused_moe(*op_args, "silu", None, None, "concat", None, None, None, 0, backend)
    assert len(made) == 1 and entries(w13, w2) == 1 and not torch.equal(out, again)
    activation = check_activation("silu", None, None, "concat")
    unprepared = fused.run_fused_moe(
        x, w13, None, w2, None, weights, ids, None, activation, None, None, None, None, backend
    )
    assert torch.equal(again, unprepared) and torch.equal(op, unprepared) and not again.isnan().any()
    moe.fused_moe(*tokens(5)[:1], w13, w2, *tokens(5)[1:], backend=backend)  # another T
    moe.fused_moe(x, w13, w2, weights.bfloat16(), ids, backend=backend)
    moe.fused_moe(x, w13, w2, weights, ids, activation="gelu", backend=backend)
    moe.fused_moe(x, w13, w2, weights, ids, block_m=32, backend=backend)
    moe.fused_moe(x, w13, w2, weights, ids, expert_map=torch.arange(e), backend=backend)
    monkeypatch.setenv("HUMMING_BACKEND", "reference")
    moe.fused_moe(x, w13, w2, weights, ids)
    monkeypatch.delenv("HUMMING_BACKEND")
    assert len(made) == 7 and entries(w13, w2) == 7
    moe.fused_moe(x, w13, w2, weights, ids, block_m=32, backend=backend)
    assert len(made) == 7
    with pytest.raises(ValueError, match=r"topk_ids: values must lie in \[0, 4\), found 4"):
        moe.fused_moe(x, w13, w2, weights, ids.clamp(min=2) + 2, backend=backend)  # a kind of call seen before
    with pytest.raises(ValueError, match="topk_weights: expected shape"):
        moe.fused_moe(x, w13, w2, weights[:, :1], ids, backend=backend)
    assert entries(w13, w2) == 7  # a refused call is not kept
    held, w2_held = len(fused._calls), len(fused._calls[w13])
    w2_other = humming.quantize(torch.randn(e, k, inter), "int4", 32)
    moe.fused_moe(x, w13, w2_other, weights, ids, backend=backend)
    assert len(fused._calls[w13]) == w2_held + 1
    del w2_other
    gc.collect()
    assert len(fused._calls[w13]) == w2_held
    del w13
    gc.collect()
    assert len(fused._calls) == held - 1


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 100])
def test_fused_moe_prepared_call_then_a_captured_graph(m, seed):
    """On the GPU, fused_moe's prepared call (the CUDA gated w13 and w2, the Triton alignment and combine) on
    fresh tokens and routings call after call gives the unprepared path's bits; a CUDA graph captured after
    those calls replays on new inputs (the prepared call holds no call's tensor)."""
    from humming import moe
    from humming.reference.moe_layer import check_activation

    fused = sys.modules["humming.moe.fused"]
    e, k, inter, topk = 16, 512, 256, 4
    w13 = humming.quantize(torch.randn(e, 2 * inter, k, device="cuda") * 0.05, "int4", 128)
    w2 = humming.quantize(torch.randn(e, k, inter, device="cuda") * 0.05, "int4", 128)
    activation = check_activation("silu", None, None, "concat")
    unprepared = lambda x, weights, ids: fused.run_fused_moe(
        x, w13, None, w2, None, weights, ids, None, activation, None, None, None, None, "auto"
    )

    def inputs():
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        weights = torch.softmax(torch.randn(m, topk, device="cuda"), -1)
        ids = torch.stack([torch.randperm(e, device="cuda")[:topk] for _ in range(m)]).to(torch.int32)
        return x, weights, ids

    for _ in range(3):
        x, weights, ids = inputs()
        out = moe.fused_moe(x, w13, w2, weights, ids)
        assert torch.equal(out, unprepared(x, weights, ids)) and not out.isnan().any()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = moe.fused_moe(x, w13, w2, weights, ids)
    _check_replays(graph, captured, (x, weights, ids), inputs, lambda: unprepared(x, weights, ids))


def _check_replays(graph, captured, tensors, inputs, expected) -> None:
    """Twice: fresh ``inputs()`` copied into the graph's input ``tensors``, its output poisoned, a replay, then
    the output bit-equal to ``expected()``."""
    for _ in range(2):
        for tensor, fresh in zip(tensors, inputs()):
            tensor.copy_(fresh)
        captured.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, expected())


@pytest.mark.parametrize("backend,module", [("auto", "cuda"), ("cuda", "cuda"), ("triton", "triton")])
def test_activation_pass_is_the_cuda_one_unless_triton_is_asked(backend, module, monkeypatch):
    """A kernel that takes its activation pass from the caller (``pass_launcher``) gets the CUDA pass's chooser
    (which itself falls back to Triton's where the CUDA pass does not apply), except with backend="triton"."""
    from humming.cuda_kernels import act_quant as cuda_act_quant
    from humming.triton_kernels import act_quant as triton_act_quant

    asked = []
    monkeypatch.setattr(cuda_act_quant, "quantize_pass", lambda x, act: asked.append("cuda"))
    monkeypatch.setattr(triton_act_quant, "quantize_pass", lambda x, act: asked.append("triton"))
    monkeypatch.delenv("HUMMING_BACKEND", raising=False)
    linear_module = importlib.import_module("humming.linear")  # humming.linear is the function
    linear_module.activation_pass(torch.randn(4, 64), get_act_scheme("fp8"), backend)
    assert asked == [module]


@pytest.mark.gpu
@pytest.mark.parametrize("weight,act", [("e4m3-channel", "fp8"), ("e4m3-block", "fp8_g128")])
@pytest.mark.parametrize("m", [1, 16])
def test_triton_scaled_mm_on_the_cuda_pass_keeps_its_bits(weight, act, m, seed, monkeypatch):
    """The Triton scaled GEMM behind the CUDA activation pass (the default backend) gives the bits it gives
    behind the Triton pass (backend="triton"), and the CUDA pass is what ran."""
    from humming.cuda_kernels.act_quant import CudaQuantizePass, cuda_unsupported
    from humming.dispatch.plan import plan_linear

    k = 1024
    qw = humming.quantize(torch.randn(512, k, device="cuda") * 0.05, **WEIGHTS[weight])
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    scheme = get_act_scheme(act)
    if cuda_unsupported(x, scheme) is not None:
        pytest.skip(cuda_unsupported(x, scheme))
    for backend in ("auto", "triton"):
        if plan_linear(qw, scheme, x, backend).kernel != "triton.scaled_mm":
            pytest.skip(f"backend={backend} plans {plan_linear(qw, scheme, x, backend).kernel} here")
    ran = []
    call = CudaQuantizePass.__call__
    monkeypatch.setattr(CudaQuantizePass, "__call__", lambda self, *a: ran.append(1) or call(self, *a))
    on_cuda = humming.linear(x, qw, act=act)
    assert ran, "the CUDA activation pass did not run"
    on_triton = humming.linear(x, qw, act=act, backend="triton")
    assert len(ran) == 1
    ref = humming.linear(x, qw, act=act, backend="reference")
    assert not on_cuda.isnan().any() and torch.equal(on_cuda, on_triton)
    assert (on_cuda.float() - ref.float()).norm() <= 1e-2 * ref.float().norm()


@pytest.mark.gpu
@pytest.mark.parametrize(
    "weight,act", [("int4-g128", None), ("mxfp4", None), ("e4m3-channel", "fp8"), ("e4m3-block", "fp8_g128")]
)
@pytest.mark.parametrize("m", [1, 40])
def test_triton_direct_launches_give_the_launchers_bits(weight, act, m, seed, monkeypatch):
    """A call through Triton's launcher (a launch hook installed: kernels other tests launched before may
    already have their direct launch) and the next ones through the direct launch: same output bits, call
    after call and replayed from a CUDA graph, the direct launch counted (the activation pass and the GEMM)."""
    from triton import knobs

    from humming.triton_kernels._launch import DirectLaunch

    direct = []
    launch = DirectLaunch.__call__
    monkeypatch.setattr(DirectLaunch, "__call__", lambda self, *a: direct.append(1) or launch(self, *a))
    k = 1024
    qw = humming.quantize(torch.randn(512, k, device="cuda") * 0.05, **WEIGHTS[weight])
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    with monkeypatch.context() as hooked:  # a launch hook sends every launch through Triton's launcher
        hook = knobs.runtime.launch_enter_hook
        if hasattr(hook, "calls"):
            hooked.setattr(hook, "calls", [lambda *args: None])
        else:
            hooked.setattr(knobs.runtime, "launch_enter_hook", lambda *args: None)
        first = humming.linear(x, qw, act=act, backend="triton")
    assert not direct
    again = [humming.linear(x, qw, act=act, backend="triton") for _ in range(2)]
    assert direct and len(direct) % 2 == 0  # each later call launches its kernels directly
    ref = humming.linear(x, qw, act=act, backend="reference")
    assert not first.isnan().any() and (first.float() - ref.float()).norm() <= 1e-2 * ref.float().norm()
    assert all(torch.equal(first, out) for out in again)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = humming.linear(x, qw, act=act, backend="triton")
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(first, out)


_WARMUP_CHECK = """
import runpy, sys, torch
sys.argv = ["host_overhead"]
runpy.run_path(SCRIPT, run_name="harness")["fake_gpu"]()
import humming
from humming.cuda_kernels import act_quant
from humming.dispatch.plan import plan_linear
qw = humming.quantize(torch.randn(256, 512), "e4m3", -1)
x = torch.randn(3, 512, dtype=torch.bfloat16)
assert plan_linear(qw, humming.ir.activation.get_act_scheme("fp8"), x).kernel == "triton.scaled_mm"
report = humming.warmup([qw], m_values=(3,), act="fp8", progress=False)
print(sorted(k.spec.name for k in report.kernels))
int4 = humming.quantize(torch.randn(256, 512), "int4", 128)
for m in (1, 64):  # the decode kernel's fp8-values route, the FP8 GEMM
    report = humming.warmup([int4], m_values=(m,), act="fp8", progress=False)
    print(sorted(k.spec.name for k in report.kernels))
print(sorted(str(key[1]) for key in act_quant._passes))
"""


def test_warmup_readies_the_cuda_pass_of_the_triton_scaled_gemm():
    """On a faked H200, a call planned on the Triton scaled GEMM quantizes its activations with the CUDA pass
    (humming.linear's choice); humming.warmup compiles that pass with the call's kernels and makes it, so that a
    CUDA graph captured after warmup alone finds it; likewise the passes of the CUDA kernels (codes before the
    FP8 GEMM, values before the decode kernel)."""
    pytest.importorskip("cuda.bindings.driver")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = _WARMUP_CHECK.replace("SCRIPT", repr(str(ROOT / "bench/tools/host_overhead.py")))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    # warmup compiles each call's pass with its kernels (in parallel), then makes the passes
    assert lines[-4] == "['humming_act_quant_e4m3_xbf16_g0_u8_t64']", run.stdout  # Triton's GEMM: no NVRTC job
    assert "humming_act_quant_e4m3_xbf16_g0_bf16_t64" in lines[-3] and "decode" in lines[-3], run.stdout
    assert "humming_act_quant_e4m3_xbf16_g0_u8_t64" in lines[-2] and "fp8_gemm" in lines[-2], run.stdout
    assert lines[-1].startswith("['torch.Size([1, 512])', 'torch.Size([3, 512])', 'torch.Size([64, 512])'"), run.stdout


_MOE_WARMUP_CHECK = """
import runpy, sys, torch
sys.argv = ["host_overhead"]
harness = runpy.run_path(SCRIPT, run_name="harness")
w13, w2 = harness["_moe_layer"](8, 128, 256)
harness["fake_gpu"]()
import humming
from humming.cuda_kernels import _driver
from humming.moe import MoeCall
first_use = []
compile_kernel = _driver.compile_kernel
_driver.compile_kernel = lambda spec, arch: first_use.append(spec.name) or compile_kernel(spec, arch)
call = MoeCall(w13, w2, top_k=2)
print(sorted({launch.kernel for m in (1, 16) for launch in call.launches(m)}))
report = humming.warmup([call], m_values=(1, 16), progress=False)
print(sorted(k.spec.name for k in report.kernels))
for m in (1, 16):
    call.run(m)
print(first_use)
"""


def test_warmup_compiles_the_cuda_combine_of_fused_moe():
    """On a faked H200, a fused_moe layer whose combine is the CUDA kernel (one token's slot route and 16
    tokens' aligned route alike): humming.warmup compiles that combine with the layer's other CUDA kernels, in
    parallel, rather than at its first launch (warmup's own run of the call, or a served call)."""
    pytest.importorskip("cuda.bindings.driver")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = _MOE_WARMUP_CHECK.replace("SCRIPT", repr(str(ROOT / "bench/tools/host_overhead.py")))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    kernels, compiled, first_use = run.stdout.splitlines()[-3:]
    assert "'cuda.moe_combine'" in kernels, run.stdout
    assert "'humming_moe_combine_ybf16_wf32_obf16'" in compiled, run.stdout
    assert "moe_combine" not in first_use, run.stdout


_FIRST_USE_CHECK = """
import json, runpy, sys, torch
sys.argv = ["host_overhead"]
harness = runpy.run_path(SCRIPT, run_name="harness")
kind, fmt, act = CASE
gpt_oss = fmt == "mxfp4"  # gpt-oss's experts: MXFP4 with biases, swiglu_oai on interleaved gate / up rows
layout = "interleaved" if gpt_oss else "concat"
if kind != "linear":
    w13, w2 = harness["_moe_layer"](8, 128, 256, fmt, gpt_oss, layout)
harness["fake_gpu"]()
import humming
from humming.cuda_kernels import _driver
from humming.dispatch.plan import plan_grouped, plan_linear
from humming.ir.activation import get_act_scheme
from humming.moe import MoeCall, grouped_linear
# a kernel compiles outside warmup's parallel batch in _driver.get_kernel, through jit.compile_kernel under this
# name (fake_gpu's stand-in; the batch calls jit's own)
first_use = []
compile_kernel = _driver.compile_kernel
_driver.compile_kernel = lambda spec, arch: first_use.append(spec.name) or compile_kernel(spec, arch)
scheme = None if act is None else get_act_scheme(act)
if kind == "fused_moe":
    activation = dict(activation="swiglu_oai", gate_up_layout=layout) if gpt_oss else {}
    layer = MoeCall(w13, w2, top_k=2, act=act, **activation)
    counts = (1, 16, 256, 1024)  # 1024: w13 reads its tokens copied into grouped order, not gathered
    launched = {launch.kernel for m in counts for launch in layer.launches(m)}
    serve = lambda m, dtype: layer.run(m, dtype)
elif kind == "grouped_linear":  # w2's experts on their own, in routing blocks of 16 rows
    layer, counts = w2, (16, 256)
    x = lambda m, dtype: torch.randn(m, layer.K, dtype=dtype)
    launched = {plan_grouped(layer, scheme, x(m, torch.bfloat16), 16).kernel for m in counts}
    serve = lambda m, dtype: grouped_linear(x(m, dtype), layer, torch.zeros(m // 16, dtype=torch.int32), 16, act=act)
else:
    layer, counts = humming.quantize(torch.randn(256, 512), fmt, 128), (1, 64)
    x = lambda m, dtype: torch.randn(m, layer.K, dtype=dtype)
    launched = {plan_linear(layer, scheme, x(m, torch.bfloat16)).kernel for m in counts}
    serve = lambda m, dtype: humming.linear(x(m, dtype), layer, act=act)
humming.warmup([layer], m_values=counts, act=act, progress=False)
in_warmup = first_use[:]  # warmup's own runs of the calls, after its batch
first_use.clear()
for m in counts:
    serve(m, torch.bfloat16)
served = first_use[:]
first_use.clear()
serve(counts[0], torch.float16)  # a call warmup did not cover (float16 tokens): the hook sees its kernels compile
print(json.dumps([sorted(launched), in_warmup, served, first_use]))
"""


@pytest.mark.parametrize(
    "case,kernels",
    [
        (("fused_moe", "int4", None), {"cuda.grouped_decode", "cuda.grouped", "cuda.moe_combine"}),
        (("fused_moe", "mxfp4", None), {"cuda.grouped_decode", "cuda.grouped", "cuda.moe_combine"}),
        (("fused_moe", "int4", "fp8"), {"cuda.act_quant", "cuda.grouped", "cuda.moe_combine"}),
        (("linear", "int4", None), {"cuda.wna16_decode", "cuda.wna16_sm90"}),
        (("linear", "int4", "fp8"), {"cuda.wna16_decode", "cuda.fp8_gemm"}),
        (("grouped_linear", "int4", "fp8"), {"cuda.grouped"}),
    ],
    ids=["moe-int4", "moe-mxfp4-swiglu_oai", "moe-int4-fp8", "linear-int4", "linear-int4-fp8", "grouped-int4-fp8"],
)
def test_warmup_compiles_every_cuda_kernel_the_served_calls_launch(case, kernels):
    """On a faked H200, fused_moe calls at 1, 16, 256 and 1024 tokens (Qwen3-like int4 g128 experts, with 16-bit
    and fp8 activations; gpt-oss-like MXFP4 experts), humming.linear calls at M = 1 and 64 (int4 g128, 16-bit and fp8
    activations) and grouped_linear calls of fp8 activations: humming.warmup compiles in its parallel batch every
    CUDA kernel they launch, each in the variant launched (w13's grouped kernels with the gated activation in their
    epilogue, gathering the tokens or not; the activation passes), so that neither warmup's own run of the calls
    after its batch nor a served call compiles one; a call warmup did not cover does."""
    pytest.importorskip("cuda.bindings.driver")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = _FIRST_USE_CHECK.replace("SCRIPT", repr(str(ROOT / "bench/tools/host_overhead.py")))
    code = code.replace("CASE", repr(case))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    launched, in_warmup, served, uncovered = json.loads(run.stdout.splitlines()[-1])
    assert kernels <= set(launched), launched
    assert in_warmup == [] and served == [], f"compiled at first use: in warmup's runs {in_warmup}, served {served}"
    assert uncovered, "the compile hook saw no kernel of a call warmup did not cover"


def _fake_kernel(calls: list, stream_type):
    """What PackedLaunch reads of a LoadedKernel, its plain launch recorded into ``calls``."""
    ok = types.SimpleNamespace(name="CUDA_SUCCESS")

    def launch(*args):
        calls.append(("cuLaunchKernel", args))
        return (ok,)

    return types.SimpleNamespace(
        device_index=0,
        _function="function",
        _threads=384,
        _launch=launch,
        _stream=stream_type,
        _success=ok,
        allow_smem=lambda smem: None,
    )


def test_programmatic_packed_launch_asks_the_driver_for_stream_serialization(monkeypatch):
    """A programmatic PackedLaunch goes through cuLaunchKernelEx with the grid, block, shared memory and
    stream of a plain one and the programmatic-stream-serialization attribute on; a plain one through
    cuLaunchKernel. Both pass the same parameter pointer array."""
    driver = pytest.importorskip("cuda.bindings.driver")
    from humming.cuda_kernels import _driver

    calls: list = []
    kernel = _fake_kernel(calls, driver.CUstream)

    def launch_ex(config, function, params, extra):
        attr = config.attrs[0]
        calls.append(
            (
                "cuLaunchKernelEx",
                (
                    config.gridDimX,
                    config.gridDimY,
                    config.gridDimZ,
                    config.blockDimX,
                    config.sharedMemBytes,
                    config.numAttrs,
                    attr.id,
                    attr.value.programmaticStreamSerializationAllowed,
                    function,
                    params,
                    extra,
                ),
            )
        )
        return (kernel._success,)

    monkeypatch.setattr(driver, "cuLaunchKernelEx", launch_ex)
    monkeypatch.setattr(_driver, "programmatic_launches", lambda device_index: True)
    plain = _driver.PackedLaunch(kernel, (7, 2, 1), 4096, _driver.ctypes.c_int(5))
    programmatic = _driver.PackedLaunch(kernel, (7, 2, 1), 4096, _driver.ctypes.c_int(5), programmatic=True)
    plain(11)
    programmatic(11)
    programmatic(11)
    (name, args), (name_ex, args_ex), repeat = calls
    assert name == "cuLaunchKernel" and args[:7] == ("function", 7, 2, 1, 384, 1, 1) and args[7] == 4096
    serialization = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    assert name_ex == "cuLaunchKernelEx" and args_ex[:8] == (7, 2, 1, 384, 4096, 1, serialization, 1)
    assert args_ex[8] == "function" and args_ex[9] == programmatic._tail[0] and args_ex[10] == 0
    assert repeat == calls[1]
    # a driver that refuses the programmatic launch: the same launch plainly, then plain launches only
    refused = types.SimpleNamespace(name="CUDA_ERROR_NOT_SUPPORTED")
    monkeypatch.setattr(driver, "cuLaunchKernelEx", lambda *args: calls.append(("refused", args)) or (refused,))
    fallback = _driver.PackedLaunch(kernel, (7, 2, 1), 4096, _driver.ctypes.c_int(5), programmatic=True)
    del calls[:]
    fallback(11)
    fallback(11)
    assert [name for name, _ in calls] == ["refused", "cuLaunchKernel", "cuLaunchKernel"]
    # where programmatic launches are off (HUMMING_PDL, a GPU before sm_90), one asked for is plain
    monkeypatch.setattr(_driver, "programmatic_launches", lambda device_index: False)
    del calls[:]
    _driver.PackedLaunch(kernel, (7, 2, 1), 4096, _driver.ctypes.c_int(5), programmatic=True)(11)
    assert [name for name, _ in calls] == ["cuLaunchKernel"]


def test_programmatic_launches_need_hopper_and_the_flag(monkeypatch):
    """Programmatic launches from sm_90 on, unless HUMMING_PDL is off; below sm_90 the kernels' waits are not
    built, so the launches stay plain."""
    from humming.cuda_kernels import _driver

    capability = {0: (9, 0), 1: (8, 9), 2: (10, 0)}
    monkeypatch.setattr(_driver, "device_info", lambda index: types.SimpleNamespace(capability=capability[index]))
    monkeypatch.delenv("HUMMING_PDL", raising=False)
    assert [_driver.programmatic_launches(i) for i in range(3)] == [True, False, True]
    monkeypatch.setenv("HUMMING_PDL", "0")
    assert not any(_driver.programmatic_launches(i) for i in range(3))
    monkeypatch.setenv("HUMMING_PDL", "maybe")
    with pytest.raises(ValueError, match="HUMMING_PDL"):
        _driver.programmatic_launches(0)


# Plans without split-K (whose fp32 additions come in a varying order): 8192 rows fill the decode kernel's grid,
# and 300 tokens the FP8 GEMM's.
PDL_ROUTES = [("int4-g128", "fp8", m) for m in (1, 16, 300)] + [
    ("int4-channel", "fp8", 1),
    ("mxfp4", "fp8", 1),
    ("mxfp4", "fp8", 300),
    ("e4m3-channel", "fp8", 300),
    ("e4m3-block", "fp8_g128", 300),
]


@pytest.mark.gpu
@pytest.mark.parametrize("weight,act,m", PDL_ROUTES, ids=lambda v: str(v))
def test_programmatic_launch_keeps_the_bits(weight, act, m, seed, monkeypatch):
    """The GEMM launched programmatically behind the CUDA activation pass (it starts while the pass runs and
    waits for its output) gives the bits of the plain launch, eagerly and replayed from a CUDA graph on new
    activations; two weights of the same values, their launchers made under HUMMING_PDL on and off."""
    n, k = 8192, 1024
    w = torch.randn(n, k, device="cuda") * 0.05
    qws = {}
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    for flag in ("1", "0"):
        monkeypatch.setenv("HUMMING_PDL", flag)
        qws[flag] = humming.quantize(w, **{**WEIGHTS, "int4-channel": dict(weight="int4", group_size=-1)}[weight])
        humming.linear(x, qws[flag], act=act)  # makes the launcher under the flag
    monkeypatch.delenv("HUMMING_PDL")
    for _ in range(3):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 3
        on, off = (humming.linear(x, qws[f], act=act) for f in ("1", "0"))
        assert torch.isfinite(on.float()).all() and torch.equal(on, off), (weight, act, m, seed)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        # a producer of x inside the graph, so that the pass's input is written just before it
        y = x * 2
        on = humming.linear(y, qws["1"], act=act)
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        on.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(on, humming.linear(x * 2, qws["0"], act=act)), (weight, act, m, seed)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 300])
@pytest.mark.parametrize("weight", ["int4-g128", "mxfp4"])
def test_fused_moe_programmatic_launches_keep_the_bits(weight, m, seed, monkeypatch):
    """fused_moe's grouped GEMMs and combine launched programmatically (each waits for the kernel before it
    first) give the bits of plain launches, eagerly and replayed from a CUDA graph whose first kernel writes
    the tokens; two sets of experts of the same values, their launches made under HUMMING_PDL on and off."""
    from humming import moe

    e, k, inter, topk = 16, 512, 256, 4
    w13 = torch.randn(e, 2 * inter, k, device="cuda") * 0.05
    w2 = torch.randn(e, k, inter, device="cuda") * 0.05
    quantize = {"int4-g128": dict(weight="int4", group_size=128), "mxfp4": dict(weight="mxfp4")}[weight]
    experts = {flag: (humming.quantize(w13, **quantize), humming.quantize(w2, **quantize)) for flag in ("1", "0")}

    def inputs():
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        weights = torch.softmax(torch.randn(m, topk, device="cuda"), -1)
        ids = torch.stack([torch.randperm(e, device="cuda")[:topk] for _ in range(m)]).to(torch.int32)
        return x, weights, ids

    x, weights, ids = inputs()
    for flag, (a, b) in experts.items():  # each set's launches made under its flag
        monkeypatch.setenv("HUMMING_PDL", flag)
        moe.fused_moe(x, a, b, weights, ids)
    monkeypatch.delenv("HUMMING_PDL")
    for _ in range(3):
        x, weights, ids = inputs()
        on, off = (moe.fused_moe(x, *experts[flag], weights, ids) for flag in ("1", "0"))
        assert not on.isnan().any() and torch.equal(on, off), (weight, m, seed)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = moe.fused_moe(x * 2, *experts["1"], weights, ids)
    _check_replays(
        graph, captured, (x, weights, ids), inputs, lambda: moe.fused_moe(x * 2, *experts["0"], weights, ids)
    )


@pytest.mark.parametrize(
    "act, bias, static",
    [
        ("fp8", True, False),
        ("fp8_g128", False, False),
        ("mxfp4", True, False),
        ("fp8_tensor", False, False),
        ("fp8_tensor", True, True),
        ("fp8", False, True),
    ],
)
def test_fused_moe_quantized_steps_prepared(act, bias, static, seed, monkeypatch):
    """On the Triton layer, fused_moe of per-token or per-group activation scales runs prepared steps (w13's
    GEMM quantizing its tokens, the activation pass quantizing w2's input, w2's GEMM) and never
    ``run_grouped``, and so do static scales (each GEMM on the caller's quantized input); dynamic tensor-wide
    scales (quantized over each call's routed rows) take ``run_grouped``. Either way, bit for bit the
    unprepared path's, biases included, and repeat calls agree."""
    from humming import moe
    from humming.ir.activation import get_act_scheme
    from humming.reference.moe_layer import check_activation

    fused = sys.modules["humming.moe.fused"]
    e, k, inter, topk, t = 3, 128, 128, 2, 3
    bias_of = lambda *shape: torch.randn(*shape) if bias else None
    w13 = humming.quantize(torch.randn(e, 2 * inter, k), "int4", 32, bias=bias_of(e, 2 * inter))
    w2 = humming.quantize(torch.randn(e, k, inter), "int4", 32, bias=bias_of(e, k))
    x, weights = torch.randn(t, k).bfloat16(), torch.softmax(torch.randn(t, topk), -1)
    ids = torch.stack([torch.randperm(e)[:topk] for _ in range(t)]).to(torch.int32)
    grouped_runs = []
    run_grouped = fused.run_grouped
    monkeypatch.setattr(fused, "run_grouped", lambda *a: grouped_runs.append(a[1].shape) or run_grouped(*a))
    scales = (torch.tensor(0.03), torch.tensor(0.02)) if static else (None, None)
    options = dict(act=act, w13_act_scale=scales[0], w2_act_scale=scales[1], backend="triton")
    first = moe.fused_moe(x, w13, w2, weights, ids, **options)
    again = moe.fused_moe(x, w13, w2, weights, ids, **options)
    prepared = not grouped_runs
    assert prepared == (static or act != "fp8_tensor"), grouped_runs
    activation = check_activation("silu", None, None, "concat")
    args = (weights, ids, None, activation, get_act_scheme(act), *scales, None, "triton")
    unprepared = fused.run_fused_moe(x, w13, w13.bias, w2, w2.bias, *args)
    assert torch.equal(first, unprepared) and torch.equal(again, unprepared) and torch.isfinite(first).all()


def test_fused_moe_triton_16_bit_grouped_gemms_prepared(seed, monkeypatch):
    """The Triton layer's grouped GEMMs of 16-bit activations are made ready with the prepared call: a repeat
    call plans and checks nothing (``grouped_linear`` is not called), with the unprepared path's bits."""
    from humming import moe
    from humming.reference.moe_layer import check_activation
    from humming.triton_kernels import wna16

    fused = sys.modules["humming.moe.fused"]
    e, k, inter, topk, t = 3, 64, 32, 2, 3
    w13 = humming.quantize(torch.randn(e, 2 * inter, k), "int4", 32, bias=torch.randn(e, 2 * inter))
    w2 = humming.quantize(torch.randn(e, k, inter), "mxfp4")
    x, weights = torch.randn(t, k).half(), torch.softmax(torch.randn(t, topk), -1)
    ids = torch.stack([torch.randperm(e)[:topk] for _ in range(t)]).to(torch.int32)
    first = moe.fused_moe(x, w13, w2, weights, ids, backend="triton")
    planned = []
    grouped_linear = wna16.grouped_linear
    monkeypatch.setattr(wna16, "grouped_linear", lambda *a, **kw: planned.append(1) or grouped_linear(*a, **kw))
    again = moe.fused_moe(x, w13, w2, weights, ids, backend="triton")
    assert not planned
    activation = check_activation("silu", None, None, "concat")
    args = (weights, ids, None, activation, None, None, None, None, "triton")
    unprepared = fused.run_fused_moe(x, w13, w13.bias, w2, w2.bias, *args)
    assert planned and torch.equal(first, unprepared) and torch.equal(again, unprepared)
    assert torch.isfinite(first).all()
