#!/usr/bin/env bash
# The whole library on the H200, in one or two device calls (PHASES=tests,bench by default):
# - tests: every gpu-marked test, the stream-K decode table, cold / warm warmup times per layer family;
# - bench: the demo, the M sweep of humming.linear (auto dispatch) against torch bf16,
#   torch._weight_int4pack_mm, torch._scaled_mm and gemlite, and the MoE layer (humming.moe.fused_moe /
#   grouped_linear against a per-expert bf16 torch loop).
# Usage (device tool, carry .whl): [PHASES=tests|bench] bash bench/h200_all.sh   -> logs and JSON under $OUT
set -u
OUT=${OUT:-out}
PHASES=${PHASES:-tests,bench}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
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
if [[ $PHASES == *tests* ]]; then
  step gpu_tests "${TESTS_S:-330}" python3 -m pytest -q -m gpu -p no:cacheprovider --durations=15 tests
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | tail -25
  step stream_k 80 python3 bench/cuda_decode.py "$OUT/cuda_decode_stream_k.json" --stream-k
  tail -30 "$OUT/stream_k.log"
  rm -rf "$HUMMING_CACHE_DIR"  # cold, then warm from disk in a second process
  step warmup 60 python3 bench/cuda_warmup.py "$OUT/cuda_warmup_cold.json"
  step warmup_disk 30 python3 bench/cuda_warmup.py "$OUT/cuda_warmup_disk.json"
  cat "$OUT/warmup.log" "$OUT/warmup_disk.log"
fi
if [[ $PHASES == *bench* ]]; then
  step demo 60 python3 -m humming demo
  tail -17 "$OUT/demo.log"
  METHODS=torch_bf16,auto_w4a16_g128,auto_w8a16,auto_mxfp4_a16,auto_w8a8_fp8,auto_w4a8_fp8,auto_mxfp4_w4a8_fp8
  METHODS=$METHODS,torch_int4pack_g128,torch_scaled_mm_fp8
  step sweep "${SWEEP_S:-130}" python3 bench/sweep.py --methods "$METHODS" --m 1,16,1024,4096 \
    --budget-s $((${SWEEP_S:-130} - 20)) --out "$OUT/sweep.json"
  step gemlite 45 python3 bench/sweep.py --methods gemlite_w4a16_g128 --m 1,16 --shapes 28672x8192,8192x8192 \
    --budget-s 35 --out "$OUT/gemlite.json"
  step moe "${MOE_S:-70}" python3 bench/moe.py --out "$OUT/moe.json" \
    --methods fused_moe_auto,fused_moe_fp8_block_auto,torch_bf16_moe_loop,grouped_w13_auto,torch_bf16_w13_loop
  tail -25 "$OUT/moe.log"
  python3 bench/summary.py "$OUT/sweep.json" "$OUT/gemlite.json"
fi
