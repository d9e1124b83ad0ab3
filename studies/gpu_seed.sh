#!/bin/bash
# One whole seed of a study on a borrowed GPU, its records copied to $OUT (or ./gpu_records) as
# each run finishes, so that a loan cut short keeps every run it finished.
#
#   bash studies/gpu_seed.sh studies/multi30k_en_de_converged.yaml 5 [JOBS]
#
# The machine needs the prepared dataset, not the raw text: carry data/multi30k_en_de's meta.json,
# spm.model and split folders (27 MB; not .parse_cache: a call carries 64 MiB and 8 paths at most)
# and .whl (benchmarks/gpu_wheels.sh; 4 MB) with the working tree; prepare uses the dataset as
# it is when its inputs are absent. Back on the workstation, copy the record folders into
# studies/<study>/<recipe>/seed<N> and regenerate the report (`structnmt study STUDY --report`);
# a seed goes in whole, or waits in studies/pending.
set -uo pipefail
study=$1
seed=$2
jobs=${3:-4}
device=${DEVICE:-cuda}  # DEVICE=cpu: the same steps on a CPU (a check of this script)
out=${OUT:-gpu_records}
# a GPU image has neither structnmt's command nor some of its pure-Python needs: the carried
# wheels (.whl, from benchmarks/gpu_wheels.sh) and this checkout stand in
command -v structnmt > /dev/null 2>&1 || source "$(dirname "$0")/../benchmarks/gpu_env.sh" || exit 1
records=$(python3 -c "from structnmt.study import load_study; print(load_study('$study').records)")
mkdir -p "$out"
copy() {  # every record folder of this seed (a record folder appears whole, by a rename)
  for dir in "$records"/*/seed"$seed"; do
    [ -f "$dir/record.json" ] || continue
    recipe=$(basename "$(dirname "$dir")")
    mkdir -p "$out/$recipe" && cp -r "$dir" "$out/$recipe/"
  done
}
(while sleep 20; do copy; done) &
watcher=$!
trap 'kill $watcher 2>/dev/null; copy' EXIT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | tee "$out/gpu.txt"
{ if [ -n "${STRUCTNMT_COMMIT:-}" ]; then echo "$STRUCTNMT_COMMIT (as STRUCTNMT_COMMIT names it; git here: $(git rev-parse --short HEAD 2>/dev/null || echo none))"; else git rev-parse HEAD 2>/dev/null || echo "not known: no .git here and STRUCTNMT_COMMIT unset"; fi; } | tee "$out/commit.txt"
structnmt study "$study" --seeds "$seed" --device "$device" --jobs "$jobs" 2>&1 | tee "$out/study.log"
