"""Regenerate a results folder's README.md (tables) and PNG plots from its ``python -m humming bench`` JSONs.

Usage: python bench/report.py bench/results/h200   (reads every *.json there with a header and rows)

Tables: one per (op, case, shape, dtype), a row per M, a column per system (CUDA-graph us per call), then
humming (auto) over the floor, the fastest single humming route and auto over it, and the speed-up of
humming over torch-bf16 and humming-kernels (their time / humming's: above 1, humming is faster). A
check-only JSON gets the same tables of relative errors. Plots (matplotlib, the ``bench`` extra):
``<op>_time.png`` (us vs M) and ``<op>_ratio.png`` (time / floor vs M), a panel per (case, dtype) and
shape, log-x.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

README = "README.md"
#: The system whose rows are humming.linear under torch.compile (its ratio to the eager humming rows)
COMPILED = "humming-compiled"


def load(folder: Path) -> dict[str, dict]:
    """op -> the sweep document of ``folder`` (files without a header and rows are not sweeps)."""
    docs = {}
    for path in sorted(folder.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            print(f"{path}: not read ({err})", file=sys.stderr)
            continue
        if isinstance(doc, dict) and "header" in doc and "rows" in doc:
            doc["file"] = path.name
            docs[doc["header"]["op"]] = doc
    return docs


def _value_key(rows: list[dict]) -> str:
    return "graph_us" if any("graph_us" in r for r in rows) else "rel_err"


def _shape(row: dict) -> str:
    base = f"{row['n']}x{row['k']}"
    return base if "experts" not in row else f"E{row['experts']} {base} top{row['topk']}"


def _groups(rows: list[dict]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["case"], _shape(r), r["dtype"]), []).append(r)
    return groups


def _systems(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["system"] for r in rows))


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.0f}"


def _table(rows: list[dict], key: str) -> list[str]:
    systems = _systems(rows)
    by = {(r["m"], r["system"]): r for r in rows}
    ms = sorted({r["m"] for r in rows})
    timed = key == "graph_us"
    extra = ["humming / floor", "best route", "humming / best", "vs torch-bf16", "vs humming-kernels"] if timed else []
    compiled = timed and COMPILED in systems
    extra += ["compiled / humming"] if compiled else []
    head = ["M", "floor us", *systems, "humming kernel", *extra]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in ms:
        cells = [str(m), _fmt(next(r["floor_us"] for r in rows if r["m"] == m))]
        for s in systems:
            r = by.get((m, s))
            cells.append("" if r is None else "err" if "error" in r else _fmt(r.get(key)))
        auto = by.get((m, "humming"), {})
        cells.append(auto.get("kernel") or "")
        if timed:
            cells += _ratios(m, systems, by, auto.get(key))
        if compiled:
            cells.append(_over(by.get((m, COMPILED), {}).get(key), auto.get(key)))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _over(a, b) -> str:
    return _fmt(a / b) if a is not None and b else ""


def _ratios(m: int, systems: list[str], by: dict, auto: float | None) -> list[str]:
    routes = [(by[(m, s)].get("graph_us"), s) for s in systems if s.startswith("humming:") and (m, s) in by]
    routes = [(t, s) for t, s in routes if t is not None]
    best_t, best = min(routes) if routes else (None, "")
    floor = by.get((m, "humming"), {}).get("floor_us")
    torch_t = by.get((m, "torch-bf16"), {}).get("graph_us")
    peer_t = by.get((m, "humming-kernels"), {}).get("graph_us")
    return [
        _over(auto, floor),
        best.removeprefix("humming:"),
        _over(auto, best_t),
        _over(torch_t, auto),
        _over(peer_t, auto),
    ]


def _summary(rows: list[dict]) -> list[str]:
    """The headline ratios over every point: ``humming`` (the dispatcher) over the best single route, over
    humming-kernels, and ``humming-compiled`` over ``humming``."""
    by = {(r["case"], _shape(r), r["dtype"], r["m"], r["system"]): r.get("graph_us") for r in rows}
    points = {key[:4] for key in by}
    auto_best, vs_peer, compiled = [], [], []
    for point in sorted(points):
        auto = by.get((*point, "humming"))
        if auto is None:
            continue
        routes = [t for (*p, s), t in by.items() if tuple(p) == point and s.startswith("humming:") and t]
        if routes:
            auto_best.append((auto / min(routes), point))
        if by.get((*point, "humming-kernels")):
            vs_peer.append((auto / by[(*point, "humming-kernels")], point))
        if by.get((*point, COMPILED)):
            compiled.append((by[(*point, COMPILED)] / auto, point))

    def line(label: str, ratios: list, bound: float) -> str:
        if not ratios:
            return f"- {label}: no points"
        worst = max(ratios)
        within = sum(r <= bound for r, _ in ratios)
        where = " ".join(str(v) for v in worst[1])
        return f"- {label}: {within} of {len(ratios)} points at most {bound}; worst {worst[0]:.3f} ({where})"

    return [
        line("humming / best single route (CUDA-graph time)", auto_best, 1.03),
        line("humming / humming-kernels", vs_peer, 0.95),
        line("humming-compiled / humming", compiled, 1.02),
    ]


def readme(docs: dict[str, dict], folder: Path, plots: list[str]) -> str:
    title = next((d["header"]["device"]["name"] for d in docs.values()), folder.name)
    out = [f"# Benchmarks: {title}", ""]
    out += [f"Generated by `python bench/report.py {folder}` from the JSON files here; do not edit by hand.", ""]
    if not docs:
        out += [
            "No results yet. On the GPU machine: `bash bench/h200.sh` (it writes `linear.json`, `moe.json`, this",
            "file and the plots under `$OUT`); copy them here, or run `python -m humming bench linear --out",
            f"{folder}/linear.json` and `... moe --out {folder}/moe.json`, then this script.",
        ]
        return "\n".join(out) + "\n"
    for op, doc in docs.items():
        h, rows = doc["header"], doc["rows"]
        key = _value_key(rows)
        out += [f"## {op} (`{doc['file']}`)", ""]
        versions = ", ".join(f"{k} {v}" for k, v in h["versions"].items() if v)
        out += [f"- {h['date']}, {h['device']['name']}; {versions}", f"- `{h['command']}`", f"- timing: {h['timing']}"]
        out += [f"- {h['floor']} (roof {h['roofs']['copy_bytes_per_s']:.3g} B/s: {h['roofs']['source']})"]
        out += [f"- {h['shared']}"]
        if h["not_measured"]:
            out += [f"- {h['not_measured']} points not measured (time budget {h['budget_s']} s)"]
        out += [f"- skipped {name}: {reason}" for name, reason in h["skipped"].items()]
        out += [f"- ![{p}]({p})" for p in plots if p.startswith(op + "_")]
        if key == "graph_us":
            out += _summary(rows)
        unit = "CUDA-graph us per call" if key == "graph_us" else "relative error vs the float32 product"
        for (case, shape, dtype), group in _groups(rows).items():
            out += ["", f"### {case}, {shape}, {dtype} ({unit})", "", *_table(group, key)]
        out.append("")
    return "\n".join(out) + "\n"


def plot(docs: dict[str, dict], folder: Path) -> list[str]:
    """Write ``<op>_time.png`` and ``<op>_ratio.png`` for timed sweeps; returns the file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for op, doc in docs.items():
        rows = [r for r in doc["rows"] if "graph_us" in r]
        if not rows:
            continue
        groups = _groups(rows)
        panels = list(dict.fromkeys((c, d) for c, _, d in groups)), list(dict.fromkeys(s for _, s, _ in groups))
        for kind in ("time", "ratio"):
            fig, axes = plt.subplots(
                len(panels[0]), len(panels[1]), figsize=(5 * len(panels[1]), 3.6 * len(panels[0])), squeeze=False
            )
            for i, (case, dtype) in enumerate(panels[0]):
                for j, shape in enumerate(panels[1]):
                    _panel(axes[i][j], groups.get((case, shape, dtype), []), kind, f"{case} {shape} {dtype}")
            fig.tight_layout()
            name = f"{op}_{kind}.png"
            fig.savefig(folder / name, dpi=80)
            plt.close(fig)
            written.append(name)
    return written


def _panel(ax, rows: list[dict], kind: str, title: str) -> None:
    ax.set_title(title, fontsize=9)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("M")
    ax.set_ylabel("graph us" if kind == "time" else "time / floor")
    for s in _systems(rows):
        pts = sorted(
            (r["m"], r["graph_us"] / (r["floor_us"] if kind == "ratio" else 1)) for r in rows if r["system"] == s
        )
        style = dict(linewidth=0.8, linestyle="--") if s.startswith("humming:") else dict(linewidth=1.6, marker=".")
        ax.plot(*zip(*pts), label=s, **style)
    if kind == "time" and rows:
        floor = sorted({(r["m"], r["floor_us"]) for r in rows})
        ax.plot(*zip(*floor), color="black", linewidth=0.8, linestyle=":", label="floor")
        ax.set_yscale("log")
    elif rows:
        ax.axhline(1, color="black", linewidth=0.8, linestyle=":")
    ax.legend(fontsize=6)


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    folder = Path(argv[0])
    docs = load(folder)
    try:
        plots = plot(docs, folder)
    except ImportError as err:  # matplotlib is the bench extra's; the tables do not need it
        print(f"plots skipped: {err} (pip install -e '.[bench]')", file=sys.stderr)
        plots = []
    (folder / README).write_text(readme(docs, folder, plots))
    print(f"wrote {folder / README}" + "".join(f", {folder / p}" for p in plots))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
