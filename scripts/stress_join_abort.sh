#!/usr/bin/env bash
# Join/abort stress test: N short gRPC jobs (2 or 3 ranks, a tiny config), in each of which one
# rank is killed (SIGKILL) or interrupted (SIGTERM) at a random point of its startup, rendezvous,
# stream setup or first steps; every job must end promptly with a clean error: no hang, no crash
# signal, no sanitizer report (scripts/sanitizers/stress_join_abort.py says exactly what is
# checked). Prints a line per job and a summary; exits 1 when any job failed.
#
#   scripts/stress_join_abort.sh N [harness options: --parallel P --bound S --seed X --keep ...]
#
# Environment: SAN = asan (default: builds build-asan/bin/dtrain with ASan + UBSan), tsan, or
# none (DTRAIN_BIN, default build/bin/dtrain, as it is); STRESS_DIR (default
# build-<SAN>/stress: a failed job's folder, logs and reports, stays there).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/sanitizers/common.sh
(($# >= 1)) && [[ $1 =~ ^[1-9][0-9]*$ ]] || {
  echo "usage: $0 N [harness options]" >&2
  exit 2
}
jobs=$1
shift
san=${SAN:-asan}
case $san in
  asan | tsan)
    san_build "$san" dtrain
    bin=$PWD/build-$san/bin/dtrain
    san_env "$san" "$PWD/build-$san/stress/reports"  # each job points log_path at its folder
    ;;
  none) bin=${DTRAIN_BIN:-$PWD/build/bin/dtrain} ;;
  *) echo "$0: SAN must be asan, tsan or none, not '$san'" >&2 && exit 2 ;;
esac
work=${STRESS_DIR:-$PWD/build-$san/stress}
exec python3 scripts/sanitizers/stress_join_abort.py "$jobs" --bin "$bin" --work "$work" "$@"
