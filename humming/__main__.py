"""Command line: ``python -m humming demo`` (the main job), ``inspect PATH`` (a checkpoint), ``tune`` (a GPU's
dispatch table) and ``bench`` (sweeps against torch and the other kernel libraries)."""

from __future__ import annotations

import argparse
import sys
import time

import torch
from tqdm import tqdm

import humming

#: (label, quantize arguments, activation scheme) of the demo table.
DEMO_CASES = [
    ("W8A16 int8 per-channel", dict(weight="int8", group_size=-1), None),
    ("W4A16 int4 g128", dict(weight="int4", group_size=128), None),
    ("W4A16 uint4 g128 zero-point", dict(weight="int4", group_size=128, zero_point=True), None),
    ("W3A16 int3 g64", dict(weight="int3", group_size=64), None),
    ("W4A16 nf4 g64", dict(weight="nf4", group_size=64), None),
    ("W8A16 fp8 e4m3 per-channel", dict(weight="e4m3", group_size=-1), None),
    ("W4A16 mxfp4", dict(weight="mxfp4"), None),
    ("W4A16 nvfp4", dict(weight="nvfp4"), None),
    ("W8A8 fp8 per-token x per-channel", dict(weight="e4m3", group_size=-1), "fp8"),
    ("W8A8 fp8 1x128 x 128x128 blocks", dict(weight="fp8_block"), "fp8_g128"),
    ("W8A8 int8", dict(weight="int8", group_size=-1), "int8"),
    ("W4A8 int4 g128 x fp8", dict(weight="int4", group_size=128), "fp8"),
    ("W4A4 nvfp4 x nvfp4", dict(weight="nvfp4"), "nvfp4"),
]


def _time_ms(fn, iters: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def demo(args: argparse.Namespace) -> int:
    """Quantize a seeded layer in several formats, run ``humming.linear`` and print a table."""
    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    n, k, m = args.n, args.k, args.m
    gen = torch.Generator().manual_seed(args.seed)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(torch.bfloat16)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    ref = x.double() @ w.double().T
    w, x = w.to(device), x.to(device)
    print(f"humming {humming.__version__} demo: layer N={n} K={k}, M={m} tokens, device={device}")
    if device == "cuda":
        print(f"GPU: {torch.cuda.get_device_name()}")
    rows = [
        ("bf16 (unquantized)", w.numel() * 2, 0.0, "torch", _time_ms(lambda: x @ w.T) if device == "cuda" else None)
    ]
    progress = tqdm(DEMO_CASES, desc="quantize + run", unit="format", file=sys.stderr, leave=False)
    for label, qargs, act in progress:
        progress.set_postfix_str(label)
        qw = humming.quantize(w, **qargs)
        out = humming.linear(x, qw, act=act)
        err = float((out.double().cpu() - ref).norm() / ref.norm())
        backend = _backend_name(qw, act, x)
        ms = _time_ms(lambda qw=qw, act=act: humming.linear(x, qw, act=act)) if device == "cuda" else None
        rows.append((label, qw.nbytes, err, backend, ms))
    header = f"{'format':36s} {'bytes':>10s} {'bits/w':>7s} {'rel.err':>9s} {'backend':>10s} {'time':>10s}"
    print(header)
    print("-" * len(header))
    for label, nbytes, err, backend, ms in rows:
        timing = f"{ms * 1e3:8.1f}us" if ms is not None else "       n/a"
        print(f"{label:36s} {nbytes:10d} {8 * nbytes / (n * k):7.2f} {err:9.2e} {backend:>10s} {timing}")
    return 0


def _backend_name(qw, act, x) -> str:
    return humming.explain(qw, x.shape[0], act, dtype=x.dtype).kernel


def inspect(args: argparse.Namespace) -> int:
    from .loaders.cli import inspect_main

    return inspect_main([args.path, *(["--modules", *args.modules] if args.modules else [])])


def _version_text() -> str:
    """humming's version and the versions of what it runs on (what a bug report needs)."""
    from importlib.metadata import PackageNotFoundError, version

    parts = [f"humming {humming.__version__}", f"torch {torch.__version__}"]
    for dist in ("triton", "numpy", "cuda-core", "nvidia-cuda-nvrtc"):
        try:
            parts.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            parts.append(f"{dist} (not installed)")
    cuda = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only torch build"
    return ", ".join([*parts, cuda])


def _positive(text: str) -> int:
    """An argparse type: a positive int (the demo's sizes)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="humming", description=__doc__)
    parser.add_argument("--version", action="version", version=_version_text())
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="quantize an example layer in many formats and compare (CPU or GPU)")
    p.add_argument("--n", type=_positive, default=1024, help="output features (default 1024)")
    p.add_argument("--k", type=_positive, default=1024, help="input features (default 1024)")
    p.add_argument("--m", type=_positive, default=16, help="tokens (default 16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpu", action="store_true", help="stay on the CPU even when a GPU is present")
    p.set_defaults(func=demo)
    sub.add_parser("tune", help="measure the kernels on this GPU and write its dispatch table (tune --help)")
    sub.add_parser("bench", help="time humming against torch, gemlite and humming-kernels (bench --help)")
    p = sub.add_parser("inspect", help="list the quantized modules of a checkpoint folder")
    p.add_argument("path")
    p.add_argument("--modules", nargs="*", help="only these module names / shell wildcards")
    p.set_defaults(func=inspect)
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["tune"]:  # its own parser: python -m humming tune --help
        from .dispatch.tune import main as tune_main

        return tune_main(argv[1:])
    if argv[:1] == ["bench"]:  # its own parser: python -m humming bench --help
        from .bench import main as bench_main

        return bench_main(argv[1:])
    args = parser.parse_args(argv)
    start = time.perf_counter()
    status = args.func(args)
    print(f"done in {time.perf_counter() - start:.1f}s", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
