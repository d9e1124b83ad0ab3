# Sourced at the start of a command on a borrowed GPU machine (`.whl` carried; see
# benchmarks/gpu_wheels.sh): installs the carried wheels beside the image's own packages, puts
# them and this checkout on the path, and makes `structnmt` the checkout's command line
# (structnmt is not installed there). Works from any directory: it finds the checkout by itself.
#
#   source benchmarks/gpu_env.sh && python3 benchmarks/gpu_report.py
_structnmt_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if ls "$_structnmt_root"/.whl/*.whl > /dev/null 2>&1; then
  if ! python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      "$_structnmt_root"/.whl/*.whl; then
    echo "gpu_env: installing the carried wheels failed" >&2
    return 1 2> /dev/null || exit 1
  fi
  if ls "$_structnmt_root"/.whl/joey/*.whl > /dev/null 2>&1; then  # Joey NMT's own (gpu_wheels.sh)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site-joey \
      "$_structnmt_root"/.whl/joey/*.whl && export JOEY_PYTHONPATH=/tmp/site-joey
  fi
  rm -rf /tmp/site/test  # a wheel's stray top-level `test` package would shadow the standard library's
  export PYTHONPATH=/tmp/site:$_structnmt_root${PYTHONPATH:+:$PYTHONPATH}
else
  echo "gpu_env: no .whl/ in $_structnmt_root (bash benchmarks/gpu_wheels.sh, then carry .whl):" \
       "structnmt's own imports may fail" >&2
  export PYTHONPATH=$_structnmt_root${PYTHONPATH:+:$PYTHONPATH}
fi
if ! command -v structnmt > /dev/null 2>&1; then
  structnmt() { python3 -m structnmt.cli.main "$@"; }
  export -f structnmt
fi
if ! command -v python > /dev/null 2>&1; then
  python() { python3 "$@"; }
  export -f python
fi
unset _structnmt_root
