#!/usr/bin/env bash
# The Multi30k studies in the background: each `structnmt study` skips the runs its records
# already hold, so this can be started again after any stop, on any machine.
#   JOBS=2 nohup studies/run_all.sh > runs/studies.log 2>&1 &
# JOBS=2 runs two trainings at once, one thread each (on two cores this gives more runs per hour
# than one two-thread run, and other work on the machine slows it without stalling it).
# Order: En->De; En->Fr's runs that do not depend on SyncAttn's lambda; the lambda sweep (val
# only); then, once configs/multi30k_en_fr_syncattn.yaml has the sweep's best lambda_sync
# (studies/sweep_choice.py checks, and stops here until it does), En->Fr's SyncAttn runs; last,
# En->De's control recipes for LPSI (lpsi without synchronisation, local_window).
set -u
cd "$(dirname "$0")/.."
study() { nice -n 10 structnmt study "studies/$1.yaml" --jobs "${JOBS:-1}" "${@:2}" || echo "[run_all] $1: not every run finished"; }
MAIN_EN_DE="transformer pascal deps_san_rs deps_san_plain udiscal sasa sacra dbsa_src lpsi_synchmse"
# shellcheck disable=SC2086
study multi30k_en_de --only $MAIN_EN_DE
study multi30k_en_fr --only transformer dbsa
study syncattn_lambda
if python studies/sweep_choice.py; then
  study multi30k_en_fr
else
  echo "[run_all] En->Fr SyncAttn waits for the sweep's lambda (above)"
fi
study multi30k_en_de  # the controls: the runs above are recorded, so only they are left
