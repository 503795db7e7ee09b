#!/usr/bin/env bash
# `make test` three times in a row on a fresh clone while another `make test` runs
# beside it, in a loop, on a second clone: what shows that no test's verdict depends on
# how loaded the machine is or on another checkout testing at once (fixed ports, shared
# files). Both clones go beside this checkout (so ../shared is theirs too), each with its
# own copy of $CARGO_TARGET_DIR when set (else they build from scratch), under the
# environment .ci/run gives `make test`. Needs what .ci/run needs: as root it starts the
# Slurm as .ci/run does (cancelling what killed runs left queued). About 45 minutes a run
# beside another on 2 cores with a warm target directory (2 h 15 min for 3; 3 of 3 passed
# at 60188b3): on a fresh machine, start it right after set-up. When clone a's runs end,
# the run of clone b in progress is stopped.
#
#   scripts/test-beside.sh [RUNS]    # summary in ../test-beside/summary.txt; exit 0 if all passed
set -u
runs=${1:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
out=$(dirname "$here")/test-beside
rm -rf "$out" && mkdir -p "$out"
# As root, the Slurm .ci/run starts, with nothing queued (what killed runs left cancelled).
slurm() { [ "$(id -u)" != 0 ] || SLURM_ACCOUNTING=1 "$here/scripts/slurm-up.sh" --nodes 3 --gpus-per-node 2 --clean; }
slurm >&2 || exit 2
for c in a b; do
  git clone -q "$here" "$out/clone-$c" || exit 2
  if [ -n "${CARGO_TARGET_DIR:-}" ] && [ -d "$CARGO_TARGET_DIR" ]; then
    cp -a "$CARGO_TARGET_DIR" "$out/target-$c"
  fi
done
# The clones must sit beside ../shared as this checkout does.
ln -s "$(dirname "$here")/shared" "$out/shared" 2>/dev/null || true
echo "clones of $(git -C "$here" rev-parse --short HEAD), $(date)" > "$out/summary.txt"
run() { # clone log
  ( cd "$out/clone-$1" && export CARGO_TARGET_DIR="$out/target-$1" CI=true INSTA_UPDATE=no \
      PROPTEST_RNG_SEED=20261202 RUBICK_REQUIRE_PYTORCH=1 && RUBICK_VENV=$(scripts/python-env.sh) && export RUBICK_VENV \
    && start=$(date +%s) && make test > "$out/$2" 2>&1; rc=$?
    echo "$1 $2 rc=$rc $(( $(date +%s) - start )) s" >> "$out/summary.txt"; return $rc )
}
( i=0; while [ ! -f "$out/done" ]; do i=$((i + 1)); run b "b-$i.log"; done ) &
failed=0
for i in $(seq "$runs"); do run a "a-$i.log" || failed=1; done
touch "$out/done"
# b's run in progress has nothing left to stand beside: stopped rather than waited for
# (45 min), with every process it started, found by its environment (tests start some in
# sessions of their own), and what it left queued in Slurm; the loop then sees done.
of_b() { grep -lsz "^CARGO_TARGET_DIR=$out/target-b\$" /proc/[0-9]*/environ | cut -d/ -f3; }
# shellcheck disable=SC2046 # one pid per word
kill -TERM $(of_b) 2>/dev/null
sleep 5
# shellcheck disable=SC2046
kill -KILL $(of_b) 2>/dev/null
wait
echo "b's last run was stopped when a's runs ended: its rc is not a verdict" >> "$out/summary.txt"
slurm >/dev/null 2>&1
cat "$out/summary.txt"
exit $failed
