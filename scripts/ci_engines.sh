#!/usr/bin/env bash
# CI's engine stage: installs Slurm (slurmctld, slurmd, slurm-client, munge) and Open MPI
# (openmpi-bin) from Debian where missing, then runs the tests that drive them for real,
# `ctest -L engines` (tests/engines: scripts/slurm.sbatch under a private one-node Slurm,
# dtrain under mpirun). DTRAIN_ENGINES_REQUIRED=1: a test whose engine cannot start fails here
# instead of skipping. Builds dtrain and test_engines in BUILD_DIR (default build) if needed;
# JOBS as for scripts/test.sh. Leaves no daemon running (each test stops the cluster it started).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}

# The tests make their clusters under DTRAIN_ENGINES_TMP; whatever a test killed by its timeout
# left running there is stopped on the way out.
DTRAIN_ENGINES_TMP=$(mktemp -d /tmp/dtrain-engines.XXXXXX)
export DTRAIN_ENGINES_TMP
sweep() {
  local d
  for d in "$DTRAIN_ENGINES_TMP"/dtrain_slurm_*; do
    if [ -d "$d" ]; then
      echo "ci_engines: stopping the cluster a test left in $d" >&2
      scripts/engines/slurm.sh stop "$d" || true
    fi
  done
  rm -rf "$DTRAIN_ENGINES_TMP"
}
trap sweep EXIT

t0=$SECONDS
# One apt-get run for both engines (each script's own `install` would make two).
scripts/engines/apt_install.sh slurmctld slurmd slurm-client munge openmpi-bin
scripts/engines/slurm.sh install
scripts/engines/openmpi.sh install
t1=$SECONDS
if [ -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake --build "$BUILD_DIR" -j "$JOBS" --target dtrain test_engines
else
  BUILD_DIR=$BUILD_DIR scripts/setup.sh dtrain test_engines
fi
t2=$SECONDS
DTRAIN_ENGINES_REQUIRED=1 ctest --test-dir "$BUILD_DIR" -L engines --no-tests=error \
  --output-on-failure -j "$JOBS"
t3=$SECONDS
versions="Slurm $(dpkg-query -W -f='${Version}' slurmd)"
versions+=", Open MPI $(dpkg-query -W -f='${Version}' openmpi-bin)"
echo "ci_engines: install $((t1 - t0)) s, build $((t2 - t1)) s, tests $((t3 - t2)) s ($versions)"
