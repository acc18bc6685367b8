#!/usr/bin/env bash
# A single-node Slurm on this machine for tests/e2e/test_slurm.py: installs Debian's
# slurm-wlm and munge if missing, writes a minimal slurm.conf for this host, starts munged,
# slurmctld and slurmd, and waits until the node takes jobs. Idempotent: when all that is
# already so, it returns at once.
#
# Exit codes: 0 Slurm is up; 3 Slurm cannot run here (not root, no apt-get, a Slurm this
# script did not configure); anything else: the set-up failed (the message says where).
set -euo pipefail

CONF=/etc/slurm/slurm.conf
MARK="# written by rlsys scripts/ci/slurm_up.sh"
LOG_DIR=/var/log/slurm
HOST=$(hostname -s)

cannot() {
  echo "slurm_up: cannot start Slurm here: $*" >&2
  exit 3
}

fail() {
  echo "slurm_up: $*" >&2
  exit 1
}

# The node takes jobs: idle, or running some (a job left by an earlier test session).
node_up() {
  case "$(sinfo --noheader --node "$HOST" --format=%T 2>/dev/null | head -n1)" in
  idle | mixed | allocated | completing) return 0 ;;
  *) return 1 ;;
  esac
}

munge_up() {
  munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1
}

# This host as the only node, with the CPUs and memory slurmd detects (a node configured
# with more than it has is drained). No cgroup plugins: linuxproc and task/none work in
# containers and VMs alike.
slurm_conf() {
  cat <<EOF
$MARK
ClusterName=rlsys-ci
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# A requeued job may start again cred_expire seconds after it ended (default 120).
AuthInfo=cred_expire=10
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
# Jobs that become eligible with time (a requeued one) wait for these loops (60 s, 30 s).
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
# Time between SIGTERM and SIGKILL when a job is cancelled or requeued: room to checkpoint.
KillWait=60
MinJobAge=600
NodeName=$HOST NodeAddr=127.0.0.1 $(slurmd -C | head -n1 | sed 's/^NodeName=[^ ]* //')
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

if [ -f "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
  cannot "$CONF exists and was not written by this script; the tests use only their own Slurm"
fi
if command -v slurmd >/dev/null && [ -f "$CONF" ] && [ "$(slurm_conf)" = "$(cat "$CONF")" ] &&
  munge_up && node_up; then
  exit 0
fi
[ "$(id -u)" -eq 0 ] || cannot "it needs root to install and start munged, slurmctld and slurmd"

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null ||
  ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
  command -v apt-get >/dev/null || cannot "slurm-wlm is not installed and there is no apt-get"
  echo "slurm_up: installing slurm-wlm and munge with apt-get" >&2
  export DEBIAN_FRONTEND=noninteractive
  # An index older than a day may name package versions the mirror no longer has.
  if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mmin -1440)" ]; then
    apt-get update -qq
  fi
  apt-get install -y -qq -o DPkg::Lock::Timeout=300 --no-install-recommends slurm-wlm munge \
    >/dev/null
fi

# munged, with the key the package's postinst makes (or one made here if that was skipped).
if [ ! -s /etc/munge/munge.key ]; then
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /etc/munge/munge.key /run/munge /var/log/munge /var/lib/munge
chmod 400 /etc/munge/munge.key
if ! munge_up; then
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 50); do
    munge_up && break
    sleep 0.1
  done
  munge_up || fail "munged did not start; see /var/log/munge/munged.log"
fi

mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd "$LOG_DIR"
slurm_conf >"$CONF.new"
if ! cmp -s "$CONF.new" "$CONF"; then
  mv "$CONF.new" "$CONF"
  # Daemons started with another slurm.conf read this one only when they restart.
  scontrol shutdown >/dev/null 2>&1 || true
  for _ in $(seq 100); do
    pgrep -x slurmctld >/dev/null || pgrep -x slurmd >/dev/null || break
    sleep 0.1
  done
else
  rm "$CONF.new"
fi

if ! scontrol ping 2>/dev/null | grep -q UP; then
  slurmctld
fi
for _ in $(seq 100); do
  scontrol ping 2>/dev/null | grep -q UP && break
  sleep 0.2
done
scontrol ping | grep -q UP || fail "slurmctld did not come up; see $LOG_DIR/slurmctld.log"
pgrep -x slurmd >/dev/null || slurmd
# A node left down or drained by an earlier slurmd that was killed takes jobs again.
scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 || true
for _ in $(seq 150); do
  node_up && exit 0
  sleep 0.2
done
fail "node $HOST is not taking jobs after 30 s; see $LOG_DIR/slurmd.log and sinfo -R"
