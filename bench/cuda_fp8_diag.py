"""Isolates each stage of the FP8 GEMM on the GPU: tensor-map bytes, the Triton activation pass against
the reference quantizer, the kernel on an outer product (rows and columns constant along K) and on random inputs,
with each epilogue (TMA store, plain stores). The last line names the epilogue and activation pass that
work: ``CHOICE store=tma|direct|none act=triton|reference``.

Usage: python bench/cuda_fp8_diag.py
"""

from __future__ import annotations

import ctypes
import dataclasses

import torch

import humming
from humming.cuda_kernels import fp8_gemm
from humming.ir.activation import get_act_scheme
from humming.triton_kernels.act_quant import quantize_activation as triton_quantize

SENTINEL = -3.0


def tensor_map_bytes_agree() -> bool:
    from cuda.bindings import driver

    t = torch.randint(0, 255, (256, 512), dtype=torch.uint8, device="cuda")
    raw = fp8_gemm._tensor_map(t, 128, 64)
    u64, u32 = driver.cuuint64_t, driver.cuuint32_t
    _, tmap = driver.cuTensorMapEncodeTiled(
        driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT8,
        2,
        t.data_ptr(),
        [u64(512), u64(256)],
        [u64(512)],
        [u32(128), u32(64)],
        [u32(1), u32(1)],
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    )
    words = b"".join(int(w).to_bytes(8, "little") for w in tmap.opaque)
    print(f"tensor map: getPtr bytes == opaque words: {raw == words}; first words {raw[:16].hex()}")
    return raw == words


def act_quant_agrees(x: torch.Tensor, act_name: str) -> bool:
    ref = humming.quantize_activation(x, act_name)
    tri = triton_quantize(x, act_name)
    same_codes = torch.equal(ref.codes, tri.codes)
    same_scales = torch.equal(ref.scales.to(torch.float32), tri.scales.to(torch.float32))
    nan_codes = int(((tri.codes & 0x7F) == 0x7F).sum())
    print(f"act {act_name}: triton codes == reference {same_codes}, scales equal {same_scales}, NaN codes {nan_codes}")
    return same_codes and same_scales


def run_case(qw, qa, act, tuning, label: str) -> float:
    prep = fp8_gemm.prepare(qw)
    m, n = qa.codes.shape[0], qw.N
    out = torch.full((m, -(-n // 8) * 8), SENTINEL, device="cuda", dtype=torch.bfloat16)[:, :n]
    fp8_gemm.run(prep, qa, act, None, torch.bfloat16, tuning=tuning, out=out)
    torch.cuda.synchronize()
    ref = humming.dequantize_activation(qa).double() @ humming.dequantize(qw, torch.float32).double().T
    unwritten = int((out == SENTINEL).sum())
    nans = int(torch.isnan(out).sum())
    finite = torch.isfinite(out)
    rel = ((out.double() - ref).where(finite, 0).norm() / ref.norm()).item()
    print(
        f"{label}: rel err (finite part) {rel:.3e}, NaN {nans}, unwritten {unwritten} of {out.numel()},"
        f" ref NaN {int(torch.isnan(ref).sum())}; out[0,:6] {out[0, :6].tolist()} ref[0,:6] {ref[0, :6].tolist()}"
    )
    return rel if nans == 0 and unwritten == 0 else float("inf")


def main() -> None:
    torch.manual_seed(0)
    maps_ok = tensor_map_bytes_agree()
    x = torch.randn(37, 1000, device="cuda", dtype=torch.bfloat16)
    act_ok = all(act_quant_agrees(x, name) for name in ("fp8", "fp8_tensor", "fp8_g128"))
    act = get_act_scheme("fp8")
    limits = fp8_gemm.device_limits(torch.cuda.current_device())
    # out[m, n] = K (m + 1) (n + 1): constant along K, so only the row / column mapping can be wrong
    rows = torch.arange(1, 14, device="cuda", dtype=torch.float32)[:, None].expand(13, 256)
    cols = torch.arange(1, 73, device="cuda", dtype=torch.float32)[:, None].expand(72, 256)
    outer_w = humming.quantize(cols.contiguous(), weight="e4m3", group_size=-1)
    outer_x = humming.quantize_activation(rows.to(torch.bfloat16), act)
    w = humming.quantize(torch.randn(333, 1000, device="cuda") * 0.05, weight="e4m3", group_size=-1)
    qa_ref = humming.quantize_activation(x, act)
    good = {}
    for store in (True, False):
        base = fp8_gemm.choose_tuning(37, 333, 1000, limits)
        name = "tma" if store else "direct"
        run_case(outer_w, outer_x, act, dataclasses.replace(base, tma_store=store), f"outer product {name}")
        errs = [run_case(w, qa_ref, act, dataclasses.replace(base, tma_store=store), f"random {name} heuristic")]
        wide = fp8_gemm.Fp8Tuning(2, 64, 3, 1, tma_store=store)
        errs.append(run_case(w, qa_ref, act, wide, f"random {name} 2wg"))
        good[name] = max(errs) < 1e-2
    store = next((k for k in ("tma", "direct") if good[k]), "none")
    tuning = dataclasses.replace(fp8_gemm.choose_tuning(37, 333, 1000, limits), tma_store=store != "direct")
    run_case(w, triton_quantize(x, act), act, tuning, "random with triton-quantized activations")
    print(f"maps ok {maps_ok}, act_quant ok {act_ok}, struct {ctypes.sizeof(fp8_gemm._Params)} bytes")
    print(f"CHOICE store={store} act={'triton' if act_ok else 'reference'}")


if __name__ == "__main__":
    main()
