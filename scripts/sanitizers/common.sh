# Sourced by scripts/sanitize.sh, scripts/fuzz.sh and scripts/stress_join_abort.sh: building a
# sanitizer variant of dtrain and running processes under it with every report kept.
#
#   san_build asan|tsan TARGET...   installs the compiler where missing, configures build-<v>/
#                                   and builds the CMake targets given
#   san_env asan|tsan DIR           exports the *SAN_OPTIONS: reports of every process (children
#                                   included) go to files DIR/<kind>.<pid>, with suppressions
#   san_reports DIR                 prints those reports; fails when there is any
#
# Variants: asan = ASan + UBSan (with clang also libFuzzer's coverage, DTRAIN_FUZZ=ON, so one
# build folder serves the tests and fuzz/); tsan = TSan. Both -O1 with line tables, unity builds.
# Environment: SAN_CXX / SAN_CC (default clang++-16 / clang-16, Debian 12's newest: clang 14
# lacks C++20 pieces dtrain uses, such as lambdas capturing structured bindings and _Float16 on
# x86-64; g++ / gcc work for asan and tsan, not for fuzzing), JOBS (default nproc).

SAN_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SAN_CXX=${SAN_CXX:-clang++-16}
SAN_CC=${SAN_CC:-clang-16}

san_build() {
  local variant=$1
  shift
  local sanitize fuzz=OFF
  case $variant in
    asan) sanitize=address,undefined ;;
    tsan) sanitize=thread ;;
    *) echo "san_build: unknown variant '$variant' (asan or tsan)" >&2 && return 2 ;;
  esac
  # Debian's clang and its runtimes (the sanitizers, libFuzzer); llvm-16 for llvm-symbolizer,
  # which turns report addresses into file:line. gcc's runtimes come with build-essential.
  local pkgs=(build-essential cmake)
  [[ $SAN_CXX == clang* ]] && pkgs+=(clang-16 libclang-rt-16-dev llvm-16)
  "$SAN_ROOT/scripts/install_packages.sh" "${pkgs[@]}"
  if [[ $variant == asan && $SAN_CXX == clang* ]]; then fuzz=ON; fi
  local dir=$SAN_ROOT/build-$variant
  echo "sanitize: building $* in build-$variant ($sanitize, $SAN_CXX, fuzz=$fuzz)"
  # A unity build (16 sources per compile): the instrumented build is CI's longest step, and
  # parsing the gRPC, protobuf and spdlog headers once per batch instead of once per source
  # halves it (ASan + UBSan of test_comm, dtrain and fuzz/ on 2 cores: 821 s to 377 s). So no
  # two sources of one target may define the same name at file scope, anonymous namespaces
  # included; a clash fails here, not in the everyday build.
  CXX=$SAN_CXX CC=$SAN_CC cmake -S "$SAN_ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -DDTRAIN_SANITIZE=$sanitize -DDTRAIN_FUZZ=$fuzz \
    -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=16 >/dev/null
  cmake --build "$dir" -j "${JOBS:-$(nproc)}" --target "$@"
}

san_env() {
  local variant=$1 dir=$2 supp=$SAN_ROOT/scripts/sanitizers
  mkdir -p "$dir"
  local sym
  sym=$(command -v llvm-symbolizer-16 || command -v llvm-symbolizer || true)
  local common="log_path=$dir/report:print_suppressions=0${sym:+:external_symbolizer_path=$sym}"
  case $variant in
    asan)
      export ASAN_OPTIONS="$common:detect_leaks=1:strict_string_checks=1:check_initialization_order=1:detect_stack_use_after_return=1"
      export UBSAN_OPTIONS="$common:print_stacktrace=1:halt_on_error=1:suppressions=$supp/ubsan.supp"
      export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
      ;;
    tsan)
      export TSAN_OPTIONS="$common:suppressions=$supp/tsan.supp:second_deadlock_stack=1:halt_on_error=0"
      # OpenBLAS (uninstrumented) syncs its worker threads with spin loops TSan cannot see: one
      # thread where a config does not set runtime.threads (tsan.supp says what else is not ours).
      export OPENBLAS_NUM_THREADS=1
      ;;
  esac
}

san_reports() {
  local dir=$1 n=0 f
  for f in "$dir"/report.*; do
    [[ -e $f ]] || continue
    # LeakSanitizer also leaves notes that are no report ("Unable to get registers from thread
    # N": a thread exited during its scan at exit); they are shown, not counted.
    if ! grep -qE '(ERROR|WARNING): [A-Za-z]+Sanitizer|runtime error:|SUMMARY: [A-Za-z]+Sanitizer' "$f"; then
      echo "sanitize: note (not a report) in $f: $(head -c 300 "$f")"
      continue
    fi
    ((++n))
    echo "===== sanitizer report $f"
    cat "$f"
    echo
  done
  if ((n)); then
    echo "sanitize: $n sanitizer report(s) in $dir" >&2
    return 1
  fi
}
