#!/usr/bin/env bash
# The end of `make demo`: rubick-run drives two copies of the PyTorch reference workload
# on this machine's local backend, scheduled each round by rubick-plan from the state's
# own JobBatch (the cron loop of the README). One job is stopped; in the later rounds the
# planner decides whether the other takes both worker slots (rubick-run then
# reconfigures it: checkpoint, relaunch at DP 2, resume) or stays (a second slot of this
# machine may add too little to repay a restart), and says which and why. Then the
# status table, and both stopped.
# Usage: scripts/demo-run.sh BIN_DIR VENV CLUSTER PERF_MODEL OUT_DIR
set -euo pipefail
bin=$1 venv=$2 cluster=$3 model=$4 out=$5
state="$out/demo-run"
export PATH="$venv/bin:$PATH"
rm -rf "$state" && mkdir -p "$state"
for name in demo-a demo-b; do
  sed -e "s/^name: gpt-tiny/name: $name/" -e 's/^iterations: 200/iterations: 3000/' examples/pytorch/job.yaml \
    > "$state/$name.yaml"
  echo "perfModel: $(realpath "$model")" >> "$state/$name.yaml"
done
round() {
  "$bin/rubick-run" jobs --state "$state/dir" --cluster "$cluster" \
    | "$bin/rubick-plan" schedule --cluster "$cluster" --jobs - --current "$state/dir/current.yaml" --explain \
    | "$bin/rubick-run" apply - --state "$state/dir"
}
set -x
"$bin/rubick-run" submit "$state/demo-a.yaml" "$state/demo-b.yaml" --state "$state/dir"
"$bin/rubick-run" jobs --state "$state/dir" \
  | "$bin/rubick-plan" schedule --cluster "$cluster" --jobs - --explain \
  | "$bin/rubick-run" apply - --state "$state/dir"
sleep 10
"$bin/rubick-run" stop demo-b --state "$state/dir"
for _ in 1 2 3 4; do round; done
sleep 10
"$bin/rubick-run" status --state "$state/dir"
set +x
# What the last round did with demo-a, and why (its assignment in the applied schedule).
what=$(awk '/^- job: demo-a$/ {a = 1; next} /^- job:/ {a = 0} a && /^  (plan|change|reason):/' "$state/dir/current.yaml" \
  | sed -e 's/^  //' -e "s/^\([a-z]*\): '\(.*\)'\$/\1: \2/" -e "s/''/'/g" | paste -sd ';' -)
echo "demo: demo-a after the rounds: ${what:-not in the last schedule}" >&2
set -x
"$bin/rubick-run" stop demo-a --state "$state/dir"
