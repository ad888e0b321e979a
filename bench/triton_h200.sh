#!/bin/bash
# One device call for the Triton kernels: GPU tests, the M sweep (torch/humming baselines), gemlite on a
# subset of M (its autotuner is slow), and the WnA16 tile tuner; everything lands in $OUT.
# Usage (device tool): bash bench/triton_h200.sh   (with .whl/gemlite carried)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/gemlite/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/env.log" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$OUT/env.log" 2>&1
MAIN=torch_bf16,triton_w4a16_g128,triton_w8a16,triton_mxfp4_a16,triton_w8a8_fp8,triton_w4a8_fp8,torch_int4pack_g128,torch_scaled_mm_fp8
timeout 125 python3 bench/sweep.py --methods $MAIN --budget-s 105 --out "$OUT/sweep.json" > "$OUT/sweep.log" 2>&1
echo "sweep rc=$?"
timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_triton_wna16.py tests/test_triton_dequant.py > "$OUT/pytest_gpu.log" 2>&1
echo "pytest rc=$?"; tail -4 "$OUT/pytest_gpu.log"
timeout 35 python3 bench/sweep.py --methods gemlite_w4a16_g128,gemlite_w8a16,gemlite_mxfp4_a16 --m 1,16,1024,8192 \
  --shapes 28672x8192 --budget-s 25 --out "$OUT/gemlite.json" > "$OUT/gemlite.log" 2>&1
echo "gemlite rc=$?"
timeout 35 python3 bench/sweep.py --tune --m 1,16,128,1024,8192 --budget-s 28 --out "$OUT/tune.json" > "$OUT/tune.log" 2>&1
echo "tune rc=$?"
python3 - <<'PY'
import json, os
out = os.environ["OUT"]
r = json.load(open(f"{out}/sweep.json"))
print(r["roofs"])
for row in r["rows"]:
    if "graph_us" in row and row["M"] in (1, 16, 1024, 8192):
        print(row["method"], row["N"], row["M"], row["graph_us"], row["graph_over_floor"], row.get("speed_vs_torch_bf16"))
PY
