#!/usr/bin/env bash
# Two rounds of rubick-run on this machine's GPU: the PyTorch workload started under one
# plan, reconfigured to another (checkpoint, relaunch, resume), then stopped. Leaves in
# OUT (default ./out/gpu-rounds) the state, both runs' metric lines and a summary line
# per run; the runs' own files in WORK (default OUT/work).
#
#   scripts/run-gpu.sh [RUBICK_RUN_BINARY]
#
# Environment: JOB (default data/profiles/gpt-98m.job.yaml), CLUSTER (default
# data/profiles/cluster-h200.yaml: one node `local-0`), PLAN1 / PLAN2 (default
# dp1-tp1-pp1-mb8-ga8 / dp1-tp1-pp1-mb64-ga1), CPUS (default 4), SECONDS_PER_ROUND (default 45), python
# with torch on PATH (or RUBICK_PYTHON).
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-target/release/rubick-run}"
out="${OUT:-out/gpu-rounds}"
work="${WORK:-$out/work}"
job="${JOB:-data/profiles/gpt-98m.job.yaml}"
cluster="${CLUSTER:-data/profiles/cluster-h200.yaml}"
plan1="${PLAN1:-dp1-tp1-pp1-mb8-ga8}" plan2="${PLAN2:-dp1-tp1-pp1-mb64-ga1}"
wait_s="${SECONDS_PER_ROUND:-45}"
mkdir -p "$out" "$work"
. scripts/python-on-path.sh
state="$work/state"
name="$(sed -n 's/^name: *//p' "$job" | head -1)"
group_cluster="$(sed -n 's/^name: *//p' "$cluster" | head -1)"
round() { # round N PLAN
  cat >"$work/round$1.yaml" <<YAML
apiVersion: rubick/v1
kind: Schedule
cluster: $group_cluster
round: $1
policy: by-hand
assignments:
  - { job: $name, plan: $2, nodes: [{ node: local-0, gpus: [0], cpus: ${CPUS:-4}, hostMemoryGib: 16 }], predictedThroughput: 1, change: started }
totals: { gpusUsed: 1, gpusTotal: 1, cpusUsed: ${CPUS:-4}, hostMemoryGibUsed: 16, normalizedThroughput: 1 }
objective: 0
solver: { method: by-hand, status: optimal }
YAML
  "$bin" apply "$work/round$1.yaml" --cluster "$cluster" --state "$state"
}
"$bin" submit "$job" --state "$state"
round 1 "$plan1"
sleep "$wait_s"
round 2 "$plan2"
sleep "$wait_s"
"$bin" status --state "$state" | tee "$out/status.txt"
"$bin" stop "$name" --state "$state"
cp "$state/state.yaml" "$out/state.yaml"
for k in 1 2; do
  m="$state/jobs/$name/attempt-$k/metrics.jsonl"
  cp "$m" "$out/metrics-$k.jsonl"
  "$py" - "$m" "$k" <<'PY' | tee -a "$out/summary.txt"
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
its = [l for l in lines if "iter_time_s" in l]
t = [l["iter_time_s"] for l in its[3:]] or [l["iter_time_s"] for l in its]
ck = [l["iter"] for l in lines if l.get("event") == "checkpointed"]
print(f"run {sys.argv[2]}: iterations {its[0]['iter']}..{its[-1]['iter']}, median iter {statistics.median(t):.4f} s, "
      f"loss {its[0].get('loss')} -> {its[-1].get('loss')}, checkpointed at {ck}")
PY
done
