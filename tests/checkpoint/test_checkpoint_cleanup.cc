// What interrupted checkpoint writes leave behind (temp files of atomic writes) is removed at the
// start of a run and by every commit, never a complete checkpoint or a file of another name.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "checkpoint/checkpoint.h"
#include "test_util.h"

using namespace dtrain;
using dtrain::testing::TempDir;
namespace fs = std::filesystem;

TEST_CASE("orphaned temp files of checkpoint writes are removed, nothing else") {
  TempDir dir;
  const std::string ck = dir / "checkpoints";
  fs::create_directories(ck + "/step-20");
  auto touch = [&](const std::string& rel) {
    dir.write("checkpoints/" + rel, std::string(50, 'x'));
    return ck + "/" + rel;
  };
  const std::string orphan1 = touch(".step-30.safetensors.tmp.Ab12Cd");
  const std::string orphan2 = touch(".latest.tmp.zz99ZZ");
  const std::string orphan3 = touch("step-20/.rank-1.safetensors.tmp.q1w2e3");
  const std::vector<std::string> kept = {
      touch("step-10.safetensors"),
      touch("step-20/rank-0.safetensors"),
      touch("step-20/manifest.json"),
      touch("notes.tmp.txt"),
      touch(".hidden"),
      touch(".step-40.safetensors.tmp.short")};  // not mkstemp's 6-character suffix

  // commit_checkpoint sweeps only the folder itself (shards of other steps may be complete).
  commit_checkpoint(ck, "step-10.safetensors", 3);
  CHECK_FALSE(fs::exists(orphan1));
  CHECK_FALSE(fs::exists(orphan2));
  CHECK(fs::exists(orphan3));
  CHECK(fs::exists(ck + "/latest"));

  // At the start of a run the sharded step folders are swept too.
  CHECK(remove_orphaned_temp_files(ck, true) == 1);
  CHECK_FALSE(fs::exists(orphan3));
  for (const auto& k : kept) CHECK_MESSAGE(fs::exists(k), k);
  CHECK(remove_orphaned_temp_files(ck, true) == 0);
  CHECK(remove_orphaned_temp_files(dir / "missing", true) == 0);  // no folder: nothing to do
}

TEST_CASE("incomplete checkpoints are removed: step folders without a manifest, temp files") {
  TempDir dir;
  const std::string ck = dir / "checkpoints";
  auto touch = [&](const std::string& rel) {
    fs::create_directories(fs::path(ck + "/" + rel).parent_path());
    dir.write("checkpoints/" + rel, std::string(50, 'x'));
    return ck + "/" + rel;
  };
  const std::string half =
      touch("step-30/rank-0.safetensors");  // the save died before the manifest
  const std::string temp = touch("step-20/.rank-1.safetensors.tmp.q1w2e3");
  fs::create_directories(ck + "/step-40");  // not even a shard yet
  const std::vector<std::string> kept = {
      touch("step-10.safetensors"),       touch("step-20/rank-0.safetensors"),
      touch("step-20/manifest.json"),     touch("latest"),
      touch("step-x/rank-0.safetensors"),  // not a step entry
      touch("other/rank-0.safetensors")};
  CHECK(remove_incomplete_checkpoints(ck) == 3);
  CHECK_FALSE(fs::exists(fs::path(half).parent_path()));
  CHECK_FALSE(fs::exists(temp));
  CHECK_FALSE(fs::exists(ck + "/step-40"));
  for (const auto& k : kept) CHECK_MESSAGE(fs::exists(k), k);
  CHECK(remove_incomplete_checkpoints(ck) == 0);
  CHECK(remove_incomplete_checkpoints(dir / "missing") == 0);
}
