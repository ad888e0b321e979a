#!/usr/bin/env bash
# The GPU checks in one device call (about 6 minutes on the H200; the tests run in 4 processes, since most of their time is compiling): every gpu-marked test (batch invariance,
# tensors past 2^31 elements and the hypothesis properties included), then compute-sanitizer memcheck and
# racecheck over one small run of each CUDA kernel family, then the hypothesis properties again with more
# examples. Logs under $OUT: env.log, gpu_tests.log, sanitizers.log, fuzz.log.
# Usage (repository root, on the GPU machine): OUT=out bash bench/tools/h200_checks.sh
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 HUMMING_CACHE_DIR=/tmp/humming-cache
step() {  # step NAME SECONDS CMD...: time-limited, logged to $OUT/NAME.log, keeps going on failure
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "== $name: exit $? in $((SECONDS - t0))s" | tee -a "$OUT/$name.log"
}
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  python3 -m humming --version
} >"$OUT/env.log" 2>&1
step gpu_tests "${TESTS_S:-300}" python3 -m pytest -q -m gpu -p no:cacheprovider -n "${WORKERS:-4}" --durations=15 tests
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | tail -20
SANITIZER=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
t0=$SECONDS
for tool in memcheck racecheck; do
  for script in bench/tools/cuda_sanitize.py bench/tools/cuda_fp8_sanitize.py; do
    echo "### compute-sanitizer --tool $tool $script"
    timeout "${SAN_S:-100}" "$SANITIZER" --tool "$tool" --error-exitcode 99 python3 "$script"
    echo "### exit $?"
  done
done >"$OUT/sanitizers.log" 2>&1
echo "== sanitizers: in $((SECONDS - t0))s" | tee -a "$OUT/sanitizers.log"
# memcheck also lists cuda-bindings' cuGetProcAddress probes (host API errors); kernel errors are the rest
grep -E "^### |ERROR SUMMARY|RACECHECK SUMMARY|Invalid __|Out of bounds" "$OUT/sanitizers.log"
step fuzz "${FUZZ_S:-120}" env HUMMING_FUZZ_PROFILE=long HUMMING_FUZZ_EXAMPLES="${FUZZ_EXAMPLES:-100}" \
  python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fuzz.py
tail -3 "$OUT/fuzz.log"
