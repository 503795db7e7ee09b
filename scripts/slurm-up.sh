#!/usr/bin/env bash
# Start (or check) a single-node Slurm on this machine: Debian 12's slurm-wlm 22.05,
# controller and node both `localhost`, no systemd, no cgroups, fake GPUs. The Slurm
# backend of rubick-launch is tested against it (.ci/run starts it).
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
#   SLURM_FAKE_GPUS=N   fake GPUs on the node (default 4; 0 for none)
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
# start the services themselves.
set -euo pipefail

NGPU="${SLURM_FAKE_GPUS:-4}"
ACCOUNTING="${SLURM_ACCOUNTING:-0}"
CPUS="$(nproc)"
MEM_MB="$(($(awk '/MemTotal/{print $2}' /proc/meminfo) / 1024 - 1024))"
CONF_DIR=/etc/slurm
LOG_DIR=/var/log/slurm
SPOOL=/var/spool/slurm
T0="$(date +%s%N)"

log() { printf '[slurm-up +%dms] %s\n' "$((($(date +%s%N) - T0) / 1000000))" "$*" >&2; }
die() { log "$*"; exit 1; }

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
node_state() { sinfo -h -n localhost -o %T 2>/dev/null || true; }

[ "$(id -u)" = 0 ] || die "must run as root"
case "$NGPU" in '' | *[!0-9]*) die "SLURM_FAKE_GPUS must be a number, got '$NGPU'" ;; esac

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
install -d -o root -g root -m 0755 "$SPOOL/d" "$SPOOL/fakegpu"
# Fake GPUs: character devices aliasing /dev/null (major 1, minor 3).
for ((i = 0; i < NGPU; i++)); do
  dev="$SPOOL/fakegpu/nvidia$i"
  [ -c "$dev" ] || { rm -f "$dev"; mknod "$dev" c 1 3; }
done
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
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
StateSaveLocation=$SPOOL/ctld
SlurmdSpoolDir=$SPOOL/d
$accounting
JobCompType=jobcomp/filetxt
JobCompLoc=$LOG_DIR/jobcomp.log
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=30
SchedulerParameters=sched_interval=2
$gres_types
NodeName=localhost CPUs=$CPUS RealMemory=$MEM_MB$gres_node State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
{
  echo "# generated by rubick's scripts/slurm-up.sh: fake GPUs, no NVML"
  echo "AutoDetect=off"
  if ((NGPU > 0)); then
    echo "NodeName=localhost Name=gpu File=$SPOOL/fakegpu/nvidia[0-$((NGPU - 1))]"
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
  stop /run/slurmd.pid slurmd
  stop /run/slurmctld.pid slurmctld
fi
if ! alive /run/slurmctld.pid slurmctld; then
  log "starting slurmctld"
  rm -f /run/slurmctld.pid
  /usr/sbin/slurmctld # daemonizes; keeps the saved state (-i would ignore it)
fi
for _ in $(seq 75); do ctld_ok && break; sleep 0.2; done
ctld_ok || { tail -20 "$LOG_DIR/slurmctld.log" >&2; die "slurmctld does not answer"; }
if ! alive /run/slurmd.pid slurmd; then
  log "starting slurmd"
  rm -f /run/slurmd.pid
  /usr/sbin/slurmd -N localhost
fi

# ---- 5. the node up and schedulable ----
ready_state() { case "$1" in idle | mixed | allocated | completing) return 0 ;; esac; return 1; }
st="$(node_state)"
if ! ready_state "$st"; then
  log "waiting for the node (state '${st:-none}')"
  for _ in $(seq 100); do
    st="$(node_state)"
    ready_state "$st" && break
    case "$st" in
      down* | drain* | fail* | inval*) scontrol update nodename=localhost state=resume 2>/dev/null || true ;;
    esac
    sleep 0.3
  done
fi
ready_state "$st" || { tail -20 "$LOG_DIR/slurmd.log" >&2; die "node state '$st'"; }
log "up"
echo "ready: $(sinfo -h -o '%P %a %D %T %c cpus %G')"
