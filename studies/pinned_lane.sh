#!/usr/bin/env bash
# Runs of a study, one after another, from a git worktree pinned at one commit, so that every run
# of a seed trains at the same code while the checkout goes on changing (resumable: run the same
# line again; a stopped run resumes from its checkpoint in the shared runs/ folder).
#
#   bash studies/pinned_lane.sh COMMIT STUDY.yaml RECIPE:SEED [RECIPE:SEED ...]
#   setsid nohup bash studies/pinned_lane.sh 5bdd5b6 studies/multi30k_en_de_converged.yaml \
#       transformer:5 local_window_both:5 > /dev/null 2>&1 < /dev/null &    # two lanes for two cores
#
# The worktree (../structnmt-COMMIT, or $PINNED_DIR) shares this checkout's ignored runs/, data/
# and parsers/ by links. Each run trains on one thread (THREADS), niced (NICE), with its output
# appended to runs/logs/RECIPE_sSEED.log; each finished record is moved from the worktree into
# this checkout's studies/pending/<study>/<recipe>/seed<N>, to be taken into the study once its
# seed is whole (studies/pending/README.md). Stop a lane with `pkill -f studies/pinned_lane.sh`,
# then `pkill -TERM -f structnmt.study.runs` (the runs checkpoint and exit).
set -uo pipefail
if [ $# -lt 3 ]; then
  sed -n 2,15p "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
main=$(cd "$(dirname "$0")/.." && pwd)
commit=$(git -C "$main" rev-parse --short "$1") || { echo "error: no commit $1" >&2; exit 2; }
study=$2; shift 2
dir=${PINNED_DIR:-$main/../structnmt-$commit}
if [ ! -d "$dir" ]; then
  git -C "$main" worktree add --detach "$dir" "$commit" || exit 1
fi
for shared in runs data parsers; do
  mkdir -p "$main/$shared"
  [ -e "$dir/$shared" ] || ln -s "$main/$shared" "$dir/$shared"
done
mkdir -p "$main/runs/logs"
cd "$dir" || exit 1
for item in "$@"; do
  recipe=${item%%:*}; seed=${item##*:}
  record=$(python -c "import sys; from structnmt.study.spec import load_study
print(load_study(sys.argv[1]).record_dir(sys.argv[2], int(sys.argv[3])))" "$study" "$recipe" "$seed") || continue
  held="$main/studies/pending/$(basename "$(dirname "$(dirname "$record")")")/$recipe/seed$seed"
  if [ -f "$held/record.json" ] || [ -f "$main/$record/record.json" ]; then
    echo "== $recipe seed $seed: recorded already" >> "$main/runs/logs/lane_$$.log"
    continue
  fi
  echo "== $(date -u +%FT%TZ) $recipe seed $seed at $commit in $dir" >> "$main/runs/logs/lane_$$.log"
  OMP_NUM_THREADS=${THREADS:-1} MKL_NUM_THREADS=${THREADS:-1} nice -n "${NICE:-5}" \
    python -m structnmt.study.runs "$study" "$recipe" "$seed" "${THREADS:-1}" \
    >> "$main/runs/logs/${recipe}_s${seed}.log" 2>&1
  code=$?
  echo "== $(date -u +%FT%TZ) $recipe seed $seed exit $code" >> "$main/runs/logs/lane_$$.log"
  if [ "$code" -eq 0 ] && [ -f "$record/record.json" ]; then
    mkdir -p "$(dirname "$held")" && mv "$record" "$held" && echo "held: $held" >> "$main/runs/logs/lane_$$.log"
  fi
done
