#!/usr/bin/env bash
# Start (or check) a Slurm on this machine: Debian 12's slurm-wlm 22.05, no systemd,
# no cgroups, fake GPUs. The Slurm backends of rubick-launch and rubick-run are tested
# against it (.ci/run starts it with --nodes 3).
#
#   scripts/slurm-up.sh                      one node, `localhost` (controller and node)
#   scripts/slurm-up.sh --nodes N [--gpus-per-node G]
#                                            N nodes mn1..mnN: each slurmd in a UTS and
#                                            mount namespace of its own (hostname mnK, a
#                                            private /etc/hosts naming every node),
#                                            address 127.0.1.K, its own port; jobs on a
#                                            node see that node's hostname, so a run
#                                            spanning nodes works as on a real cluster
#   scripts/slurm-up.sh ... --clean          also cancel every job in the queue and wait
#                                            until the nodes are free: for a machine that
#                                            only tests use (.ci/run), where anything
#                                            queued is a leftover of a run that was killed
#
# stdout: exactly one line at the end, `ready: <partition> <avail> <nodes> <state>
# <cpus> cpus <gres>`.  Progress goes to stderr.  Exit status non-zero when Slurm
# could not be brought up (with the tail of the daemon's log on stderr).
#
# Idempotent: installs the packages only when missing, rewrites the configuration
# only when it changed, and (re)starts munged, slurmctld and slurmd only when they
# are not running (a stale pid file of a killed daemon is detected) or the
# configuration changed. A second run on a healthy Slurm changes nothing (~0.2 s).
#
# Run as root. Environment:
#   SLURM_FAKE_GPUS=N   fake GPUs per node (default 4; 0 for none; --gpus-per-node wins)
#   SLURM_RESTART=1     restart slurmctld and slurmd even when healthy
#   SLURM_ACCOUNTING=1  full accounting: MariaDB and slurmdbd (GPUs in AllocTRES), so
#                       `sacct` answers as on a real cluster (+~45 s the first time).
#                       Without it, `sacct -c` reads the job completion log.
#
# Pitfalls this works around (see shared/reference/engines/slurm-single-node.md):
# GPUs declared by count alone are dropped ("Removing file-less GPU") and File=/dev/null
# is refused, so each fake GPU is a character device aliasing /dev/null; the node is
# named localhost, so slurmd needs `-N localhost`; requeued jobs wait cred_expire
# seconds (default 120) before they may run again; Debian's package scripts would
# start the services themselves. Several nodes on one machine: see
# shared/reference/engines/slurm-multi-node.md (several slurmd on loopback, each in its
# own UTS + mount namespace; proctrack/linuxproc, no cgroup plugins).
set -euo pipefail

NGPU="${SLURM_FAKE_GPUS:-4}"
NODES=0
CLEAN=0
ACCOUNTING="${SLURM_ACCOUNTING:-0}"
CPUS="$(nproc)"
MEM_MB="$(($(awk '/MemTotal/{print $2}' /proc/meminfo) / 1024 - 1024))"
CONF_DIR=/etc/slurm
LOG_DIR=/var/log/slurm
SPOOL=/var/spool/slurm
T0="$(date +%s%N)"

log() { printf '[slurm-up +%dms] %s\n' "$((($(date +%s%N) - T0) / 1000000))" "$*" >&2; }
die() { log "$*"; exit 1; }

while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) NODES="${2:-}"; shift 2 || die "--nodes needs a number" ;;
    --nodes=*) NODES="${1#*=}"; shift ;;
    --gpus-per-node) NGPU="${2:-}"; shift 2 || die "--gpus-per-node needs a number" ;;
    --gpus-per-node=*) NGPU="${1#*=}"; shift ;;
    --clean) CLEAN=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (--nodes N, --gpus-per-node G, --clean)" ;;
  esac
done
case "$NODES" in '' | *[!0-9]*) die "--nodes must be a number, got '$NODES'" ;; esac
((NODES <= 200)) || die "--nodes $NODES: at most 200 (addresses 127.0.1.1-200)"
# The nodes: `localhost` alone, or mn1..mnN.
if ((NODES == 0)); then
  names=(localhost)
else
  names=()
  for ((k = 1; k <= NODES; k++)); do names+=("mn$k"); done
fi

# alive PIDFILE NAME: the pid file names a running process called NAME (a pid file
# left by a killed daemon may name a pid reused by something else, or a zombie that
# init has not reaped yet).
alive() {
  local pid
  [ -s "$1" ] || return 1
  pid="$(cat "$1")"
  [ -r "/proc/$pid/comm" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] &&
    ! grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2>/dev/null
}

# stop PIDFILE NAME: stop the daemon, wait for it to exit, drop its pid file.
stop() {
  if alive "$1" "$2"; then
    local pid
    pid="$(cat "$1")"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
  fi
  rm -f "$1"
}

munge_ok() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }
ctld_ok() { scontrol ping 2>/dev/null | grep -q 'is UP'; }
# node_state NAME: the node's state as sinfo says it (empty when unknown).
node_state() { sinfo -h -n "$1" -o %T 2>/dev/null || true; }

[ "$(id -u)" = 0 ] || die "must run as root"
case "$NGPU" in '' | *[!0-9]*) die "the GPUs per node must be a number, got '$NGPU'" ;; esac

# ---- 1. packages (apt only when one is missing) ----
need=()
packages=(munge slurmctld slurmd slurm-client)
if [ "$ACCOUNTING" = 1 ]; then packages+=(mariadb-server slurmdbd); fi
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
done
if ((${#need[@]})); then
  log "installing ${need[*]}"
  # Debian's maintainer scripts call invoke-rc.d; keep them from starting anything.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  [ -n "$(find /var/lib/apt/lists -name '*Packages*' -mmin -1440 2>/dev/null | head -1)" ] || apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  log "installed"
fi

# ---- 2. munge ----
install -d -o munge -g munge -m 0755 /run/munge
install -d -o munge -g munge -m 0700 /var/log/munge /etc/munge
install -d -o munge -g munge -m 0711 /var/lib/munge
if [ ! -s /etc/munge/munge.key ]; then
  log "creating the munge key"
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
if ! munge_ok; then
  log "starting munged"
  stop /run/munge/munged.pid munged
  rm -f /run/munge/munge.socket.2*
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 50); do munge_ok && break; sleep 0.1; done
fi
munge_ok || die "munge does not work: $(tail -5 /var/log/munge/munged.log 2>/dev/null)"

# ---- 3. configuration ----
install -d -m 0755 "$CONF_DIR"
install -d -o slurm -g slurm -m 0755 "$LOG_DIR" "$SPOOL" "$SPOOL/ctld"
install -d -o root -g root -m 0755 "$SPOOL/fakegpu"
for name in "${names[@]}"; do install -d -o root -g root -m 0755 "$SPOOL/d-$name"; done
# Fake GPUs: character devices aliasing /dev/null (major 1, minor 3), per node.
for name in "${names[@]}"; do
  for ((i = 0; i < NGPU; i++)); do
    dev="$SPOOL/fakegpu/$name-nvidia$i"
    [ -c "$dev" ] || { rm -f "$dev"; mknod "$dev" c 1 3; }
  done
done
# Each node's /etc/hosts (bind-mounted in its namespace): the controller and every node.
if ((NODES > 0)); then
  hosts_new="$(mktemp)"
  {
    echo "# generated by rubick's scripts/slurm-up.sh: the nodes' /etc/hosts"
    echo "127.0.0.1 localhost"
    for ((k = 1; k <= NODES; k++)); do echo "127.0.1.$k mn$k"; done
  } >"$hosts_new"
  cmp -s "$hosts_new" "$SPOOL/hosts" || install -m 0644 "$hosts_new" "$SPOOL/hosts"
  rm -f "$hosts_new"
fi
if [ "$ACCOUNTING" = 1 ]; then
  accounting="# slurmdbd (MariaDB) keeps the accounting: sacct answers as on a real cluster
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStorageTRES=gres/gpu"
else
  accounting="# no slurmdbd: \`sacct -c\` reads the job completion log instead
AccountingStorageType=accounting_storage/none"
fi
gres_node="" gres_types=""
if ((NGPU > 0)); then gres_node=" Gres=gpu:$NGPU" gres_types="GresTypes=gpu"; fi
node_lines=""
if ((NODES == 0)); then
  node_lines="NodeName=localhost CPUs=$CPUS RealMemory=$MEM_MB$gres_node State=UNKNOWN"
else
  # One slurmd per node on this machine: its own address and port (slurmd binds every
  # address); every node declares the machine's cores and memory (they share them).
  for ((k = 1; k <= NODES; k++)); do
    node_lines+="NodeName=mn$k NodeAddr=127.0.1.$k Port=$((7000 + k)) CPUs=$CPUS RealMemory=$MEM_MB$gres_node State=UNKNOWN"$'\n'
  done
fi
new_conf="$(mktemp)"
new_gres="$(mktemp)"
cat >"$new_conf" <<EOF
# generated by rubick's scripts/slurm-up.sh: edits are overwritten
ClusterName=rubick
SlurmctldHost=localhost
SlurmUser=slurm
AuthType=auth/munge
# a requeued job waits cred_expire seconds before it may run again (default 120)
AuthInfo=cred_expire=10
CredType=cred/munge
MpiDefault=none
MailProg=/bin/true
# no cgroups here: processes are tracked by their parent pids; a cancelled job's
# signals reach every process of that tree
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd-%n.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd-%n.log
StateSaveLocation=$SPOOL/ctld
SlurmdSpoolDir=$SPOOL/d-%n
$accounting
JobCompType=jobcomp/filetxt
JobCompLoc=$LOG_DIR/jobcomp.log
MinJobAge=300
SlurmctldTimeout=30
# a node whose slurmd died is noticed in 14-23 s, DOWN in 26-42 s; back by itself
SlurmdTimeout=20
SchedulerParameters=sched_interval=2
$gres_types
$node_lines
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
{
  echo "# generated by rubick's scripts/slurm-up.sh: fake GPUs, no NVML"
  echo "AutoDetect=off"
  if ((NGPU > 0)); then
    for name in "${names[@]}"; do
      echo "NodeName=$name Name=gpu File=$SPOOL/fakegpu/$name-nvidia[0-$((NGPU - 1))]"
    done
  fi
} >"$new_gres"
changed=0
for f in slurm.conf gres.conf; do
  src="$new_conf"
  [ "$f" = gres.conf ] && src="$new_gres"
  if ! cmp -s "$src" "$CONF_DIR/$f"; then
    install -m 0644 "$src" "$CONF_DIR/$f"
    changed=1
  fi
done
rm -f "$new_conf" "$new_gres"

# ---- 4. daemons ----
db_ok() { mariadb -e 'select 1' >/dev/null 2>&1; }
dbd_ok() { alive /run/slurmdbd.pid slurmdbd && (echo >/dev/tcp/127.0.0.1/6819) 2>/dev/null; }
if [ "$ACCOUNTING" = 1 ]; then
  if ! db_ok; then
    log "starting mariadbd"
    install -d -o mysql -g mysql -m 0755 /run/mysqld
    runuser -u mysql -- /usr/sbin/mariadbd >"$LOG_DIR/mariadb.log" 2>&1 &
    for _ in $(seq 100); do db_ok && break; sleep 0.2; done
    db_ok || { tail -20 "$LOG_DIR/mariadb.log" >&2; die "MariaDB does not answer"; }
  fi
  mariadb -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurmdbd';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
  new_dbd="$(mktemp)"
  {
    echo "# generated by rubick's scripts/slurm-up.sh: edits are overwritten"
    echo "AuthType=auth/munge"
    echo "DbdHost=localhost"
    echo "SlurmUser=slurm"
    echo "LogFile=$LOG_DIR/slurmdbd.log"
    echo "PidFile=/run/slurmdbd.pid"
    echo "StorageType=accounting_storage/mysql"
    echo "StorageHost=localhost"
    echo "StorageUser=slurm"
    echo "StoragePass=slurmdbd"
    echo "StorageLoc=slurm_acct_db"
  } >"$new_dbd"
  if ! cmp -s "$new_dbd" "$CONF_DIR/slurmdbd.conf"; then
    install -o slurm -g slurm -m 0600 "$new_dbd" "$CONF_DIR/slurmdbd.conf"
    stop /run/slurmdbd.pid slurmdbd
  fi
  rm -f "$new_dbd"
  if ! dbd_ok; then
    log "starting slurmdbd"
    stop /run/slurmdbd.pid slurmdbd
    /usr/sbin/slurmdbd # daemonizes
    for _ in $(seq 100); do dbd_ok && break; sleep 0.2; done
    dbd_ok || { tail -20 "$LOG_DIR/slurmdbd.log" >&2; die "slurmdbd does not answer"; }
  fi
fi
if [ "$changed" = 1 ] || [ "${SLURM_RESTART:-0}" = 1 ]; then
  log "configuration changed (or restart asked): restarting the daemons"
  # Every slurmd, of this layout or an earlier one (/run/slurmd.pid: before per-node files).
  for pidfile in /run/slurmd.pid /run/slurmd-*.pid; do
    [ -e "$pidfile" ] && stop "$pidfile" slurmd
  done
  stop /run/slurmctld.pid slurmctld
fi
if ! alive /run/slurmctld.pid slurmctld; then
  log "starting slurmctld"
  rm -f /run/slurmctld.pid
  /usr/sbin/slurmctld # daemonizes; keeps the saved state (-i would ignore it)
fi
for _ in $(seq 75); do ctld_ok && break; sleep 0.2; done
ctld_ok || { tail -20 "$LOG_DIR/slurmctld.log" >&2; die "slurmctld does not answer"; }
for name in "${names[@]}"; do
  alive "/run/slurmd-$name.pid" slurmd && continue
  log "starting slurmd $name"
  "$(dirname "$0")/slurm-node.sh" start "$name"
done

# ---- 5. leftovers (--clean): the controller keeps its jobs across restarts ----
# slurmctld saves its queue and reloads it when it starts again: the jobs of a test run
# killed with the machine (or by hand) come back, requeued or "running" on a node whose
# processes are long gone, and hold the nodes that the next run's jobs wait for (an hour,
# rubick-launch's pending limit). Only a caller that owns the machine asks for this.
if [ "$CLEAN" = 1 ]; then
  left="$(squeue -h -a -o '%i %T %j %N' 2>/dev/null || true)"
  if [ -n "$left" ]; then
    log "cancelling $(printf '%s\n' "$left" | wc -l) job(s) left in the queue:"
    printf '%s\n' "$left" | sed 's/^/    /' >&2
    # shellcheck disable=SC2046 # one job id per word
    scancel $(printf '%s\n' "$left" | awk '{print $1}') 2>/dev/null || true
    for _ in $(seq 150); do [ -z "$(squeue -h -a -o %i 2>/dev/null)" ] && break; sleep 0.2; done
    still="$(squeue -h -a -o '%i %T %j %N' 2>/dev/null || true)"
    [ -z "$still" ] || die "jobs still queued 30 s after scancel: $still"
  fi
fi

# ---- 6. the nodes up and schedulable ----
ready_state() { case "$1" in idle | mixed | allocated | completing) return 0 ;; esac; return 1; }
for name in "${names[@]}"; do
  st="$(node_state "$name")"
  ready_state "$st" && continue
  log "waiting for node $name (state '${st:-none}')"
  for _ in $(seq 100); do
    st="$(node_state "$name")"
    ready_state "$st" && break
    case "$st" in
      down* | drain* | fail* | inval*) scontrol update nodename="$name" state=resume 2>/dev/null || true ;;
    esac
    sleep 0.3
  done
  ready_state "$st" || { tail -20 "$LOG_DIR/slurmd-$name.log" >&2; die "node $name: state '$st'"; }
done
log "up"
echo "ready: $(sinfo -h -o '%P %a %D %T %c cpus %G' | paste -sd ';')"
