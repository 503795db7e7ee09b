#!/usr/bin/env bash
# One node of the multi-node test Slurm (scripts/slurm-up.sh --nodes N) failed or
# brought back, as a real node fails: its daemon and every process it ran killed.
#
#   scripts/slurm-node.sh fail NAME    kill -9 NAME's slurmd and every process whose
#                                      environment says it runs on NAME
#                                      (SLURMD_NODENAME=NAME: the job steps and their
#                                      children, in any session)
#   scripts/slurm-node.sh start NAME   start NAME's slurmd (its own UTS + mount
#                                      namespace: hostname NAME, the nodes' hosts file)
#                                      unless it runs; Slurm takes the node back by
#                                      itself (ReturnToService=2)
#
# Run as root. slurm-up.sh starts every node's slurmd through `start`.
set -euo pipefail
SPOOL=/var/spool/slurm
die() { echo "slurm-node: $*" >&2; exit 2; }
[ $# = 2 ] || die "usage: slurm-node.sh fail|start NAME"
what="$1" name="$2"
case "$name" in '' | *[!A-Za-z0-9._-]*) die "node name '$name': [A-Za-z0-9._-] only" ;; esac
pidfile="/run/slurmd-$name.pid"
# alive: the pid file names a running slurmd (not a reused pid, not a zombie).
alive() {
  local pid
  [ -s "$pidfile" ] || return 1
  pid="$(cat "$pidfile")"
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = slurmd ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2>/dev/null
}
case "$what" in
  fail)
    if alive; then kill -9 "$(cat "$pidfile")"; fi
    # Twice: a process may fork between the scan and the kill.
    for _ in 1 2; do
      for env in /proc/[0-9]*/environ; do
        pid="${env#/proc/}" pid="${pid%/environ}"
        [ "$pid" = $$ ] && continue
        if tr '\0' '\n' <"$env" 2>/dev/null | grep -qx "SLURMD_NODENAME=$name"; then
          kill -9 "$pid" 2>/dev/null || true
        fi
      done
    done
    ;;
  start)
    alive && exit 0
    rm -f "$pidfile"
    if [ "$name" = localhost ]; then
      /usr/sbin/slurmd -N localhost
    else
      # Its own hostname and hosts file; the network stays the machine's (loopback).
      unshare --mount --uts --propagation private sh -c \
        'hostname "$1" && mount --bind "$2" /etc/hosts && exec /usr/sbin/slurmd -N "$1"' \
        slurmd-up "$name" "$SPOOL/hosts"
    fi
    ;;
  *) die "unknown action '$what' (fail, start)" ;;
esac
