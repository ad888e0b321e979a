#!/usr/bin/env bash
# One device call for the stream-K decode kernel: GPU tests, compute-sanitizer, timing table.
# Usage (on the GPU machine, repo root, wheels of cuda-core under .whl): bash bench/cuda_decode_stream_k.sh
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD HUMMING_CACHE_DIR=/tmp/hc PYTHONUNBUFFERED=1
step() {  # step NAME SECONDS CMD...: run with a time limit, log to $OUT/NAME.log, keep going on failure
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "== $name: exit $? in $((SECONDS - t0))s" | tee -a "$OUT/$name.log"
}
nvidia-smi -L
step stream_k_pytest 150 python3 -m pytest -x -q -p no:cacheprovider -rs tests/test_cuda_decode.py
tail -4 "$OUT/stream_k_pytest.log"
step stream_k_memcheck 30 compute-sanitizer --tool memcheck --report-api-errors no python3 bench/cuda_decode.py - --sanitize
step stream_k_racecheck 30 compute-sanitizer --tool racecheck --report-api-errors no python3 bench/cuda_decode.py - --sanitize
cat "$OUT/stream_k_racecheck.log" >>"$OUT/stream_k_memcheck.log" && rm "$OUT/stream_k_racecheck.log"
grep -E "SUMMARY|rel err|==" "$OUT/stream_k_memcheck.log"
step stream_k_bench 75 python3 bench/cuda_decode.py "$OUT/cuda_decode_stream_k.json" --stream-k
cat "$OUT/stream_k_bench.log"
