"""Regenerate a results folder's README.md (tables) and PNG plots from its ``python -m humming bench`` JSONs.

Usage: python bench/report.py bench/results/h200   (reads every *.json there with a header and rows)

Tables: one per (op, case, shape, dtype), a row per M, a column per system (CUDA-graph us per call), then
humming (auto) over the floor, the fastest single humming route and auto over it, and the speed-up of
humming over torch (torch-bf16; moe: torch-grouped-mm) and humming-kernels (their time / humming's: above
1, humming is faster). Op moe: per model, case and dtype, a table per routing and grouped GEMM, and one
of the whole layer (its CUDA-graph and eager time, their difference, and its time over its two grouped
GEMMs'), after the issue's targets over all points. A check-only JSON gets the same tables of relative
errors. Plots (matplotlib, the ``bench`` extra), one colour per system in all of them: ``<op>_speedup.png``,
heatmaps of humming's time over humming-kernels' and over the best same-work torch baseline's per (case,
shape) and M, green where humming is faster; ``<op>_floor.png``, each system's time over the bandwidth
floor against M where that floor bounds the calls (M <= 256; linear: at the headline shape; per-kernel routes
only in the tables).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

README = "README.md"
#: The system whose rows are humming.linear under torch.compile (its ratio to the eager humming rows)
COMPILED = "humming-compiled"
PEER = "humming-kernels"
#: The torch baseline of each op's "vs torch" column
TORCH = {"linear": "torch-bf16", "moe": "torch-grouped-mm"}
#: The issue's MoE targets: the layer within this factor of its two grouped GEMMs; eager within this many us
#: of the CUDA-graph time at M up to EAGER_M
LAYER_BOUND = 1.15
EAGER_US, EAGER_M = 30.0, 16


def load(folder: Path) -> dict[str, dict]:
    """op -> the sweep document of ``folder``: ``<op>.json``, else the last other file of that op (files
    without a header and rows are not sweeps; side runs such as ``moe_gather.json`` do not replace the
    op's own file)."""
    docs = {}
    for path in sorted(folder.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            print(f"{path}: not read ({err})", file=sys.stderr)
            continue
        if isinstance(doc, dict) and "header" in doc and "rows" in doc:
            op = doc["header"]["op"]
            doc["file"] = path.name
            if docs.get(op, {}).get("file") != f"{op}.json":
                docs[op] = doc
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


def _table(rows: list[dict], key: str, baseline: str = TORCH["linear"]) -> list[str]:
    systems = _systems(rows)
    by = {(r["m"], r["system"]): r for r in rows}
    ms = sorted({r["m"] for r in rows})
    timed = key == "graph_us"
    extra = ["humming / floor", "best route", "humming / best", f"vs {baseline}", f"vs {PEER}"] if timed else []
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
            cells += _ratios(m, systems, by, auto.get(key), baseline)
        if compiled:
            cells.append(_over(by.get((m, COMPILED), {}).get(key), auto.get(key)))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _over(a, b) -> str:
    return _fmt(a / b) if a is not None and b else ""


def _ratios(m: int, systems: list[str], by: dict, auto: float | None, baseline: str) -> list[str]:
    routes = [(by[(m, s)].get("graph_us"), s) for s in systems if s.startswith("humming:") and (m, s) in by]
    routes = [(t, s) for t, s in routes if t is not None]
    best_t, best = min(routes) if routes else (None, "")
    floor = by.get((m, "humming"), {}).get("floor_us")
    torch_t = by.get((m, baseline), {}).get("graph_us")
    peer_t = by.get((m, PEER), {}).get("graph_us")
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

    return [
        _bound_line("humming / best single route (CUDA-graph time)", auto_best, 1.03),
        _bound_line("humming / humming-kernels", vs_peer, 0.95),
        _bound_line("humming-compiled / humming", compiled, 1.02),
    ]


def _bound_line(label: str, values: list[tuple[float, tuple]], bound: float, unit: str = "") -> str:
    """How many of ``values`` (``(value, point)``) are at most ``bound``, and the worst."""
    if not values:
        return f"- {label}: no points"
    worst = max(values)
    within = sum(v <= bound for v, _ in values)
    where = " ".join(str(v) for v in worst[1])
    return f"- {label}: {within} of {len(values)} points at most {bound:g}{unit}; worst {worst[0]:.3f}{unit} ({where})"


# ---------------------------------------------------------------------------------------------------- moe
PARTS = ("grouped_w13", "grouped_w2", "layer")


def _by_model(op: str, rows: list[dict]) -> bool:
    """Whether a sweep's rows are MoE rows per model, part and routing (a MoE sweep of shapes, written before
    models, gets the tables of op linear)."""
    return op == "moe" and all("model" in r for r in rows)


def _moe_point(row: dict) -> tuple:
    return (row["model"], row["case"], row["dtype"], row["routing"], f"M={row['m']}")


def _moe_summary(rows: list[dict]) -> list[str]:
    """The issue's targets over every point: humming's grouped GEMMs over humming-kernels', the layer over its
    two grouped GEMMs, and eager over CUDA-graph time at small M."""
    by = {(*_moe_point(r), r["part"], r["system"]): r for r in rows if "graph_us" in r}
    vs_peer, layer, eager = [], [], []
    for (*point, part, system), r in by.items():
        point = tuple(point)
        if system != "humming":
            continue
        peer = by.get((*point, part, PEER))
        if peer is not None and part != "layer":
            vs_peer.append((r["graph_us"] / peer["graph_us"], (*point, part)))
        if part == "layer":
            gemms = [by.get((*point, p, "humming")) for p in PARTS[:2]]
            if all(gemms):
                layer.append((r["graph_us"] / sum(g["graph_us"] for g in gemms), point))
        if r["m"] <= EAGER_M:
            eager.append((r["eager_us"] - r["graph_us"], (*point, part)))
    return [
        _geomean_line("humming grouped GEMM / humming-kernels (CUDA-graph time)", vs_peer),
        _bound_line("layer / (its two grouped GEMMs), humming", layer, LAYER_BOUND),
        _bound_line(f"eager - CUDA-graph time, humming rows at M <= {EAGER_M}", eager, EAGER_US, " us"),
    ]


def _geomean_line(label: str, ratios: list[tuple[float, tuple]]) -> str:
    if not ratios:
        return f"- {label}: no points"
    mean = math.exp(sum(math.log(r) for r, _ in ratios) / len(ratios))
    best, worst = min(ratios), max(ratios)
    return (
        f"- {label}: geometric mean {mean:.3f} over {len(ratios)} points; best {best[0]:.3f} "
        f"({' '.join(map(str, best[1]))}), worst {worst[0]:.3f} ({' '.join(map(str, worst[1]))})"
    )


def _moe_groups(rows: list[dict]) -> dict[tuple, list[dict]]:
    """(model, case, dtype, routing, part) -> rows, in the order the sweep wrote them."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["case"], r["dtype"], r["routing"], r["part"]), []).append(r)
    return groups


def _layer_table(layer: list[dict], gemms: list[dict]) -> list[str]:
    """The whole layer (humming's fused_moe) per M: CUDA-graph and eager time, their difference, its time over
    humming's two grouped GEMMs' and over the floor."""
    head = ["M", "floor us", "graph us", "eager us", "eager - graph us", "w13 + w2 us", "layer / (w13 + w2)"]
    head += ["layer / floor", "kernels"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    gemm = {(r["m"], r["part"]): r.get("graph_us") for r in gemms if r["system"] == "humming"}
    for r in sorted((r for r in layer if r["system"] == "humming"), key=lambda r: r["m"]):
        if "error" in r:
            lines.append(f"| {r['m']} | {_fmt(r['floor_us'])} | err |" + " |" * (len(head) - 3))
            continue
        parts = [gemm.get((r["m"], p)) for p in PARTS[:2]]
        both = sum(parts) if all(parts) else None
        graph, eager = r["graph_us"], r["eager_us"]
        cells = [str(r["m"]), _fmt(r["floor_us"]), _fmt(graph), _fmt(eager), _fmt(eager - graph), _fmt(both)]
        cells += [_over(graph, both), _over(graph, r["floor_us"]), r.get("kernel") or ""]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _moe_sections(rows: list[dict], key: str) -> list[str]:
    unit = "CUDA-graph us per call" if key == "graph_us" else "relative error vs the float32 product"
    groups = _moe_groups(rows)
    out = []
    for model, case, dtype in dict.fromkeys(k[:3] for k in groups):
        first = next(r for k, g in groups.items() if k[:3] == (model, case, dtype) for r in g)
        dims = f"E={first['experts']}, top-{first['topk']}"
        out += ["", f"### {model}: {case}, {dtype} ({dims})"]
        for routing in dict.fromkeys(k[3] for k in groups if k[:3] == (model, case, dtype)):
            for part in PARTS:
                group = groups.get((model, case, dtype, routing, part))
                if not group:
                    continue
                shape = f"{group[0]['n']}x{group[0]['k']}"
                if part == "layer" and key == "graph_us":
                    gemms = [r for p in PARTS[:2] for r in groups.get((model, case, dtype, routing, p), [])]
                    out += ["", f"#### {routing} routing, whole layer (fused_moe, w13 {shape})", ""]
                    out += _layer_table(group, gemms)
                else:
                    out += ["", f"#### {routing} routing, {part} ({shape}; {unit})", ""]
                    out += _table(group, key, TORCH["moe"])
    return out


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
        out += [f"- {name}: {h[name]}" for name in ("parts", "routings", "order") if name in h]
        if h["not_measured"]:
            out += [f"- {h['not_measured']} points not measured (time budget {h['budget_s']} s)"]
        out += [f"- skipped {name}: {reason}" for name, reason in h["skipped"].items()]
        out += [f"- not run: {what}: {reason}" for what, reason in h.get("unsupported", {}).items()]
        out += [f"- ![{p}]({p})" for p in plots if p.startswith(op + "_")]
        if _by_model(op, rows):
            out += _moe_summary(rows) if key == "graph_us" else []
            out += _moe_sections(rows, key)
            out.append("")
            continue
        if key == "graph_us":
            out += _summary(rows)
        unit = "CUDA-graph us per call" if key == "graph_us" else "relative error vs the float32 product"
        for (case, shape, dtype), group in _groups(rows).items():
            out += ["", f"### {case}, {shape}, {dtype} ({unit})", "", *_table(group, key)]
        out.append("")
    return "\n".join(out) + "\n"


#: One colour per system in every plot (humming's per-kernel routes: shades of humming's blue, by name).
COLORS = {
    "humming": "#1f4e9c",
    COMPILED: "#6baed6",
    PEER: "#e6550d",
    "gemlite": "#e377c2",
    "torch-bf16": "#636363",
    "torch-scaled-mm": "#9e9ac8",
    "torch-scaled-mm+quant": "#54278f",
    "torch-grouped-mm": "#636363",
    "torch-scaled-grouped-mm": "#54278f",
}
_ROUTE_COLORS = ("#08306b", "#2171b5", "#4292c6", "#08519c", "#3182bd", "#9ecae1")
#: The torch baselines that take the same inputs and make the same output as humming's call (activation
#: quantization included); ``torch-scaled-mm`` takes activations quantized beforehand, so it is left out.
SAME_WORK = {"linear": ("torch-bf16", "torch-scaled-mm+quant"), "moe": ("torch-grouped-mm", "torch-scaled-grouped-mm")}
#: The shape of the time-over-floor plot of op linear (the README quotes it; MoE: every shape), and its largest
#: M: past it the calls are compute-bound and the bandwidth floor no longer bounds them (the heatmaps show them).
FLOOR_SHAPE = "28672x8192"
FLOOR_M = 256


def color(system: str) -> str:
    if system in COLORS:
        return COLORS[system]
    return _ROUTE_COLORS[sum(map(ord, system)) % len(_ROUTE_COLORS)]


def plot(docs: dict[str, dict], folder: Path) -> list[str]:
    """Write, for each timed sweep, ``<op>_speedup.png`` (heatmaps of humming's time over humming-kernels' and
    over the best same-work torch baseline's, per case and shape x M; green where humming is faster) and
    ``<op>_floor.png`` (each system's time over the bandwidth floor against M, a panel per case, at the
    headline shape); returns the file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for op, doc in docs.items():
        rows = [r for r in doc["rows"] if "graph_us" in r]
        if not rows:
            continue
        name = f"{op}_speedup.png"
        _speedup_figure(plt, op, rows, doc["header"]["device"]["name"]).savefig(folder / name, dpi=130)
        written.append(name)
        name = f"{op}_floor.png"
        _floor_figure(plt, op, rows, doc["header"]["device"]["name"]).savefig(folder / name, dpi=130)
        written.append(name)
        plt.close("all")
    return written


def _point(row: dict) -> tuple:
    """A heatmap row: (model?, routing?, part?, case, shape)."""
    where = tuple(row[k] for k in ("model", "routing", "part") if k in row)
    return (*where, row["case"], _shape(row))


def _ratios_by_point(op: str, rows: list[dict], other) -> dict[tuple, dict[int, float]]:
    """``{point: {M: humming time / the other system's}}``; ``other(by_system)`` picks the other's time."""
    by: dict[tuple, dict[str, float]] = {}
    for r in rows:
        if "graph_us" in r:
            by.setdefault((_point(r), r["m"], r["dtype"]), {})[r["system"]] = r["graph_us"]
    out: dict[tuple, dict[int, float]] = {}
    for (point, m, dtype), times in by.items():
        theirs = other(times)
        if "humming" in times and theirs:
            out.setdefault((*point, dtype), {})[m] = times["humming"] / theirs
    return out


def _speedup_figure(plt, op: str, rows: list[dict], device: str):
    from matplotlib.colors import TwoSlopeNorm

    baselines = SAME_WORK[op]
    panels = [
        (f"humming / {PEER}", _ratios_by_point(op, rows, lambda t: t.get(PEER))),
        (
            f"humming / best torch ({', '.join(baselines)})",
            _ratios_by_point(op, rows, lambda t: min((t[s] for s in baselines if s in t), default=None)),
        ),
    ]
    points = sorted({p for _, ratios in panels for p in ratios})
    ms = sorted({r["m"] for r in rows})
    size = (3.2 + 0.62 * len(ms) * 2, 1.6 + 0.3 * len(points))
    fig, axes = plt.subplots(1, 2, figsize=size, squeeze=False, sharey=True, layout="constrained")
    norm = TwoSlopeNorm(vmin=-2, vcenter=0, vmax=2)  # log2 of the ratio: 4x faster .. 4x slower
    for ax, (title, ratios) in zip(axes[0], panels):
        grid = [[ratios.get(p, {}).get(m) for m in ms] for p in points]
        values = [[math.nan if v is None else -math.log2(v) for v in row] for row in grid]
        image = ax.imshow(values, cmap="RdYlGn", norm=norm, aspect="auto")
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                text = "n/a" if v is None else f"{v:.2f}"
                ax.text(j, i, text, ha="center", va="center", fontsize=7, color="#444" if v is None else "black")
        ax.set_xticks(range(len(ms)), [str(m) for m in ms], fontsize=8)
        ax.set_yticks(range(len(points)), [" ".join(map(str, p)) for p in points], fontsize=7)
        ax.tick_params(axis="y", labelleft=ax is axes[0][0])
        ax.set_xlabel("M (tokens)")
        ax.set_title(title, fontsize=9)
        ax.set_facecolor("#dddddd")
    bar = fig.colorbar(image, ax=axes[0].tolist(), shrink=0.6, ticks=[-2, -1, 0, 1, 2])
    bar.ax.set_yticklabels(["4x slower", "2x slower", "same", "2x faster", "4x faster"], fontsize=7)
    fig.suptitle(
        f"{op} on {device}: humming's CUDA-graph time over the other system's (green: humming is faster)", fontsize=9
    )
    return fig


def _floor_figure(plt, op: str, rows: list[dict], device: str):
    """Time over the bandwidth floor per system against M up to FLOOR_M, where the floor bounds the calls: a
    panel per case (and MoE part / routing) at FLOOR_SHAPE (MoE: every shape); humming's per-kernel routes
    are in the tables, not here."""
    from matplotlib.ticker import FuncFormatter

    rows = [r for r in rows if op != "linear" or _shape(r) == FLOOR_SHAPE]
    rows = [r for r in rows if ":" not in r["system"] and r["m"] <= FLOOR_M]
    panels: dict[tuple, list[dict]] = {}
    for r in rows:
        panels.setdefault((*_point(r), r["dtype"]), []).append(r)
    cols = min(3, len(panels))
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.4 * cols, 3.2 * nrows + 0.8), squeeze=False)
    systems = list(dict.fromkeys(r["system"] for r in rows))
    for ax, (key, group) in zip(axes.flat, panels.items()):
        for system in systems:
            pts = sorted((r["m"], r["graph_us"] / r["floor_us"]) for r in group if r["system"] == system)
            if pts:
                ax.plot(*zip(*pts), color=color(system), marker="o", markersize=3, linewidth=1.4, label=system)
        ax.axhline(1, color="black", linewidth=0.8, linestyle=":")
        ax.set_xscale("log", base=2)
        ms = sorted({r["m"] for r in group})
        ax.set_xticks(ms, [str(m) for m in ms])
        ax.set_yscale("log")
        plain = FuncFormatter(lambda v, _: f"{v:g}")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if v >= 1 else ""))
        ax.set_xlabel("M (tokens)", fontsize=8)
        ax.set_ylabel("time / floor", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_title(" ".join(map(str, key)), fontsize=9)
        ax.grid(True, which="major", linewidth=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    handles = [plt.Line2D([], [], color=color(s), marker="o", markersize=3, linewidth=1.4) for s in systems]
    fig.legend(handles, systems, loc="lower center", ncol=len(systems), fontsize=8, frameon=False)
    fig.suptitle(
        f"{op} on {device}, memory-bound M (<= {FLOOR_M}): CUDA-graph time over the bandwidth floor (1 = the floor; "
        "lower is faster)",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    return fig


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
