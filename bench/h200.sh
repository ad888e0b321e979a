#!/usr/bin/env bash
# The standard H200 benchmark in one device call (under 10 minutes): the dense sweep and the MoE sweep of
# `python -m humming bench` (humming, each humming kernel, torch bf16, torch._scaled_mm, torch._grouped_mm /
# _scaled_grouped_mm, gemlite and humming-kernels when carried), then bench/report.py. Writes into $OUT (7
# files, 8 at most): linear.json, moe.json, README.md, {linear,moe}_{speedup,floor}.png, bench.log.
#   OUT=out bash bench/h200.sh              # both sweeps, the MoE one in what the dense one leaves
#   OUT=out MOE_S=0 bash bench/h200.sh      # linear.json alone (about 5 minutes)
#   OUT=out LINEAR_S=0 bash bench/h200.sh   # moe.json alone: every model preset, M = 1 ... 8192 (about 9 minutes)
# then copy the JSON files into bench/results/h200/ and run python bench/report.py bench/results/h200.
#
# Carried wheels: bench/tools/carried_wheels.sh (.whl/*.whl on PYTHONPATH, .whl/humming-kernels/*.whl
# as the peer, outside it).
# Knobs: LINEAR_S / MOE_S (wall seconds of each sweep, default 290 / 540 - LINEAR_S: together they fit one
# device call; 0 skips one; a sweep stops timing 40 s before its limit and writes what it has), M / MOE_M
# (default 1,16,64,256,1024,4096,8192 / every power of two from 1 to 8192), ROUNDS / MOE_ROUNDS (interleaved
# timing rounds per point, default 3 / 2), DTYPES (default bf16; bf16,fp16 doubles the work), LINEAR_CASES /
# MOE_CASES (MoE default: each model's own), LINEAR_SHAPES / MOE_SHAPES, MOE_MODELS (default: every preset,
# deepseek-v3, qwen3-30b-a3b, gpt-oss-120b, kimi-k2; with MOE_SHAPES only those shapes unless it is set).
# Usage: from the repository root, as above.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
LOG="$OUT/bench.log"
source bench/tools/carried_wheels.sh "$LOG"
export PYTHONUNBUFFERED=1 HUMMING_CACHE_DIR=/tmp/humming-cache TQDM_MININTERVAL=10
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  python3 -m humming --version
} >>"$LOG" 2>&1
DTYPES=${DTYPES:-bf16}
sweep() {  # sweep OP SECONDS M ROUNDS [ARGS...]: the sweep stops timing 40 s before the hard limit, writes what it has
  local op=$1 limit=$2 m=$3 rounds=$4; shift 4
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" python3 -m humming bench "$op" --m "$m" --dtypes "$DTYPES" \
    --budget-s $((limit - 40)) --rounds "$rounds" --peer-site /tmp/hk-site --out "$OUT/$op.json" "$@" >>"$LOG" 2>&1
  echo "== $op: exit $? in $((SECONDS - t0))s" >>"$LOG"
}
LINEAR_S=${LINEAR_S:-290}
MOE_S=${MOE_S:-$((LINEAR_S < 540 ? 540 - LINEAR_S : 0))}
MOE_M=${MOE_M:-1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192}
[ "$LINEAR_S" -gt 0 ] && sweep linear "$LINEAR_S" "${M:-1,16,64,256,1024,4096,8192}" "${ROUNDS:-3}" \
  ${LINEAR_CASES:+--cases "$LINEAR_CASES"} ${LINEAR_SHAPES:+--shapes "$LINEAR_SHAPES"}
[ "$MOE_S" -gt 0 ] && sweep moe "$MOE_S" "$MOE_M" "${MOE_ROUNDS:-2}" ${MOE_MODELS:+--models "$MOE_MODELS"} \
  ${MOE_CASES:+--cases "$MOE_CASES"} ${MOE_SHAPES:+--shapes "$MOE_SHAPES"}
rm -f "$OUT"/*.tmp  # a sweep killed while writing leaves its last complete JSON and this
python3 bench/report.py "$OUT" >>"$LOG" 2>&1
grep -E "^(skipped|==|wrote|plots skipped)|rows \(" "$LOG"
