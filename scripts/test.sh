#!/usr/bin/env bash
# Sets up (scripts/setup.sh, building everything: dtrain and every test binary), then runs every
# test with CTest, printing output on failure, then the sanitizer and fuzzing stage
# (scripts/ci_sanitize.sh: comm tests under ASan + UBSan, the join/abort stress test, each fuzz
# target for 10 s). Environment: JOBS (compile jobs and parallel tests, default nproc),
# BUILD_DIR (default build), SANITIZE (default 1; 0 skips the sanitizer stage, which is also
# skipped when ctest is given arguments); arguments go to ctest (e.g. -R config).
set -euo pipefail
cd "$(dirname "$0")/.."
TARGETS=all scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "${JOBS:-$(nproc)}" "$@"
if [[ ${SANITIZE:-1} != 0 ]] && (($# == 0)); then scripts/ci_sanitize.sh; fi
