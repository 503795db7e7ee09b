#!/usr/bin/env bash
# Contract test of the PyTorch reference workload (examples/pytorch/train.py):
# a few plans for 6 iterations each (metric lines, same loss as DP1), exit
# codes 2 (bad plan) and 3 (memory cap), and the stop signal: a DP2 run gets
# SIGUSR1 on its process group after its 3rd metric line, must exit 0 with a
# `checkpointed` event, and a DP1 run must resume from it with the next
# iteration number.  CPU only; about 3 minutes on 2 cores.
#
# usage: examples/pytorch/test_contract.sh [VENV]   (default: scripts/python-env.sh)
# Ends with the line 'N passed, N failed'; exit status 1 when any failed.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=${1:-$("$root/scripts/python-env.sh")}
py=$venv/bin/python
train=$here/train.py
work=$(mktemp -d "${TMPDIR:-/tmp}/rubick-contract.XXXXXX")
trap 'rm -rf "$work"' EXIT
export CUDA_VISIBLE_DEVICES=""   # the CPU/gloo path, even on a GPU machine
export RUBICK_CPUS=${RUBICK_CPUS:-2}
unset RUBICK_DP RUBICK_TP RUBICK_PP RUBICK_ZERO RUBICK_OFFLOAD RUBICK_GA RUBICK_GC \
    RUBICK_MICRO_BATCH RUBICK_PLAN RUBICK_METRICS RUBICK_CHECKPOINT_DIR RUBICK_ITERATIONS

passed=0
failed=0
ok() { passed=$((passed + 1)); printf 'ok   %s\n' "$*"; }
ko() { failed=$((failed + 1)); printf 'FAIL %s\n' "$*"; }

# field FILE KEY: the values of KEY in FILE's JSON lines, space-separated.
field() { grep -o "\"$2\":[^,}]*" "$1" | cut -d: -f2 | tr '\n' ' ' || true; }

reference_loss=""
# plan NAME NPROC LAUNCHER ENV...: run 6 iterations, check 6 metric lines and the loss.
plan() {
    local name=$1 nproc=$2 launcher=$3
    shift 3
    local dir=$work/$name rc=0
    mkdir -p "$dir"
    local cmd=("$py" "$train" --iterations 6 --nproc-per-node "$nproc")
    if [[ $launcher == torchrun ]]; then
        cmd=("$py" -m torch.distributed.run --standalone --nproc-per-node "$nproc" "$train" --iterations 6)
    fi
    env "$@" RUBICK_METRICS="$dir/m.jsonl" RUBICK_CHECKPOINT_DIR="$dir/ck" \
        timeout 300 "${cmd[@]}" >"$dir/log" 2>&1 || rc=$?
    local iters loss
    iters=$(field "$dir/m.jsonl" iter_time_s | wc -w)
    loss=$(field "$dir/m.jsonl" loss)
    if [[ $rc != 0 || $iters != 6 ]] || ! grep -q '"event":"checkpointed","iter":6' "$dir/m.jsonl"; then
        ko "$name: rc=$rc, $iters metric lines"
        tail -5 "$dir/log"
        return
    fi
    [[ -z $reference_loss ]] && reference_loss=$loss
    if [[ $loss != "$reference_loss" ]]; then
        ko "$name: loss $loss differs from DP1's $reference_loss"
        return
    fi
    ok "$name ($launcher): 6 iterations, mean iter_time_s $(field "$dir/m.jsonl" iter_time_s |
        awk '{ s = 0; for (i = 1; i <= NF; i++) s += $i; printf "%.3f", s / NF }')"
}

plan dp1 1 self RUBICK_DP=1 RUBICK_MICRO_BATCH=16
plan dp2 2 torchrun RUBICK_DP=2 RUBICK_MICRO_BATCH=8
plan ga2 1 self RUBICK_DP=1 RUBICK_MICRO_BATCH=8 RUBICK_GA=2
plan gc 1 self RUBICK_DP=1 RUBICK_MICRO_BATCH=16 RUBICK_GC=1
plan zero1 2 self RUBICK_DP=2 RUBICK_MICRO_BATCH=8 RUBICK_ZERO=1
plan zero3-fsdp2 2 self RUBICK_DP=2 RUBICK_MICRO_BATCH=8 RUBICK_ZERO=3
plan offload-all 2 self RUBICK_DP=2 RUBICK_MICRO_BATCH=8 RUBICK_ZERO=3 RUBICK_OFFLOAD=all
plan tp2 2 self RUBICK_DP=1 RUBICK_TP=2 RUBICK_MICRO_BATCH=16
plan pp2 2 self RUBICK_DP=1 RUBICK_PP=2 RUBICK_MICRO_BATCH=8 RUBICK_GA=2

# Exit codes.
rc=0
RUBICK_DP=3 "$py" "$train" --nproc-per-node 2 --iterations 1 >"$work/bad.log" 2>&1 || rc=$?
if [[ $rc == 2 ]]; then ok "bad plan: exit 2"; else ko "bad plan: exit $rc, want 2"; fi
rc=0
RUBICK_DP=2 RUBICK_MICRO_BATCH=8 RUBICK_METRICS="$work/oom.jsonl" \
    "$py" "$train" --nproc-per-node 2 --iterations 3 --max-memory-gib 0.1 >"$work/oom.log" 2>&1 || rc=$?
if [[ $rc == 3 ]] && grep -q '"event":"oom"' "$work/oom.jsonl"; then
    ok "memory cap: exit 3 and the oom event"
else
    ko "memory cap: exit $rc"
fi

# Stop signal at DP2, resume at DP1.
stop=$work/stop
mkdir -p "$stop"
: >"$stop/m.jsonl"
RUBICK_DP=2 RUBICK_MICRO_BATCH=8 RUBICK_METRICS="$stop/m.jsonl" RUBICK_CHECKPOINT_DIR="$stop/ck" \
    setsid "$py" "$train" --nproc-per-node 2 --iterations 100000 >"$stop/log" 2>&1 &
pid=$!
for _ in $(seq 600); do
    [[ $(field "$stop/m.jsonl" iter_time_s | wc -w) -ge 3 ]] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
done
kill -s USR1 -- "-$pid" 2>/dev/null || true
rc=0
wait "$pid" || rc=$?
last=$(field "$stop/m.jsonl" iter_time_s | wc -w)
if [[ $rc == 0 ]] && grep -q "\"event\":\"checkpointed\",\"iter\":$last[,}]" "$stop/m.jsonl" &&
    [[ -f $stop/ck/sharded.json ]]; then
    ok "stop signal: exit 0, checkpointed at iteration $last"
else
    ko "stop signal: exit $rc, events: $(grep event "$stop/m.jsonl" | tr '\n' ' ')"
    tail -5 "$stop/log"
fi
rc=0
RUBICK_DP=1 RUBICK_MICRO_BATCH=16 RUBICK_METRICS="$stop/m2.jsonl" RUBICK_CHECKPOINT_DIR="$stop/ck" \
    "$py" "$train" --iterations 2 >"$stop/log2" 2>&1 || rc=$?
iters=$(field "$stop/m2.jsonl" iter | tr -s ' ')
want="$((last + 1)) $((last + 2)) $((last + 2)) "
if [[ $rc == 0 && $iters == "$want" ]]; then
    ok "resume at DP1: iterations continue at $((last + 1))"
else
    ko "resume at DP1: exit $rc, iter fields '$iters', want '$want'"
    tail -5 "$stop/log2"
fi

echo "$passed passed, $failed failed"
[[ $failed == 0 ]]
