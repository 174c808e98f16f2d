#!/usr/bin/env bash
# A private single-node Slurm cluster (munged, slurmctld, slurmd) on this machine, for the engine
# tests (tests/engines) and for trying scripts/slurm.sbatch without a real cluster.
#
#   scripts/engines/slurm.sh install              install the Debian packages that are missing
#   scripts/engines/slurm.sh start [--no-install] DIR
#                                                 start a cluster whose files all live in DIR
#                                                 (created if missing); returns once sinfo shows
#                                                 the node idle. Use SLURM_CONF=DIR/slurm.conf
#   scripts/engines/slurm.sh stop DIR             cancel its jobs, stop its daemons (by pid)
#   scripts/engines/slurm.sh run [--no-install] CMD [ARGS...]
#                                                 start a cluster in a fresh folder, run CMD with
#                                                 SLURM_CONF exported, stop the cluster whatever
#                                                 happens; exits with CMD's status
#
# e.g.  scripts/engines/slurm.sh run sbatch --wait --nodes=1 --ntasks-per-node=2 \
#           --cpus-per-task=1 scripts/slurm.sbatch configs/smoke.yaml --set distributed.backend=grpc
#
# Nothing outside DIR is touched: the munge key, munged's socket, slurm.conf, the state and spool
# folders, the logs and the pid files are all in DIR, and the two Slurm ports are picked free, so
# it neither reads nor changes /etc/slurm or /etc/munge and may run beside a real Slurm or another
# private cluster. The daemons run in the foreground (munged -F, slurmctld -D, slurmd -D),
# started here in the background, so their pids are known (DIR/<daemon>.ours); stop ends only
# those pids (after checking the pid still runs that program) and any slurmstepd left holding a
# file in DIR.
#
# Needs root (slurmd starts job steps as any user). Exit status of install/start/run's own
# failures: 77 (a test's "skipped") when Slurm is not installed and --no-install was given, when
# not root, or when the packages cannot be installed; 1 when an installed Slurm fails to start
# (the daemons' log tails are printed). Tested with Debian 12's Slurm 22.05.8 and munge 0.5.15.
set -uo pipefail

packages=(slurmctld slurmd slurm-client munge)
programs=(munged mungekey slurmctld slurmd sinfo sbatch scancel squeue)

die() {
  echo "slurm.sh: $*" >&2
  exit 1
}
skip() {
  echo "slurm.sh: SKIP: $*" >&2
  exit 77
}

installed() {
  local p
  for p in "${programs[@]}"; do command -v "$p" >/dev/null 2>&1 || return 1; done
}

install() {
  "$(dirname "$0")/apt_install.sh" "${packages[@]}" || exit $?
  installed || skip "installed ${packages[*]} but a program is still missing"
}

# A TCP port nothing listens on (the daemons fail loudly if another process takes it first).
free_port() {
  local p i
  for ((i = 0; i < 200; i++)); do
    p=$((30000 + (RANDOM * 32768 + RANDOM) % 30000))
    if command -v ss >/dev/null; then
      [ -z "$(ss -Htan "( sport = :$p )" 2>/dev/null)" ] && { echo "$p"; return 0; }
    elif ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"
      return 0
    fi
  done
  die "no free TCP port found"
}

# Whether pid $1 is alive and runs program $2 (so a recycled pid is never signalled). A zombie
# counts as ended: the daemons are reparented once `start` returns, and whoever reaps them may
# take its time.
runs() {
  local stat
  [ -n "$1" ] && stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  local state=${stat##*) }
  [[ ${state%% *} != Z && $(cat "/proc/$1/comm" 2>/dev/null) == "$2"* ]]
}

write_conf() {
  local dir=$1 host=$2 cpus
  cpus=$(nproc)
  : >"$dir/plugstack.conf"
  # No cgroup.conf: proctrack/linuxproc and task/none need none (22.05 has no cgroup "disabled"
  # plugin). The builtin scheduler with no batch delay and no minimum interval starts a job as
  # soon as it fits (the defaults wait up to 3 s); KillWait 5 (not 30): a cancelled job's SIGKILL
  # follows its SIGTERM quickly. A random FirstJobId: scripts/slurm.sbatch derives MASTER_PORT
  # from the job id, so two private clusters running at once must not both start at job 1.
  cat >"$dir/slurm.conf" <<EOF
# Written by scripts/engines/slurm.sh: a private one-node cluster whose files all live here.
ClusterName=dtrain
FirstJobId=$((RANDOM * 30 + 1))
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
PlugStackConfig=$dir/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
KillWait=5
InactiveLimit=0
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

tail_logs() {
  local dir=$1 f
  for f in munged slurmctld slurmd; do
    [ -s "$dir/$f.log" ] && { echo "--- $dir/$f.log (tail)" >&2; tail -n 15 "$dir/$f.log" >&2; }
    [ -s "$dir/$f.out" ] && { echo "--- $dir/$f.out (tail)" >&2; tail -n 15 "$dir/$f.out" >&2; }
  done
}

# Polls `cmd...` every 0.1 s for at most $1 seconds.
wait_for() {
  local limit=$1 i
  shift
  for ((i = 0; i < limit * 10; i++)); do
    "$@" && return 0
    sleep 0.1
  done
  return 1
}

# Starts program $2 (args after it) in the background, stdio to DIR/$2.out, records its pid.
spawn() {
  local dir=$1 name=$2
  shift 2
  "$name" "$@" </dev/null >"$dir/$name.out" 2>&1 &
  echo $! >"$dir/$name.ours"
}

node_idle() { [[ $(sinfo -h -N -o %T 2>/dev/null) == idle ]]; }
munge_works() {
  munge -n -S "$1/munge.socket" 2>/dev/null | unmunge -S "$1/munge.socket" >/dev/null 2>&1
}

start() {
  local no_install=0
  [ "${1:-}" = --no-install ] && { no_install=1; shift; }
  (($# == 1)) || die "usage: slurm.sh start [--no-install] DIR"
  local dir=$1
  if ! installed; then
    ((no_install)) && skip "Slurm is not installed (scripts/engines/slurm.sh install installs it)"
    install
  fi
  [ "$(id -u)" -eq 0 ] || skip "a private Slurm needs root here (SlurmdUser=root)"
  mkdir -p "$dir" && chmod 700 "$dir" || die "cannot create $dir"
  dir=$(cd "$dir" && pwd)
  [ -e "$dir/slurmctld.ours" ] && die "$dir already holds a cluster (slurm.sh stop $dir first)"
  mkdir -p "$dir/state" "$dir/spool"
  local host
  host=$(hostname -s)
  write_conf "$dir" "$host"
  export SLURM_CONF=$dir/slurm.conf

  # A key of this cluster's own (mungekey writes it mode 0600).
  mungekey --create --keyfile="$dir/munge.key" >/dev/null 2>&1 || die "mungekey failed"
  spawn "$dir" munged --foreground --force --key-file="$dir/munge.key" \
    --socket="$dir/munge.socket" --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" \
    --seed-file="$dir/munged.seed"
  wait_for 10 munge_works "$dir" || { tail_logs "$dir"; stop "$dir"; die "munged did not start"; }
  spawn "$dir" slurmctld -D -f "$SLURM_CONF"
  spawn "$dir" slurmd -D -f "$SLURM_CONF" -N "$host"
  if ! wait_for 30 node_idle; then
    sinfo -N >&2
    tail_logs "$dir"
    stop "$dir"
    die "node $host did not become idle within 30 s"
  fi
  echo "slurm.sh: cluster up in $dir (node $host idle): export SLURM_CONF=$SLURM_CONF" >&2
}

# Sends $2 to pid $1 if it still runs program $3, then waits up to $4 s for it to end.
end_pid() {
  local pid=$1 sig=$2 prog=$3 limit=$4
  runs "$pid" "$prog" || return 0
  kill "-$sig" "$pid" 2>/dev/null
  wait_for "$limit" eval "! runs $pid $prog"
}

stop() {
  (($# == 1)) || die "usage: slurm.sh stop DIR"
  local dir=$1 name pid
  [ -d "$dir" ] || return 0
  dir=$(cd "$dir" && pwd)
  export SLURM_CONF=$dir/slurm.conf
  # Jobs first, while slurmctld and slurmd can still end their steps cleanly.
  pid=$(cat "$dir/slurmctld.ours" 2>/dev/null)
  if runs "$pid" slurmctld && [ -n "$(squeue -h -o %i 2>/dev/null)" ]; then
    scancel --full --signal=KILL $(squeue -h -o %i) 2>/dev/null
    wait_for 15 eval '[ -z "$(squeue -h -t running,pending,completing -o %i 2>/dev/null)" ]' ||
      echo "slurm.sh: jobs still listed after 15 s: stopping the daemons anyway" >&2
  fi
  for name in slurmd slurmctld munged; do
    pid=$(cat "$dir/$name.ours" 2>/dev/null)
    end_pid "$pid" TERM "$name" 10 || end_pid "$pid" KILL "$name" 5 ||
      echo "slurm.sh: $name (pid $pid) did not end" >&2
    rm -f "$dir/$name.ours"
  done
  # A slurmstepd outliving slurmd still holds the slurmd log (a file in DIR) open.
  local comm fd
  for pid in /proc/[0-9]*; do
    pid=${pid#/proc/}
    read -r comm <"/proc/$pid/comm" 2>/dev/null || continue
    [ "$comm" = slurmstepd ] || continue
    for fd in "/proc/$pid/fd"/*; do
      [[ $(readlink "$fd" 2>/dev/null) == "$dir"/* ]] || continue
      echo "slurm.sh: killing slurmstepd $pid left behind" >&2
      kill -KILL "$pid" 2>/dev/null
      break
    done
  done
  return 0
}

run() {
  local opt=()
  [ "${1:-}" = --no-install ] && { opt=(--no-install); shift; }
  (($# >= 1)) || die "usage: slurm.sh run [--no-install] CMD [ARGS...]"
  # Global: the EXIT trap runs after this function has returned.
  run_dir=$(mktemp -d /tmp/dtrain-slurm.XXXXXX) || die "mktemp failed"
  trap 'stop "$run_dir"; rm -rf "$run_dir"' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  (start "${opt[@]}" "$run_dir") || exit $?
  export SLURM_CONF=$run_dir/slurm.conf
  "$@"
}

case ${1:-} in
  install) install ;;
  start) shift; start "$@" ;;
  stop) shift; stop "$@" ;;
  run) shift; run "$@" ;;
  *)
    sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
