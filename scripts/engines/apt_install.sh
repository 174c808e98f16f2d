#!/usr/bin/env bash
# Installs the named Debian packages that are missing, in one apt-get run, for the engine scripts
# (slurm.sh, openmpi.sh, ../ci_engines.sh); does nothing when all are installed.
#
#   scripts/engines/apt_install.sh slurmctld slurmd slurm-client munge openmpi-bin
#
# Unlike scripts/install_packages.sh (the build's packages) it keeps the packages' services from
# starting (policy-rc.d answers 101 for the length of the install: the engine scripts start
# private daemons of their own, and Slurm's would look for /etc/slurm/slurm.conf), runs
# `apt-get update` only when an install from the current package lists fails (saves its time in
# CI), and writes apt's output to a log shown only on failure. Exit 77 (a test's "skipped") when
# it cannot install: not root, no apt-get, or apt-get failed.
set -uo pipefail

missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
((${#missing[@]})) || exit 0

skip() {
  echo "apt_install.sh: SKIP: $*" >&2
  exit 77
}
[ "$(id -u)" -eq 0 ] || skip "${missing[*]} not installed, and installing needs root"
command -v apt-get >/dev/null || skip "${missing[*]} not installed, and there is no apt-get"

echo "apt_install.sh: installing ${missing[*]}" >&2
log=$(mktemp /tmp/dtrain-apt.XXXXXX)
policy=/usr/sbin/policy-rc.d
created=0
# The policy must not outlive the install, whatever ends it (Ctrl-C, `timeout`): left behind it
# keeps every later package's services on this host from starting.
cleanup() {
  ((created)) && rm -f "$policy"
  rm -f "$log"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && created=1
fi
get() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"; }
{ get "${missing[@]}" || { apt-get update -q && get "${missing[@]}"; }; } >"$log" 2>&1
rc=$?
if ((rc != 0)); then
  tail -n 20 "$log" >&2
  skip "apt-get install ${missing[*]} failed (exit $rc)"
fi
