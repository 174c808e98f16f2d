// The progress bar (train/progress.h): what it prints before a loss is known, and after.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>

#include "test_util.h"
#include "train/progress.h"

using namespace dtrain;
using dtrain::testing::contains;

namespace {

// What fn writes to stderr (fd 2 pointed at a temporary file meanwhile).
std::string stderr_of(const std::function<void()>& fn) {
  std::fflush(stderr);
  char path[] = "/tmp/dtrain-progress-XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  const int saved = dup(2);
  dup2(fd, 2);
  fn();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::string out;
  lseek(fd, 0, SEEK_SET);
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fd);
  unlink(path);
  return out;
}

}  // namespace

TEST_CASE("progress bar: no loss yet shows '-', not nan, a real NaN loss still shows") {
  const std::string before = stderr_of([] {
    ProgressBar bar(true);
    bar.update(1, 10, 0.1, std::nullopt, 0.0);
  });
  CHECK(contains(before, "step 1/10"));
  CHECK(contains(before, "loss -  "));
  CHECK_FALSE(contains(before, "nan"));
  const std::string known = stderr_of([] {
    ProgressBar bar(true);
    bar.update(10, 10, 1.0, 2.5, 100.0);
  });
  CHECK(contains(known, "loss 2.5000"));
  const std::string diverged = stderr_of([] {
    ProgressBar bar(true);
    bar.update(10, 10, 1.0, std::nan(""), 100.0);
  });
  CHECK(contains(diverged, "loss nan"));
  const std::string off = stderr_of([] {
    ProgressBar bar(false);
    bar.update(10, 10, 1.0, 2.5, 100.0);
  });
  CHECK(off.empty());
}
