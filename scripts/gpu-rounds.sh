# Sourced by the GPU scripts (run-gpu.sh, torchtitan-gpu.sh) after python-on-path.sh:
# `two_rounds` runs a job for two rounds of rubick-run on this machine (local backend),
# started under one plan, reconfigured to another (checkpoint, relaunch, resume), then
# stopped, and leaves the state, both runs' metric lines and a summary line per run.
#
#   two_rounds RUBICK_RUN JOB CLUSTER OUT WORK PLAN1 PLAN2 SECONDS_PER_ROUND
#
# The run is placed on the cluster's first node (`<first group>-0`), on GPUs 0..n-1 for
# a plan of n processes, with $CPUS cores (default 4).
two_rounds() {
  local bin=$1 job=$2 cluster=$3 out=$4 work=$5 plan1=$6 plan2=$7 wait_s=$8
  local state="$work/state" name group_cluster node
  mkdir -p "$out" "$work"
  name="$(sed -n 's/^name: *//p' "$job" | head -1)"
  group_cluster="$(sed -n 's/^name: *//p' "$cluster" | head -1)"
  node="$(sed -n 's/^- name: *//p' "$cluster" | head -1)-0"
  round() { # round N PLAN
    local n ids
    n="$("$py" -c 'import sys; from rubick import Plan; print(Plan.from_env({"RUBICK_PLAN": sys.argv[1]}).world_size)' "$2")"
    ids="$(seq -s, 0 $((n - 1)) | sed 's/,/, /g')"
    cat >"$work/round$1.yaml" <<YAML
apiVersion: rubick/v1
kind: Schedule
cluster: $group_cluster
round: $1
policy: by-hand
assignments:
  - { job: $name, plan: $2, nodes: [{ node: $node, gpus: [$ids], cpus: ${CPUS:-4}, hostMemoryGib: 16 }], predictedThroughput: 1, change: started }
totals: { gpusUsed: $n, gpusTotal: $n, cpusUsed: ${CPUS:-4}, hostMemoryGibUsed: 16, normalizedThroughput: 1 }
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
  local k m
  for k in 1 2; do
    m="$state/jobs/$name/attempt-$k/metrics.jsonl"
    cp "$m" "$out/metrics-$k.jsonl"
    "$py" - "$m" "$k" <<'PY' | tee -a "$out/summary.txt"
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
its = [l for l in lines if "iter_time_s" in l]
t = [l["iter_time_s"] for l in its[3:]] or [l["iter_time_s"] for l in its]
ck = [(l["iter"], l.get("save_s")) for l in lines if l.get("event") == "checkpointed"]
print(f"run {sys.argv[2]}: iterations {its[0]['iter']}..{its[-1]['iter']}, median iter {statistics.median(t):.4f} s, "
      f"loss {its[0].get('loss')} -> {its[-1].get('loss')}, checkpointed (iteration, save_s) {ck}")
PY
  done
}
