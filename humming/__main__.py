"""Command line: ``python -m humming demo`` (the main job), ``inspect PATH`` (a checkpoint), ``explain`` (which
kernel a call runs), ``tune`` (a GPU's dispatch table) and ``bench`` (sweeps against torch and the other kernel
libraries). ``--json`` on inspect, explain, tune and bench prints the same facts as JSON; errors go to stderr with
exit status 1 (2 for a bad command line)."""

from __future__ import annotations

import argparse
import sys
import time

import torch
from tqdm import tqdm

import humming

from ._cli import Formatter, print_json, print_table, size

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
        backend = humming.explain(qw, x.shape[0], act, dtype=x.dtype).kernel
        ms = _time_ms(lambda qw=qw, act=act: humming.linear(x, qw, act=act)) if device == "cuda" else None
        rows.append((label, qw.nbytes, err, backend, ms))
    table = [
        [
            label,
            nbytes,
            f"{8 * nbytes / (n * k):.2f}",
            f"{err:.2e}",
            backend,
            "n/a" if ms is None else f"{ms * 1e3:.1f}us",
        ]
        for label, nbytes, err, backend, ms in rows
    ]
    print_table(
        ["format", "bytes", "bits/w", "rel.err", "kernel", "time"], table, right=("bytes", "bits/w", "rel.err", "time")
    )
    return 0


def inspect(args: argparse.Namespace) -> int:
    """List a checkpoint's quantized modules (stdout) and what would not load, with the reason (stderr)."""
    from .loaders.summary import checkpoint_summary

    summary = checkpoint_summary(args.path, args.modules)
    if args.json:
        print_json(summary)
    else:
        print(f"{summary['path']}: {summary['format']}")
        rows = [[m["name"], "x".join(map(str, m["shape"])), m["layout"], size(m["bytes"])] for m in summary["modules"]]
        print_table(["module", "shape", "format / layout", "bytes"], rows, right=("bytes",))
        print(f"{len(rows)} quantized modules, {size(summary['bytes'])}")
        print(f"{summary['unquantized']} unquantized tensors (left out)")
    for failed in summary["failed"]:
        print(f"NOT LOADED {failed['name']}: {failed['reason']}", file=sys.stderr)
    if summary["failed"]:
        print(f"{len(summary['failed'])} quantized modules would not load", file=sys.stderr)
    return 1 if summary["failed"] else 0


def explain(args: argparse.Namespace) -> int:
    """The kernel ``humming.linear`` runs for a weight of this scheme and shape at M tokens, and why not others."""
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    qargs = dict(weight=args.weight, zero_point=args.zero_point)
    if args.group_size is not None:
        qargs["group_size"] = _group_size(args.group_size)
    qw = humming.quantize(torch.randn(args.n, args.k, device=device, dtype=torch.bfloat16), **qargs)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    plan = humming.explain(qw, args.m, args.act, dtype=dtype, backend=args.backend)
    if args.json:
        print_json(
            dict(
                weight=qw.describe(),
                shape=list(qw.shape),
                m=args.m,
                act=args.act,
                device=str(qw.device),
                kernel=plan.kernel,
                backend=plan.backend,
                layout=plan.layout,
                tuning=None if plan.tuning is None else str(plan.tuning),
                source=plan.source,
                rejected=[dict(kernel=name, reason=reason) for name, reason in plan.rejected],
            )
        )
    else:
        print(f"{qw.describe()} {args.n}x{args.k}, M={args.m}, act={args.act}, on {qw.device}:")
        print(plan)
    return 0


def _group_size(text: str):
    """``--group-size``: an int (``-1``: per-channel), ``tensor``, or ``BNxBK`` blocks."""
    if text == "tensor":
        return text
    try:
        parts = [int(v) for v in text.lower().split("x")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int, 'tensor' or BNxBK, got {text!r}") from None
    if len(parts) not in (1, 2):
        raise argparse.ArgumentTypeError(f"expected an int, 'tensor' or BNxBK, got {text!r}")
    return parts[0] if len(parts) == 1 else tuple(parts)


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
    """An argparse type: a positive int (sizes)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    """The one parser of ``python -m humming``: a subcommand each."""
    from . import bench
    from .dispatch import tune

    top = argparse.ArgumentParser(prog="humming", description=__doc__, formatter_class=Formatter)
    top.add_argument("--version", action="version", version=_version_text())
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add = lambda name, func, **kw: sub.add_parser(name, formatter_class=Formatter, description=func.__doc__, **kw)

    p = add("demo", demo, help="quantize an example layer in many formats and compare (CPU or GPU)")
    p.add_argument("--n", type=_positive, default=1024, help="output features")
    p.add_argument("--k", type=_positive, default=1024, help="input features")
    p.add_argument("--m", type=_positive, default=16, help="tokens")
    p.add_argument("--seed", type=int, default=0, help="seed of the layer's weights and inputs")
    p.add_argument("--cpu", action="store_true", help="stay on the CPU even when a GPU is present")
    p.set_defaults(func=demo)

    p = add("inspect", inspect, help="list the quantized modules of a checkpoint folder")
    p.add_argument("path", help="checkpoint folder (config.json + *.safetensors)")
    p.add_argument("--modules", nargs="*", default=None, help="only these module names / shell wildcards")
    p.add_argument("--json", action="store_true", help="print the modules and failures as JSON on stdout")
    p.set_defaults(func=inspect)

    p = add("explain", explain, help="which kernel humming.linear runs for a weight scheme, shape and M")
    p.add_argument("--weight", default="int4", help="format or scheme, as humming.quantize (int4, nvfp4, fp8_block...)")
    p.add_argument("--group-size", default=None, help="int, -1 (per-channel), tensor or BNxBK; default: the scheme's")
    p.add_argument("--zero-point", action="store_true", help="integer zero points (uintN)")
    p.add_argument("--n", type=_positive, default=4096, help="output features")
    p.add_argument("--k", type=_positive, default=4096, help="input features")
    p.add_argument("--m", type=_positive, default=16, help="tokens")
    p.add_argument("--act", default=None, help="activation scheme (fp8, int8, nvfp4...); default: 16-bit")
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16", help="activation dtype")
    p.add_argument("--backend", default="auto", help="auto, reference, triton or cuda")
    p.add_argument("--device", default=None, help="device of the weight; default: cuda if present, else cpu")
    p.add_argument("--json", action="store_true", help="print the plan as JSON on stdout")
    p.set_defaults(func=explain)

    p = add("tune", tune.run, help="measure the kernels on this GPU and write its dispatch table")
    p.description = tune.__doc__
    tune.add_arguments(p)
    p.set_defaults(func=tune.run, parser=p)

    p = add("bench", bench.run, help="time humming against torch, gemlite and humming-kernels")
    p.description = bench.__doc__
    bench.add_arguments(p)
    p.set_defaults(func=bench.run, parser=p)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    start = time.perf_counter()
    try:  # tune and bench report their own usage errors through their parser (exit status 2)
        status = args.func(args, args.parser) if "parser" in vars(args) else args.func(args)
    except (ValueError, TypeError, OSError) as err:  # CheckpointError is a ValueError
        print(f"humming {args.command}: error: {err}", file=sys.stderr)
        return 1
    if not getattr(args, "json", False):
        print(f"done in {time.perf_counter() - start:.1f}s", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
