#!/usr/bin/env bash
# One device call for the Hopper FP8 GEMM: stage-by-stage diagnosis, GPU tests, benchmark vs
# torch._scaled_mm, compute-sanitizer memcheck on small configs. Logs under $OUT (default ./out).
# Usage (on the GPU machine, repo root): bash bench/cuda_fp8_h200.sh   (about 6 minutes at most)
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export HUMMING_CACHE_DIR=/tmp/humming-cache
if ! python3 -c "import cuda.core, cuda.bindings" 2>/dev/null && ls .whl/cuda_core-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
{
  nvidia-smi -L
  python3 -c "import torch, triton, cuda.core, cuda.bindings; from humming.cuda_kernels import jit; \
print('torch', torch.__version__, 'triton', triton.__version__, 'cuda-core', cuda.core.__version__, \
'cuda-bindings', cuda.bindings.__version__, 'nvrtc', jit.nvrtc_version())"
} 2>&1 | tee "$OUT/cuda_fp8_env.log"
step() {  # step NAME SECONDS CMD...: run with a time limit, log to $OUT/NAME.log; returns the exit code
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc in $((SECONDS - t0))s" | tee -a "$OUT/$name.log"
  return $rc
}
step cuda_fp8_diag 45 python3 bench/cuda_fp8_diag.py
cat "$OUT/cuda_fp8_diag.log"
choice=$(grep CHOICE "$OUT/cuda_fp8_diag.log")
case "$choice" in
  *store=tma*) ;;
  *store=direct*) sed -i 's/^    tma_store: bool = True$/    tma_store: bool = False/' humming/cuda_kernels/fp8_gemm.py ;;
  *)
    step cuda_fp8_memcheck 60 compute-sanitizer --tool memcheck --leak-check no python3 bench/cuda_fp8_sanitize.py
    grep -v "Host Frame\|cuGetProcAddress\|Saved host backtrace\|^========= $" "$OUT/cuda_fp8_memcheck.log" | head -40
    exit 1 ;;
esac
step cuda_fp8_pytest 120 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_fp8.py
grep -E "passed|failed|Error|assert" "$OUT/cuda_fp8_pytest.log" | tail -12
step cuda_fp8_bench 150 python3 bench/cuda_fp8.py "$OUT/cuda_fp8_h200.json"
tail -40 "$OUT/cuda_fp8_bench.log"
step cuda_fp8_memcheck 45 compute-sanitizer --tool memcheck --leak-check no python3 bench/cuda_fp8_sanitize.py
grep -E "ERROR SUMMARY|rel err|==" "$OUT/cuda_fp8_memcheck.log" | tail -8
