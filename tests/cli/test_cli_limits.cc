// Resource limits a user can run into: a model whose training state cannot fit, and more
// in-process ranks than the address space has room for threads. Both are one clear message and
// exit 2 before anything is trained, never std::bad_alloc or std::terminate.
#include <doctest/doctest.h>

#include <string>

#include "cli/cli_util.h"
#include "test_util.h"

using namespace dtrain::testing;

namespace {
const std::string kBin = DTRAIN_BIN;
const std::string kSrc = DTRAIN_SOURCE_DIR;
}  // namespace

TEST_CASE("a model too large for this machine's memory is refused before it is allocated") {
  TempDir dir;
  const auto r = run_cmd(kBin + " run " + kSrc +
                         "/configs/smoke.yaml --set 'model.hidden=[1000000000]' --out " +
                         dir / "big" + " 2>&1");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "parameters (model.hidden): training needs about"));
  CHECK(contains(r.output, "GiB this process can allocate"));
  CHECK_FALSE(contains(r.output, "bad_alloc"));
}

TEST_CASE("more in-process ranks than threads fit in the address space: exit 2, no abort") {
  TempDir dir;
  // 4 GB of address space hold a few hundred 8 MiB thread stacks, not 1024.
  const auto r = run_cmd("bash -c 'ulimit -v 4000000; " + kBin + " run " + kSrc +
                         "/configs/smoke.yaml --set distributed.world_size=1024 --out " +
                         dir / "many" + " --log-level warn' 2>&1");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "cannot start 1024 in-process ranks"));
  CHECK_FALSE(contains(r.output, "terminate called"));
}
