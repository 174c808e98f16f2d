#!/usr/bin/env bash
# Installs the Debian packages given as arguments that are not installed yet (apt-get, through
# sudo unless root); does nothing when all are. Shared by setup.sh and the sanitizer scripts.
#
#   scripts/install_packages.sh clang libclang-rt-14-dev
set -euo pipefail
missing=()
for p in "$@"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  echo "install_packages: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
