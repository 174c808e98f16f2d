// `dtrain eval` of a run folder while the run trains into it and prunes its checkpoints
// (train.checkpoint.keep_last): the latest it resolved was deleted while it was read, and eval
// failed with exit 2, "does not exist" (1 to 5 of 40 evaluations, a checkpoint a step).
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "test_util.h"

using dtrain::testing::CmdResult;
using dtrain::testing::run_cmd;
using dtrain::testing::TempDir;

TEST_CASE("eval of a run folder being written and pruned reads the newest checkpoint") {
  TempDir dir;
  const std::string cfg = std::string(DTRAIN_SOURCE_DIR) + "/configs/smoke.yaml";
  const std::string bin = DTRAIN_BIN;
  // A checkpoint every step, one kept: for about 10 s of training (stopped below).
  std::thread run([&] {
    run_cmd("timeout 60 " + bin + " run " + cfg + " --out " + dir / "r" +
            " --set train.max_steps=20000 --set train.epochs=1000 --set "
            "train.checkpoint.every_steps=1 --set train.checkpoint.keep_last=1 --log-level warn");
  });
  while (!std::filesystem::exists(dir / "r/checkpoints/latest"))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  int ok = 0;
  for (int i = 0; i < 15; ++i) {
    const CmdResult r =
        run_cmd(bin + " eval " + cfg + " --checkpoint " + dir / "r" + " --log-level warn");
    CHECK_MESSAGE(r.exit_code == 0, r.output);
    ok += r.exit_code == 0;
  }
  run_cmd("pkill -f -- '--out " + dir / "r" + " '");
  run.join();
  CHECK(ok == 15);
}
