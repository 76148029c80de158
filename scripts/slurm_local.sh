#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for trying `hydra/launcher=slurm` and for the `slurm` tests.
#   scripts/slurm_local.sh start    install slurm + munge if missing (Debian/Ubuntu, root), write
#                                   slurm.conf for this host, start munged, slurmctld, slurmd
#   scripts/slurm_local.sh stop     stop the three daemons (by their pid files)
#   scripts/slurm_local.sh status   sinfo
# Accounting is off (no slurmdbd): sacct prints warnings, which submitit tolerates.
set -euo pipefail

CONF_DIR=/etc/slurm
STATE=/var/spool/slurm-local
LOGS=/var/log/slurm-local
RUN=/run/slurm-local

need_root() { [[ $(id -u) == 0 ]] || { echo "slurm_local: must run as root" >&2; exit 3; }; }

install_if_missing() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null && return
  command -v apt-get >/dev/null || { echo "slurm_local: slurm is not installed and apt-get is missing" >&2; exit 4; }
  echo "slurm_local: installing slurm-wlm and munge" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null \
    || { echo "slurm_local: apt-get install slurm-wlm munge failed" >&2; exit 4; }
}

write_conf() {
  local host node
  host=$(hostname -s)
  # slurmd -C reports this host's CPUs, sockets, cores and memory as a NodeName line.
  node=$(slurmd -C | head -1)
  mkdir -p "$CONF_DIR" "$STATE/ctld" "$STATE/d" "$LOGS" "$RUN"
  cat > "$CONF_DIR/slurm.conf" <<CONF
ClusterName=fsdplab
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
}

alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

start() {
  need_root
  install_if_missing
  write_conf
  [[ -f /etc/munge/munge.key ]] || { mungekey --create 2>/dev/null || create-munge-key -f; }
  mkdir -p /run/munge && chown munge:munge /run/munge /etc/munge/munge.key 2>/dev/null || true
  alive /run/munge/munged.pid || runuser -u munge -- /usr/sbin/munged
  alive "$RUN/slurmctld.pid" || slurmctld
  alive "$RUN/slurmd.pid" || slurmd
  for _ in $(seq 60); do
    if sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then sinfo; return 0; fi
    scontrol update nodename="$(hostname -s)" state=resume >/dev/null 2>&1 || true
    sleep 1
  done
  echo "slurm_local: the node did not become idle; see $LOGS" >&2
  exit 5
}

stop() {
  need_root
  for pidfile in "$RUN/slurmd.pid" "$RUN/slurmctld.pid" /run/munge/munged.pid; do
    if alive "$pidfile"; then kill "$(cat "$pidfile")"; fi
  done
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) sinfo ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 64 ;;
esac
