"""Host (CPU) time of one eager ``humming.linear`` call per weight format and activation scheme, on a CPU-only
machine: the GPU is faked at the lowest level, and everything above it runs for real.

Faked (see :func:`fake_gpu`):

- tensors are CPU tensors that report ``cuda:0`` (``torch.Tensor.device``); allocations asked on a CUDA
  device are made on the CPU;
- device properties are an H200's (sm_90, 132 SMs), so the dispatcher's tables and heuristics apply;
- ``torch.cuda`` stream, device and capture queries return stream 0 of device 0, not capturing;
- the CUDA driver (module loading, ``cuTensorMapEncodeTiled``, ``cuFuncSetAttribute``, ``cuLaunchKernel(Ex)``) and
  NVRTC: nothing is compiled or launched, the launches are counted;
- Triton: its driver (device 0, stream 0, target sm_90) and its compiler: a kernel "compiles" into a
  ``CompiledKernel`` whose launcher only counts.

Per combination: the eager call (``us``), and ``torch.ops.humming.linear`` called directly (``op us``: what
code compiled by ``torch.compile`` calls per linear, the wrapper's own cost left out). The figures are
microseconds of Python and torch dispatch on this CPU, not GPU times: on a GPU each real
launch, stream query and caching-allocator allocation costs a little more. Each combination also reports
the launches and the aten ops of one call (views left out: the allocations, and torch ops that launch GPU
kernels of their own).

``--moe``: one eager ``humming.moe.fused_moe`` call instead (``--moe-format`` experts, ``--experts`` of them,
``--topk`` each; ``w13 [E, 2 * --moe-inter, --moe-k]``, small so that the host time shows), with ``topk_ids``
already on the "GPU"; routing, alignment, both grouped GEMMs, the activation pass and the combine, on
``--moe-backend`` (the Triton layer with ``triton``).

Usage: ``python bench/tools/host_overhead.py [--n 28672] [--k 8192] [--iters 2000] [--only COMBO] [--m 1,16]
[--profile COMBO] [--save FILE.json] [--compare FILE.json] [--moe]`` (preparing the weights at full size takes
a minute or two of CPU). ``--save`` writes the rows as JSON; ``--compare`` prints a saved run's figures next to
this one's (before / after a change). torch runs on one thread: the aten ops the fake runs on the CPU
would otherwise wait on a thread pool shared with other processes.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import functools
import json
import os
import pstats
import sys
import time
import types
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # real Triton JIT functions, not the interpreter
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
from torch.utils._python_dispatch import TorchDispatchMode

COUNTS: collections.Counter = collections.Counter()
_CUDA0, _CPU = torch.device("cuda", 0), torch.device("cpu")


class _Stream:
    """What ``torch.cuda.current_stream`` returns, for stream 0."""

    cuda_stream = 0

    def __init__(self, device_index: int) -> None:
        self.device_index = device_index


def _on_cpu(fn):
    """``fn`` (a torch factory) with a CUDA ``device=`` made on the CPU."""

    def factory(*args, device=None, **kwargs):
        if device is not None and str(device).startswith("cuda"):
            device = _CPU
        return fn(*args, device=device, **kwargs)

    return factory


_PARAM_BYTES = {
    "i1": 1,
    "i8": 1,
    "u8": 1,
    "i16": 2,
    "u16": 2,
    "i32": 4,
    "u32": 4,
    "i64": 8,
    "u64": 8,
    "fp32": 4,
    "fp64": 8,
}


def fake_gpu() -> None:
    """Install the fakes of the module docstring (for the rest of the process)."""
    import torch.cuda
    from cuda.bindings import driver
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.driver import CudaLauncher
    from triton.compiler.compiler import CompiledKernel
    from triton.runtime import driver as triton_driver
    from triton.runtime.jit import JITFunction

    from humming import device
    from humming.cuda_kernels import _driver, jit

    torch.Tensor.device = property(lambda self: _CUDA0)
    for name in ("empty", "zeros", "ones", "full", "randn", "arange", "tensor", "empty_strided"):
        setattr(torch, name, _on_cpu(getattr(torch, name)))
    torch.cuda._initialized = True
    torch.cuda.is_available = lambda: True
    torch.cuda.current_device = lambda: 0
    torch.cuda.is_current_stream_capturing = lambda: False
    torch._C._cuda_getCurrentRawStream = lambda index: 0

    def current_stream(device=None):
        torch.cuda._lazy_init()
        return _Stream(torch.cuda._utils._get_device_index(device, optional=True))

    torch.cuda.current_stream = current_stream

    info = device.DeviceInfo(0, "fake H200", (9, 0), device.DeviceLimits(132, 232448, 233472), 60 << 20)
    device._info = lambda index: info

    def counted(name, result):
        def call(*args):
            COUNTS[name] += 1
            return result() if callable(result) else result

        return call

    ok = driver.CUresult.CUDA_SUCCESS
    driver.cuInit = counted("cuInit", (ok,))
    driver.cuDeviceGet = counted("cuDeviceGet", (ok, driver.CUdevice(0)))
    driver.cuDevicePrimaryCtxRetain = counted("cuDevicePrimaryCtxRetain", (ok, driver.CUcontext()))
    driver.cuCtxSetCurrent = counted("cuCtxSetCurrent", (ok,))
    driver.cuModuleLoadData = counted("cuModuleLoadData", (ok, driver.CUmodule()))
    driver.cuModuleGetFunction = counted("cuModuleGetFunction", (ok, driver.CUfunction()))
    driver.cuFuncSetAttribute = counted("cuFuncSetAttribute", (ok,))
    driver.cuLaunchKernel = counted("cuda launch", (ok,))
    driver.cuLaunchKernelEx = counted("cuda launch", (ok,))
    driver.cuTensorMapEncodeTiled = counted("cuTensorMapEncodeTiled", lambda: (ok, driver.CUtensorMap()))
    _driver.compile_kernel = lambda spec, arch: jit.CompiledKernel(spec, arch, "", b"", "", "fake", 0.0)

    class FakeTritonDriver:
        def get_current_device(self):
            return 0

        def get_current_stream(self, device):
            return 0

        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

    triton_driver.set_active(FakeTritonDriver())

    def compile_stub(self, key, signature, device, constexprs, options, attrs, warmup):
        """A compiled kernel as Triton's compiler would return it, its parameters those of its signature's
        non-constexpr arguments and the two scratch pointers (the PTX entry says so, for humming's direct
        launch); its launcher's Python runs, its C launch only counts."""
        launcher = object.__new__(CudaLauncher)
        launcher.launch = counted("triton launch", None)
        launcher.gsan_enabled = launcher.launch_cooperative_grid = launcher.launch_pdl = False
        launcher.num_ctas, launcher.arg_annotations, launcher.kernel_signature = 1, None, None
        launcher.global_scratch_size = launcher.profile_scratch_size = 0
        launcher.global_scratch_align = launcher.profile_scratch_align = 1
        kernel = object.__new__(CompiledKernel)
        kernel.module, kernel._module_pid = object(), None  # "loaded"; never unloaded
        kernel.function, kernel.packed_metadata, kernel.name = 0, (), self.fn.__name__
        kernel.src = types.SimpleNamespace(signature=signature, fn=self)
        kernel.metadata = types.SimpleNamespace(num_warps=options.num_warps, num_ctas=1, shared=0)
        sizes = [8 if ty.startswith("*") else _PARAM_BYTES[ty] for ty in signature.values() if ty != "constexpr"]
        params = ", ".join(f".param .u{8 * size} p{i}" for i, size in enumerate([*sizes, 8, 8]))
        kernel.asm = {"ptx": f".visible .entry {kernel.name}({params})"}
        kernel._run = launcher
        self.device_caches[device][0][key] = kernel
        return kernel

    JITFunction._do_compile = compile_stub


# ------------------------------------------------------------------------------------------- the layers
def _weights(n: int, k: int) -> dict:
    """The weights of each combination, random codes with plausible scales (the values never matter)."""
    from humming.ir.quantize import quantize
    from humming.ir.weight import QuantizedWeight

    words = lambda bits: torch.randint(-(2**31), 2**31 - 1, (n, k * bits // 32), dtype=torch.int32)
    scales = lambda rows, cols, dtype=torch.float32: (torch.rand(rows, cols) + 0.5).to(dtype)
    e8m0 = torch.full((n, k // 32), 120, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    int4 = QuantizedWeight((n, k), "int4", words(4), scales(n, k // 128, torch.bfloat16), (1, 128))
    mxfp4 = QuantizedWeight((n, k), "e2m1", words(4), e8m0, (1, 32))
    fp8_channel = QuantizedWeight((n, k), "e4m3", words(8), scales(n, 1), (1, -1))
    fp8_block = QuantizedWeight((n, k), "e4m3", words(8), scales(n // 128, k // 128), (128, 128))
    int8_channel = QuantizedWeight((n, k), "int8", words(8), scales(n, 1), (1, -1))
    zeros = torch.randint(0, 16, (n, k // 128), dtype=torch.uint8)
    uint4_zp = QuantizedWeight((n, k), "uint4", words(4), scales(n, k // 128, torch.float16), (1, 128), zeros=zeros)
    nvfp4 = quantize(torch.randn(n, k), "nvfp4")
    return {
        "W4A16 int4 g128": (int4, None),
        "MXFP4 x bf16": (mxfp4, None),
        "W4A16 uint4 + zero points g128": (uint4_zp, None),
        "W8A16 int8 channel": (int8_channel, None),
        "W8A8 fp8 channel, act fp8": (fp8_channel, "fp8"),
        "W8A8 fp8 block, act fp8_g128": (fp8_block, "fp8_g128"),
        "W4A8 int4 x fp8": (int4, "fp8"),
        "MXFP4 x fp8": (mxfp4, "fp8"),
        "W8A8 int8 channel, act int8": (int8_channel, "int8"),
        "NVFP4 x bf16": (nvfp4, None),
        "NVFP4 x nvfp4": (nvfp4, "nvfp4"),
    }


class _CountOps(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and func.__name__ not in ("detach.default", "alias.default"):
            COUNTS[f"aten {func.__name__}"] += 1
        return func(*args, **(kwargs or {}))


def _runs_on_cuda(qw, scheme, x) -> bool:
    from humming.dispatch.plan import plan_linear

    try:
        plan_linear(qw, scheme, x, "cuda")
    except ValueError:  # no CUDA kernel takes this combination
        return False
    return True


def _moe_layer(
    experts: int, inter: int, k: int, fmt: str = "int4", bias: bool = False, gate_up_layout: str = "concat"
) -> tuple:
    """``(w13, w2)``: expert weights of random codes, int4 g128 (``fmt="int4"``), MXFP4 (``"mxfp4"``) or e4m3 in
    128 x 128 blocks (``"fp8_block"``, DeepSeek-V3's, run with fp8_g128 activations), with random bf16 biases
    where ``bias``, prepared for the CUDA grouped kernels (w13 with its rows in the gated epilogue's order for
    ``gate_up_layout``, as fused_moe runs it)."""
    from humming import cuda_kernels
    from humming.cuda_kernels import _wna16
    from humming.ir.weight import QuantizedWeight

    def weight(n, width):
        codes = torch.randint(-(2**31), 2**31 - 1, (experts, n, width // 8), dtype=torch.int32)
        biases = torch.randn(experts, n, dtype=torch.bfloat16) if bias else None
        if fmt == "fp8_block":
            codes = torch.randn(experts, n, width).to(torch.float8_e4m3fn).view(torch.int32)
            scales = torch.rand(experts, n // 128, width // 128) + 0.5
            return QuantizedWeight((experts, n, width), "e4m3", codes, scales, (128, 128), bias=biases)
        if fmt == "mxfp4":
            e8m0 = torch.full((experts, n, width // 32), 120, dtype=torch.uint8).view(torch.float8_e8m0fnu)
            return QuantizedWeight((experts, n, width), "e2m1", codes, e8m0, (1, 32), bias=biases)
        scales = (torch.rand(experts, n, width // 128) + 0.5).to(torch.bfloat16)
        return QuantizedWeight((experts, n, width), "int4", codes, scales, (1, 128), bias=biases)

    layer = weight(2 * inter, k), weight(k, inter)
    with contextlib.suppress(ValueError, RuntimeError):
        # w13 in the gated epilogue's row order (fused_moe's path), w2 in the plain one
        _wna16.prepare_gate_up(layer[0], gate_up_layout)
        cuda_kernels.prepare(layer[1])
    return layer


#: The activation scheme fused_moe runs each ``--moe-format`` with.
_MOE_ACTS = {"int4": None, "mxfp4": None, "fp8_block": "fp8_g128"}


def _count(call) -> tuple[int, int]:
    """``(launches, aten ops)`` of one ``call()`` (after a first call that plans, prepares and "compiles")."""
    call()
    COUNTS.clear()
    with _CountOps():
        call()
    launches = COUNTS["cuda launch"] + COUNTS["triton launch"]
    return launches, sum(v for key, v in COUNTS.items() if key.startswith("aten "))


def _moe_rows(args, layer, before: dict) -> list[dict]:
    """The rows of ``--moe``: one eager fused_moe call per M (``before``: a saved run's rows by M)."""
    from humming import moe

    w13, w2 = layer
    rows = []
    fmt, act = args.moe_format, _MOE_ACTS[args.moe_format]
    print(f"E={args.experts} topk={args.topk} w13 [E, {2 * args.moe_inter}, {args.moe_k}] {fmt}: host us per")
    print("eager fused_moe call (CPU-side, GPU faked)")
    print(f"{'M':>4} {'us':>8}  launches  aten ops" + ("  | before: us  launches  aten ops" if before else ""))
    for m in (int(v) for v in args.m.split(",")):
        x = torch.randn(m, args.moe_k, dtype=torch.bfloat16)
        ids = torch.stack([torch.randperm(args.experts)[: args.topk] for _ in range(m)]).to(torch.int32)
        weights = torch.rand(m, args.topk)
        call = lambda: moe.fused_moe(x, w13, w2, weights, ids, act=act, backend=args.moe_backend)  # noqa: B023
        launches, aten_ops = _count(call)
        row = {"combination": f"fused_moe {fmt}", "m": m, "backend": args.moe_backend, "launches": launches}
        row |= {"aten_ops": aten_ops, "us": round(measure(call, args.iters), 1)}
        rows.append(row)
        line = f"{m:>4} {row['us']:8.1f}  {launches:>8}  {aten_ops:>8}"
        old = before.get(m)
        if old:
            line += f"  | {old['us']:10.1f}  {old['launches']:>8}  {old['aten_ops']:>8}"
        print(line)
        if args.profile and args.profile in row["combination"]:
            profile = cProfile.Profile()
            profile.runcall(lambda: [call() for _ in range(args.iters)])  # noqa: B023
            pstats.Stats(profile).sort_stats(os.environ.get("HOST_PROFILE_SORT", "tottime")).print_stats(30)
    return rows


def measure(fn, iters: int) -> float:
    """The mean host microseconds of ``fn()`` in the fastest of 7 rounds (other processes only add time)."""
    rounds = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        rounds.append((time.perf_counter() - start) / iters * 1e6)
    return min(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=28672)
    parser.add_argument("--k", type=int, default=8192)
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--m", default="1,16", help="the token counts, comma-separated")
    parser.add_argument("--only", metavar="COMBO", help="run the combinations whose name holds this substring")
    parser.add_argument("--profile", metavar="COMBO", help="cProfile this combination (a substring of its name)")
    parser.add_argument("--save", metavar="FILE", help="write the rows as JSON")
    parser.add_argument("--compare", metavar="FILE", help="print the rows of a run saved with --save alongside")
    parser.add_argument("--moe", action="store_true", help="time fused_moe instead of humming.linear")
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--topk", type=int, default=8)
    parser.add_argument("--moe-inter", type=int, default=256)
    parser.add_argument("--moe-k", type=int, default=512)
    parser.add_argument("--moe-format", choices=sorted(_MOE_ACTS), default="int4", help="the experts' format")
    parser.add_argument("--moe-backend", default="auto", help="fused_moe's backend (triton: the Triton layer)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.moe:
        layer = _moe_layer(args.experts, args.moe_inter, args.moe_k, args.moe_format)
        fake_gpu()
        before = {r["m"]: r for r in json.loads(Path(args.compare).read_text())} if args.compare else {}
        rows = _moe_rows(args, layer, before)
        if args.save:
            Path(args.save).write_text(json.dumps(rows, indent=1) + "\n")
        return

    import humming
    from humming import cuda_kernels, ops
    from humming.dispatch.plan import plan_linear
    from humming.ir.activation import get_act_scheme

    combos = {name: c for name, c in _weights(args.n, args.k).items() if not args.only or args.only in name}
    for qw, act in combos.values():  # the layouts each kernel reads, made once on the CPU before faking
        with contextlib.suppress(ValueError, RuntimeError):  # no CUDA kernel takes NVFP4 x 16-bit activations
            cuda_kernels.prepare(qw, act)
    fake_gpu()

    before = {}
    if args.compare:
        before = {(r["combination"], r["m"], r["backend"]): r for r in json.loads(Path(args.compare).read_text())}
    print(f"N={args.n} K={args.k}: host us per eager humming.linear call (CPU-side, GPU faked)")
    columns = f"{'combination':32} {'M':>3} {'backend':>7} {'us':>7} {'op us':>7}  {'kernel':17} launches  aten ops"
    print(columns + ("  | before: us   op us  launches  aten ops" if before else ""))
    rows = []
    for name, (qw, act) in combos.items():
        scheme = None if act is None else get_act_scheme(act)
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, args.k, dtype=torch.bfloat16)
            # the dispatcher's choice, and the CUDA backend's where that choice is a Triton kernel
            backends = ["auto"] + (
                ["cuda"] if plan_linear(qw, scheme, x).backend != "cuda" and _runs_on_cuda(qw, scheme, x) else []
            )
            for backend in backends:
                call = lambda: humming.linear(x, qw, act=act, backend=backend)  # noqa: B023 (called in this loop)
                # what compiled code calls per call: the custom op, which finds the weight by its handle
                args_of_op = (x, None, None, *ops.weight_args(qw), None, act, torch.bfloat16, backend)
                op = functools.partial(torch.ops.humming.linear, *args_of_op)
                launches, aten_ops = _count(call)
                row = {
                    "combination": name,
                    "m": m,
                    "backend": backend,
                    "kernel": plan_linear(qw, scheme, x, backend).kernel,
                    "launches": launches,
                    "aten_ops": aten_ops,
                    "us": round(measure(call, args.iters), 1),
                    "op_us": round(measure(op, args.iters), 1),
                }
                rows.append(row)
                line = f"{name:32} {m:>3} {backend:>7} {row['us']:7.1f} {row['op_us']:7.1f}  {row['kernel']:17}"
                line += f" {row['launches']:>8}  {row['aten_ops']:>8}"
                old = before.get((name, m, backend))
                if old:
                    line += f"  | {old['us']:10.1f} {old.get('op_us', float('nan')):7.1f}"
                    line += f"  {old['launches']:>8}  {old['aten_ops']:>8}"
                print(line)
                if args.profile and args.profile in name:
                    profile = cProfile.Profile()
                    profile.runcall(lambda: [call() for _ in range(args.iters)])  # noqa: B023
                    pstats.Stats(profile).sort_stats(os.environ.get("HOST_PROFILE_SORT", "tottime")).print_stats(30)
    if args.save:
        Path(args.save).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
