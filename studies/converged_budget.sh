#!/usr/bin/env bash
# The update budget of the converged Multi30k study (studies/multi30k_en_de_converged.yaml, issue 26):
# one vanilla run, validating (greedy BLEU on val) every 400 updates up to 6,000, on the parse-free
# copy of the recipe's data (the same sub-words: vanilla reads no tree). The budget is where its
# validation BLEU stops improving. Resumable: run it again after any stop.
#   nohup studies/converged_budget.sh > runs/budget.log 2>&1 &
set -u
cd "$(dirname "$0")/.."
P="--set data.src.parser.backend=none --set data.src.scenes=none --set data.dir=data/multi30k_en_de_plain"
nice -n 10 structnmt prepare configs/multi30k_en_de_transformer.yaml $P || exit 1
R=""; [ -f runs/multi30k_en_de_converged_budget/last.pt ] && R="--resume"
# shellcheck disable=SC2086
nice -n 10 structnmt train configs/multi30k_en_de_transformer.yaml $R $P \
  --set training.out_dir=runs/multi30k_en_de_converged_budget --set training.max_steps=6000 \
  --set training.max_minutes=0 --set training.valid_every=400 --set training.threads=1 \
  --set training.keep_last=3 --set training.progress=false
