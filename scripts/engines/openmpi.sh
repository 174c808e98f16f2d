#!/usr/bin/env bash
# Open MPI's mpirun for the engine tests (tests/engines) and for README's mpirun command.
#
#   scripts/engines/openmpi.sh install    install Debian's openmpi-bin when mpirun is missing
#   scripts/engines/openmpi.sh check      exit 0 when mpirun is there, 77 (with the reason) if not
#
# dtrain does not link MPI: mpirun only starts the processes and sets OMPI_COMM_WORLD_*, which
# `dtrain run` reads (MASTER_ADDR and MASTER_PORT must be exported with -x). Exit 77 (a test's
# "skipped") when Open MPI is missing and cannot be installed (apt_install.sh: not root, no
# apt-get, the install failed). Tested with Debian 12's Open MPI 4.1.4.
set -uo pipefail

skip() {
  echo "openmpi.sh: SKIP: $*" >&2
  exit 77
}

installed() { command -v mpirun >/dev/null 2>&1; }

case ${1:-} in
  install)
    "$(dirname "$0")/apt_install.sh" openmpi-bin || exit $?
    installed || skip "installed openmpi-bin but mpirun is still missing"
    ;;
  check)
    installed || skip "Open MPI is not installed (scripts/engines/openmpi.sh install installs it)"
    ;;
  *)
    sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
