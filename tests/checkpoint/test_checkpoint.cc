#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "test_util.h"
#include "util/check.h"

using namespace dtrain;
using dtrain::testing::TempDir;

namespace {
Model small_model(int64_t hidden) {
  ModelConfig mc;
  mc.hidden = {hidden};
  return build_mlp(mc, 5, 3);
}
}  // namespace

TEST_CASE("checkpoint round trip restores parameters, state and metadata exactly") {
  TempDir dir;
  const Model m = small_model(4);
  const int64_t P = m.param_count();
  std::vector<float> p(P), mom(P), p2(P, 0.0f), mom2(P, 0.0f);
  m.init(p.data(), 11);
  for (int64_t i = 0; i < P; ++i) mom[i] = 0.001f * static_cast<float>(i) - 0.3f;
  CheckpointMeta meta;
  meta.step = 17;
  meta.epoch = 2;
  meta.batch = 5;
  meta.optimizer = "sgd";
  meta.optimizer_steps = 17;
  meta.rng = Rng(3).to_string();
  meta.config_hash = "abc";
  const std::string path = dir / "step-17.safetensors";
  save_checkpoint(path, m, p.data(), {{"momentum", mom.data()}}, meta);
  const CheckpointMeta got = load_checkpoint(path, m, p2.data(), {{"momentum", mom2.data()}});
  CHECK(p2 == p);
  CHECK(mom2 == mom);
  CHECK(got.step == 17);
  CHECK(got.epoch == 2);
  CHECK(got.batch == 5);
  CHECK(got.optimizer == "sgd");
  CHECK(got.rng == meta.rng);
  CHECK(got.config_hash == "abc");

  // Weights only.
  std::vector<float> p3(P, 0.0f);
  load_checkpoint(path, m, p3.data(), {});
  CHECK(p3 == p);
}

TEST_CASE("checkpoint from another model, truncated or corrupt is refused and changes nothing") {
  TempDir dir;
  const Model m = small_model(4);
  const Model other = small_model(6);
  std::vector<float> p(m.param_count(), 1.0f);
  CheckpointMeta meta;
  meta.optimizer = "sgd";
  meta.rng = Rng(1).to_string();
  const std::string path = dir / "c.safetensors";
  save_checkpoint(path, m, p.data(), {}, meta);

  std::vector<float> q(other.param_count(), 5.0f);
  try {
    load_checkpoint(path, other, q.data(), {});
    FAIL("loaded into another model");
  } catch (const UserError& e) {
    CHECK(std::string(e.what()).find("does not match the model") != std::string::npos);
    CHECK(std::string(e.what()).find("layers.0.weight") != std::string::npos);
  }
  for (float v : q) REQUIRE(v == 5.0f);

  // A tensor the model has none of (nanoGPT's attention mask buffers, say): named.
  {
    const StFile f = read_safetensors(path);
    std::vector<StTensorRef> refs;
    for (const auto& [name, t] : f.tensors) refs.push_back({name, t.shape, t.data.data()});
    const float one = 1.0f;
    refs.push_back({"h.0.attn.bias", {1}, &one});
    write_safetensors(dir / "extra.safetensors", refs, f.metadata);
    CHECK_THROWS_WITH_AS(load_checkpoint(dir / "extra.safetensors", m, p.data(), {}),
                         doctest::Contains("('h.0.attn.bias' is none of the model's)"), UserError);
  }
  // Asking for optimizer state the file does not have.
  std::vector<float> mom(m.param_count());
  CHECK_THROWS_AS(load_checkpoint(path, m, p.data(), {{"momentum", mom.data()}}), UserError);

  const std::string bytes = dtrain::testing::read_text(path);
  for (size_t cut : {size_t{0}, size_t{4}, size_t{20}, bytes.size() / 2, bytes.size() - 1}) {
    const std::string t = dir.write("t.safetensors", bytes.substr(0, cut));
    CHECK_THROWS_AS(load_checkpoint(t, m, p.data(), {}), UserError);
  }
  CHECK_THROWS_AS(load_checkpoint(dir / "missing.safetensors", m, p.data(), {}), UserError);
}

TEST_CASE("commit_checkpoint names the newest and keeps the last N") {
  TempDir dir;
  for (int s : {10, 20, 30, 40}) {
    dir.write(checkpoint_file_name(s), "x");
    commit_checkpoint(dir.path(), checkpoint_file_name(s), 2);
  }
  CHECK(std::filesystem::exists(dir / "step-40.safetensors"));
  CHECK(std::filesystem::exists(dir / "step-30.safetensors"));
  CHECK_FALSE(std::filesystem::exists(dir / "step-20.safetensors"));
  CHECK_FALSE(std::filesystem::exists(dir / "step-10.safetensors"));
  CHECK(dtrain::testing::read_text(dir / "latest") == "step-40.safetensors\n");
  CHECK(resolve_checkpoint(dir.path(), false) == dir / "step-40.safetensors");
  CHECK(resolve_checkpoint(dir / "step-30.safetensors", false) == dir / "step-30.safetensors");
  // The `latest` file itself is followed (it holds a name, not tensors).
  CHECK(resolve_checkpoint(dir / "latest", false) == dir / "step-40.safetensors");
  CHECK(resolve_checkpoint(dir / "nothing", true).empty());
  CHECK_THROWS_AS(resolve_checkpoint(dir / "nothing", false), UserError);
  // A name with a NUL (a hand-edited file): the file system would see "step-40.safetensors".
  dir.write("latest", std::string("step-40.safetensors\0junk\n", 25));
  CHECK_THROWS_AS(resolve_checkpoint(dir.path(), false), UserError);
  // A latest naming itself (it was read as a checkpoint: "not a safetensors file").
  dir.write("latest", "latest\n");
  CHECK_THROWS_WITH_AS(resolve_checkpoint(dir.path(), false),
                       doctest::Contains("does not name a checkpoint file (it holds 'latest')"),
                       UserError);
  dir.write("latest", "step-99.safetensors\n");
  CHECK_THROWS_AS(resolve_checkpoint(dir.path(), false), UserError);
  CHECK_THROWS_AS(resolve_checkpoint(dir / "latest", false), UserError);
  // No latest at all: the newest complete step (a folder without its manifest is incomplete).
  std::filesystem::remove(dir / "latest");
  std::filesystem::create_directory(dir / "step-50");
  dir.write("step-50/rank-0.safetensors", "x");
  CHECK(resolve_checkpoint(dir.path(), false) == dir / "step-40.safetensors");
  // A step folder with no manifest (even no shard), named directly or by latest, says so.
  std::filesystem::create_directory(dir / "step-60");
  const auto msg = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(msg([&] {
          resolve_checkpoint(dir / "step-60", false);
        }).find("is a folder without manifest.json") != std::string::npos);
  dir.write("latest", "step-60\n");
  CHECK(msg([&] {
          resolve_checkpoint(dir.path(), false);
        }).find("names 'step-60', a folder without manifest.json") != std::string::npos);
  std::filesystem::remove(dir / "latest");
  std::filesystem::remove(dir / "step-60");
  // A sharded checkpoint's manifest or shard file means its folder; a device is no checkpoint.
  dir.write("step-50/manifest.json", "{}");
  CHECK(resolve_checkpoint(dir / "step-50/manifest.json", false) == dir / "step-50");
  CHECK(resolve_checkpoint(dir / "step-50/rank-0.safetensors", false) == dir / "step-50");
  CHECK_THROWS_WITH_AS(resolve_checkpoint("/dev/null", false),
                       "checkpoint '/dev/null' is not a regular file or a checkpoint folder",
                       UserError);
}

TEST_CASE("keep_last removes an abandoned timeline's later checkpoints first") {
  // Steps 10..40 saved, then the run resumed from step 10 and saved 20 again: 30 and 40 belong
  // to the timeline it left, and keep_last 2 keeps 10 and the new 20.
  TempDir dir;
  for (int s : {10, 20, 30, 40}) {
    dir.write(checkpoint_file_name(s), "x");
    commit_checkpoint(dir.path(), checkpoint_file_name(s), 4);
  }
  dir.write(checkpoint_file_name(20), "y");
  commit_checkpoint(dir.path(), checkpoint_file_name(20), 2);
  CHECK(std::filesystem::exists(dir / "step-10.safetensors"));
  CHECK(std::filesystem::exists(dir / "step-20.safetensors"));
  CHECK_FALSE(std::filesystem::exists(dir / "step-30.safetensors"));
  CHECK_FALSE(std::filesystem::exists(dir / "step-40.safetensors"));
  // The abandoned timeline saved step 50 sharded (a folder), this one saves it as a file: the
  // folder is superseded and goes (keep_last kept it and removed this run's step 20, before).
  dir.write("step-50/manifest.json", "{}");
  commit_checkpoint(dir.path(), "step-50", 3);
  dir.write(checkpoint_file_name(50), "z");
  commit_checkpoint(dir.path(), checkpoint_file_name(50), 3);
  CHECK_FALSE(std::filesystem::exists(dir / "step-50"));
  for (int s : {10, 20, 50}) CHECK(std::filesystem::exists(dir / checkpoint_file_name(s)));
}

TEST_CASE("keep_last never keeps an interrupted save in place of a complete checkpoint") {
  // A sharded save of step 20 was cut off (its folder has no manifest); the run resumed from 10
  // and went on past it. keep_last 2 keeps the two newest steps that can be resumed: 10 and 30,
  // not the manifest-less folder 20 and 30.
  TempDir dir;
  dir.write(checkpoint_file_name(10), "x");
  commit_checkpoint(dir.path(), checkpoint_file_name(10), 2);
  dir.write("step-20/rank-0.safetensors", "partial");
  dir.write(checkpoint_file_name(30), "y");
  commit_checkpoint(dir.path(), checkpoint_file_name(30), 2);
  CHECK(std::filesystem::exists(dir / "step-10.safetensors"));
  CHECK(std::filesystem::exists(dir / "step-30.safetensors"));
  CHECK_FALSE(std::filesystem::exists(dir / "step-20"));
}
