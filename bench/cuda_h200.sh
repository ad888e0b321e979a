#!/usr/bin/env bash
# One device call: GPU tests, decode benchmark (+ tuning sweep), warmup cold/warm, compute-sanitizer.
# Usage (on the GPU machine, repo root): bash bench/cuda_h200.sh   (logs under $OUT, default ./out)
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export HUMMING_CACHE_DIR=/tmp/humming-cache
if ! python3 -c "import cuda.core, cuda.bindings" 2>/dev/null && ls .whl/cuda_core-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
{
  nvidia-smi -L
  python3 -c "import torch, cuda.core, cuda.bindings; from humming.cuda_kernels import jit; \
print('torch', torch.__version__, 'cuda-core', cuda.core.__version__, 'cuda-bindings', cuda.bindings.__version__, \
'nvrtc', jit.nvrtc_version())"
} 2>&1
step() {  # step NAME SECONDS CMD...: run with a time limit, log to $OUT/NAME.log, keep going on failure
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "== $name: exit $? in $((SECONDS - t0))s" | tee -a "$OUT/$name.log"
}
step cuda_pytest 90 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_jit.py tests/test_cuda_decode.py tests/test_cuda_gemm.py tests/test_cuda_compile.py
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda_pytest.log" | tail -15
step cuda_bench 90 python3 bench/cuda_decode.py "$OUT/cuda_decode.json" --sweep
tail -45 "$OUT/cuda_bench.log"
step cuda_gemm 40 python3 bench/cuda_gemm.py "$OUT/cuda_gemm.json"
tail -20 "$OUT/cuda_gemm.log"
rm -rf /tmp/humming-warm
HUMMING_CACHE_DIR=/tmp/humming-warm step cuda_warmup_cold 40 python3 bench/cuda_warmup.py "$OUT/cuda_warmup.json"
HUMMING_CACHE_DIR=/tmp/humming-warm step cuda_warmup_warm 30 python3 bench/cuda_warmup.py /tmp/cuda_warmup_warm.json
cat "$OUT/cuda_warmup_warm.log" >>"$OUT/cuda_warmup_cold.log"
rm -f "$OUT/cuda_warmup_warm.log"
grep -h -E "warmup:|  (decode|gemm)" "$OUT"/cuda_warmup_cold.log
{
  step cuda_memcheck 45 compute-sanitizer --tool memcheck --report-api-errors no python3 bench/cuda_sanitize.py
  step cuda_racecheck 45 compute-sanitizer --tool racecheck --report-api-errors no python3 bench/cuda_sanitize.py
} 2>&1
cat "$OUT/cuda_racecheck.log" >>"$OUT/cuda_memcheck.log"
rm -f "$OUT/cuda_racecheck.log"
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rel err|==" "$OUT/cuda_memcheck.log" | tail -14
