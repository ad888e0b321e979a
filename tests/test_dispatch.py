"""The one decision (humming/dispatch/plan.py): table lookup by M, the heuristic, unknown devices, overrides,
caching, explain, logging, deterministic mode, and that every plan and table entry names a real kernel."""

from __future__ import annotations

import json
import logging

import pytest
import torch

import humming
from humming.dispatch import plan as dispatch
from humming.dispatch.kernels import DENSE_KERNELS, GROUPED_KERNELS
from humming.dispatch.support import combination_error
from humming.ir.activation import get_act_scheme


def _weight(weight="int4", group_size=32, n=48, k=64, **kwargs):
    return humming.quantize(torch.randn(n, k), weight, group_size=group_size, **kwargs)


def _table(tmp_path, entries, capability=(9, 0), sm_count=132) -> dispatch.Table:
    path = tmp_path / "table.json"
    path.write_text(json.dumps(dict(capability=list(capability), sm_count=sm_count, entries=entries)))
    (table,) = dispatch.load_tables(str(tmp_path))
    return table


def _order(qw, act, m, **overrides):
    kwargs = dict(requested="auto", on_cuda=True, grouped=False, deterministic=False, table=None)
    kwargs.update(overrides)
    return dispatch.candidate_order(qw, None if act is None else get_act_scheme(act), m, **kwargs)


def test_heuristic_order_by_activation_and_m():
    qw = _weight()
    assert _order(qw, None, 1) == (("cuda.wna16_sm90", "cuda.wna16_decode", "triton.wna16", "reference"), "heuristic")
    assert _order(qw, "fp8", 16)[0][:2] == ("cuda.wna16_decode", "cuda.fp8_gemm")
    assert _order(qw, "fp8", 17)[0][:2] == ("cuda.fp8_gemm", "cuda.wna16_sm90")  # the W4A8 route above M = 16
    assert _order(humming.quantize(torch.randn(32, 64), "nvfp4"), "nvfp4", 64)[0][0] == "cuda.fp4_gemm"


@pytest.mark.parametrize(
    ("weight", "act", "first"),
    [
        ("fp8_block", "fp8_g128", "triton.grouped"),  # DeepSeek-V3's experts: Triton first (moe.json)
        ("int4", None, "cuda.grouped_decode"),  # 16-bit activations: the decode regime's kernel, then sm_90a
        ("mxfp4", None, "cuda.grouped_decode"),
        ("int4", "fp8", "cuda.grouped"),  # per-token e4m3 activations: not the measured fp8-block case
    ],
)
def test_grouped_heuristic_order(weight, act, first):
    qw = humming.quantize(torch.randn(256, 256), weight, **({"group_size": 128} if weight == "int4" else {}))
    order, source = _order(qw, act, 1, grouped=True)
    assert order[0] == first and source == "heuristic"
    assert set(order) - {"cuda.grouped_decode"} == {"cuda.grouped", "triton.grouped", "reference"}
    assert order[-1] == "reference"
    assert ("cuda.grouped_decode" in order) == (act is None)


def test_table_applies_to_its_m_range_only(tmp_path):
    qw = _weight()
    table = _table(
        tmp_path,
        [
            dict(weight="int4+group", act="fp8", n=48, k=64, m_max=16, order=["cuda.fp8_gemm"]),
            dict(weight="int4+group", act="fp8", n=48, k=64, m_max=256, order=["triton.scaled_mm", "cuda.fp8_gemm"]),
        ],
    )
    order, source = _order(qw, "fp8", 1, table=table)
    assert order[0] == "cuda.fp8_gemm" and source == "table table.json"
    assert set(order) == set(_order(qw, "fp8", 1)[0])  # the heuristic's other kernels follow the table's
    assert _order(qw, "fp8", 17, table=table)[0][:2] == ("triton.scaled_mm", "cuda.fp8_gemm")
    assert _order(qw, "fp8", 256, table=table)[0][0] == "triton.scaled_mm"
    # past the largest measured M: the heuristic, never a small-M entry
    assert _order(qw, "fp8", 257, table=table) == _order(qw, "fp8", 257)
    assert _order(qw, None, 16, table=table) == _order(qw, None, 16)  # no entry for this act
    assert _order(_weight(zero_point=True), "fp8", 1, table=table)[1] == "heuristic"  # uint4+zp: another key
    assert _order(_weight(group_size=-1), "fp8", 1, table=table)[1] == "heuristic"  # per-channel: another key


def test_table_takes_the_nearest_measured_shape(tmp_path):
    entry = lambda n, k, kernel: dict(weight="int4+group", act="none", n=n, k=k, m_max=64, order=[kernel])
    table = _table(
        tmp_path,
        [
            entry(28672, 8192, "cuda.wna16_sm90"),
            entry(2048, 7168, "triton.wna16"),
            entry(7168, 2048, "cuda.wna16_decode"),
        ],
    )
    assert table.order("int4+group", "none", 64, 24576, 8192) == ("cuda.wna16_sm90",)
    assert table.order("int4+group", "none", 64, 1536, 6144) == ("triton.wna16",)
    assert table.order("int4+group", "none", 64, 8192, 2048) == ("cuda.wna16_decode",)
    assert table.order("int4+group", "none", 65, 8192, 2048) is None


def test_table_with_an_unknown_kernel_is_refused(tmp_path):
    (tmp_path / "bad.json").write_text(
        json.dumps(
            dict(
                capability=[9, 0],
                sm_count=132,
                entries=[dict(weight="int4+group", act="none", m_max=1, order=["cuda.nope"])],
            )
        )
    )
    with pytest.raises(ValueError, match="unknown kernel"):
        dispatch.load_tables(str(tmp_path))


def test_weight_keys_tell_apart_what_changes_the_kernels():
    keys = {
        dispatch.weight_key(humming.quantize(torch.randn(32, 64), *args, **kwargs))
        for args, kwargs in [
            (("mxfp4",), {}),
            (("nvfp4",), {}),
            (("int4",), dict(group_size=32)),
            (("int4",), dict(group_size=32, zero_point=True)),
        ]
    }
    assert keys == {"e2m1+e8m0+group", "e2m1+e4m3scales+group", "int4+group", "uint4+group+zp"}
    layouts = {
        dispatch.weight_key(humming.quantize(torch.randn(256, 256), "int4", group_size=g)) for g in (32, 128, -1)
    }
    assert layouts == {"int4+group", "int4+channel"}  # group sizes share rows; per-channel has its own
    assert dispatch.weight_key(humming.quantize(torch.randn(256, 256), "fp8_block")) == "e4m3+block"


def test_a_table_of_the_gpus_own_name_comes_before_one_of_its_kind(fake_cuda_device, tmp_path, monkeypatch):
    """GPUs of one compute capability and SM count (an H100 SXM and an H200) each take a table measured on a
    GPU of their name, else the first of their kind; humming tune names each table's file after its GPU."""
    from humming.dispatch.tune import table_file_name

    kind = dict(capability=[9, 0], sm_count=132, entries=[])
    names = {}
    for device in ("NVIDIA H200", "NVIDIA H100 80GB HBM3"):
        names[device] = table_file_name(dict(kind, device=device))
        (tmp_path / names[device]).write_text(json.dumps(dict(kind, device=device)))
    assert names["NVIDIA H100 80GB HBM3"] == "sm90_132sm_nvidia-h100-80gb-hbm3.json"
    monkeypatch.setenv("HUMMING_TABLES_DIR", str(tmp_path))
    for device in names:
        fake_cuda_device((9, 0), sm_count=132, name=device)
        assert dispatch._table_for(torch.device("cuda", 0)).path.endswith(names[device])
    fake_cuda_device((9, 0), sm_count=132, name="NVIDIA H800")  # no table of its own: the first of its kind
    assert dispatch._table_for(torch.device("cuda", 0)).path.endswith(sorted(names.values())[0])


def test_a_gpus_own_table_serves_its_cases_and_its_kinds_table_the_rest(fake_cuda_device, tmp_path, monkeypatch):
    """A table tuned on one GPU for some cases only (``humming tune --cases``) keeps the rows of its kind's
    table for every other case and for the M its own rows do not reach; the plan names the file its rows came
    from."""
    from humming.dispatch.tune import table_file_name

    def row(weight, act, order):
        return dict(weight=weight, act=act, n=48, k=64, m_max=64, order=order)

    kind = dict(capability=[9, 0], sm_count=132)
    generic = dict(kind, device="NVIDIA H200", entries=[row("int4+group", "fp8", ["cuda.fp8_gemm"])])
    generic["entries"].append(row("int4+group", "none", ["triton.wna16"]))
    generic["entries"].append(dict(row("int4+group", "fp8", ["triton.scaled_mm"]), m_max=4096))
    own = dict(kind, device="NVIDIA H100 80GB HBM3", entries=[row("int4+group", "fp8", ["cuda.wna16_decode"])])
    for table in (generic, own):
        (tmp_path / table_file_name(table)).write_text(json.dumps(table))
    monkeypatch.setenv("HUMMING_TABLES_DIR", str(tmp_path))
    fake_cuda_device((9, 0), sm_count=132, name=own["device"])
    table = dispatch._table_for(torch.device("cuda", 0))
    qw = _weight()
    order, source = _order(qw, "fp8", 16, table=table)
    assert order[0] == "cuda.wna16_decode" and source == f"table {table_file_name(own)}"
    order, source = _order(qw, None, 16, table=table)
    assert order[0] == "triton.wna16" and source == f"table {table_file_name(generic)}"
    order, source = _order(qw, "fp8", 1000, table=table)  # past the M the GPU's own rows reach
    assert order[0] == "triton.scaled_mm" and source == f"table {table_file_name(generic)}"
    assert _order(_weight("int8", group_size=-1), None, 16, table=table) == _order(
        _weight("int8", group_size=-1), None, 16
    )  # in neither table: the heuristic


def test_unknown_device_gets_no_table(fake_cuda_device):
    fake_cuda_device((8, 9), sm_count=128)
    assert dispatch._table_for(torch.device("cuda", 0)) is None


@pytest.mark.parametrize("table", dispatch.load_tables(), ids=lambda t: t.path.rsplit("/", 1)[-1])
def test_committed_tables_name_real_kernels_for_valid_combinations(table):
    assert table.entries, "a committed table has entries"
    for (weight, act), shapes in table.entries.items():
        fmt = humming.get_format(weight.split("+")[0])
        layouts = {"group", "channel", "block", "tensor"}
        assert len(set(weight.split("+")) & layouts) == 1, weight  # every key names its scale layout
        assert set(weight.split("+")[1:]) <= {"e8m0", "e4m3scales", "zp", "actorder"} | layouts, weight
        scheme = None if act == "none" else get_act_scheme(act)
        assert combination_error(fmt, scheme) is None, (weight, act)
        for rows in shapes.values():
            for _, order in rows:
                assert order and all(k in DENSE_KERNELS and k != "reference" for k in order), order


def test_overrides_and_cpu(monkeypatch):
    qw = _weight()
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    assert _order(qw, None, 3, on_cuda=False) == (("reference",), _order(qw, None, 3, on_cuda=False)[1])
    plan = dispatch.plan_linear(qw, None, x)
    assert plan.kernel == "reference" and "CPU" in plan.source
    plan = dispatch.plan_linear(qw, None, x, backend="triton")
    assert plan.kernel == "triton.wna16" and plan.source == "backend='triton'"
    assert plan.tuning is not None and plan.tuning.block_m >= 1
    monkeypatch.setenv("HUMMING_BACKEND", "triton")
    assert dispatch.plan_linear(_weight(), None, x).kernel == "triton.wna16"
    monkeypatch.setenv("HUMMING_BACKEND", "tpu")
    with pytest.raises(ValueError, match="HUMMING_BACKEND: expected one of"):
        dispatch.plan_linear(qw, None, x)
    monkeypatch.delenv("HUMMING_BACKEND")
    cuda_reasons = r"backend 'cuda' cannot run this call: cuda\.wna16_sm90: .*cuda\.wna16_decode: "
    with pytest.raises(ValueError, match=cuda_reasons):
        humming.linear(x, qw, backend="cuda")


def test_plans_are_cached_per_weight_and_call_shape(monkeypatch):
    qw = _weight()
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    decided = []
    decide = dispatch._decide
    monkeypatch.setattr(dispatch, "_decide", lambda *a: decided.append(a[2].shape[0]) or decide(*a))
    first = dispatch.plan_linear(qw, None, x, "triton")
    assert dispatch.plan_linear(qw, None, x.clone(), "triton") is first
    dispatch.plan_linear(qw, None, x[:2], "triton")
    dispatch.plan_linear(qw, get_act_scheme("fp8"), x, "triton")
    assert decided == [5, 2, 5]


def test_explain_names_the_kernel_and_why_not_the_others():
    qw = _weight()
    plan = humming.explain(qw, 4, act="fp8", backend="triton")
    assert plan.kernel == "triton.scaled_mm"
    text = str(plan)
    assert text.startswith("triton.scaled_mm (backend triton, layout ir) chosen by backend='triton'")
    assert "not triton.wna16: the WnA16 GEMM takes 16-bit activations" in text
    assert humming.explain(qw, 1).kernel == "reference"
    experts = humming.stack([_weight(), _weight()])
    assert humming.explain(experts, 20, backend="triton").kernel == "triton.grouped"
    with pytest.raises(ValueError, match="m: expected a positive"):
        humming.explain(qw, 0)


def test_log_dispatch_logs_each_decision_once(monkeypatch, caplog):
    monkeypatch.setenv("HUMMING_LOG_DISPATCH", "1")
    qw = _weight()
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    with caplog.at_level(logging.WARNING, logger="humming.dispatch"):
        for _ in range(3):
            humming.linear(x, qw)
    lines = [r.getMessage() for r in caplog.records if r.name == "humming.dispatch"]
    assert len(lines) == 1 and "-> reference" in lines[0], lines


@pytest.mark.parametrize(
    "qargs, act",
    [
        (dict(weight="int4", group_size=32), None),
        (dict(weight="int8", group_size=-1), "int8"),
        (dict(weight="e4m3", group_size=-1), "fp8"),
        (dict(weight="int4", group_size=32), "fp8"),
        (dict(weight="nvfp4"), "nvfp4"),
        (dict(weight="mxfp4"), None),
    ],
    ids=lambda v: str(v),
)
@pytest.mark.parametrize("backend", ["auto", "triton", "reference"])
def test_every_plan_names_a_kernel_that_runs_the_call(qargs, act, backend):
    qw = humming.quantize(torch.randn(32, 64), **qargs)
    scheme = None if act is None else get_act_scheme(act)
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    plan = dispatch.plan_linear(qw, scheme, x, backend)
    kernel = DENSE_KERNELS[plan.kernel]
    assert kernel.backend == plan.backend and kernel.unsupported(qw, scheme, x) is None
    ref = humming.linear(x, qw, act=act, backend="reference").float()
    out = humming.linear(x, qw, act=act, backend=backend).float()
    assert torch.isfinite(out).all() and (out - ref).norm() <= 2e-2 * ref.norm()


def test_grouped_kernels_are_registered_for_every_backend():
    assert {k.backend for k in GROUPED_KERNELS.values()} == {"cuda", "triton", "reference"}


def test_deterministic_mode_uses_one_tuning_for_every_m(monkeypatch):
    qw = _weight(n=64, k=128)
    humming.set_deterministic(True)
    try:
        assert humming.is_deterministic()
        plans = [dispatch.plan_linear(qw, None, torch.randn(m, 128, dtype=torch.bfloat16), "triton") for m in (1, 300)]
        assert plans[0].tuning == plans[1].tuning and plans[0].tuning.split_k == 1
        assert not plans[0].tuning.dequant_first and plans[0].source == "deterministic mode"
        with pytest.raises(ValueError, match="no batch-invariant kernel"):
            dispatch.plan_linear(qw, None, torch.randn(2, 128, dtype=torch.bfloat16), "cuda")
        x = torch.randn(37, 128, dtype=torch.bfloat16)
        full = humming.linear(x, qw, backend="triton")
        for rows in (slice(0, 1), slice(5, 21), slice(36, 37)):
            assert torch.equal(humming.linear(x[rows], qw, backend="triton"), full[rows])
    finally:
        humming.set_deterministic(None)
    monkeypatch.setenv("HUMMING_DETERMINISTIC", "1")
    assert humming.is_deterministic()
    with pytest.raises(TypeError, match="enabled"):
        humming.set_deterministic("yes")


def test_warmup_refuses_cpu_layers():
    with pytest.raises(ValueError, match=r"layers\[0\]: is on cpu"):
        humming.warmup([_weight()])
    with pytest.raises(TypeError, match=r"layers\[0\]: expected a QuantizedWeight"):
        humming.warmup([torch.zeros(2)])


def test_unwarmed_error_names_the_warmup_call():
    """A kernel that could not load inside a capture: the error keeps its type and names the warmup call."""
    from humming.cuda_kernels import KernelNotReadyError
    from humming.dispatch.plan import unwarmed_error

    qw = humming.quantize(torch.randn(64, 128), "int4", group_size=128)
    x = torch.randn(5, 128, dtype=torch.bfloat16)
    err = unwarmed_error(KernelNotReadyError("kernel k is not loaded"), qw, None, x, "auto")
    assert isinstance(err, KernelNotReadyError)
    assert "kernel k is not loaded" in str(err)
    assert "humming.warmup([weight], m_values=[5], act=None, act_dtype=torch.bfloat16, backend='auto')" in str(err)
    grouped = unwarmed_error(KernelNotReadyError("k"), qw, None, x, "cuda", block_m=16)
    assert "block_ms=[16], backend='cuda'" in str(grouped)


def test_bench_timings_join_the_table():
    """``humming tune --from-timings T --add-bench B``: a sweep's per-kernel rows replace the table's timings of
    the same weight, act, shape, M and kernel (the faster of bf16 and fp16), add new ones, reorder the
    entries; the humming and torch rows, and a sweep of another device, are not taken."""
    from humming.dispatch.tune import _entries, merge_bench_timings

    def timing(kernel, m, us, n=64):
        return dict(case="c", weight="int4", act="none", n=n, k=128, m=m, kernel=kernel, graph_us=us, eager_us=us)

    table = dict(
        device="NVIDIA H200", timings=[timing("cuda.wna16_decode", 16, 10.0), timing("triton.wna16", 16, 12.0)]
    )

    def row(system, kernel, m, us, dtype="bf16", n=64):
        return timing(kernel, m, us, n) | dict(system=system, dtype=dtype)

    bench = dict(
        header=dict(op="linear", device=dict(name="NVIDIA H200")),
        rows=[
            row("humming:triton.wna16", "triton.wna16", 16, 9.0),
            row("humming:triton.wna16", "triton.wna16", 16, 8.0, dtype="fp16"),
            row("humming", "triton.wna16", 16, 1.0),
            row("torch-bf16", "torch.nn.functional.linear", 16, 1.0),
            row("humming:cuda.wna16_decode", "cuda.wna16_decode", 16, 20.0, n=32),
        ],
    )
    merged = merge_bench_timings(table, bench)
    assert sorted((t["n"], t["kernel"], t["graph_us"]) for t in merged) == [
        (32, "cuda.wna16_decode", 20.0),
        (64, "cuda.wna16_decode", 10.0),
        (64, "triton.wna16", 8.0),
    ]
    (entry,) = [e for e in _entries(merged) if e["n"] == 64]
    assert entry["order"] == ["triton.wna16", "cuda.wna16_decode"]
    bench["header"]["device"]["name"] = "NVIDIA A100"
    with pytest.raises(ValueError, match="--add-bench"):
        merge_bench_timings(table, bench)


def test_tune_takes_several_bench_sweeps(tmp_path):
    """``humming tune --from-timings T --add-bench B1 --add-bench B2``: both sweeps join the table, the later
    one's timing of a point replacing the earlier one's."""
    import json

    from humming.__main__ import main

    def timing(kernel, m, us):
        return dict(case="c", weight="int4", act="none", n=64, k=128, m=m, kernel=kernel, graph_us=us, eager_us=us)

    def bench(*rows):
        header = dict(op="linear", device=dict(name="NVIDIA H200"))
        return dict(
            header=header, rows=[timing(k, m, us) | dict(system=f"humming:{k}", dtype="bf16") for k, m, us in rows]
        )

    table = dict(device="NVIDIA H200", timings=[timing("cuda.wna16_decode", 16, 10.0)])
    paths = [tmp_path / name for name in ("table.json", "b1.json", "b2.json")]
    paths[0].write_text(json.dumps(table))
    paths[1].write_text(json.dumps(bench(("triton.wna16", 16, 8.0), ("triton.wna16", 1, 5.0))))
    paths[2].write_text(json.dumps(bench(("triton.wna16", 16, 12.0))))
    out = tmp_path / "out.json"
    args = ["tune", "--from-timings", str(paths[0]), "--add-bench", str(paths[1]), "--add-bench", str(paths[2])]
    assert main([*args, "--out", str(out), "--json"]) == 0
    timings = {(t["kernel"], t["m"]): t["graph_us"] for t in json.loads(out.read_text())["timings"]}
    assert timings == {("cuda.wna16_decode", 16): 10.0, ("triton.wna16", 16): 12.0, ("triton.wna16", 1): 5.0}
