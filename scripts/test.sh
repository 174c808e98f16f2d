#!/usr/bin/env bash
# Sets up (scripts/setup.sh, building everything: dtrain and every test binary), then runs every
# test with CTest, printing output on failure. Environment: JOBS (compile jobs and parallel
# tests, default nproc), BUILD_DIR (default build); arguments go to ctest (e.g. -R config).
set -euo pipefail
cd "$(dirname "$0")/.."
TARGETS=all scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "${JOBS:-$(nproc)}" "$@"
