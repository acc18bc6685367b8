#!/usr/bin/env bash
# The RLHF example on CPU (docs/rlhf.md; the README links it), on the synthetic review task
# (task=reviews: a hidden labeller prefers positive reviews; the metric is the fraction of
# held-out greedy replies it calls positive):
#   1. rlsys sft    the tiny model imitates reviews of mixed sentiment
#   2. rlsys rm     a reward model learns the labeller's ranking of the SFT model's replies
#   3. rlsys train  PPO against that reward model (the labeller's own score has weight 0)
#   4. rlsys dpo    DPO from the SFT model on pairs ranked the same way
# Each stage's run directory lands under RLSYS_RLHF_DIR (default runs/rlhf-<timestamp>); the
# last line printed is `summary: <path>` to a JSON with every stage's figures. Extra arguments
# are Hydra overrides given to every stage, after the example's own.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. "${RLSYS_VENV:-.venv}/bin/activate"
OUT="$(realpath -m "${RLSYS_RLHF_DIR:-runs/rlhf-$(date +%Y%m%d-%H%M%S)}")"
mkdir -p "$OUT"

# stage NAME ARGS...: run `rlsys ARGS... run.output_dir=$OUT run.name=NAME`, logging to
# $OUT/NAME.log, and set SUMMARY to the summary.json it printed.
stage() {
  local name=$1
  shift
  echo "== $name: rlsys $* (log: $OUT/$name.log)"
  # the full log goes to the file; the console shows the evals and rlsys's own lines
  rlsys "$@" task=reviews run.output_dir="$OUT" run.name="$name" "${EXTRA[@]}" 2>&1 \
    | tee "$OUT/$name.log" | grep --line-buffered -E 'EVAL|rlsys|summary:' || true
  SUMMARY="$(sed -n 's/^summary: //p' "$OUT/$name.log" | tail -n 1)"
  if [ -z "$SUMMARY" ]; then
    tail -n 20 "$OUT/$name.log" >&2
    echo "rlhf example: stage $name failed (above: the end of $OUT/$name.log)" >&2
    exit 1
  fi
}
final_model() { python -c 'import json, sys; print(json.load(open(sys.argv[1]))["final_model"])' "$1"; }
EXTRA=("$@")

stage sft sft sft.target_accuracy=null sft.max_steps=150 sft.eval_every=50
SFT="$SUMMARY"
stage rm rm model.path="$(final_model "$SFT")" warm_start.enabled=false \
  preference.synthetic=ranked rm.max_steps=200
RM="$SUMMARY"
stage ppo train model.path="$(final_model "$SFT")" warm_start.enabled=false algorithm=ppo \
  "reward.model.paths=[$(final_model "$RM")]" reward.weight=0 reward.model.num_cpus=0.5 \
  trainer.total_steps=40 trainer.eval_every=20
PPO="$SUMMARY"
stage dpo dpo model.path="$(final_model "$SFT")" warm_start.enabled=false \
  preference.synthetic=ranked dpo.max_steps=100
DPO="$SUMMARY"
python -m rlsys.trainers.preference.summary "$OUT/summary.json" sft="$SFT" rm="$RM" ppo="$PPO" dpo="$DPO"
