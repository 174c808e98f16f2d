#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang, ASan + UBSan, in build-asan/) and runs each for a
# bounded time on its seed corpus (fuzz/corpus/<target>/) and its committed crash inputs
# (fuzz/regressions/<target>/, when present). New inputs go to build-asan/fuzz-corpus/<target>/
# (kept between runs, never committed); a crash, sanitizer report, leak, timeout or OOM writes
# its input to build-asan/fuzz-artifacts/<target>/ and fails this script.
#
#   scripts/fuzz.sh [seconds per target, default 60] [target...]   (default: every target)
#
# To keep a crash: put its input in fuzz/regressions/<target>/, add a doctest in tests/<area>/
# that reads it, then fix the code.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/sanitizers/common.sh
secs=${1:-60}
[[ $secs =~ ^[1-9][0-9]*$ ]] || {
  echo "usage: $0 [seconds] [target...]" >&2
  exit 2
}
shift $(($# ? 1 : 0))
[[ $SAN_CXX == clang* ]] || {
  echo "fuzz: libFuzzer needs clang (SAN_CXX=$SAN_CXX)" >&2
  exit 2
}
san_build asan fuzz
b=$PWD/build-asan
if (($#)); then targets=("$@"); else mapfile -t targets <"$b/fuzz_targets.txt"; fi
# Reports go to stderr here: libFuzzer reads them to decide it found a crash.
export ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$PWD/scripts/sanitizers/ubsan.supp"
export LSAN_OPTIONS="suppressions=$PWD/scripts/sanitizers/lsan.supp:print_suppressions=0"
failed=()
for t in "${targets[@]}"; do
  [[ -n $t ]] || continue
  mkdir -p "$b/fuzz-corpus/$t" "$b/fuzz-artifacts/$t"
  dirs=("$b/fuzz-corpus/$t" "fuzz/corpus/$t")
  [[ -d fuzz/regressions/$t ]] && dirs+=("fuzz/regressions/$t")
  echo "fuzz: $t for $secs s"
  if ! "$b/bin/fuzz_$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$b/fuzz-artifacts/$t/" "${dirs[@]}" \
    >"$b/fuzz-artifacts/$t.log" 2>&1; then
    failed+=("$t")
    tail -60 "$b/fuzz-artifacts/$t.log"
  fi
  grep -E '^stat::(number_of_executed_units|peak_rss_mb)|^#[0-9]+ *DONE' "$b/fuzz-artifacts/$t.log" |
    tr '\n' ' ' | sed "s/^/fuzz: $t: /"
  echo
done
if ((${#failed[@]})); then
  echo "fuzz: FAILED: ${failed[*]} (inputs in $b/fuzz-artifacts/, logs $b/fuzz-artifacts/<target>.log)" >&2
  exit 1
fi
echo "fuzz: clean (${#targets[@]} targets, $secs s each)"
