#!/usr/bin/env bash
# Runs N ranks of `dtrain run` on this machine, the way `dtrain launch --nproc N` does, in plain
# shell: a template for scripting your own launches.
#
#   scripts/launch_local.sh N CONFIG [dtrain run args...]
#   scripts/launch_local.sh 4 configs/fmnist_mlp.yaml --set distributed.backend=grpc
#
# Each rank gets torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
# MASTER_ADDR, MASTER_PORT) and DTRAIN_JOB_TOKEN, which `dtrain run` reads to find its place in
# the job. Rank r's output goes to OUT/logs/rank-<r>.log (OUT: the --out given, else
# runs/<config stem>); rank 0's is also followed here. When a rank fails the others get SIGTERM,
# then SIGKILL after GRACE seconds; Ctrl-C / SIGTERM to this script are passed on the same way
# (SIGINT as SIGINT, which the ranks catch although a script's background jobs start with it ignored).
#
# Environment: DTRAIN_BIN (default build/bin/dtrain next to this script), MASTER_PORT (default: a
# free port), DTRAIN_JOB_TOKEN (default: random), GRACE (default 10).
# Exit status: 0 when every rank succeeded, 2 when one failed on bad input (exit 2, as dtrain
# launch), else 1 when one failed, 128+N when stopped by signal N
# (after SIGTERM, the ranks' own code when they all exit with one: 75 for a preemption).
set -uo pipefail

die() {
  echo "launch_local.sh: $*" >&2
  exit 2
}

if ((BASH_VERSINFO[0] < 5 || (BASH_VERSINFO[0] == 5 && BASH_VERSINFO[1] < 1))); then
  die "needs bash >= 5.1 (wait -n with process ids)"
fi
(($# >= 2)) || die "usage: $0 N CONFIG [dtrain run args...]"
nproc=$1
config=$2
shift 2
[[ $nproc =~ ^[1-9][0-9]*$ ]] || die "N must be a positive integer, got '$nproc'"
[[ -f $config ]] || die "no such config file: $config"

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${DTRAIN_BIN:-$root/build/bin/dtrain}
[[ -x $bin ]] || die "no dtrain binary at $bin (build it, or set DTRAIN_BIN)"
grace=${GRACE:-10}

# The output folder, as `dtrain run` picks it: --out if given, else runs/<config stem>.
base=$(basename -- "$config")
out="runs/${base%.*}"
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case ${args[i]} in
    --out) ((i + 1 < ${#args[@]})) && out=${args[i + 1]} ;;
    --out=*) out=${args[i]#--out=} ;;
  esac
done
logs="$out/logs"
mkdir -p "$logs" || die "cannot create $logs"

free_port() {
  # Bind port 0 and read back what the kernel chose; another process may still take it before
  # rank 0 binds it (rendezvous then fails loudly). Without python3: a random high port.
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' \
    2>/dev/null || shuf -i 20000-60999 -n 1
}
port=${MASTER_PORT:-$(free_port)}
token=${DTRAIN_JOB_TOKEN:-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}

echo "launch_local.sh: $nproc rank(s), master 127.0.0.1:$port, logs in $logs/rank-<r>.log" >&2

declare -A rank_of=() # pid -> rank, for the ranks still running
starting=1     # set while the ranks are being started (from before the handlers are in place)
stopping=""    # set once the ranks were told to stop
failed=""      # the first rank that failed
interrupted="" # the signal number that stopped us
first_signal_us=0 # when it came (EPOCHREALTIME, us): another signal within 1 s is that one again
stop_codes=""  # the ranks' exit statuses once they were told to stop
rank_stopped=""    # set when a rank stopped on a signal of its own (not this script's)
rank_stop_codes="" # those ranks' exit statuses
user_error=""      # set when a rank failed on bad input (exit 2)

# Signals each rank's process only: `dtrain run` starts no processes of its own. (A rank that
# does would need its own process group, e.g. setsid, and `kill -- -PGID`.)
signal_ranks() {
  local pid
  for pid in "${!rank_of[@]}"; do kill "-$1" "$pid" 2>/dev/null; done
}

# Signals the running ranks with ${stop_sig:-TERM}, then KILLs those still alive after $grace
# seconds. Runs in the background so the main loop keeps reaping (and reporting) ranks meanwhile.
stop_ranks() {
  [[ -n ${killer_pid:-} ]] && return # once: a second killer would outlive this script
  stopping=1
  signal_ranks "${stop_sig:-TERM}"
  (
    # read -t waits without a child process, so killing this subshell leaves nothing behind.
    read -rt "$grace" <> <(:) || :
    echo "launch_local.sh: ranks still running $grace s after SIGTERM: sending SIGKILL" >&2
    for pid in "$@"; do kill -KILL "$pid" 2>/dev/null; done
  ) &
  killer_pid=$!
}

on_signal() { # $1: signal name, $2: its number
  local now
  now=${EPOCHREALTIME/[.,]/}
  if [[ -n $stopping ]]; then
    # Another signal within a second is the same request delivered twice (`timeout`, a
    # terminal and a process group each send one), as `dtrain` itself takes it.
    if [[ -n $interrupted ]] && ((now - first_signal_us < 1000000)); then
      return
    fi
    echo "launch_local.sh: got SIG$1 again: killing the ranks" >&2
    signal_ranks KILL
    return
  fi
  echo "launch_local.sh: got SIG$1: stopping the ranks" >&2
  interrupted=$2
  first_signal_us=$now
  stopping=1
  # SIGINT is passed on as it is (the ranks catch it although this script's background jobs
  # start with it ignored; one that came from the terminal reached them too, and they take the
  # two as one request), SIGHUP as SIGTERM (under nohup the ranks ignore SIGHUP).
  [[ $1 == INT ]] && stop_sig=INT
  # While the ranks start, the one being started is not in rank_of yet: the start loop stops
  # them all once it has ended.
  [[ -n $starting ]] && return
  stop_ranks "${!rank_of[@]}"
}
# Safety net: should this script die early (a bug, set -u), take the ranks with it.
trap 'signal_ranks KILL' EXIT
trap 'on_signal INT 2' INT
trap 'on_signal TERM 15' TERM
trap 'on_signal HUP 1' HUP

# (The handlers above are in place first: a signal while the ranks start stops those started, and
# no more start; it used to end this script alone, leaving them running.)
for ((r = 0; r < nproc; r++)); do
  [[ -n $stopping ]] && break
  log="$logs/rank-$r.log"
  echo "==== launch_local.sh $(date '+%F %T'): rank $r of $nproc ====" >>"$log"
  ((r == 0)) && rank0_offset=$(($(stat -c %s "$log") + 1)) # show only this run's output
  RANK=$r WORLD_SIZE=$nproc LOCAL_RANK=$r LOCAL_WORLD_SIZE=$nproc \
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port DTRAIN_JOB_TOKEN=$token \
    "$bin" run "$config" "$@" </dev/null >>"$log" 2>&1 &
  rank_of[$!]=$r
  ((r == 0)) && rank0_pid=$!
done
starting=""
[[ -n $interrupted ]] && stop_ranks "${!rank_of[@]}"
# Show rank 0 here; tail exits by itself once rank 0 is gone.
tail_pid=""
if [[ -n ${rank0_pid:-} ]]; then
  tail -c "+$rank0_offset" -s 0.2 -F --pid="$rank0_pid" "$logs/rank-0.log" 2>/dev/null &
  tail_pid=$!
fi

describe() { # exit status of a rank, in words
  if (($1 > 128)); then
    # (bash reports a death by signal N and an exit with 128 + N alike: dtrain exits 130 after
    # the checkpoint SIGINT asked for)
    echo "exit status $1 (128 + SIG$(kill -l "$(($1 - 128))"): stopped or killed by it"
  else
    echo "exit status $1"
  fi
}

# A rank's code for a stop it took on a signal (checkpoint written): 75 preempted, or 128 + INT,
# TERM, HUP or USR1, as dtrain launch counts them.
is_stop_code() { (($1 == 75 || $1 == 130 || $1 == 143 || $1 == 129 || $1 == 138)); }

# Called once per rank, when it has ended with status $2.
finished() {
  local r=${rank_of[$1]}
  unset "rank_of[$1]"
  (($2 == 2)) && user_error=1 # bad input, whenever it ends: the job is a user error
  if [[ -n $stopping ]]; then
    echo "launch_local.sh: rank $r stopped: $(describe "$2")" >&2
    stop_codes+=" $2"
  elif [[ -z $failed ]] && is_stop_code "$2"; then
    # A rank of this job was signalled (not this script): the ranks stop at the step they
    # agreed on, each with the same code, which is the job's (as dtrain launch passes it on).
    [[ -z $rank_stopped ]] &&
      echo "launch_local.sh: rank $r stopped: exit status $2; no signal came to this script:" \
        "a rank was signalled (a Ctrl-C reaches the ranks alone when this script runs in the" \
        "background) and the ranks stop at the step they agreed on" >&2
    rank_stopped=1
    rank_stop_codes+=" $2"
  elif (($2 != 0)); then
    echo "launch_local.sh: rank $r failed: $(describe "$2"); stopping the others" >&2
    failed=$r
    ((${#rank_of[@]} > 0)) && stop_ranks "${!rank_of[@]}"
  fi
}

while ((${#rank_of[@]} > 0)); do
  # Blocks until a rank ends or a trapped signal arrives. It returns at once when bash has
  # already reaped one of these ranks on its own (a "no such job" error): the scan below finds it.
  wait -n "${!rank_of[@]}" 2>/dev/null
  for pid in "${!rank_of[@]}"; do
    kill -0 "$pid" 2>/dev/null && continue
    status=0
    wait "$pid" 2>/dev/null || status=$? # bash keeps the status of reaped background jobs
    finished "$pid" "$status"
  done
done

[[ -n ${killer_pid:-} ]] && kill "$killer_pid" 2>/dev/null
[[ -n $tail_pid ]] && wait "$tail_pid" 2>/dev/null
if [[ -n $failed ]]; then
  # A rank signalled while the ranks were starting stops alone (they cannot agree yet) and its
  # peers then fail without it: the signal is the cause, a stop to pass on (as dtrain launch
  # does), unless a rank refused its input.
  if [[ -n $rank_stopped && -z $user_error ]]; then
    read -ra codes <<<"$rank_stop_codes"
    echo "launch_local.sh: a rank was signalled (exit status ${codes[0]}) and its peers then" \
      "failed without it: the job stops" >&2
    exit "${codes[0]}"
  fi
  [[ -n $user_error ]] && exit 2 # bad input: dtrain launch's code, which no restart repeats
  exit 1
elif [[ -n $rank_stopped && -z $interrupted ]]; then
  read -ra codes <<<"$rank_stop_codes"
  same=${codes[0]}
  for c in "${codes[@]}"; do [[ $c == "$same" ]] || same=""; done
  if [[ -n $same ]] && ((${#codes[@]} == nproc)); then exit "$same"; fi
  echo "launch_local.sh: the ranks ended with different codes ($rank_stop_codes)" \
    "after a rank was signalled" >&2
  exit 1
elif [[ -n $interrupted ]]; then
  # After SIGTERM (the ranks get it as such) the ranks' own code when they all agree, as dtrain
  # launch passes it through: 75 when SIGTERM is their preemption signal (checkpoint written,
  # requeue). SIGHUP reaches the ranks as SIGTERM, so it keeps 128 + N, as SIGINT does.
  read -ra codes <<<"$stop_codes"
  same=${codes[0]:-}
  for c in "${codes[@]}"; do [[ $c == "$same" ]] || same=""; done
  # (An exited code only: ranks SIGKILLed after GRACE report 137, which is no code of theirs.)
  if ((interrupted == 15)) && [[ -n $same ]] && ((same < 128 || same == 128 + 15)) &&
    ((${#codes[@]} == nproc)); then
    exit "$same"
  fi
  exit $((128 + interrupted))
fi
echo "launch_local.sh: all $nproc rank(s) finished; results in $out" >&2
