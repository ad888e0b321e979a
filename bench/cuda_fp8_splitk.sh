#!/usr/bin/env bash
# One device call for FP8 GEMM split-K: the split-K GPU tests, the rest of the FP8 GPU tests, memcheck and
# racecheck on one odd-shape split case, then the split-K timing table (bench/cuda_fp8_splitk.py) that
# decides whether choose_tuning adopts split-K. Logs under $OUT (default ./out).
# Usage (on the GPU machine, repo root, carry .whl): bash bench/cuda_fp8_splitk.sh   (3 minutes at most)
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export HUMMING_CACHE_DIR=/tmp/humming-cache
if ! python3 -c "import cuda.core, cuda.bindings" 2>/dev/null && ls .whl/cuda_core-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
step() {  # step NAME SECONDS CMD...: run with a time limit, log to $OUT/NAME.log; returns the exit code
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc in $((SECONDS - t0))s" | tee -a "$OUT/$name.log"
  return $rc
}
step splitk_pytest 45 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_fp8.py -k split_k
tail -15 "$OUT/splitk_pytest.log"
step fp8_pytest 50 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_fp8.py -m gpu -k "not split_k"
tail -5 "$OUT/fp8_pytest.log"
one="test_split_k_matches_float64_reference and e4m3-m3-n333"
for tool in memcheck racecheck; do
  step "splitk_$tool" 20 compute-sanitizer --tool "$tool" python3 -m pytest -q -p no:cacheprovider \
    tests/test_cuda_fp8.py -k "$one"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$OUT/splitk_$tool.log" | tail -3
done
step splitk_bench 45 python3 bench/cuda_fp8_splitk.py "$OUT/cuda_fp8_splitk.json"
tail -20 "$OUT/splitk_bench.log"
