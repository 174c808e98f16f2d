#!/usr/bin/env bash
# Installs dtrain's build dependencies (Debian packages) where missing, then configures and builds
# into build/ (Release). Idempotent: a second run installs nothing and rebuilds only what changed.
# Environment: BUILD_DIR (default build), BUILD_TYPE (default Release), JOBS (default nproc).
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake
  libcli11-dev libyaml-cpp-dev libspdlog-dev libopenblas-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  doctest-dev zlib1g-dev nlohmann-json3-dev
  pkg-config libcairo2-dev
  dataset-fashion-mnist
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

BUILD_DIR=${BUILD_DIR:-build}
BUILD_TYPE=${BUILD_TYPE:-Release}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE="$BUILD_TYPE" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"
echo "setup: built $BUILD_DIR/bin/dtrain"
