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
. scripts/gpu-rounds.sh
PYTHONPATH="python${PYTHONPATH:+:$PYTHONPATH}" two_rounds "$bin" "$job" "$cluster" "$out" "$work" "$plan1" "$plan2" "$wait_s"
