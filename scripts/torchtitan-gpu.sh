#!/usr/bin/env bash
# torchtitan's llama3 debug model (examples/torchtitan/job.yaml) under rubick on this
# machine's GPU(s): profiled by rubick-profile (NVML) under CONFIGS, fitted by rubick-fit,
# then started by rubick-run under PLAN1 and reconfigured to PLAN2 (torchtitan's DCP
# save at the step boundary, relaunch, resume at the next step; the data loader starts
# over when the data-parallel degree changed). Leaves in OUT (default
# ./out/torchtitan-gpu) the profile, the fitted model, the rounds' state, metric lines
# and a summary line per run, ready to be committed under data/profiles/.
#
#   scripts/torchtitan-gpu.sh [TARGET_DIR]      # the release binaries (default target/release)
#
# Needs: a GPU (torchtitan runs no CPU-only training: pytorch/torchtitan#1661), python
# with torch on PATH (or RUBICK_PYTHON) and torchtitan 0.3.0 importable from it, as
# installed, or in the venv's layer that scripts/python-env.sh installs (PYTHONPATH may
# name such a layer too). Environment: CONFIGS (default
# data/profiles/configs-torchtitan-gpu.csv: one GPU; configs-torchtitan-gpu4.csv
# for 4), PLAN1 / PLAN2 (default dp1-tp1-pp1-mb2-ga4 -> dp1-tp1-pp1-mb8-ga1-sel), CPUS
# (default 4), SECONDS_PER_ROUND (default 60).
set -euo pipefail
cd "$(dirname "$0")/.."
bins="${1:-target/release}"
out="${OUT:-out/torchtitan-gpu}"
configs="${CONFIGS:-data/profiles/configs-torchtitan-gpu.csv}"
plan1="${PLAN1:-dp1-tp1-pp1-mb2-ga4}" plan2="${PLAN2:-dp1-tp1-pp1-mb8-ga1-sel}"
wait_s="${SECONDS_PER_ROUND:-60}"
job=examples/torchtitan/job.yaml
mkdir -p "$out"
. scripts/python-on-path.sh
if ! command -v nvidia-smi >/dev/null || ! "$py" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())'; then
  echo "torchtitan-gpu: no CUDA GPU here (nvidia-smi, torch.cuda): torchtitan needs one" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/nvidia-smi.txt"
PYTHONPATH="python${PYTHONPATH:+:$PYTHONPATH}" "$py" -c '
from rubick.integrations.torchtitan import importable; importable()
import torch, torchtitan
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0), "torchtitan", torchtitan.__version__)
' | tee -a "$out/nvidia-smi.txt"
"$py" examples/torchtitan/assets.py examples/torchtitan/assets

# Profile and fit.
"$bins/rubick-profile" devices --cluster-out "$out/cluster.yaml" 2>&1 | tee "$out/devices.txt"
status=0
"$bins/rubick-profile" run "$job" --configs "$configs" --cluster "$out/cluster.yaml" \
  --work-dir "$out/runs" -o "$out/torchtitan-llama3-debug.csv" -v 2>&1 | tee "$out/profile.txt" || status=$?
for log in "$out"/runs/*/log.txt; do
  [ -f "$log" ] && tail -5 "$log" | sed "s|^|$(basename "$(dirname "$log")"): |" >>"$out/run-logs-tail.txt"
done
[ "$status" = 0 ] || exit "$status"
"$bins/rubick-fit" fit "$out/torchtitan-llama3-debug.csv" --job "$job" --cluster "$out/cluster.yaml" \
  -o "$out/torchtitan-llama3-debug.model.yaml" 2>&1 | tee "$out/fit.txt"

# Two rounds: started under PLAN1, reconfigured to PLAN2, stopped.
. scripts/gpu-rounds.sh
PYTHONPATH="python${PYTHONPATH:+:$PYTHONPATH}" two_rounds "$bins/rubick-run" "$job" "$out/cluster.yaml" "$out" "$out/work" \
  "$plan1" "$plan2" "$wait_s"
