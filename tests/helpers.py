"""Helpers shared by the test modules: NVRTC compilation into a fresh cache, the CUDA binary tools that read
cubins, the bit-exact and norm-wise comparisons of a kernel's output with its reference. Test modules import it
as ``helpers``: pytest's rootdir-relative imports put tests/ on sys.path."""

from __future__ import annotations

import hashlib
import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import humming
from humming import dequantize, quantize
from humming.cuda_kernels import jit
from humming.cuda_kernels._warmup import warmup_specs
from humming.ir.activation import dequantize_activation, quantize_activation
from humming.timing import capture_graph

#: Skips a test where NVRTC cannot compile (no cuda-python / NVRTC library), saying why.
needs_nvrtc = pytest.mark.skipif(
    jit.compiler_unavailable_reason() is not None, reason=f"{jit.compiler_unavailable_reason()}"
)


#: An sm_90 GPU (H100 / H200 / H20): what the Hopper CUDA kernels run on.
HAS_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def needs_sm90(test):
    """A GPU test that needs an sm_90 GPU (skipped on other GPUs; without one, as every gpu test)."""
    test = pytest.mark.gpu(test)
    return pytest.mark.skipif(torch.cuda.is_available() and not HAS_SM90, reason="needs an sm_90 GPU")(test)


def compile_fresh(jobs, cache_dir) -> list[jit.CompiledKernel]:
    """The kernels of ``jobs`` (``(spec, arch)`` pairs) compiled by NVRTC into the empty disk cache
    ``cache_dir``, the in-process cache cleared before and after: every cubin and compile log comes from
    this compilation, not from an earlier run or test."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HUMMING_CACHE_DIR", str(cache_dir))
        jit.clear_memory_cache()
        report = warmup_specs(jobs, progress=False)
        jit.clear_memory_cache()
    return report.kernels


def cuda_tool(name: str) -> str | None:
    """Path of the CUDA binary tool ``name`` (``cuobjdump``, ``nvdisasm``): the copy in triton's package,
    else the one on PATH, else ``None``."""
    spec = importlib.util.find_spec("triton")
    if spec is not None and spec.origin is not None:
        candidate = Path(spec.origin).parent / "backends" / "nvidia" / "bin" / name
        if candidate.is_file():
            return str(candidate)
    return shutil.which(name)


_TOOL_OUTPUTS: dict = {}  # (tool, args, sha256 of the cubin) -> stdout: several tests read one kernel's SASS


def cubin_tool(tool_name: str, args: list[str], kernel: jit.CompiledKernel, tmp_path) -> str:
    """The standard output of ``tool_name args`` on ``kernel``'s cubin (written under ``tmp_path``), run once
    per cubin and arguments in the test session; skips the test when the tool is not found."""
    tool = cuda_tool(tool_name)
    if tool is None:
        pytest.skip(f"{tool_name} not found (neither in triton's package nor on PATH)")
    key = (tool_name, tuple(args), hashlib.sha256(kernel.cubin).hexdigest())
    if key not in _TOOL_OUTPUTS:
        path = tmp_path / f"{kernel.spec.name}-{kernel.arch}.cubin"
        path.write_bytes(kernel.cubin)
        _TOOL_OUTPUTS[key] = subprocess.run([tool, *args, str(path)], check=True, capture_output=True, text=True).stdout
    return _TOOL_OUTPUTS[key]


def backend_unsupported(qweight, act, x: torch.Tensor, backend: str) -> str | None:
    """Why no kernel of ``backend`` runs ``humming.linear(x, qweight, act=act, backend=backend)`` (each
    kernel's reason, as the dispatcher gives them), or ``None``."""
    from humming.dispatch.plan import plan_linear

    try:
        plan_linear(qweight, act, x, backend)
    except ValueError as err:
        return str(err)
    return None


def capture(fn):
    """``fn()`` captured in a CUDA graph by :func:`humming.timing.capture_graph` (one eager run on a side
    stream first, so that compilation, loading and workspaces happen outside the capture; one replay after):
    returns the graph and what the captured call returned, the tensors each replay rewrites."""
    returned = []
    graph = capture_graph(lambda: returned.append(fn()))
    return graph, returned[-1]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float64, after checking that ``out`` holds no NaN (outputs are poisoned
    with NaN before the call: a NaN is an element the kernel did not write)."""
    assert not torch.isnan(out).any(), f"{int(torch.isnan(out).sum())} NaN (unwritten) outputs"
    ref = ref.double()
    return float((out.double() - ref).norm() / ref.norm().clamp_min(1e-30))


def gated(h: torch.Tensor, activation: str, layout: str, alpha: float = 1.702, limit: float = 7.0) -> torch.Tensor:
    """``fused_moe``'s activations from their formulas, for float64 references: ``h [..., 2I] -> [..., I]``,
    gate and up columns concatenated or interleaved; swiglu_oai as gpt-oss's ``swiglu`` (gpt_oss/torch/model.py)."""
    inter = h.shape[-1] // 2
    gate, up = (h[..., 0::2], h[..., 1::2]) if layout == "interleaved" else (h[..., :inter], h[..., inter:])
    if activation == "silu":
        return gate / (1 + torch.exp(-gate)) * up
    if activation == "gelu":
        return 0.5 * gate * (1 + torch.erf(gate / 2**0.5)) * up
    if activation == "gelu_tanh":
        return 0.5 * gate * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (gate + 0.044715 * gate**3))) * up
    gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    return gate * torch.sigmoid(alpha * gate) * (up + 1)


def act_order_dequantized(
    x2d: torch.Tensor, act: str, perm: torch.Tensor | None, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """``x2d [M, K]`` quantized with ``act`` and dequantized to ``dtype``, as ``humming.linear`` defines it for
    a weight whose act-order column order is ``perm`` (``None``: not act-order): ``x2d[:, perm]`` quantized,
    the values put back in ``x2d``'s column order (humming/ir/act_order.py)."""
    if perm is None:
        return humming.dequantize_activation(humming.quantize_activation(x2d, act), dtype)
    out = torch.empty(x2d.shape, dtype=dtype, device=x2d.device)
    out[:, perm] = humming.dequantize_activation(humming.quantize_activation(x2d[:, perm], act), dtype)
    return out


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def assert_bit_exact(out: torch.Tensor, ref: torch.Tensor, what: str = "") -> None:
    """``out`` is ``ref`` bit for bit (so ``-0.0`` is not ``0.0``), of the same shape and dtype, for results
    whose math is exact; NaN must stand where ``ref`` has NaN (any payload). A failure names how many elements
    differ and the first one."""
    prefix = f"{what}: " if what else ""
    assert out.shape == ref.shape and out.dtype == ref.dtype, (
        f"{prefix}{tuple(out.shape)} {out.dtype} vs {tuple(ref.shape)} {ref.dtype}"
    )
    nan = torch.isnan(ref.float()) if ref.is_floating_point() else torch.zeros_like(ref, dtype=torch.bool)
    got_nan = torch.isnan(out.float()) if out.is_floating_point() else nan
    assert torch.equal(got_nan, nan), f"{prefix}NaN positions differ"
    ints = _INT_OF_SIZE[out.element_size()]
    bad = (out.contiguous().view(ints) != ref.contiguous().view(ints)) & ~nan
    if bad.any():
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(f"{prefix}{int(bad.sum())} elements differ; first at {idx}: {out[idx]} vs {ref[idx]}")


def assert_rel_close(
    out: torch.Tensor, ref: torch.Tensor, tol: float = 1e-2, *, precision: torch.dtype, seed: int | None = None
) -> None:
    """``out [R, C]`` has no NaN and ``||out - ref|| / ||ref|| < tol``, computed in ``precision``.

    NaN fails first: outputs are poisoned with NaN before the call, so a NaN is an element the kernel did not
    write. The error is norm-wise because the kernels accumulate in fp32 and round once to the output type:
    single elements near zero may be far off in relative terms while the whole output is within one rounding
    of it; each test picks ``tol`` from that rounding (1e-2 for bf16 outputs, the output type's epsilon where
    the products are exact). A failure names the worst element and ``seed`` when given.
    """
    assert not torch.isnan(out).any(), f"NaN (unwritten) outputs at {torch.isnan(out).nonzero()[:5].tolist()}"
    diff = out.to(precision) - ref
    err = diff.norm() / ref.norm()
    worst = divmod(int(diff.abs().argmax()), diff.shape[1])
    assert err < tol, (
        ("" if seed is None else f"seed {seed}: ")
        + f"relative error {float(err):.3e} >= {tol:.1e}; worst (row, column) = {worst}:"
        f" {out[worst].item()} vs {ref[worst].item()}"
    )


def fp4_problem(scheme: str, m: int, n: int, k: int, seed: int):
    """The FP4 GEMM tests' operands (sm_120a and sm_100a): a ``[n, k]`` weight quantized to ``scheme`` and
    ``[m, k]`` activations quantized to the same scheme; magnitudes vary per 16 along K so that every scale matters."""
    gen = torch.Generator().manual_seed(seed)

    def data(rows: int) -> torch.Tensor:
        base = torch.randn(rows, k, generator=gen, dtype=torch.float64)
        spread = torch.exp2(torch.randint(-6, 7, (rows, -(-k // 16)), generator=gen).to(torch.float64))
        return (base * spread.repeat_interleave(16, 1)[:, :k]).to(torch.float32)

    qw = quantize(data(n), scheme)
    qa = quantize_activation(data(m), scheme)
    return qw, qa


def fp4_reference(qw, qa, bias) -> torch.Tensor:
    """float64 ``dequant(x) @ dequant(W)^T + bias``: the IR's definition of an FP4 GEMM."""
    ref = dequantize_activation(qa, torch.float64) @ dequantize(qw, torch.float64).T
    return ref if bias is None else ref + bias.to(torch.float64)


def assert_fp4_matches_reference(got: torch.Tensor, qw, qa, bias) -> None:
    """An emulated kernel result (float64, NaN where never written) against the dequantized matmul.

    The reference rounds scale * global_scale to fp32 once per element (docs/ir.md); the kernels apply the
    global scales after the sum. Both are exact otherwise, so the two differ by at most ~2^-23 of the sum of
    |terms|; a wrong lane, byte or nibble mapping is off by O(1) of it, and NaN never passes.
    """
    ref = fp4_reference(qw, qa, bias)
    magnitude = dequantize_activation(qa, torch.float64).abs() @ dequantize(qw, torch.float64).abs().T
    err = (got - ref).abs()
    bad = ~(err <= 2.5e-7 * magnitude + 1e-12)
    worst = divmod(int(torch.nan_to_num(err / (magnitude + 1e-30), nan=float("inf")).argmax()), ref.shape[1])
    assert not bad.any(), f"{int(bad.sum())} elements off; worst relative to |x| @ |w|^T at (m, n) = {worst}"


def instructions_before_each_wait(sass: str, mma: str, only: str = "") -> list[int]:
    """For every wgmma group of ``sass`` (``mma`` instructions, e.g. ``"HGMMA"``, then a
    ``WARPGROUP.DEPBAR``), the instructions between its last MMA and the wait (those whose opcode starts
    with ``only``): the work the consumer does while its tensor-core operations run."""
    gaps, last, counted = [], None, 0
    ops = _sass_ops(sass)
    for op in ops:
        if op.startswith(mma):
            last, counted = op, 0
        elif op.startswith("WARPGROUP.DEPBAR") and last is not None:
            gaps.append(counted)
            last = None
        elif last is not None and op.startswith(only):
            counted += 1
    return gaps


def instructions_between_groups(sass: str, mma: str, only: str = "") -> list[int]:
    """For every pair of consecutive wgmma groups of ``sass`` (``mma`` instructions after a
    ``WARPGROUP.ARRIVE``) with no wait for all groups (``WARPGROUP.DEPBAR`` to 0) between them, the
    instructions between the first group's last MMA and the second's first (those whose opcode starts with
    ``only``): the work the consumer does while the first group runs, before it queues the second."""
    gaps, counted, new_group = [], None, False
    for op in _sass_ops(sass):
        if op.startswith(mma):
            if counted is not None and new_group:
                gaps.append(counted)
            counted, new_group = 0, False
        elif op.startswith("WARPGROUP.DEPBAR") and op.endswith("0x0"):
            counted = None
        elif op.startswith("WARPGROUP.ARRIVE"):
            new_group = True
        elif counted is not None and op.startswith(only):
            counted += 1
    return gaps


def _sass_ops(sass: str) -> list[str]:
    """The opcodes and operands of ``sass``'s instructions, in order."""
    return [
        line.split("*/", 1)[1].split(";")[0].strip()
        for line in sass.splitlines()
        if re.match(r"\s+/\*[0-9a-f]{4}\*/", line)
    ]


def instructions_after_each_wait(sass: str, mma: str, pending: int) -> list[int]:
    """For every ``WARPGROUP.DEPBAR`` of ``sass`` that leaves ``pending`` wgmma groups in flight, the
    instructions between it and the next ``mma`` instruction (e.g. ``"HGMMA"``): the work the consumer does
    while those groups run, before it queues the next one."""
    gaps, since = [], None
    ops = _sass_ops(sass)
    for op in ops:
        if op.startswith(mma) and since is not None:
            gaps.append(since)
            since = None
        elif op.startswith("WARPGROUP.DEPBAR"):
            since = 0 if op.endswith(f"gsb0, {pending:#x}") else None
        elif since is not None:
            since += 1
    return gaps


def instructions_between_waits(sass: str, pending: int, only: str = "") -> list[int]:
    """For every ``WARPGROUP.DEPBAR`` of ``sass`` that leaves ``pending`` wgmma groups in flight and is followed
    by another wait, the instructions between the two (those whose opcode starts with ``only``): the work the
    consumer does while those groups run, before it waits for them."""
    gaps, since = [], None
    for op in _sass_ops(sass):
        if op.startswith("WARPGROUP.DEPBAR"):
            if since is not None:
                gaps.append(since)
            since = 0 if op.endswith(f"gsb0, {pending:#x}") else None
        elif since is not None and op.startswith(only):
            since += 1
    return gaps


def with_sm_count(monkeypatch, module, sm_count: int) -> None:
    """Makes ``module``'s ``device_limits`` report ``sm_count`` multiprocessors (the rest as the device has):
    a persistent grid of that few blocks walks many tiles per block even on small test shapes."""
    real = module.device_limits
    monkeypatch.setattr(module, "device_limits", lambda device=None: real(device)._replace(sm_count=sm_count))


def grouped_route(counts: list[int], block_m: int, device) -> tuple[torch.Tensor, int]:
    """``expert_ids`` of the contiguous grouped layout for ``counts[e]`` rows of expert ``e`` (each segment
    padded to ``block_m``, used segments first in expert order, M_pad the static worst case), and M_pad."""
    e = len(counts)
    m_pad = -(-(sum(counts) + e * (block_m - 1)) // block_m) * block_m
    ids = [i for i, c in enumerate(counts) for _ in range(-(-c // block_m))]
    ids += [-1] * (m_pad // block_m - len(ids))
    return torch.tensor(ids, dtype=torch.int32, device=device), m_pad


def grouped_reference(x: torch.Tensor, qw, row_expert: torch.Tensor, act: torch.dtype) -> torch.Tensor:
    """float64 ``x @ W_e^T`` per grouped row, ``W_e`` = ``humming.dequantize`` of the row's expert rounded once
    to ``act`` (what the CUDA kernels multiply); NaN in rows of -1 segments."""
    from humming.moe import expert_weight

    ref = torch.full((x.shape[0], qw.N), float("nan"), device=x.device, dtype=torch.float64)
    for i in row_expert.unique().tolist():
        if i >= 0:
            w = dequantize(expert_weight(qw, i), act).double()
            ref[row_expert == i] = x[row_expert == i].double() @ w.T
    return ref


def assert_gather_matches_copy(gathered, copied, grouped, qw, expert_ids, block_m: int, rows, bias, act) -> None:
    """A gathering grouped GEMM's output against the same kernel on the rows copied into grouped order
    (``grouped``): bit for bit in used segments, NaN (unwritten) in -1 segments, and within one rounding of
    float64 on the rows that hold a token."""
    row_expert = expert_ids.repeat_interleave(block_m)
    used = row_expert >= 0
    assert torch.equal(gathered[used], copied[used])
    assert gathered[~used].isnan().all(), "a row of a skipped (-1) segment was written"
    real = rows >= 0
    ref = grouped_reference(grouped, qw, row_expert, act) + bias.double()[row_expert.clamp(min=0)]
    assert_rel_close(gathered[real], ref[real], torch.finfo(act).eps, precision=torch.float64)
