#!/usr/bin/env bash
# Profile the PyTorch workload on this machine's GPU(s) with rubick-profile (NVML) and
# leave the table, the cluster and the logs in OUT (default ./out/gpu-profile; the runs'
# own directories in WORK, default OUT/runs).
#
#   scripts/profile-gpu.sh [RUBICK_PROFILE_BINARY]
#
# Needs python with torch on PATH (or RUBICK_PYTHON). Measures data/profiles/gpt-98m.job.yaml
# under CONFIGS (default data/profiles/configs-gpu.csv: one GPU, micro-batch, accumulation,
# checkpointing).
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-target/release/rubick-profile}"
out="${OUT:-out/gpu-profile}"
work="${WORK:-$out/runs}"
configs="${CONFIGS:-data/profiles/configs-gpu.csv}"
mkdir -p "$out" "$work"
. scripts/python-on-path.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/nvidia-smi.txt"
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))' | tee -a "$out/nvidia-smi.txt"
"$bin" devices --cluster-out "$out/cluster-gpu.yaml" 2>&1 | tee "$out/devices.txt"
status=0
"$bin" run data/profiles/gpt-98m.job.yaml --configs "$configs" \
  --cluster "$out/cluster-gpu.yaml" --work-dir "$work" -o "$out/gpt-98m-gpu.csv" -v 2>&1 | tee "$out/profile-98m.txt" || status=$?
# The work dirs hold logs: keep the failures' for reading back.
for log in "$work"/*/log.txt; do
  [ -f "$log" ] && tail -5 "$log" | sed "s|^|$(basename "$(dirname "$log")"): |" >>"$out/run-logs-tail.txt"
done
exit "$status"
