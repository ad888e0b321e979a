"""``python -m humming tune``: measure every kernel that can run each (weight format, activation scheme, M)
on this GPU and write the dispatcher's table for it (``sm<arch>_<SMs>sm_<device>.json`` in the user data folder
unless ``--out`` says otherwise; ``HUMMING_TABLES_DIR`` points the dispatcher at it).

For each case, shape and M, every dense kernel that supports the call is timed (CUDA-graph time, weight
copies past the L2, :mod:`humming.timing`) with the tuning it would run; the table's order for each shape
and M sorts kernels by time (the dispatcher takes the nearest measured shape). The raw timings are kept
in the file, so that a table can be rebuilt (``--from-timings``) when the selection logic changes.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from .._cli import Formatter, print_json, print_table

__all__ = ["CASES", "add_arguments", "main", "run", "table_file_name", "tune", "user_tables_dir"]

#: name -> (humming.quantize arguments, activation scheme): the formats serving runs.
CASES = {
    "w4a16-int4-g128": (dict(weight="int4", group_size=128), None),
    "w4a16-int4-g32": (dict(weight="int4", group_size=32), None),
    "w4a16-uint4-g128-zp": (dict(weight="int4", group_size=128, zero_point=True), None),
    "w8a16-int8-channel": (dict(weight="int8", group_size=-1), None),
    "w8a16-e4m3-channel": (dict(weight="e4m3", group_size=-1), None),
    "mxfp4-a16": (dict(weight="mxfp4"), None),
    "nvfp4-a16": (dict(weight="nvfp4"), None),
    "w8a8-fp8-channel": (dict(weight="e4m3", group_size=-1), "fp8"),
    "w8a8-fp8-block": (dict(weight="fp8_block"), "fp8_g128"),
    "w8a8-int8-channel": (dict(weight="int8", group_size=-1), "int8"),
    "w4a8-int4-g128-fp8": (dict(weight="int4", group_size=128), "fp8"),
    "w4a8-int4-channel-fp8": (dict(weight="int4", group_size=-1), "fp8"),
    "w4a8-mxfp4-fp8": (dict(weight="mxfp4"), "fp8"),
}


def _parse_shapes(text: str) -> list[tuple[int, int]]:
    """``"NxK,NxK"`` -> ``[(N, K), ...]`` of positive sizes (argparse reports the error with the option)."""
    try:
        shapes = [tuple(int(v) for v in s.lower().split("x")) for s in text.split(",")]
    except ValueError:
        shapes = []
    if not shapes or any(len(s) != 2 or min(s) < 1 for s in shapes):
        raise argparse.ArgumentTypeError(f"expected positive NxK[,NxK...], got {text!r}")
    return shapes


def _parse_ints(text: str) -> list[int]:
    """``"1,16,64"`` -> ``[1, 16, 64]``: positive token counts."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return values


def tune(cases: list[str], shapes: list[tuple[int, int]], m_values: list[int], progress: bool = True) -> dict:
    """Time every supported dense kernel for each case, shape and M on the current GPU; returns the table
    (``entries``: per weight, act and M, the kernel order) with the raw ``timings``."""
    import humming

    from ..device import device_info
    from ..ir.activation import get_act_scheme
    from ..timing import copies_past_l2
    from .kernels import DENSE_KERNELS
    from .plan import act_key, weight_key

    unknown = [c for c in cases if c not in CASES]
    if unknown:
        raise ValueError(f"cases: unknown {unknown}; known: {sorted(CASES)}")
    info = device_info()
    timings = []
    jobs = [(c, s) for c in cases for s in shapes]
    for case, (n, k) in tqdm(jobs, desc="humming tune", unit="case x shape", disable=not progress, file=sys.stderr):
        qargs, act_name = CASES[case]
        act = None if act_name is None else get_act_scheme(act_name)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / math.sqrt(k)
        first = humming.quantize(w, **qargs)
        copies = [first] + [humming.quantize(w, **qargs) for _ in range(copies_past_l2(first.nbytes) - 1)]
        for index, m in enumerate(m_values):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            warm = index == 0  # the first timing after the weights are made runs slow: done twice, kept once
            for name, kernel in DENSE_KERNELS.items():
                if name == "reference" or kernel.unsupported(first, act, x) is not None:
                    continue
                tuning = kernel.tuning(first, act, x)
                if warm:
                    _time_kernel(kernel, x, copies, act, tuning)
                    warm = False
                row = _time_kernel(kernel, x, copies, act, tuning)
                timings.append(
                    dict(
                        case=case,
                        weight=weight_key(first),
                        act=act_key(act),
                        n=n,
                        k=k,
                        m=m,
                        kernel=name,
                        tuning=str(tuning),
                        **row,
                    )
                )
            del x
        del copies, first, w
        torch.cuda.empty_cache()
    return dict(
        device=info.name,
        capability=list(info.capability),
        sm_count=info.sm_count,
        generated_by="python -m humming tune " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["tune"] else []),
        versions=dict(humming=humming.__version__, torch=torch.__version__, triton=_version("triton")),
        entries=_entries(timings),
        timings=timings,
    )


def _time_kernel(kernel, x, copies, act, tuning) -> dict:
    from ..timing import time_calls

    return time_calls([lambda qw=qw: kernel.run(x, qw, None, act, torch.bfloat16, tuning) for qw in copies])


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def merge_bench_timings(table: dict, bench: dict) -> list[dict]:
    """``table``'s timings with the ``humming:<kernel>`` rows of a ``humming bench linear`` sweep (the
    same measurement: each kernel with the tuning it would run) in place of those of the same weight, act,
    shape, M and kernel. The sweep must come from the table's device."""
    header = bench["header"]
    if header["op"] != "linear" or header["device"]["name"] != table["device"]:
        raise ValueError(
            f"--add-bench: expected a linear sweep of {table['device']}, got op {header['op']!r} on "
            f"{header['device']['name']}"
        )
    fields = ("case", "weight", "act", "n", "k", "m", "kernel", "graph_us", "eager_us")
    added = {}
    for row in bench["rows"]:
        if row["system"].startswith("humming:") and "graph_us" in row:
            key = (row["weight"], row["act"], row["n"], row["k"], row["m"], row["kernel"])
            if key not in added or row["graph_us"] < added[key]["graph_us"]:  # bf16 and fp16 rows: the faster
                added[key] = {f: row[f] for f in fields} | {"source": "bench"}
    kept = [r for r in table["timings"] if (r["weight"], r["act"], r["n"], r["k"], r["m"], r["kernel"]) not in added]
    return kept + list(added.values())


def _entries(timings: list[dict]) -> list[dict]:
    """Per (weight, act, shape, M): the kernels ordered by measured time, with each one's time over the
    fastest (``slowdown``)."""
    groups: dict = {}
    for row in timings:
        groups.setdefault((row["weight"], row["act"], row["n"], row["k"], row["m"]), []).append(row)
    entries = []
    for (weight, act, n, k, m), rows in sorted(groups.items()):
        fastest = {}
        for r in rows:  # several cases may share a key (same format, other group size): keep each kernel's best
            fastest[r["kernel"]] = min(fastest.get(r["kernel"], math.inf), r["graph_us"])
        order = sorted(fastest, key=fastest.get)
        best = fastest[order[0]]
        slowdown = {kern: round(fastest[kern] / best, 3) for kern in order}
        entries.append(dict(weight=weight, act=act, n=n, k=k, m_max=m, order=order, slowdown=slowdown))
    return entries


def verify(table: dict, table_dir: Path, progress: bool = True) -> list[dict]:
    """``humming.linear`` ("auto", deciding with the tables of ``table_dir``) against the fastest kernel
    of ``table``'s timings, both timed now, one after the other, on every case, shape and M; each row gives
    the kernel auto ran and its time over the fastest kernel's."""
    import os

    import humming

    from ..ir.activation import get_act_scheme
    from ..timing import copies_past_l2, time_calls
    from . import plan
    from .kernels import DENSE_KERNELS

    os.environ["HUMMING_TABLES_DIR"] = str(table_dir)
    plan.load_tables.cache_clear()
    best: dict = {}
    for r in table["timings"]:
        key = (r["case"], r["n"], r["k"], r["m"])
        if key not in best or r["graph_us"] < best[key]["graph_us"]:
            best[key] = r
    shapes = sorted({(c, n, k) for c, n, k, _ in best})
    rows = []
    for case, n, k in tqdm(shapes, desc="humming tune --verify", disable=not progress, file=sys.stderr):
        qargs, act_name = CASES[case]
        act = None if act_name is None else get_act_scheme(act_name)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / math.sqrt(k)
        first = humming.quantize(w, **qargs)
        copies = [first] + [humming.quantize(w, **qargs) for _ in range(copies_past_l2(first.nbytes) - 1)]
        for (c, bn, bk, m), fastest in sorted(best.items()):
            if (c, bn, bk) != (case, n, k):
                continue
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            auto = time_calls([lambda qw=qw, x=x, a=act: humming.linear(x, qw, act=a) for qw in copies])
            kernel = DENSE_KERNELS[fastest["kernel"]]
            direct = _time_kernel(kernel, x, copies, act, kernel.tuning(first, act, x))
            rows.append(
                dict(
                    case=case,
                    n=n,
                    k=k,
                    m=m,
                    kernel=humming.explain(first, m, act).kernel,
                    graph_us=auto["graph_us"],
                    eager_us=auto["eager_us"],
                    best_kernel=fastest["kernel"],
                    best_graph_us=direct["graph_us"],
                    ratio=auto["graph_us"] / direct["graph_us"],
                )
            )
        del copies, first, w
        torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="humming tune", description=__doc__, formatter_class=Formatter)
    add_arguments(parser)
    return run(parser.parse_args(argv), parser)


def table_file_name(table: dict) -> str:
    """``sm<arch>_<SMs>sm_<device>.json``: GPUs of one compute capability and SM count (an H100 SXM and an
    H200) get tables of their own, which the dispatcher tells apart by the device name they record."""
    arch = table["capability"][0] * 10 + table["capability"][1]
    device = re.sub(r"[^a-z0-9]+", "-", table["device"].lower()).strip("-")
    return f"sm{arch}_{table['sm_count']}sm_{device}.json"


def user_tables_dir() -> Path:
    """Where ``tune`` writes tables by default: the user data folder's ``humming/tables`` (``platformdirs``:
    ``$XDG_DATA_HOME/humming/tables``, else ``~/.local/share/humming/tables`` on Linux)."""
    import platformdirs

    return Path(platformdirs.user_data_dir("humming", appauthor=False)) / "tables"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``python -m humming tune``'s options."""
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated cases (weight format x activations)")
    parser.add_argument(
        "--shapes", type=_parse_shapes, default="28672x8192,8192x8192,7168x2048", help="weight shapes NxK,NxK..."
    )
    parser.add_argument(
        "--m", type=_parse_ints, default="1,16,32,64,128,256,512,1024,4096", help="token counts M,M,... to time"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the table to write (default: sm<arch>_<SMs>sm.json in the user data folder, "
        f"{user_tables_dir()}; HUMMING_TABLES_DIR=<its folder> makes the dispatcher read it)",
    )
    parser.add_argument(
        "--verify", type=Path, default=None, help="then time humming.linear with the new table; rows to this JSON"
    )
    parser.add_argument(
        "--from-timings", type=Path, default=None, help="rebuild the table from a tune JSON's raw timings (no GPU)"
    )
    parser.add_argument(
        "--add-bench",
        type=Path,
        action="append",
        default=None,
        help="with --from-timings: also take the per-kernel rows of a `humming bench linear` JSON (same device); "
        "repeat it for several sweeps, later ones replacing earlier ones' timings of the same point",
    )
    parser.add_argument("--json", action="store_true", help="print what was written as JSON on stdout")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Measure (or rebuild) the table ``args`` describes and write it."""
    unknown = sorted(set(args.cases.split(",")) - set(CASES))
    if unknown:
        parser.error(f"--cases: unknown case(s) {unknown}; known: {', '.join(CASES)}")
    if args.add_bench is not None and args.from_timings is None:
        parser.error("--add-bench: needs --from-timings (the table whose timings it joins)")
    if args.from_timings is not None:
        table = json.loads(args.from_timings.read_text())
        for bench in args.add_bench or ():
            table["timings"] = merge_bench_timings(table, json.loads(bench.read_text()))
        table["entries"] = _entries(table["timings"])
    elif not torch.cuda.is_available():
        parser.error("tune measures kernels on a CUDA GPU; none is visible")
    else:
        table = tune(args.cases.split(","), args.shapes, args.m)
    out = args.out or user_tables_dir() / table_file_name(table)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table, indent=1) + "\n")
    summary = dict(out=str(out), entries=len(table["entries"]), timings=len(table["timings"]))
    if args.verify is not None:
        rows = verify(table, out.parent)
        args.verify.write_text(json.dumps(dict(device=table["device"], rows=rows), indent=1) + "\n")
        summary.update(verify=str(args.verify), worst=max(rows, key=lambda r: r["ratio"]))
    if args.json:
        print_json(summary)
        return 0
    print(f"wrote {out}: {len(table['entries'])} entries from {len(table['timings'])} timings")
    if args.out is None:
        print(f"the dispatcher reads it with HUMMING_TABLES_DIR={out.parent}")
    if args.verify is not None:
        worst = summary["worst"]
        print_table(
            ["case", "shape", "M", "auto ran", "fastest", "auto / fastest"],
            [
                [
                    worst["case"],
                    f"{worst['n']}x{worst['k']}",
                    worst["m"],
                    worst["kernel"],
                    worst["best_kernel"],
                    f"{worst['ratio']:.3f}",
                ]
            ],
            right=("M", "auto / fastest"),
        )
        print(f"(the worst point of {len(rows)}); wrote {args.verify}")
    return 0
