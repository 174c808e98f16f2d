#!/usr/bin/env bash
# Builds dtrain's sanitizer variants and runs the comm, checkpoint and train tests under them.
# Exits non-zero when a test fails or any process (test binaries and the ranks they start)
# produced a sanitizer report; the reports are printed at the end.
#
#   scripts/sanitize.sh [asan|tsan|all]   (default all)
#     asan: ASan + UBSan in build-asan/ (with clang it also builds fuzz/, see scripts/fuzz.sh)
#     tsan: TSan in build-tsan/
#
# Environment: SAN_TESTS (ctest -R regex, default '^(comm|checkpoint|train):'), SAN_TARGETS
# (CMake targets, default test_comm test_checkpoint test_train), SAN_CXX / SAN_CC (default
# clang++-16 / clang-16), JOBS (default nproc). Suppressions (third-party code only) are in
# scripts/sanitizers/*.supp; reports are kept in build-<variant>/san-logs/.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/sanitizers/common.sh

what=${1:-all}
case $what in
  asan | tsan) variants=("$what") ;;
  all) variants=(asan tsan) ;;
  *) echo "usage: $0 [asan|tsan|all]" >&2 && exit 2 ;;
esac
tests=${SAN_TESTS:-'^(comm|checkpoint|train):'}
read -r -a targets <<<"${SAN_TARGETS:-test_comm test_checkpoint test_train}"

status=0
for v in "${variants[@]}"; do
  start=$SECONDS
  san_build "$v" "${targets[@]}"
  built=$SECONDS
  logs=$PWD/build-$v/san-logs
  rm -rf "$logs"
  (
    san_env "$v" "$logs"
    ctest --test-dir "build-$v" -R "$tests" --output-on-failure -j "${JOBS:-$(nproc)}"
  ) || status=1
  san_reports "$logs" || status=1
  echo "sanitize: $v: built in $((built - start)) s, tests in $((SECONDS - built)) s"
done
if ((status)); then echo "sanitize: FAILED ($what)" >&2; else echo "sanitize: clean ($what)"; fi
exit $status
