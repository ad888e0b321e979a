"""Top-k routing (``humming.moe.topk_routing``): the torch reference against an independent per-token
implementation in float64 Python, the Triton kernel (the interpreter on CPU) against the reference for each
model's routing, ties, NaN, argument errors, and on a GPU real sizes and CUDA-graph capture.

Ids must match exactly: the logits are random floats, so no two keys of a token tie or lie within float32
rounding of each other (on the GPU at real sizes some do; those tokens are named and left out). Weights
match to float32 rounding (``rtol=1e-5``; 1e-5 against the float64 implementation too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
import torch
from helpers import capture

from humming import moe

pytest.importorskip("humming.triton_kernels.routing")


@dataclass(frozen=True)
class Style:
    """One model's routing: ``kwargs`` of ``topk_routing`` besides ``top_k`` and the bias."""

    name: str
    e: int
    top_k: int
    kwargs: dict = field(default_factory=dict)
    bias: bool = False

    def __str__(self) -> str:
        return self.name

    def args(self, logits: torch.Tensor, seed: int = 0) -> dict:
        """The call's keyword arguments, with a bias of DeepSeek-V3's magnitude (a few hundredths) if any."""
        gen = torch.Generator().manual_seed(seed)
        bias = (torch.rand(self.e, generator=gen) * 0.1 - 0.05).to(logits.device) if self.bias else None
        return {**self.kwargs, "correction_bias": bias}


_DEEPSEEK = {"scoring": "sigmoid", "renormalize": True, "num_groups": 8, "topk_groups": 4, "routed_scaling": 2.5}
STYLES = [
    Style("mixtral", 8, 2, {"renormalize": True}),
    Style("qwen3", 128, 8, {"renormalize": True}),
    Style("deepseek-v3", 256, 8, _DEEPSEEK, bias=True),
    Style("gpt-oss", 128, 4, {"order": "topk_then_softmax"}),
    Style("kimi-k2", 384, 8, {"scoring": "sigmoid", "renormalize": True, "routed_scaling": 2.827}, bias=True),
]
#: Paths of the kernel no model above takes: sigmoid without a bias, groups on softmax scores, groups of one.
EXTRA = [
    Style("sigmoid", 64, 6, {"scoring": "sigmoid"}),
    Style("softmax-groups", 64, 6, {"num_groups": 8, "topk_groups": 3, "renormalize": True}),
    Style("groups-of-one", 16, 4, {"scoring": "sigmoid", "num_groups": 16, "topk_groups": 6}, bias=True),
    Style("e512-k16", 512, 16, {"routed_scaling": 1.5}),
]


def _by_hand(logits: torch.Tensor, top_k: int, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    """The routing one token at a time in float64 Python, as the models' code states it."""
    bias = kw.get("correction_bias")
    bias = [0.0] * logits.shape[1] if bias is None else bias.double().tolist()
    all_w, all_ids = [], []
    for row in logits.double().tolist():
        e = len(row)
        if kw.get("order") == "topk_then_softmax":
            picked = sorted(range(e), key=lambda i: (-row[i], i))[:top_k]
            exps = [math.exp(row[i] - row[picked[0]]) for i in picked]
            w = [v / sum(exps) for v in exps]
        else:
            if kw.get("scoring", "softmax") == "softmax":
                exps = [math.exp(v - max(row)) for v in row]
                scores = [v / sum(exps) for v in exps]
            else:
                scores = [1 / (1 + math.exp(-v)) for v in row]
            key = [s + b for s, b in zip(scores, bias)]
            candidates = list(range(e))
            if kw.get("num_groups"):
                size = e // kw["num_groups"]
                group_score = [sum(sorted(key[g * size : (g + 1) * size])[-2:]) for g in range(kw["num_groups"])]
                kept = sorted(range(kw["num_groups"]), key=lambda g: (-group_score[g], g))[: kw["topk_groups"]]
                candidates = [i for g in kept for i in range(g * size, (g + 1) * size)]
            picked = sorted(candidates, key=lambda i: (-key[i], i))[:top_k]
            w = [scores[i] for i in picked]
        if kw.get("renormalize"):
            w = [v / sum(w) for v in w]
        all_w.append([v * kw.get("routed_scaling", 1.0) for v in w])
        all_ids.append(picked)
    return torch.tensor(all_w, dtype=torch.float64), torch.tensor(all_ids, dtype=torch.int32)


def _assert_same(got, ref, what: str) -> None:
    (w, ids), (ref_w, ref_ids) = got, ref
    assert ids.dtype == torch.int32 and w.dtype == torch.float32 and ids.shape == ref_ids.shape == w.shape
    bad = (ids != ref_ids).any(-1).nonzero().flatten()
    assert not len(bad), (
        f"{what}: ids of {len(bad)} tokens differ, first {int(bad[0])}: {ids[bad[0]]} vs {ref_ids[bad[0]]}"
    )
    torch.testing.assert_close(w.double(), ref_w.double(), rtol=1e-5, atol=1e-7, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("style", STYLES + EXTRA, ids=str)
def test_reference_matches_by_hand(style: Style, seed: int) -> None:
    logits = torch.randn(5, style.e)
    kw = style.args(logits, seed)
    got = moe.topk_routing(logits, style.top_k, **kw, backend="reference")
    _assert_same(got, _by_hand(logits, style.top_k, **kw), style.name)


@pytest.mark.parametrize("t", [1, 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("style", STYLES + EXTRA, ids=str)
def test_kernel_matches_reference(style: Style, dtype, t: int, seed: int) -> None:
    """bfloat16 logits hold many exact ties: the kernel must break them as the reference does."""
    logits = torch.randn(t, style.e).to(dtype)
    kw = style.args(logits, seed)
    ref = moe.topk_routing(logits, style.top_k, **kw, backend="reference")
    _assert_same(moe.topk_routing(logits, style.top_k, **kw, backend="triton"), ref, f"{style} seed {seed}")


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_ties_pick_the_lower_id(backend: str) -> None:
    logits = torch.zeros(2, 256)
    _, ids = moe.topk_routing(logits, 8, **_DEEPSEEK, backend=backend)  # every group ties: groups 0-3
    assert ids.tolist() == [list(range(8))] * 2
    logits[:, 40:44] = 1.0  # group 1 (32-63) first, then groups 0, 2, 3; experts 40-43, then 0-3
    _, ids = moe.topk_routing(logits, 8, **_DEEPSEEK, backend=backend)
    assert ids.tolist() == [[40, 41, 42, 43, 0, 1, 2, 3]] * 2
    weights, ids = moe.topk_routing(torch.zeros(1, 8), 3, order="topk_then_softmax", backend=backend)
    assert ids.tolist() == [[0, 1, 2]] and torch.equal(weights, torch.full((1, 3), 1 / 3))


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_nan_ranks_last(backend: str) -> None:
    logits = torch.tensor([[0.5, float("nan"), -1.0, 2.0]])
    weights, ids = moe.topk_routing(logits, 3, scoring="sigmoid", backend=backend)
    assert ids.tolist() == [[3, 0, 2]]
    torch.testing.assert_close(weights, logits[:, [3, 0, 2]].sigmoid(), rtol=1e-6, atol=0)
    weights, ids = moe.topk_routing(logits, 2, backend=backend)  # a NaN in a softmax: NaN weights
    assert ids.tolist() == [[3, 0]] and weights.isnan().all()


def test_bias_picks_but_does_not_weight(seed: int) -> None:
    logits = torch.randn(4, 16)
    bias = torch.zeros(16)
    bias[5] = 10.0
    for backend in ("reference", "triton"):
        weights, ids = moe.topk_routing(logits, 2, scoring="sigmoid", correction_bias=bias, backend=backend)
        assert (ids[:, 0] == 5).all()
        torch.testing.assert_close(weights, logits.sigmoid().gather(1, ids.long()), rtol=1e-6, atol=0)


def test_topk_then_softmax_is_renormalized_softmax(seed: int) -> None:
    """gpt-oss's order equals softmax, top k, renormalize, up to rounding."""
    logits = torch.randn(6, 32) * 3
    got = moe.topk_routing(logits, 4, order="topk_then_softmax")
    _assert_same(got, moe.topk_routing(logits, 4, renormalize=True), "gpt-oss")


def test_strided_logits_and_no_tokens(seed: int) -> None:
    wide = torch.randn(3, 80)
    for logits in (wide[:, 8:72], wide[:, :64].t().contiguous().t()):  # rows 80 apart; columns 3 apart
        ref = moe.topk_routing(logits, 4, backend="reference")
        _assert_same(moe.topk_routing(logits, 4, backend="triton"), ref, f"strides {logits.stride()}")
    for backend in ("reference", "triton"):
        weights, ids = moe.topk_routing(torch.randn(0, 64), 4, **_DEEPSEEK, backend=backend)
        assert weights.shape == ids.shape == (0, 4) and ids.dtype == torch.int32


def test_auto_runs_the_reference_on_cpu_and_triton_refuses_large_calls(seed: int) -> None:
    logits = torch.randn(3, 2048)
    for a, b in zip(moe.topk_routing(logits, 4), moe.topk_routing(logits, 4, backend="reference")):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="backend: 'triton' cannot run this routing call: 2048 experts pad to 2048"):
        moe.topk_routing(logits, 4, backend="triton")


_LOGITS = torch.zeros(2, 64)
_BIAS = torch.zeros(64)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_groups": 8}, "num_groups, topk_groups: give both or neither"),
        ({"num_groups": 6, "topk_groups": 2}, "num_groups: expected a positive int that divides E=64"),
        ({"num_groups": 8, "topk_groups": 9}, r"topk_groups: expected an int in \[1, num_groups=8\]"),
        ({"num_groups": 16, "topk_groups": 1, "top_k": 5}, "top_k: 5 experts cannot be picked from the 1 kept groups"),
        ({"top_k": 65}, r"top_k: expected an int in \[1, 64\]"),
        ({"correction_bias": torch.zeros(63)}, r"correction_bias: expected shape \(64,\)"),
        ({"correction_bias": torch.zeros(64, dtype=torch.int32)}, "correction_bias: expected a float tensor"),
        ({"correction_bias": torch.zeros(64, device="meta")}, "correction_bias is on meta but router_logits is on cpu"),
        ({"routed_scaling": 0.0}, "routed_scaling: expected a positive finite number"),
        ({"routed_scaling": float("inf")}, "routed_scaling: expected a positive finite number"),
        ({"routed_scaling": True}, "routed_scaling: expected a positive finite number"),
        ({"scoring": "relu"}, "scoring: expected one of"),
        ({"order": "softmax_then_topk"}, "order: expected one of"),
        ({"order": "topk_then_softmax", "scoring": "sigmoid"}, "scoring: order='topk_then_softmax' takes a softmax"),
        ({"order": "topk_then_softmax", "correction_bias": _BIAS}, "order: 'topk_then_softmax' ranks the raw logits"),
        ({"order": "topk_then_softmax", "num_groups": 8, "topk_groups": 2}, "order: 'topk_then_softmax' ranks"),
        ({"renormalize": 1}, "renormalize: expected a bool"),
        ({"backend": "cuda"}, "backend: expected one of"),
        ({"router_logits": torch.zeros(2, 64, dtype=torch.int32)}, "router_logits: expected a float tensor"),
        ({"router_logits": torch.zeros(64)}, r"router_logits: expected shape \[T, E\]"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_rejects(kwargs: dict, match: str) -> None:
    kwargs = {"router_logits": _LOGITS, "top_k": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        moe.topk_routing(**kwargs)


# -------------------------------------------------------------------------------------------------- GPU
def _near_ties(values: torch.Tensor, rtol: float) -> torch.Tensor:
    """Rows (bool) of ``values [T, N]`` holding two values within ``rtol`` of each other."""
    s = values.sort(-1).values
    return (s.diff(dim=-1) <= rtol * torch.maximum(s[:, 1:].abs(), s[:, :-1].abs())).any(-1)


def _tokens_near_a_tie(logits: torch.Tensor, top_k: int, kw: dict, rtol: float = 2e-6) -> torch.Tensor:
    """Tokens (bool ``[T]``) whose best ``top_k + 1`` keys (in the kept groups) or best ``topk_groups + 1``
    group scores hold two within ``rtol``, which float32 rounding (the kernel's exp is not torch's) may
    order either way. None where the keys are the logits (compared exactly)."""
    if kw["correction_bias"] is None and not kw.get("num_groups"):
        return torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    keys = logits.float().sigmoid() if kw.get("scoring") == "sigmoid" else logits.float().softmax(-1)
    if kw["correction_bias"] is not None:
        keys = keys + kw["correction_bias"]
    near = torch.zeros(len(keys), dtype=torch.bool, device=keys.device)
    pickable = keys.shape[1]
    if kw.get("num_groups"):
        grouped = keys.view(len(keys), kw["num_groups"], -1)
        group_scores = grouped.topk(min(2, grouped.shape[-1]), -1).values.sum(-1)
        near |= _near_ties(group_scores.topk(min(kw["topk_groups"] + 1, kw["num_groups"]), -1).values, rtol)
        kept = torch.zeros_like(group_scores, dtype=torch.bool)
        kept.scatter_(1, group_scores.topk(kw["topk_groups"], -1).indices, True)
        keys = torch.where(kept[:, :, None], grouped, float("-inf")).flatten(1)
        pickable = kw["topk_groups"] * grouped.shape[-1]
    return near | _near_ties(keys.topk(min(top_k + 1, pickable), -1).values, rtol)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 8192])
@pytest.mark.parametrize("style", STYLES + EXTRA, ids=str)
def test_gpu_kernel_matches_reference(style: Style, t: int, seed: int) -> None:
    exact = not style.bias and "num_groups" not in style.kwargs  # ranked on the logits: bf16 ties are exact
    logits = torch.randn(t, style.e, device="cuda", dtype=torch.bfloat16 if exact else torch.float32)
    kw = style.args(logits, seed)
    w, ids = moe.topk_routing(logits, style.top_k, **kw)
    ref_w, ref_ids = moe.topk_routing(logits, style.top_k, **kw, backend="reference")
    near = _tokens_near_a_tie(logits, style.top_k, kw)
    assert near.float().mean() < 0.01, f"{style}: {int(near.sum())} of {t} tokens near a tie"
    keep = ~near
    _assert_same((w[keep], ids[keep]), (ref_w[keep], ref_ids[keep]), f"{style} seed {seed}")


@pytest.mark.gpu
@pytest.mark.parametrize("style", STYLES, ids=str)
def test_gpu_graph_and_compile(style: Style, seed: int) -> None:
    """The kernel captured in a CUDA graph replays to eager results on new logits; torch.compile with a
    dynamic T gives the eager results."""
    logits = torch.randn(64, style.e, device="cuda")
    kw = style.args(logits, seed)
    graph, (w, ids) = capture(lambda: moe.topk_routing(logits, style.top_k, **kw))
    logits.copy_(torch.randn_like(logits))
    graph.replay()
    expect = moe.topk_routing(logits, style.top_k, **kw)
    assert torch.equal(ids, expect[1]) and torch.equal(w, expect[0])
    f = torch.compile(lambda x: moe.topk_routing(x, style.top_k, **kw), fullgraph=True, dynamic=True)
    for t in (3, 1000):
        x = torch.randn(t, style.e, device="cuda")
        for a, b in zip(f(x), moe.topk_routing(x, style.top_k, **kw)):
            assert torch.equal(a, b)
