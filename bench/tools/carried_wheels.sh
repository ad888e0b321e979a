# Sourced by the device scripts (bench/h200.sh, bench/tools/h200_checks.sh): installs the wheels carried in
# .whl/ (the device has no network), with --no-deps, and puts the general ones on PYTHONPATH.
#   .whl/*.whl                  -> /tmp/site, on PYTHONPATH: what the device image lacks of this repo's
#                                  requirements (platformdirs, filelock) and the bench extras (gemlite,
#                                  matplotlib for the plots, ...)
#   .whl/humming-kernels/*.whl  -> /tmp/hk-site, NOT on PYTHONPATH: humming-kernels==0.1.19 (also taken from
#                                  .whl/humming_kernels-*.whl) and what it needs beyond this repo's
#                                  requirements; its package is also named `humming`, so the sweep runs it
#                                  in a worker process (--peer-site /tmp/hk-site)
# Usage: source bench/tools/carried_wheels.sh LOGFILE
carried_install() {  # carried_install DIR WHEELS...: no network, no dependencies
  local dir=$1
  shift
  [ $# -gt 0 ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$dir" "$@"
}
shopt -s nullglob
carried_general=() carried_peer=(.whl/humming-kernels/*.whl .whl/humming_kernels-*.whl)
for w in .whl/*.whl; do [[ $w == .whl/humming_kernels-* ]] || carried_general+=("$w"); done
carried_install /tmp/site "${carried_general[@]}" >>"${1:-/dev/stderr}" 2>&1
carried_install /tmp/hk-site "${carried_peer[@]}" >>"${1:-/dev/stderr}" 2>&1
shopt -u nullglob
export PYTHONPATH=/tmp/site:$PWD
