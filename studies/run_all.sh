#!/usr/bin/env bash
# The Multi30k studies one after another, in the background: each `structnmt study` skips the
# runs its records already hold, so this can be started again after any stop, on any machine.
#   nohup studies/run_all.sh > runs/studies.log 2>&1 &
# En->Fr runs after the SyncAttn lambda sweep (set its recipe's lambda_sync to the sweep's best).
set -u
cd "$(dirname "$0")/.."
for study in multi30k_en_de syncattn_lambda multi30k_en_fr; do
  nice -n 10 structnmt study "studies/$study.yaml" || echo "[run_all] $study: not every run finished"
done
