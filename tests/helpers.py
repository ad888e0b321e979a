"""Helpers shared by the test modules: NVRTC compilation into a fresh cache, the CUDA binary tools that read
cubins, and the norm-wise comparison of a kernel's output with its float reference. Test modules import it
as ``helpers``: pytest's rootdir-relative imports put tests/ on sys.path."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import humming
from humming.cuda_kernels import jit
from humming.cuda_kernels._warmup import warmup_specs
from humming.timing import capture_graph

#: Skips a test where NVRTC cannot compile (no cuda-python / NVRTC library), saying why.
needs_nvrtc = pytest.mark.skipif(
    jit.compiler_unavailable_reason() is not None, reason=f"{jit.compiler_unavailable_reason()}"
)


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


def cubin_tool(tool_name: str, args: list[str], kernel: jit.CompiledKernel, tmp_path) -> str:
    """The standard output of ``tool_name args`` on ``kernel``'s cubin (written under ``tmp_path``); skips
    the test when the tool is not found."""
    tool = cuda_tool(tool_name)
    if tool is None:
        pytest.skip(f"{tool_name} not found (neither in triton's package nor on PATH)")
    path = tmp_path / f"{kernel.spec.name}-{kernel.arch}.cubin"
    path.write_bytes(kernel.cubin)
    return subprocess.run([tool, *args, str(path)], check=True, capture_output=True, text=True).stdout


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


def e4m3_codes(rows: int, k: int, device="cuda") -> torch.Tensor:
    """uint8 ``[rows, k]`` e4m3 codes, uniform over the 254 non-NaN codes (0x7F and 0xFF are skipped): FP8
    operands built directly in the IR, so that a check depends on nothing but the kernel and torch's exact
    e4m3 decoding."""
    codes = torch.randint(0, 254, (rows, k), dtype=torch.int32, device=device)
    return (codes + (codes >= 0x7F).to(torch.int32)).to(torch.uint8)


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
