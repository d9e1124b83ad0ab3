# Sourced at the start of a command on a borrowed GPU machine (the working tree's root, `.whl`
# carried; see benchmarks/gpu_wheels.sh): installs the carried wheels beside the image's own
# packages, puts this checkout on the path, and makes `structnmt` the checkout's command line
# (structnmt is not installed there).
#
#   source benchmarks/gpu_env.sh && python3 benchmarks/gpu_report.py
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || return 1 2> /dev/null || exit 1
  export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
else
  echo "gpu_env: no .whl/ here (bash benchmarks/gpu_wheels.sh, then carry .whl): structnmt's own imports may fail" >&2
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
if ! command -v structnmt > /dev/null 2>&1; then
  structnmt() { python3 -m structnmt.cli.main "$@"; }
  export -f structnmt
fi
command -v python > /dev/null 2>&1 || { python() { python3 "$@"; }; export -f python; }
