#!/usr/bin/env bash
# The GPU checks in one device call, each step inside its own time box (the boxes add up to under 9 minutes):
#   gpu_tests   every unmarked gpu test but the fuzzer, in parallel processes (most of their time is compiling):
#               WORKERS, or fewer where the card cannot hold that many times tests/conftest.py's LIGHT_MEMORY_GIB
#   gpu_heavy   the heavy_memory tests, in as many processes as the card holds times its GPU_MEMORY_LIMIT_GIB
#   gpu_big     the big_memory tests, one at a time
#   sanitizers  compute-sanitizer memcheck and racecheck over one small run of each CUDA kernel family
#   fuzz        the hypothesis properties (tests/test_fuzz.py), random examples, one property per process
#   fp32_decode the Triton WnA16, dequantization and grouped tests with HUMMING_TRITON_PACKED_DECODE=0: the decode
#               the formats the packed one does not take run, on the weights it takes (not in the default STEPS)
# Each parallel step prints a line per test (-v), so that a step cut by its time box still names its failures.
# Logs under $OUT: env.log, gpu_tests.log, gpu_heavy.log, gpu_big.log, gpu_memory.log (each gpu test's peak), sanitizers.log,
# fuzz.log; the last lines printed are one summary line per step.
# Usage (repository root, on the GPU machine, carrying .whl): OUT=out bash bench/tools/h200_checks.sh
# STEPS (comma-separated, default all): the steps to run, so that the suite can be spread over device calls, e.g.
#   STEPS=gpu_tests TESTS_S=540 ... then STEPS=gpu_heavy,gpu_big,sanitizers,fuzz ...
set -u
STEPS=${STEPS:-gpu_tests,gpu_heavy,gpu_big,sanitizers,fuzz}
OUT=${OUT:-out}
mkdir -p "$OUT"
source bench/tools/carried_wheels.sh "$OUT/env.log"  # platformdirs and filelock: the image lacks them
export PYTHONUNBUFFERED=1 HUMMING_CACHE_DIR=/tmp/humming-cache
export HUMMING_TEST_MEMORY_LOG=$OUT/gpu_memory.log
: >"$HUMMING_TEST_MEMORY_LOG"
SUMMARY=()
step() {  # step NAME SECONDS CMD...: time-limited, logged to $OUT/NAME.log, keeps going on failure; skipped unless in STEPS
  local name=$1 limit=$2
  shift 2
  [[ ",$STEPS," == *",$name,"* ]] || return 0
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  local line="== $name: exit $rc in $((SECONDS - t0))s of ${limit}s"
  [ $rc -eq 124 ] && line="$line (CUT OFF by its time box)"
  echo "$line" | tee -a "$OUT/$name.log"
  SUMMARY+=("$line :: $(grep -E '[0-9]+ (passed|failed)' "$OUT/$name.log" | tail -1)")
}
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv,noheader
  python3 -m humming --version
  python3 -c "import transformers; print('transformers', transformers.__version__)" 2>&1
} >>"$OUT/env.log" 2>&1
PYTEST=(python3 -m pytest -v -p no:cacheprovider --durations=15)
# workers NEED_GIB: WORKERS, capped by how many tests of NEED_GIB (plus a context each) the card holds
workers() {
  local card
  card=$(python3 -c "import torch; print(int(torch.cuda.get_device_properties(0).total_memory / 2**30))")
  local fit=$((card / ($1 + 1)))
  echo $((fit < 1 ? 1 : (fit < ${WORKERS:-12} ? fit : ${WORKERS:-12})))
}
LIGHT=$(workers "$(python3 -c 'import tests.conftest as c; print(c.LIGHT_MEMORY_GIB)')")
HEAVY=$(workers "$(python3 -c 'import tests.conftest as c; print(c.GPU_MEMORY_LIMIT_GIB)')")
echo "workers: $LIGHT light, $HEAVY heavy" | tee -a "$OUT/env.log"
failures() { [ -f "$OUT/$1.log" ] || return 0; grep -E "(FAILED|ERROR) tests/" "$OUT/$1.log" | sed -E 's/^\[gw[0-9]+\] \[ *[0-9]+%\] //; s/ - .*//' | sort -u | head -30; }
step gpu_tests "${TESTS_S:-240}" "${PYTEST[@]}" -m "gpu and not big_memory and not heavy_memory" -n "$LIGHT" \
  --ignore=tests/test_fuzz.py tests
failures gpu_tests
step gpu_heavy "${HEAVY_S:-60}" "${PYTEST[@]}" -m "gpu and heavy_memory" -n "$HEAVY" tests
failures gpu_heavy
step gpu_big "${BIG_S:-60}" "${PYTEST[@]}" -m "gpu and big_memory" tests
failures gpu_big
SANITIZER=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
sanitize() {
  for tool in memcheck racecheck; do
    for script in bench/tools/cuda_sanitize.py bench/tools/cuda_fp8_sanitize.py; do
      echo "### compute-sanitizer --tool $tool $script"
      "$SANITIZER" --tool "$tool" --error-exitcode 99 python3 "$script"
      echo "### exit $?"
    done
  done
}
export -f sanitize
export SANITIZER
step sanitizers "${SAN_S:-90}" bash -c sanitize
# memcheck also lists cuda-bindings' cuGetProcAddress probes (host API errors); kernel errors are the rest
[ -f "$OUT/sanitizers.log" ] && grep -E "^### |ERROR SUMMARY|RACECHECK SUMMARY|Invalid __|Out of bounds" "$OUT/sanitizers.log"
step fp32_decode "${FP32_DECODE_S:-150}" env HUMMING_TRITON_PACKED_DECODE=0 "${PYTEST[@]}" \
  -m "gpu and not big_memory and not heavy_memory" -n "$LIGHT" tests/test_triton_dequant.py tests/test_triton_wna16.py \
  tests/test_triton_large.py tests/moe/test_grouped.py tests/moe/test_gather.py
failures fp32_decode
step fuzz "${FUZZ_S:-70}" env HUMMING_FUZZ_PROFILE=long HUMMING_FUZZ_EXAMPLES="${FUZZ_EXAMPLES:-40}" \
  "${PYTEST[@]}" -m gpu -n "$LIGHT" tests/test_fuzz.py
echo "-- largest GPU peaks (GiB):"
sort -rn "$HUMMING_TEST_MEMORY_LOG" | head -8
printf '%s\n' "${SUMMARY[@]}"
