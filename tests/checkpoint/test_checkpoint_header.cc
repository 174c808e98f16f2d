// check_checkpoint: the up-front check of --resume / --checkpoint reads headers only, and says
// when a file is not a safetensors file or not a dtrain checkpoint.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "test_util.h"
#include "util/check.h"
#include "util/fs.h"

using namespace dtrain;
using dtrain::testing::TempDir;

namespace {

std::string error_of(const std::string& path) {
  try {
    check_checkpoint(path, false);
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string saved_checkpoint(const TempDir& dir) {
  ModelConfig mc;
  mc.hidden = {4};
  const Model m = build_mlp(mc, 5, 3);
  std::vector<float> p(static_cast<size_t>(m.param_count()), 0.5f);
  CheckpointMeta meta;
  meta.optimizer = "sgd";
  const std::string path = dir / "step-1.safetensors";
  save_checkpoint(path, m, p.data(), {}, meta);
  return path;
}

}  // namespace

TEST_CASE("check_checkpoint accepts a checkpoint from its header alone") {
  TempDir dir;
  const std::string path = saved_checkpoint(dir);
  CHECK(check_checkpoint(path, false) == path);
  CHECK(read_safetensors_metadata(path).at("format") == "dtrain-checkpoint");
  // Tensor bytes cut off: the full read refuses it, the header check (which reads no tensor
  // data) passes; the load that follows reports the truncation.
  const std::string bytes = read_file(path);
  const std::string cut = dir / "cut.safetensors";
  std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() - 4);
  CHECK(check_checkpoint(cut, false) == cut);
  CHECK_THROWS_AS(read_safetensors(cut), UserError);
  // A checkpoints folder resolves to its latest.
  commit_checkpoint(dir.path(), "step-1.safetensors", 3);
  CHECK(check_checkpoint(dir.path(), false) == path);
  CHECK(check_checkpoint(dir / "nothing", true).empty());
  // A latest that is no small regular file (a FIFO would block the read forever) is refused.
  std::filesystem::remove(dir / "latest");
  REQUIRE(::mkfifo((dir / "latest").c_str(), 0600) == 0);
  CHECK_THROWS_WITH_AS(check_checkpoint(dir.path(), false),
                       doctest::Contains("latest' is not a regular file"), UserError);
  std::filesystem::remove(dir / "latest");
  std::ofstream(dir / "latest") << std::string(10000, 'x');
  CHECK_THROWS_WITH_AS(check_checkpoint(dir.path(), false), doctest::Contains("not a latest file"),
                       UserError);
}

TEST_CASE("check_checkpoint: not a safetensors file, not a dtrain checkpoint, bad manifest") {
  TempDir dir;
  const std::string yaml = dir.write("c.yaml", "data:\n  format: synthetic\n");
  CHECK(error_of(yaml).starts_with("'" + yaml +
                                   "' is not a safetensors file (corrupt header length "));
  const std::string text = dir.write("t.txt", std::string("\x05\0\0\0\0\0\0\0hello", 13));
  CHECK(error_of(text).starts_with("'" + text + "' is not a safetensors file (corrupt header: "));
  const std::string other = dir.write("o.safetensors", std::string("\x02\0\0\0\0\0\0\0{}", 10));
  CHECK(error_of(other) == "checkpoint '" + other +
                               "': not a dtrain checkpoint (no format=dtrain-checkpoint in "
                               "__metadata__; model weights from elsewhere, such as a PyTorch "
                               "state_dict, start a run through train.init_from)");
  const std::string sharded = dir / "step-3";
  std::filesystem::create_directories(sharded);
  dir.write("step-3/manifest.json", R"({"format": "dtrain-checkpoint", "format_version": 99})");
  CHECK(error_of(sharded) == "checkpoint '" + sharded +
                                 "': format version 99, this dtrain reads versions " +
                                 std::to_string(kOldestCheckpointFormatVersion) + " to " +
                                 std::to_string(kCheckpointFormatVersion));
  dir.write("step-3/manifest.json", "{");
  CHECK(error_of(sharded).starts_with("checkpoint '" + sharded + "': manifest.json is malformed"));
  // Without the JSON library's bracketed tag ("[json.exception.parse_error.101] ...").
  CHECK(error_of(sharded).find("[json.exception") == std::string::npos);
  CHECK(error_of(text).find("[json.exception") == std::string::npos);
}
