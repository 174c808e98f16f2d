// ExitDeadline: a teardown that hangs after a failure ends with the error and its code; one that
// ends in time leaves nothing armed.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "test_util.h"
#include "util/exit_deadline.h"

using dtrain::ExitDeadline;
using dtrain::testing::contains;
using dtrain::testing::read_text;
using dtrain::testing::TempDir;

TEST_CASE("exit deadline: a hung teardown ends with the error and its code, in time") {
  TempDir t;
  const std::string err = t / "stderr";
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const int fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, STDERR_FILENO);
    const ExitDeadline bound(1, 2, "rank 1: the data does not fit");
    for (;;) ::pause();  // (gRPC's shutdown waiting for a thread that never started)
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 2);
  const std::string text = read_text(err);
  CHECK_MESSAGE(contains(text, "error: rank 1: the data does not fit\n"), text);
  CHECK_MESSAGE(contains(text, "did not end in time"), text);
}

TEST_CASE("exit deadline: a teardown that ends in time disarms it") {
  { const ExitDeadline bound(1, 3, "never said"); }
  ::sleep(2);  // past the bound: still here
  CHECK(::alarm(0) == 0);
}
