#!/usr/bin/env bash
# Runs of a study, one after another, from a git worktree pinned at one commit, so that every run
# of a seed trains at the same code while the checkout goes on changing (resumable: run the same
# line again; a stopped run resumes from its checkpoint in the shared runs/ folder).
#
#   bash studies/pinned_lane.sh COMMIT STUDY.yaml RECIPE:SEED [RECIPE:SEED ...]
#   setsid nohup bash studies/pinned_lane.sh 5bdd5b6 studies/multi30k_en_de_converged.yaml \
#       transformer:5 local_window_both:5 > /dev/null 2>&1 < /dev/null &    # two lanes for two cores
#
# STUDY.yaml is a path from the repository's root, as the pinned commit has it. The worktree
# (../structnmt-COMMIT, or $PINNED_DIR) shares this checkout's ignored runs/, data/ and parsers/ by
# links. Each run trains on one thread (THREADS), niced (NICE); what it prints goes to
# runs/logs/STUDY/RECIPE_sSEED.log, what the lane does to runs/logs/lane_PID.log. A finished
# record moves from the worktree into this checkout's pending/STUDY/RECIPE/seedN beside the study's
# records (Study.held_dir: studies/pending/... for records in studies/), to be
# taken into the study once its seed is whole (studies/pending/README.md). A run whose seed has
# records from another kind of machine or precision is not started (structnmt.study.same_machine;
# ALLOW_OTHER_MACHINE=1 starts it all the same). Stop one lane with
# `kill -TERM -- -PID` (PID in runs/logs/lane_PID.pid; its run checkpoints and the lane ends).
set -uo pipefail
if [ $# -lt 3 ]; then
  sed -n 2,19p "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
main=$(cd "$(dirname "$0")/.." && pwd)
commit=$(git -C "$main" rev-parse --verify --quiet "$1^{commit}") || { echo "error: $1 is not a commit" >&2; exit 2; }
short=${commit:0:12}
study=$2; shift 2
case $study in
  /*|../*|*/../*) echo "error: give the study file from the repository's root (studies/NAME.yaml), not $study" >&2
                  exit 2 ;;
esac
git -C "$main" cat-file -e "$commit:$study" 2>/dev/null \
  || { echo "error: commit $short has no $study (a path from the repository's root)" >&2; exit 2; }
dir=${PINNED_DIR:-$main/../structnmt-$short}
mkdir -p "$main/runs/logs"
log="$main/runs/logs/lane_$$.log"
echo $$ > "$main/runs/logs/lane_$$.pid"
say() { echo "== $(date -u +%FT%TZ) $*" >> "$log"; }

# one lane creates the worktree while the others wait; each checks it is a clean checkout of the commit
exec 9> "$main/runs/.pinned_lane.lock"
flock 9
if [ ! -e "$dir" ]; then
  git -C "$main" worktree add --detach "$dir" "$commit" >> "$log" 2>&1 || { say "cannot add a worktree at $dir"; exit 1; }
fi
for shared in runs data parsers; do
  mkdir -p "$main/$shared"
  [ -L "$dir/$shared" ] || [ -e "$dir/$shared" ] || ln -s "$main/$shared" "$dir/$shared"
done
flock -u 9
if [ "$(git -C "$dir" rev-parse HEAD 2>/dev/null)" != "$commit" ] \
   || [ -n "$(git -C "$dir" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  say "$dir is not a clean checkout of $short: stopping (remove it, or name another with PINNED_DIR)"
  exit 2
fi
cd "$dir" || exit 1
# TERM (kill -TERM -- -PID) reaches the run, which checkpoints and exits 75; the lane waits for it
# and stops, saying so, instead of dying before the run has saved. A TERM that comes between runs
# (while a record is looked up or moved) stops the lane at the next check, never starting a run.
stop=0
trap 'stop=1; say "signal received: the lane stops after its run has saved"' TERM
stopped() { [ "$stop" = 1 ] && { say "stopped by a signal"; exit 75; }; }
name=$(basename "${study%.yaml}")
mkdir -p "$main/runs/logs/$name"
for item in "$@"; do
  stopped
  recipe=${item%%:*}; seed=${item##*:}
  if [ "$recipe" = "$item" ] || ! [[ $seed =~ ^[0-9]+$ ]]; then
    say "$item: not RECIPE:SEED, skipped"
    continue
  fi
  record=$(python -c "import sys; from structnmt.study.spec import load_study
s = load_study(sys.argv[1]); s.recipe(sys.argv[2])  # raises (any commit) for a recipe it lacks
print(s.record_dir(sys.argv[2], int(sys.argv[3])))" "$study" "$recipe" "$seed" 2>> "$log") \
    || { say "$item: $study at $short has no such recipe, or cannot be read (above), skipped"; continue; }
  # where this checkout's code holds finished records (Study.held_root, held_dir; the pinned commit
  # may predate them): the folder the machine check reads, and this run's record's place in it
  held=$(cd "$main" && python -c "import sys; from structnmt.study.spec import load_study
s = load_study(sys.argv[1]); print(s.held_root.resolve()); print(s.held_dir(sys.argv[2], int(sys.argv[3])).resolve())" \
    "$study" "$recipe" "$seed" 2>> "$log") \
    || { say "$item: this checkout cannot read $study (above), skipped"; continue; }
  held_root=${held%%$'\n'*}; held=${held#*$'\n'}
  if [ -f "$held/record.json" ] || [ -f "$main/$record/record.json" ]; then
    say "$item: recorded already"
    continue
  fi
  if [ ! -f "$record/record.json" ] && [ "${ALLOW_OTHER_MACHINE:-0}" != 1 ]; then
    # a seed's runs train on one kind of machine, in one precision: a lane on another kind skips
    # the run (ALLOW_OTHER_MACHINE=1 trains all the same; the report then warns that the seed mixes).
    # The check runs from this checkout (the pinned commit may predate it) and reads its study file.
    said=$(cd "$main" && python -m structnmt.study.same_machine "$study" "$recipe" "$seed" "$held_root" 2>&1)
    code=$?
    stopped
    case $code in
      0) say "$item: same kind of machine: $said" ;;
      3) say "$item: not started: $said"; continue ;;
      *) say "$item: the machine check failed (exit $code), the lane stops: $said"; exit 2 ;;
    esac
  fi
  stopped
  if [ ! -f "$record/record.json" ]; then
    say "$item at $short in $dir"
    OMP_NUM_THREADS=${THREADS:-1} MKL_NUM_THREADS=${THREADS:-1} nice -n "${NICE:-5}" \
      python -m structnmt.study.runs "$study" "$recipe" "$seed" "${THREADS:-1}" \
      >> "$main/runs/logs/$name/${recipe}_s${seed}.log" 2>&1
    code=$?
    say "$item: exit $code"
    [ "$code" -eq 75 ] && { say "the run was stopped by a signal: the lane stops too"; exit 75; }
  fi
  if [ -f "$record/record.json" ]; then  # written whole (a rename), so whole here
    mkdir -p "$(dirname "$held")" && mv -T "$record" "$held" && say "$item: held in $held"
  fi
done
