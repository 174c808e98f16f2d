// doctest's main, after the same OpenBLAS kernel choice the dtrain binary makes (tensor/blas.h),
// so library tests compute with the kernels the binary uses.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <atomic>
#include <cstdio>
#include <string_view>

#include "quiet_listener.h"
#include "tensor/blas.h"
#include "util/quick_exit.h"

namespace {

// How many test cases the run's filters matched (test_run_end's count).
std::atomic<int> g_matched{-1};

struct CountMatched : dtrain::testing::QuietListener {
  using QuietListener::QuietListener;
  void test_run_end(const doctest::TestRunStats& s) override {
    g_matched.store(static_cast<int>(s.numTestCasesPassingFilters));
  }
};
REGISTER_LISTENER("count_matched", 1, CountMatched);

int run_tests(int argc, char** argv) {
  const int rc = doctest::Context(argc, argv).run();
  // CTest runs each case by name (--test-case=NAME): a name the filter cannot match (CMake
  // splits a name at ';') ran nothing and passed. That is a failure: the test never ran.
  bool filtered = false, listing = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a(argv[i]);
    filtered = filtered || a.starts_with("--test-case=") || a.starts_with("-tc=");
    listing = listing || a.starts_with("--list") || a.starts_with("-l");
  }
  if (rc == 0 && filtered && !listing && g_matched.load() == 0) {
    std::fprintf(stderr, "no test case matches the --test-case filter: nothing ran\n");
    return 1;
  }
  return rc;
}

}  // namespace

// Ends as the dtrain binary ends (util/quick_exit.h): the libraries' exit handlers skipped, so
// what a test proves is not undone by a teardown race that dtrain itself never runs.
int main(int argc, char** argv) {
  dtrain::reexec_with_better_blas(argv);
  dtrain::quick_exit_flushed(run_tests(argc, argv));
}
