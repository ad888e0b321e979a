"""Isolates each stage of the FP8 GEMM on the GPU: tensor-map bytes, the kernel on an outer product
(rows and columns constant along K: checks the row / column mapping and the scales) and on random codes
(checks the K-direction swizzle of TMA against the wgmma descriptors), with each epilogue (TMA store,
plain stores) and both warpgroup counts, for W8A8 (rows, 128-blocks) and W4A8; and, for information,
the Triton activation pass against humming's reference quantizer on the GPU. The last line names the
epilogue with which every W8A8 problem is right: ``CHOICE store=tma|direct|none``.

Usage: python bench/cuda_fp8_diag.py
"""

from __future__ import annotations

import dataclasses

import torch

import humming
from bench.cuda_fp8_inputs import random_activation, random_weight, reference
from humming.cuda_kernels import fp8_gemm
from humming.cuda_kernels._driver import tensor_map_2d
from humming.ir.activation import QuantizedActivation, get_act_scheme
from humming.ir.weight import QuantizedWeight
from humming.triton_kernels.act_quant import quantize_activation as triton_quantize

SENTINEL = -3.0


def tensor_map_bytes_agree() -> bool:
    from cuda.bindings import driver

    t = torch.randint(0, 255, (256, 512), dtype=torch.uint8, device="cuda")
    raw = tensor_map_2d(t, 128, 64)
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
    print(f"tensor map: getPtr bytes == opaque words: {raw == words}")
    return raw == words


def act_quant_report(x: torch.Tensor, act_name: str) -> None:
    ref = humming.quantize_activation(x, act_name)
    tri = triton_quantize(x, act_name)
    differ = int((ref.codes != tri.codes).sum())
    print(
        f"act {act_name} on CUDA: triton vs reference codes differ at {differ} of {x.numel()}, NaN codes"
        f" triton {int(((tri.codes & 0x7F) == 0x7F).sum())} reference {int(((ref.codes & 0x7F) == 0x7F).sum())}"
    )


def outer_product(m: int, n: int, k: int):
    """x[i, :] = i + 1 and W[j, :] = j + 1 as e4m3 code 448 (0x7E) with scales (i + 1) / 448, (j + 1) / 448."""
    act = get_act_scheme("fp8")
    x_codes = torch.full((m, k), 0x7E, dtype=torch.uint8, device="cuda")
    x_scales = torch.arange(1, m + 1, device="cuda", dtype=torch.float32)[:, None] / 448
    qa = QuantizedActivation(act, x_codes, x_scales)
    w_codes = torch.full((n, k), 0x7E, dtype=torch.uint8, device="cuda").view(torch.int32)
    w_scales = torch.arange(1, n + 1, device="cuda", dtype=torch.float32)[:, None] / 448
    return QuantizedWeight((n, k), "e4m3", w_codes, w_scales, (1, -1)), qa


def run_case(qw, qa, tuning, label: str) -> float:
    m, n = qa.codes.shape[0], qw.N
    out = torch.full((m, -(-n // 8) * 8), SENTINEL, device="cuda", dtype=torch.bfloat16)[:, :n]
    fp8_gemm.run(fp8_gemm.prepare(qw), qa, qa.scheme, None, torch.bfloat16, tuning=tuning, out=out)
    torch.cuda.synchronize()
    ref = reference(qa, qw)
    unwritten = int((out == SENTINEL).sum())
    nans = int(torch.isnan(out).sum())
    rel = ((out.double() - ref).norm() / ref.norm()).item()
    print(
        f"{label} {tuning}: rel err {rel:.3e}, NaN {nans}, unwritten {unwritten} of {out.numel()};"
        f" out[0,:4] {out[0, :4].tolist()} ref[0,:4] {[round(v, 3) for v in ref[0, :4].tolist()]}"
    )
    return rel if nans == 0 and unwritten == 0 else float("inf")


def main() -> None:
    torch.manual_seed(0)
    tensor_map_bytes_agree()
    limits = fp8_gemm.device_limits(torch.cuda.current_device())
    problems = [  # label, weight, activations (W8A8 first: they decide the CHOICE line)
        ("outer", *outer_product(13, 72, 256)),
        ("random", random_weight(333, 1000, -1, "cuda"), random_activation(37, 1000, "fp8", "cuda")),
        ("random", random_weight(1000, 520, -1, "cuda"), random_activation(300, 520, "fp8", "cuda")),
        ("block", random_weight(1000, 1000, (128, 128), "cuda"), random_activation(77, 1000, "fp8_g128", "cuda")),
        ("w4a8", random_weight(1000, 1000, 128, "cuda", fmt="int4"), random_activation(77, 1000, "fp8", "cuda")),
    ]
    good = {}
    for store in (True, False):
        errs = {}
        for label, qw, qa in problems:
            m, k = qa.codes.shape
            base = fp8_gemm.choose_tuning(m, qw.N, k, limits, fp8_gemm._w_format(qw))
            for tuning in (base, fp8_gemm.Fp8Tuning(2, 64, 3, 1)):
                err = run_case(qw, qa, dataclasses.replace(tuning, tma_store=store), label)
                errs[label] = max(errs.get(label, 0.0), err)
        name = "tma" if store else "direct"
        good[name] = max(v for k, v in errs.items() if k != "w4a8") < 1e-2
        print(f"{name}: worst rel err per problem {errs}")
    x = torch.randn(37, 1000, device="cuda", dtype=torch.bfloat16)
    for name in ("fp8", "fp8_g128"):
        act_quant_report(x, name)
    store = next((k for k in ("tma", "direct") if good[k]), "none")
    print(f"CHOICE store={store}")


if __name__ == "__main__":
    main()
