#!/usr/bin/env bash
# The sanitizer and fuzzing stage of scripts/test.sh (and so of CI), sized for its budget: one
# ASan + UBSan build (build-asan/, clang) of only what the stage runs (test_comm, dtrain and the
# fuzz targets), then
#   1. the comm tests under ASan + UBSan (scripts/sanitize.sh asan),
#   2. the join/abort stress test, STRESS_JOBS short jobs (default 12) under ASan,
#   3. every fuzz target for FUZZ_SECONDS (default 10) on its seed corpus.
# The full variants (checkpoint and train tests, TSan, 200 stress jobs) are scripts/sanitize.sh
# all and scripts/stress_join_abort.sh 200, run by hand. Fails on any test failure, sanitizer
# report, stress failure or fuzz finding.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
SAN_TESTS='^comm:' SAN_TARGETS='test_comm dtrain fuzz' scripts/sanitize.sh asan
t1=$SECONDS
scripts/stress_join_abort.sh "${STRESS_JOBS:-12}"
t2=$SECONDS
scripts/fuzz.sh "${FUZZ_SECONDS:-10}"
echo "ci_sanitize: build + comm tests $((t1 - start)) s, stress $((t2 - t1)) s," \
  "fuzz $((SECONDS - t2)) s, total $((SECONDS - start)) s"
