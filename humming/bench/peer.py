"""The ``humming-kernels`` system of ``python -m humming bench``: upstream Humming's GEMMs, run in a worker process.

humming-kernels installs a top-level package that is also named ``humming``, so it cannot be imported
beside this one. The sweep starts one worker (:class:`Worker`) whose ``sys.path`` puts the directory
holding humming-kernels first and drops this package's root; the worker loads this file, and the two
it needs (``timing.py``, ``bench/inputs.py``), from this package's folder under a private name
(``_humming_bench``, without running the packages' ``__init__.py``), so that it times with
:mod:`humming.timing` on the inputs the sweep's other systems get. This module imports humming-kernels
only inside :func:`serve`, in the worker.

Calls (the package's own API and its own default configs: no tuning config is passed, so it picks one
by its heuristics for each M):

- dense: ``HummingLayer(shape_n=N, shape_k=K, weight_config, input_config, torch_dtype)``,
  ``load_from_unquantized(w)`` (its own quantizer), ``transform()``, then ``layer(x)``; with an 8-bit
  ``input_config`` the call quantizes ``x`` itself (dynamic per-token, or per-128 group).
- MoE: the same layer with ``num_experts=E`` on ``w [E, N, K]`` (``has_bias=True`` and the bias loaded
  beside the weight for a model with biases), called as its grouped-contiguous GEMM:
  ``layer(x_sorted, expert_layout=offsets, compute_config='{"gemm_type": "grouped_contiguous"}',
  top_k=topk)``, ``x_sorted`` = the routed rows sorted by expert (unpadded), ``offsets`` = int64
  ``[E + 1]`` first row of each expert (its own test data generator's layout). The input of a layer's
  second GEMM has one row per routed slot: ``top_k=1`` over the flattened routing.

Cases without an entry in :data:`CONFIGS` are not supported by humming-kernels (the sweep notes them).

Protocol: one JSON request per line on the worker's stdin; the worker answers with lines that start
with :data:`MARK` (one per M, then ``{"done": true}``); any other output (compiler logs) goes to stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial
from importlib import metadata
from pathlib import Path

from .._env import env

__all__ = ["CONFIGS", "DISTRIBUTION", "Worker", "find_site", "grouped_inputs", "serve"]

DISTRIBUTION = "humming-kernels"
MARK = "@@humming-bench "

#: case (humming.dispatch.tune.CASES) -> (weight_config, input_config) of humming-kernels' HummingLayer;
#: input_config None keeps 16-bit activations (the layer's torch_dtype).
CONFIGS = {
    "w4a16-int4-g128": ({"dtype": "int4", "group_size": 128}, None),
    "w4a16-int4-g32": ({"dtype": "int4", "group_size": 32}, None),
    "w4a16-uint4-g128-zp": ({"dtype": "uint4", "group_size": 128, "has_zero_point": True}, None),
    "w8a16-int8-channel": ({"dtype": "int8", "group_size": 0}, None),
    "w8a16-e4m3-channel": ({"dtype": "float8e4m3", "group_size": 0}, None),
    "mxfp4-a16": ({"dtype": "float4e2m1", "group_size": 32, "scale_dtype": "float8e8m0"}, None),
    "w8a8-fp8-channel": ({"dtype": "float8e4m3", "group_size": 0}, {"dtype": "float8e4m3"}),
    "w8a8-fp8-block": (
        {"dtype": "float8e4m3", "group_size": 128, "group_size_n": 128},
        {"dtype": "float8e4m3", "group_size": 128},
    ),
    "w8a8-int8-channel": ({"dtype": "int8", "group_size": 0}, {"dtype": "int8"}),
    "w4a8-int4-g128-fp8": ({"dtype": "int4", "group_size": 128}, {"dtype": "float8e4m3"}),
    "w4a8-int4-channel-fp8": ({"dtype": "int4", "group_size": 0}, {"dtype": "float8e4m3"}),
    "w4a8-mxfp4-fp8": ({"dtype": "float4e2m1", "group_size": 32, "scale_dtype": "float8e8m0"}, {"dtype": "float8e4m3"}),
}

_BOOTSTRAP = """
import importlib, os, sys, types
site, package = sys.argv[1], sys.argv[2]
ours = os.path.realpath(os.path.dirname(package))
sys.path[:] = [site] + [p for p in sys.path if p and os.path.realpath(p) != ours]
for name, path in (("_humming_bench", package), ("_humming_bench.bench", os.path.join(package, "bench"))):
    alias = types.ModuleType(name)  # empty packages: neither __init__.py runs
    alias.__path__ = [path]
    sys.modules[name] = alias
importlib.import_module("_humming_bench.bench.peer").serve()
"""


def find_site(site: str | None = None) -> tuple[str, str] | str:
    """``(directory holding humming-kernels' humming package, its version)``, or why there is none.

    ``site``: that directory (``pip install --no-deps --target DIR humming-kernels==0.1.19``); ``None``:
    ``$HUMMING_KERNELS_SITE``, else wherever the distribution is installed on ``sys.path``."""
    site = site or env("HUMMING_KERNELS_SITE")
    dists = metadata.distributions(path=[str(site)]) if site else metadata.distributions()
    for dist in dists:
        if (dist.metadata["Name"] or "").lower() == DISTRIBUTION:
            root = Path(dist.locate_file(""))
            if (root / "humming" / "layer.py").is_file():
                return str(root), dist.version
    where = f"in {site}" if site else "on sys.path ($HUMMING_KERNELS_SITE is unset)"
    return (
        f"{DISTRIBUTION} is not installed {where}: pip install --no-deps --target DIR {DISTRIBUTION}==0.1.19, "
        "then pass --peer-site DIR (it cannot share a site-packages with this humming: both are `humming`)"
    )


class Worker:
    """The worker process, started on the first request and kept for the whole sweep."""

    def __init__(self, site: str):
        self.site = site
        self._proc: subprocess.Popen | None = None

    def _start(self) -> subprocess.Popen:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if env.get("HUMMING_CACHE_DIR"):  # its JIT cache beside ours, not inside it
            env["HUMMING_CACHE_DIR"] = os.path.join(env["HUMMING_CACHE_DIR"], DISTRIBUTION)
        package = str(Path(__file__).resolve().parents[1])  # humming's folder
        cmd = [sys.executable, "-c", _BOOTSTRAP, self.site, package]
        return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def measure(self, request: dict) -> Iterator[dict]:
        """Send one request (see :func:`serve`); yield the worker's answers, one per M."""
        if self._proc is None or self._proc.poll() is not None:
            self._proc = self._start()
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        for line in self._proc.stdout:
            if not line.startswith(MARK):
                sys.stderr.write(line)
                continue
            answer = json.loads(line[len(MARK) :])
            if answer.get("done"):
                return
            yield answer
        yield {"error": f"the {DISTRIBUTION} worker exited with status {self._proc.wait()}"}

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.stdin.close()
            self._proc.wait(timeout=60)


# ------------------------------------------------------------------------------------- worker side
def _send(answer: dict) -> None:
    print(MARK + json.dumps(answer), flush=True)


def serve() -> None:
    """The worker's loop. A request: ``{"case", "n", "k", "experts", "topk", "dtype" ("bfloat16" /
    "float16"), "m_values", "deadline" (time.time()), "check_only"}``, and for a MoE part ``"seed"`` (of
    the weight), ``"routing"``, ``"per_slot"`` and ``"bias"`` (see :func:`grouped_inputs`); answers per M:
    ``{"m", "graph_us", "eager_us"}``, ``{"m", "rel_err"}`` (check only), ``{"m", "error"}`` or ``{"m",
    "skipped"}``. The layers of the last two weights are kept (a MoE sweep asks for one M at a time, for
    each part and routing in turn)."""
    layers: dict = {}
    for line in sys.stdin:
        request = json.loads(line)
        try:
            for answer in _measure(request, layers):
                _send(answer)
        except Exception as err:  # the layer did not build: one answer for the whole request
            _send({"error": f"{type(err).__name__}: {err}"[:500]})
        _send({"done": True})


def grouped_inputs(request: dict, m: int, device) -> dict:
    """A MoE request's inputs at ``m`` tokens, as the sweep's other systems get them: ``x`` (``[M, K]``, or
    ``[M * topk, K]`` with ``per_slot``), ``ids`` (``[M, topk]``, or ``[M * topk, 1]``), ``rows`` (sorted by
    expert), ``order`` (their slots), ``offsets`` (int64 ``[E + 1]``) and ``top_k`` (``ids``' width)."""
    import torch

    from . import inputs

    dtype = getattr(torch, request["dtype"])
    experts, topk, per_slot = request["experts"], request["topk"], request.get("per_slot", False)
    ids = inputs.routing(m, experts, topk, device, request.get("routing", "random"))
    if per_slot:
        ids = ids.reshape(-1, 1)
    x = inputs.activations(ids.numel() if per_slot else m, request["k"], dtype, device)
    order, counts = inputs.sorted_routing(ids, experts)
    offsets = torch.nn.functional.pad(counts.cumsum(0), (1, 0))
    return dict(x=x, ids=ids, rows=x[order // ids.shape[1]], order=order, offsets=offsets, top_k=ids.shape[1])


def _build(request: dict):
    """``(layers, w, bias)``: humming-kernels layers (copies past the L2) of the request's weight."""
    import torch

    from humming.layer import HummingLayer  # humming-kernels: this process put its directory first

    from ..timing import copies_past_l2
    from . import inputs

    dtype = getattr(torch, request["dtype"])
    n, k, experts, seed = request["n"], request["k"], request["experts"], request.get("seed", 0)
    weight_config, input_config = CONFIGS[request["case"]]
    w = inputs.weight(n, k, experts, dtype, "cuda", seed)
    bias = inputs.bias(n, experts, dtype, "cuda", seed) if request.get("bias") else None

    def build():
        layer = HummingLayer(
            shape_n=n,
            shape_k=k,
            weight_config=dict(weight_config),
            input_config=dict(input_config) if input_config else None,
            num_experts=experts,
            has_bias=bias is not None,
            torch_dtype=dtype,
        ).cuda()
        layer.load_from_unquantized(w)
        if bias is not None:
            layer.load_from_tensors({"bias": bias})
        layer.transform()
        return layer

    layers = [build()]
    nbytes = sum(t.nbytes for t in layers[0].state_dict().values())
    layers += [build() for _ in range(copies_past_l2(nbytes) - 1)]
    return layers, w if request["check_only"] else None, bias


def _measure(request: dict, cache: dict) -> Iterator[dict]:
    import torch

    from ..timing import time_calls
    from . import inputs

    key = tuple(request.get(name) for name in ("case", "n", "k", "experts", "dtype", "seed", "bias"))
    if key not in cache:
        while len(cache) >= 2:
            del cache[next(iter(cache))]
        cache[key] = _build(request)
    layers, w, bias = cache[key]
    dtype = getattr(torch, request["dtype"])
    k, experts = request["k"], request["experts"]
    grouped = json.dumps({"gemm_type": "grouped_contiguous"})
    for m in request["m_values"]:
        if time.time() > request["deadline"]:
            yield {"m": m, "skipped": "time budget"}
            continue
        try:
            if experts:
                got = grouped_inputs(request, m, "cuda")
                kwargs = dict(expert_layout=got["offsets"], compute_config=grouped, top_k=got["top_k"])
                calls = [partial(layer, got["rows"], **kwargs) for layer in layers]
            else:
                x = inputs.activations(m, k, dtype, "cuda")
                calls = [partial(layer, x) for layer in layers]
            if request["check_only"]:
                out = calls[0]()
                if experts:  # back to slot order
                    out = torch.empty_like(out).index_copy_(0, got["order"], out)
                    ref = inputs.moe_reference(got["x"], w, got["ids"], bias)
                else:
                    ref = x.float() @ w.float().T
                yield {"m": m, "rel_err": inputs.rel_err(out, ref)}
            else:
                yield {"m": m, **time_calls(calls)}
        except Exception as err:  # recorded in the row; the next M may still run
            yield {"m": m, "error": f"{type(err).__name__}: {err}"[:500]}
