#!/usr/bin/env bash
# The standard H200 benchmark in one device call (about 8 minutes): the dense sweep and the MoE sweep of
# `python -m humming bench` (humming, each humming kernel, torch bf16, torch._scaled_mm, torch._grouped_mm,
# gemlite and humming-kernels when carried), then bench/report.py. Writes into $OUT (7 files, 8 at most):
# linear.json, moe.json, README.md, {linear,moe}_{time,ratio}.png, bench.log.
#
# Carried wheels (the device has no network), all optional, installed with --no-deps:
#   .whl/*.whl                  -> /tmp/site, on PYTHONPATH (gemlite, matplotlib for the plots, ...)
#   .whl/humming-kernels/*.whl  -> /tmp/hk-site, NOT on PYTHONPATH: humming-kernels==0.1.19 (also taken from
#                                  .whl/humming_kernels-*.whl) and what it needs
#                                  beyond this repo's requirements (filelock, jinja2, tabulate); its package is
#                                  also named `humming`, so the sweep runs it in a worker process (--peer-site)
# Knobs: LINEAR_S / MOE_S (wall seconds of each sweep, default 290 / 120; 0 skips it), M (default
# 1,16,64,256,1024,4096,8192), ROUNDS (interleaved timing rounds per point, default 3),
# DTYPES (default bf16; bf16,fp16 doubles the work), LINEAR_CASES / MOE_CASES, LINEAR_SHAPES / MOE_SHAPES.
# Usage (repository root): OUT=out bash bench/h200.sh; then copy $OUT's files into bench/results/h200/.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
LOG="$OUT/bench.log"
install() {  # install DIR WHEELS...: no network, no dependencies
  local dir=$1; shift
  [ $# -gt 0 ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$dir" "$@"
}
shopt -s nullglob
wheels=() peer=(.whl/humming-kernels/*.whl .whl/humming_kernels-*.whl)  # the peer never goes on PYTHONPATH
for w in .whl/*.whl; do [[ $w == .whl/humming_kernels-* ]] || wheels+=("$w"); done
install /tmp/site "${wheels[@]}" >>"$LOG" 2>&1
install /tmp/hk-site "${peer[@]}" >>"$LOG" 2>&1
shopt -u nullglob
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HUMMING_CACHE_DIR=/tmp/humming-cache TQDM_MININTERVAL=10
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  python3 -m humming --version
} >>"$LOG" 2>&1
M=${M:-1,16,64,256,1024,4096,8192}
DTYPES=${DTYPES:-bf16}
sweep() {  # sweep OP SECONDS [ARGS...]: the sweep stops timing 40 s before the hard limit and writes what it has
  local op=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" python3 -m humming bench "$op" --m "$M" --dtypes "$DTYPES" \
    --budget-s $((limit - 40)) --rounds "${ROUNDS:-3}" --peer-site /tmp/hk-site --out "$OUT/$op.json" "$@" >>"$LOG" 2>&1
  echo "== $op: exit $? in $((SECONDS - t0))s" >>"$LOG"
}
[ "${LINEAR_S:-290}" -gt 0 ] && sweep linear "${LINEAR_S:-290}" ${LINEAR_CASES:+--cases "$LINEAR_CASES"} ${LINEAR_SHAPES:+--shapes "$LINEAR_SHAPES"}
[ "${MOE_S:-120}" -gt 0 ] && sweep moe "${MOE_S:-120}" ${MOE_CASES:+--cases "$MOE_CASES"} ${MOE_SHAPES:+--shapes "$MOE_SHAPES"}
rm -f "$OUT"/*.tmp  # a sweep killed while writing leaves its last complete JSON and this
python3 bench/report.py "$OUT" >>"$LOG" 2>&1
grep -E "^(skipped|==|wrote|plots skipped)|rows \(" "$LOG"
