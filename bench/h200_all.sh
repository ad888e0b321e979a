#!/usr/bin/env bash
# One device call for the whole library: every gpu-marked test, the demo, the M sweep of humming.linear
# (auto dispatch) against torch bf16, torch._weight_int4pack_mm, torch._scaled_mm and gemlite, and the MoE
# layer (humming.moe.fused_moe / grouped_linear against a per-expert bf16 torch loop), in one run.
# Usage (device tool, carry .whl/gemlite): bash bench/h200_all.sh   -> logs and JSON under $OUT
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
if ls .whl/gemlite/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/gemlite/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HUMMING_CACHE_DIR=/tmp/humming-cache
step() {  # step NAME SECONDS CMD...: time-limited, logged to $OUT/NAME.log, keep going on failure
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "== $name: exit $? in $((SECONDS - t0))s" | tee -a "$OUT/$name.log"
}
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} >"$OUT/env.log" 2>&1
step gpu_tests "${TESTS_S:-280}" python3 -m pytest -q -m gpu -p no:cacheprovider --durations=10 tests
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | tail -25
step demo 60 python3 -m humming demo
tail -17 "$OUT/demo.log"
METHODS=torch_bf16,auto_w4a16_g128,auto_w8a16,auto_mxfp4_a16,auto_w8a8_fp8,auto_w4a8_fp8,auto_mxfp4_w4a8_fp8
METHODS=$METHODS,torch_int4pack_g128,torch_scaled_mm_fp8
step sweep "${SWEEP_S:-130}" python3 bench/sweep.py --methods "$METHODS" --m 1,16,1024,4096 --budget-s $((${SWEEP_S:-130} - 20)) \
  --out "$OUT/sweep.json"
step gemlite 45 python3 bench/sweep.py --methods gemlite_w4a16_g128 --m 1,16 --shapes 28672x8192,8192x8192 --budget-s 35 \
  --out "$OUT/gemlite.json"
step moe "${MOE_S:-70}" python3 bench/moe.py --out "$OUT/moe.json" \
  --methods fused_moe_auto,fused_moe_fp8_block_auto,torch_bf16_moe_loop,grouped_w13_auto,torch_bf16_w13_loop
tail -25 "$OUT/moe.log"
python3 bench/summary.py "$OUT/sweep.json" "$OUT/gemlite.json"
