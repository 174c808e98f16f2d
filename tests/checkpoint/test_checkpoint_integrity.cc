// Checkpoint integrity (issue 16): every tensor carries a CRC-32 that every load verifies, a
// loaded NaN or Inf is refused, and files from before checksums load with one warning.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/integrity_util.h"
#include "log_capture.h"
#include "test_util.h"
#include "user_error.h"
#include "util/check.h"

using namespace dtrain;
using dtrain::testing::contains;
using dtrain::testing::flip_tensor_bit;
using dtrain::testing::LogCapture;
using dtrain::testing::read_text;
using dtrain::testing::set_metadata;
using dtrain::testing::set_tensor_value;
using dtrain::testing::strip_checksums;
using dtrain::testing::TempDir;
using dtrain::testing::user_error_of;

namespace {

Model small_model() {
  ModelConfig mc;
  mc.hidden = {4};
  return build_mlp(mc, 5, 3);
}

CheckpointMeta sgd_meta() {
  CheckpointMeta meta;
  meta.step = 3;
  meta.optimizer = std::string("sgd");  // (= "sgd" hits a GCC 12 -Wrestrict false positive)
  meta.rng = Rng(3).to_string();
  return meta;
}

size_t count_of(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// Rewrites dir's manifest.json through f, without its checksum: as a manifest written before
// checksums existed, or edited by someone who also dropped the checksum, so the checks behind it
// are what refuses the edit.
void rewrite_manifest(const std::string& dir, const std::function<void(nlohmann::json&)>& f) {
  nlohmann::json man = nlohmann::json::parse(read_text(dir + "/manifest.json"));
  f(man);
  man.erase("crc32");
  std::ofstream(dir + "/manifest.json", std::ios::trunc) << man.dump(1);
}

// A 2-rank sharded checkpoint of m in `dir`: rank 0 holds the first half of the flat layout,
// rank 1 the rest, each with a momentum shard; save_id as the training loop writes it ("": none,
// as before save ids).
void save_two_shards(const std::string& dir, const Model& m, const std::vector<float>& p,
                     const std::vector<float>& mom, const std::string& save_id = "") {
  std::filesystem::create_directories(dir);
  const int64_t P = m.param_count(), half = P / 2, shard = P - half;
  const std::vector<std::vector<ShardRange>> ranges = {{{0, half, 0}}, {{half, P, 0}}};
  for (int r = 0; r < 2; ++r) {
    std::vector<float> ps(static_cast<size_t>(shard), 0.0f), ms(ps);
    const int64_t b = ranges[r][0].begin, e = ranges[r][0].end;
    std::copy(p.begin() + b, p.begin() + e, ps.begin());
    std::copy(mom.begin() + b, mom.begin() + e, ms.begin());
    save_shard(dir, r, sgd_meta().step, ranges[r], shard, ps.data(), {{"momentum", ms.data()}},
               save_id);
  }
  CheckpointMeta meta = sgd_meta();
  meta.save_id = save_id;
  meta.strategy = "zero1";
  meta.world_size = 2;
  write_manifest(dir, m, meta, ranges, {"momentum"});
}

}  // namespace

TEST_CASE("a flipped bit in a checkpoint file's tensor is refused naming the file and tensor") {
  TempDir dir;
  const Model m = small_model();
  const int64_t P = m.param_count();
  std::vector<float> p(P), mom(P, 0.25f), got(P, 7.0f), got_mom(P, 7.0f);
  m.init(p.data(), 11);
  const std::string path = dir / "step-3.safetensors";
  save_checkpoint(path, m, p.data(), {{"momentum", mom.data()}}, sgd_meta());
  {
    LogCapture log;
    load_checkpoint(path, m, got.data(), {{"momentum", got_mom.data()}});
    CHECK(got == p);
    CHECK_FALSE(contains(log.text(), "CRC"));  // a checksummed file loads without a warning
  }

  const std::string name = m.params()[0].name;  // e.g. "layers.0.weight"
  for (const std::string& tensor : {name, "optim.momentum." + name}) {
    CAPTURE(tensor);
    save_checkpoint(path, m, p.data(), {{"momentum", mom.data()}}, sgd_meta());
    flip_tensor_bit(path, tensor, /*byte=*/5, /*bit=*/2);
    std::fill(got.begin(), got.end(), 7.0f);
    const std::string msg = user_error_of([&] {
      load_checkpoint(path, m, got.data(), {{"momentum", got_mom.data()}});
    });
    CHECK(contains(msg, "'" + path + "'"));
    CHECK(contains(msg, "tensor '" + tensor + "' fails its CRC-32 check"));
    CHECK(contains(msg, "the file is corrupt"));
    CHECK(std::all_of(got.begin(), got.end(), [](float v) { return v == 7.0f; }));
  }
  // Weights only (eval, predict) verify too.
  save_checkpoint(path, m, p.data(), {{"momentum", mom.data()}}, sgd_meta());
  flip_tensor_bit(path, name, 0, 0);
  CHECK(contains(user_error_of([&] { load_checkpoint(path, m, got.data(), {}); }),
                 "tensor '" + name + "' fails its CRC-32 check"));
}

TEST_CASE("a flipped bit in one shard of a sharded checkpoint is refused naming the shard") {
  TempDir dir;
  const Model m = small_model();
  const int64_t P = m.param_count();
  std::vector<float> p(P), mom(P, -0.5f), got(P, 0.0f), got_mom(P, 0.0f);
  m.init(p.data(), 12);
  const std::string ck = dir / "step-3";
  save_two_shards(ck, m, p, mom);
  load_checkpoint(ck, m, got.data(), {{"momentum", got_mom.data()}});
  CHECK(got == p);
  CHECK(got_mom == mom);

  const std::string shard1 = ck + "/" + shard_file_name(1);
  flip_tensor_bit(shard1, "params", 4, 7);
  const std::string msg = user_error_of([&] { load_checkpoint(ck, m, got.data(), {}); });
  CHECK(contains(msg, "'" + shard1 + "'"));
  CHECK(contains(msg, "tensor 'params' fails its CRC-32 check"));
  // Consolidation reads the same shards and refuses the same way.
  CHECK(contains(user_error_of([&] { consolidate_checkpoint(ck, dir / "one.safetensors"); }),
                 "tensor 'params' fails its CRC-32 check"));
  CHECK_FALSE(std::filesystem::exists(dir / "one.safetensors"));

  save_two_shards(ck, m, p, mom);
  flip_tensor_bit(ck + "/" + shard_file_name(0), "optim.momentum", 0, 1);
  CHECK(contains(user_error_of([&] {
                   load_checkpoint(ck, m, got.data(), {{"momentum", got_mom.data()}});
                 }),
                 "tensor 'optim.momentum' fails its CRC-32 check"));
}

TEST_CASE("a swapped or stale shard file is refused, and so is a manifest naming a tensor twice") {
  TempDir dir;
  const Model m = small_model();
  const int64_t P = m.param_count();
  std::vector<float> p(P), mom(P, -0.5f), got(P, 0.0f);
  m.init(p.data(), 12);
  const std::string ck = dir / "step-3";
  save_two_shards(ck, m, p, mom);
  // Rank 0's and rank 1's files swapped: each header names its writer.
  std::filesystem::rename(ck + "/rank-0.safetensors", ck + "/tmp");
  std::filesystem::rename(ck + "/rank-1.safetensors", ck + "/rank-0.safetensors");
  std::filesystem::rename(ck + "/tmp", ck + "/rank-1.safetensors");
  std::string msg = user_error_of([&] { load_checkpoint(ck, m, got.data(), {}); });
  CHECK_MESSAGE(contains(msg, "shard 'rank-0.safetensors' was written by rank 1"), msg);
  // A shard of another step copied in.
  save_two_shards(ck, m, p, mom);
  const std::vector<std::vector<ShardRange>> ranges = {{{0, P / 2, 0}}};
  std::vector<float> ps(static_cast<size_t>(P - P / 2), 0.0f);
  save_shard(ck, 0, 2, ranges[0], P - P / 2, ps.data(), {{"momentum", ps.data()}});
  msg = user_error_of([&] { load_checkpoint(ck, m, got.data(), {}); });
  CHECK_MESSAGE(contains(msg, "was written at step 2, the manifest is step 3"), msg);
  // A manifest listing one tensor twice (was an internal error when consolidated).
  save_two_shards(ck, m, p, mom);
  rewrite_manifest(ck, [&](nlohmann::json& man) { man["params"][1]["name"] = m.params()[0].name; });
  msg = user_error_of([&] { consolidate_checkpoint(ck, dir / "one.safetensors"); });
  CHECK_MESSAGE(contains(msg, "lists tensor '" + m.params()[0].name + "' twice"), msg);
  // A shard file outside the folder: refused by its name, before anything opens it (it was
  // opened and parsed first: "'/etc/passwd' is not a safetensors file").
  for (const std::string other : {"/etc/passwd", "../step-3/rank-0.safetensors"}) {
    save_two_shards(ck, m, p, mom);
    rewrite_manifest(ck, [&](nlohmann::json& man) { man["shards"][1]["file"] = other; });
    msg = user_error_of([&] { consolidate_checkpoint(ck, dir / "one.safetensors"); });
    CHECK_MESSAGE(contains(msg, "shard file name '" + other + "' has a '/'"), msg);
  }
}

TEST_CASE("a manifest claiming more values than its shards hold is refused before allocating") {
  // A tensor of 2^40 values appended to the table and to rank 1's ranges, the checksum dropped
  // (a manifest of before checksums loads with a warning): the buffers were sized by it first --
  // 4 TiB, or at 2^31 values with Adam's state enough to bring in the kernel's OOM killer.
  TempDir dir;
  const Model m = small_model();
  const int64_t P = m.param_count();
  std::vector<float> p(P), mom(P, 0.25f), got(P, 0.0f);
  m.init(p.data(), 14);
  const std::string ck = dir / "step-3";
  save_two_shards(ck, m, p, mom);
  const int64_t big = int64_t{1} << 40;
  rewrite_manifest(ck, [&](nlohmann::json& man) {
    man["params"].push_back({{"name", "zz"}, {"shape", {big}}, {"offset", P}});
    man["param_count"] = P + big;
    man["shards"][1]["ranges"].push_back({P, P + big, P - P / 2});
  });
  const std::string msg =
      user_error_of([&] { consolidate_checkpoint(ck, dir / "one.safetensors"); });
  CHECK_MESSAGE(contains(msg, "more than its 2 shard file(s) hold"), msg);
}

TEST_CASE(
    "a shard cut short is named, and a manifest too deep, too large or ambiguous is refused") {
  TempDir dir;
  const Model m = small_model();
  const int64_t P = m.param_count();
  std::vector<float> p(P), mom(P, 0.25f), got(P, 0.0f);
  m.init(p.data(), 15);
  const std::string ck = dir / "step-3";
  // An interrupted copy leaves a shard at 60% of its size: the sum of the shards' sizes falls
  // below what the (intact, checksummed) manifest lists, and the manifest was blamed.
  save_two_shards(ck, m, p, mom);
  const std::string shard = ck + "/rank-1.safetensors";
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) * 6 / 10);
  for (const bool consolidate : {false, true}) {
    const std::string msg = user_error_of([&] {
      if (consolidate)
        consolidate_checkpoint(ck, dir / "one.safetensors");
      else
        load_checkpoint(ck, m, got.data(), {});
    });
    CHECK_MESSAGE(contains(msg, "rank-1.safetensors' is not a safetensors file (truncated"), msg);
  }
  // 100,000 levels appended to the manifest with its checksum kept: the check copies and prints
  // the tree, recursing once per level (SIGSEGV in run --resume, eval and consolidate).
  save_two_shards(ck, m, p, mom);
  std::string text = read_text(ck + "/manifest.json");
  const size_t close = text.rfind('}');
  REQUIRE(close != std::string::npos);
  text = text.substr(0, close) + ", \"x\": " + std::string(100000, '[') + std::string(100000, ']') +
         "}\n";
  std::ofstream(ck + "/manifest.json", std::ios::trunc) << text;
  std::string msg = user_error_of([&] { load_checkpoint(ck, m, got.data(), {}); });
  CHECK_MESSAGE(contains(msg, "manifest.json nests its JSON 100001 levels deep"), msg);
  // 3M empty objects (9 MB; as a tree ~30-fold that) are refused before any tree is built, and
  // so is a key named twice (the checksum covers the parsed tree, which keeps one of them).
  std::string empties;
  for (int i = 0; i < 3'000'000; ++i) empties += "{},";
  std::ofstream(ck + "/manifest.json", std::ios::trunc)
      << text.substr(0, close) + ", \"x\": [" + empties + "{}]}\n";
  msg = user_error_of([&] { load_checkpoint(ck, m, got.data(), {}); });
  CHECK_MESSAGE(contains(msg, "manifest.json's JSON holds more than"), msg);
  std::ofstream(ck + "/manifest.json", std::ios::trunc)
      << text.substr(0, close) + ", \"step\": 4}\n";
  msg = user_error_of([&] { load_checkpoint(ck, m, got.data(), {}); });
  CHECK_MESSAGE(contains(msg, "manifest.json's JSON names the key 'step' twice"), msg);
}

TEST_CASE("a shard's own format and version are checked, as the manifest's are") {
  TempDir dir;
  const Model m = small_model();
  const int64_t P = m.param_count();
  std::vector<float> p(P), mom(P, 0.5f), got(P, 0.0f);
  m.init(p.data(), 15);
  const std::string ck = dir / "step-3", shard1 = ck + "/rank-1.safetensors";
  const struct {
    const char *key, *value, *expect;
  } cases[] = {
      {"format_version", "99", "format version 99, this dtrain reads versions"},
      {"format_version", "0", "format version 0, this dtrain reads versions"},
      {"format_version", "abc", "has format_version 'abc', not a number"},
      {"format_version", nullptr, "has format_version '', not a number"},
      {"format", "not-dtrain", "is not a dtrain shard (format=not-dtrain"},
      {"format", nullptr, "is not a dtrain shard (no format"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.expect);
    save_two_shards(ck, m, p, mom);
    set_metadata(shard1, c.key, c.value);
    std::string msg = user_error_of([&] { load_checkpoint(ck, m, got.data(), {}); });
    CHECK_MESSAGE(contains(msg, c.expect), msg);
    CHECK_MESSAGE(contains(msg, "rank-1.safetensors"), msg);
    msg = user_error_of([&] { consolidate_checkpoint(ck, dir / "one.safetensors"); });
    CHECK_MESSAGE(contains(msg, c.expect), msg);
  }
  CHECK_FALSE(std::filesystem::exists(dir / "one.safetensors"));
}

TEST_CASE("metadata out of range is refused: a step past 2^53, world size below 1, batch 1.5") {
  // A file whose header checksum was removed (loaded with a warning) carried step 99999999999
  // into a run that reported 100000000017 steps; a manifest's "batch": 1.5 was read as 1.
  TempDir dir;
  const Model m = small_model();
  const int64_t P = m.param_count();
  std::vector<float> p(P), mom(P, 0.5f), got(P, 0.0f);
  m.init(p.data(), 16);
  const std::string path = dir / "step-3.safetensors";
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, std::string>>{{"step", "9007199254740993"},
                                                        {"world_size", "-3"},
                                                        {"world_size", "0"},
                                                        {"schedule_steps", "-5"}}) {
    CAPTURE(key);
    save_checkpoint(path, m, p.data(), {{"momentum", mom.data()}}, sgd_meta());
    set_metadata(path, key, value.c_str());
    const std::string msg = user_error_of([&] { load_checkpoint(path, m, got.data(), {}); });
    CHECK_MESSAGE(contains(msg, "the file is corrupt"), msg);
  }
  // The JSON it carries: deep nesting (its readers copy the tree recursively: 10^5 levels
  // overflowed the stack) or no object is refused before anything reads it.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, std::string>>{{"config", deep},
                                                        {"progress", deep},
                                                        {"normalizer", deep},
                                                        {"config", "[1, 2]"},
                                                        {"progress", "not json"}}) {
    CAPTURE(key);
    save_checkpoint(path, m, p.data(), {{"momentum", mom.data()}}, sgd_meta());
    set_metadata(path, key, value.c_str());
    const std::string msg = user_error_of([&] { load_checkpoint(path, m, got.data(), {}); });
    CHECK_MESSAGE(contains(msg, "its metadata '" + key + "' is not a JSON object"), msg);
  }
  // A run without a step limit lays its schedule out over INT64_MAX steps: that loads.
  CheckpointMeta unlimited = sgd_meta();
  unlimited.schedule_steps = std::numeric_limits<int64_t>::max();
  save_checkpoint(path, m, p.data(), {{"momentum", mom.data()}}, unlimited);
  CHECK(load_checkpoint(path, m, got.data(), {}).schedule_steps == unlimited.schedule_steps);
  const std::string ck = dir / "step-4";
  save_two_shards(ck, m, p, mom);
  rewrite_manifest(ck, [](nlohmann::json& man) { man["batch"] = 1.5; });
  const std::string msg = user_error_of([&] { load_checkpoint(ck, m, got.data(), {}); });
  CHECK_MESSAGE(contains(msg, "manifest.json's batch is 1.5, not an integer"), msg);
  for (const nlohmann::json& v : {nlohmann::json(2.9), nlohmann::json(true)}) {
    CAPTURE(v.dump());
    save_two_shards(ck, m, p, mom);
    rewrite_manifest(ck, [&](nlohmann::json& man) { man["format_version"] = v; });
    const std::string e = user_error_of([&] { load_checkpoint(ck, m, got.data(), {}); });
    CHECK_MESSAGE(contains(e, "manifest.json's format_version is " + v.dump() + ", not an integer"),
                  e);
  }
  // A field of another type is named by its key or its entry (the JSON library's words alone,
  // "type must be string, but is null", named none).
  save_two_shards(ck, m, p, mom);
  rewrite_manifest(ck, [](nlohmann::json& man) { man["optimizer"] = nullptr; });
  std::string e = user_error_of([&] { load_checkpoint(ck, m, got.data(), {}); });
  CHECK_MESSAGE(contains(e, "manifest.json's optimizer is null, not a string"), e);
  save_two_shards(ck, m, p, mom);
  rewrite_manifest(ck, [](nlohmann::json& man) { man["params"][1]["shape"] = "x"; });
  e = user_error_of([&] { load_checkpoint(ck, m, got.data(), {}); });
  CHECK_MESSAGE(contains(e, "manifest.json's params[1] is malformed: "), e);
  save_two_shards(ck, m, p, mom);
  rewrite_manifest(ck, [](nlohmann::json& man) { man["shards"][1]["rank"] = "one"; });
  e = user_error_of([&] { load_checkpoint(ck, m, got.data(), {}); });
  CHECK_MESSAGE(contains(e, "manifest.json's shards[1] is malformed: "), e);
}

TEST_CASE("remove_checkpoint removes files and step folders, and a link without its target") {
  TempDir dir;
  const Model m = small_model();
  const int64_t P = m.param_count();
  std::vector<float> p(P), mom(P, 0.5f);
  m.init(p.data(), 16);
  const std::string file = dir / "step-3.safetensors", folder = dir / "step-4",
                    target = dir / "elsewhere", link = dir / "step-5";
  save_checkpoint(file, m, p.data(), {{"momentum", mom.data()}}, sgd_meta());
  save_two_shards(folder, m, p, mom);
  save_two_shards(target, m, p, mom);
  std::filesystem::create_directory_symlink(target, link);
  for (const std::string& path : {file, folder, link}) {
    std::error_code ec;
    remove_checkpoint(path, ec);
    CHECK_MESSAGE(!ec, path, ": ", ec.message());
    CHECK_FALSE(std::filesystem::exists(std::filesystem::symlink_status(path)));
  }
  CHECK(std::filesystem::exists(std::filesystem::path(target) / "manifest.json"));
  std::error_code ec;
  remove_checkpoint(dir / "step-6", ec);  // (nothing there: nothing to do)
  CHECK(!ec);
}

TEST_CASE("a shard left by another run's save of the same step is refused by its save id") {
  TempDir dir;
  const Model m = small_model();
  const int64_t P = m.param_count();
  std::vector<float> p(P), other(P), mom(P, 0.5f), got(P, 0.0f);
  m.init(p.data(), 13);
  m.init(other.data(), 14);
  const std::string ck = dir / "step-3", old = dir / "old-step-3";
  // Same step, same ranks, same ranges: only the save id tells the two runs' shards apart.
  save_two_shards(ck, m, p, mom, "00000000000000aa");
  save_two_shards(old, m, other, mom, "00000000000000bb");
  CHECK(load_checkpoint(ck, m, got.data(), {}).save_id == "00000000000000aa");
  CHECK(got == p);
  std::filesystem::copy_file(old + "/rank-1.safetensors", ck + "/rank-1.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  std::string msg = user_error_of([&] { load_checkpoint(ck, m, got.data(), {}); });
  CHECK_MESSAGE(contains(msg,
                         "shard 'rank-1.safetensors' belongs to save 00000000000000bb, the "
                         "manifest's save is 00000000000000aa"),
                msg);
  msg = user_error_of([&] { consolidate_checkpoint(ck, dir / "one.safetensors"); });
  CHECK_MESSAGE(contains(msg, "belongs to save 00000000000000bb"), msg);
  // A shard without a save id (written before they existed) under a manifest with one.
  save_two_shards(old, m, other, mom);
  std::filesystem::copy_file(old + "/rank-0.safetensors", ck + "/rank-0.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  msg = user_error_of([&] { load_checkpoint(ck, m, got.data(), {}); });
  CHECK_MESSAGE(contains(msg, "shard 'rank-0.safetensors' has no save id"), msg);
  // A manifest whose save id was removed, its shards having theirs: refused, not unchecked.
  save_two_shards(ck, m, p, mom, "00000000000000aa");
  rewrite_manifest(ck, [](nlohmann::json& man) { man.erase("save_id"); });
  msg = user_error_of([&] { load_checkpoint(ck, m, got.data(), {}); });
  CHECK_MESSAGE(contains(msg, "belongs to save 00000000000000aa, the manifest names no save"), msg);
  // Both without (an older checkpoint): not checked, loads.
  load_checkpoint(old, m, got.data(), {});
  CHECK(got == other);
}

TEST_CASE(
    "a manifest edited to shift a shard's range, repeat a state or rename a tensor is refused") {
  TempDir dir;
  const Model m = small_model();
  const int64_t P = m.param_count();
  std::vector<float> p(P), mom(P, -0.5f), got(P, 0.0f), got_mom(P);
  m.init(p.data(), 14);
  const std::string ck = dir / "step-3";
  // Any edit that keeps the manifest's checksum fails it first.
  save_two_shards(ck, m, p, mom);
  {
    nlohmann::json man = nlohmann::json::parse(read_text(ck + "/manifest.json"));
    REQUIRE(man.contains("crc32"));
    man["epoch"] = 1;
    std::ofstream(ck + "/manifest.json", std::ios::trunc) << man.dump(4);
  }
  std::string msg = user_error_of([&] { load_checkpoint(ck, m, got.data(), {}); });
  CHECK_MESSAGE(contains(msg, "manifest.json fails its CRC-32 check"), msg);
  CHECK(contains(user_error_of([&] { check_checkpoint(ck, false); }), "fails its CRC-32 check"));
  // Respaced only: the checksum is of the canonical form, so it still holds.
  save_two_shards(ck, m, p, mom);
  {
    const nlohmann::json man = nlohmann::json::parse(read_text(ck + "/manifest.json"));
    std::ofstream(ck + "/manifest.json", std::ios::trunc) << man.dump(7);
  }
  load_checkpoint(ck, m, got.data(), {});
  CHECK(got == p);
  // Without the checksum, the checks behind it:
  const auto edit = [&](const std::function<void(nlohmann::json&)>& f) {
    save_two_shards(ck, m, p, mom);
    rewrite_manifest(ck, f);
  };
  // An offset moved by one value: loaded silently, every weight shifted, before.
  edit([](nlohmann::json& man) { man["shards"][0]["ranges"][0][2] = 1; });
  msg = user_error_of([&] { load_checkpoint(ck, m, got.data(), {}); });
  CHECK_MESSAGE(contains(msg, "shard 'rank-0.safetensors' holds the ranges"), msg);
  CHECK(contains(msg, "an edited manifest"));
  CHECK(contains(user_error_of([&] { consolidate_checkpoint(ck, dir / "one.safetensors"); }),
                 "the manifest says"));
  CHECK_FALSE(std::filesystem::exists(dir / "one.safetensors"));
  // The optimizer state listed twice (an internal error when consolidated, before), or a name
  // that is not one.
  edit([](nlohmann::json& man) { man["optimizer_state"] = {"momentum", "momentum"}; });
  msg = user_error_of([&] { consolidate_checkpoint(ck, dir / "one.safetensors"); });
  CHECK_MESSAGE(contains(msg, "optimizer_state lists 'momentum' twice"), msg);
  edit([](nlohmann::json& man) { man["optimizer_state"] = {"mom.entum"}; });
  CHECK(contains(user_error_of([&] { consolidate_checkpoint(ck, dir / "one.safetensors"); }),
                 "'mom.entum', not a state name"));
  // A shape whose product wraps around int64 (each dimension plausible): refused as a bad shape,
  // not an internal error later.
  edit([](nlohmann::json& man) {
    man["params"][0]["shape"] = {int64_t{1} << 32, int64_t{1} << 32};
  });
  msg = user_error_of([&] { consolidate_checkpoint(ck, dir / "one.safetensors"); });
  CHECK_MESSAGE(contains(msg, "has a bad shape"), msg);
  // Tensor names a full checkpoint cannot hold.
  for (const std::string name : {"__metadata__", "optim.momentum.x"}) {
    edit([&](nlohmann::json& man) { man["params"][0]["name"] = name; });
    msg = user_error_of([&] { consolidate_checkpoint(ck, dir / "one.safetensors"); });
    CHECK_MESSAGE(contains(msg, "a tensor named '" + name + "'"), msg);
  }
  // An offset so large that offset + length wraps around int64: read outside the shard's
  // buffer (garbage or a crash), before.
  edit([&](nlohmann::json& man) {
    auto& r = man["shards"][0]["ranges"][0];
    r[2] = std::numeric_limits<int64_t>::max() - (r[1].get<int64_t>() - r[0].get<int64_t>()) + 1;
  });
  msg = user_error_of([&] { load_checkpoint(ck, m, got.data(), {}); });
  CHECK_MESSAGE(contains(msg, "holds the ranges"), msg);
  // A layout.tp other than 1 skipped the ranges' check (the shards' "ranges" are local under
  // tensor parallelism): their headers' global_ranges are checked whatever it says; and a
  // layout.tp below 1 is no layout.
  edit([](nlohmann::json& man) {
    man["layout"] = {{"tp", 2}, {"dp", 1}, {"pp", 1}};
    man["shards"][0]["ranges"][0][2] = 1;
  });
  msg = user_error_of([&] { load_checkpoint(ck, m, got.data(), {}); });
  CHECK_MESSAGE(contains(msg, "holds the ranges"), msg);
  edit([](nlohmann::json& man) { man["layout"] = {{"tp", 0}, {"dp", 1}, {"pp", 1}}; });
  msg = user_error_of([&] { load_checkpoint(ck, m, got.data(), {}); });
  CHECK_MESSAGE(contains(msg, "layout.tp is 0, not a tensor-parallel size"), msg);
  // Without its checksum but otherwise untouched (a manifest of an older dtrain): loads, warning.
  edit([](nlohmann::json&) {});
  {
    LogCapture log;
    load_checkpoint(ck, m, got.data(), {});
    CHECK(got == p);
    CHECK_MESSAGE(contains(log.text(), "manifest.json has no CRC-32 checksum"), log.text());
  }
  // Untouched, it still loads.
  save_two_shards(ck, m, p, mom);
  load_checkpoint(ck, m, got.data(), {{"momentum", got_mom.data()}});
  CHECK(got == p);
}

TEST_CASE("a NaN or Inf in a loaded parameter is refused naming the tensor and the index") {
  TempDir dir;
  const Model m = small_model();
  const int64_t P = m.param_count();
  std::vector<float> p(P), mom(P, 0.0f), got(P, 7.0f), got_mom(P);
  m.init(p.data(), 13);
  const std::string path = dir / "step-3.safetensors";
  const std::string bias = m.params()[1].name;
  struct Case {
    std::string tensor;
    int64_t index;
    float value;
    std::string shown;
  };
  for (const Case& c :
       {Case{bias, 2, std::numeric_limits<float>::quiet_NaN(), "nan"},
        Case{bias, 0, -std::numeric_limits<float>::infinity(), "-inf"},
        Case{"optim.momentum." + bias, 3, std::numeric_limits<float>::infinity(), "inf"}}) {
    CAPTURE(c.tensor);
    save_checkpoint(path, m, p.data(), {{"momentum", mom.data()}}, sgd_meta());
    set_tensor_value(path, c.tensor, c.index, c.value);
    const std::string msg = user_error_of([&] {
      load_checkpoint(path, m, got.data(), {{"momentum", got_mom.data()}});
    });
    CHECK(contains(msg, "checkpoint '" + path + "': tensor '" + c.tensor +
                            "' holds a non-finite value (" + c.shown + ") at index " +
                            std::to_string(c.index)));
    CHECK(std::all_of(got.begin(), got.end(), [](float v) { return v == 7.0f; }));
  }

  // In a sharded checkpoint the index is the tensor's, not the shard's.
  const std::string ck = dir / "step-4";
  save_two_shards(ck, m, p, mom);
  const ParamEntry& last = m.params().back();
  // The last tensor ends the flat layout, in rank 1's shard at offset P - half.
  const int64_t half = P / 2, flat = last.offset + 1;
  REQUIRE(flat >= half);
  set_tensor_value(ck + "/" + shard_file_name(1), "params", flat - half,
                   std::numeric_limits<float>::quiet_NaN());
  CHECK(contains(user_error_of([&] { load_checkpoint(ck, m, got.data(), {}); }),
                 "tensor '" + last.name + "' holds a non-finite value (nan) at index 1"));
}

TEST_CASE("checkpoints without checksums still load, with one warning per load") {
  TempDir dir;
  const Model m = small_model();
  const int64_t P = m.param_count();
  std::vector<float> p(P), mom(P, 0.125f), got(P, 0.0f), got_mom(P, 0.0f);
  m.init(p.data(), 14);
  const std::string path = dir / "step-3.safetensors";
  save_checkpoint(path, m, p.data(), {{"momentum", mom.data()}}, sgd_meta());
  strip_checksums(path);
  CHECK_FALSE(read_safetensors(path).checksummed);
  {
    LogCapture log;
    load_checkpoint(path, m, got.data(), {{"momentum", got_mom.data()}});
    CHECK(got == p);
    CHECK(got_mom == mom);
    CHECK(count_of(log.text(), "no CRC-32 checksums") == 1);
    CHECK(contains(log.text(), path));
  }
  // Unverified, but still checked for non-finite values.
  set_tensor_value(path, m.params()[0].name, 0, std::numeric_limits<float>::quiet_NaN());
  strip_checksums(path);
  CHECK(contains(user_error_of([&] { load_checkpoint(path, m, got.data(), {}); }),
                 "non-finite value (nan) at index 0"));

  const std::string ck = dir / "step-4";
  save_two_shards(ck, m, p, mom);
  strip_checksums(ck + "/" + shard_file_name(0));
  strip_checksums(ck + "/" + shard_file_name(1));
  LogCapture log;
  std::fill(got.begin(), got.end(), 0.0f);
  load_checkpoint(ck, m, got.data(), {{"momentum", got_mom.data()}});
  CHECK(got == p);
  CHECK(count_of(log.text(), "no CRC-32 checksums") == 1);
  CHECK(contains(log.text(), "2 of its 2 shard files"));
}

TEST_CASE("tensor checksums without the header's: loads verified, warning that the header is not") {
  TempDir dir;
  const Model m = small_model();
  const int64_t P = m.param_count();
  std::vector<float> p(P), mom(P, 0.125f), got(P, 0.0f), got_mom(P, 0.0f);
  m.init(p.data(), 15);
  const std::string path = dir / "step-3.safetensors";
  save_checkpoint(path, m, p.data(), {{"momentum", mom.data()}}, sgd_meta());
  strip_checksums(path, /*header_only=*/true);
  const StFile f = read_safetensors(path);
  CHECK(f.checksummed);
  CHECK_FALSE(f.header_checksummed);
  {
    LogCapture log;
    load_checkpoint(path, m, got.data(), {{"momentum", got_mom.data()}});
    CHECK(got == p);
    CHECK(count_of(log.text(), "no CRC-32 of the header") == 1);
    CHECK(count_of(log.text(), "no CRC-32 checksums") == 0);
  }
  // The tensors are still verified.
  flip_tensor_bit(path, m.params()[0].name);
  CHECK(contains(user_error_of([&] { load_checkpoint(path, m, got.data(), {}); }), "CRC-32"));
  // A file with both: no warning.
  save_checkpoint(path, m, p.data(), {{"momentum", mom.data()}}, sgd_meta());
  CHECK(read_safetensors(path).header_checksummed);
  {
    LogCapture log;
    load_checkpoint(path, m, got.data(), {{"momentum", got_mom.data()}});
    CHECK(log.text().find("CRC-32") == std::string::npos);
  }
  const std::string ck = dir / "step-4";
  save_two_shards(ck, m, p, mom);
  strip_checksums(ck + "/" + shard_file_name(1), /*header_only=*/true);
  LogCapture log;
  load_checkpoint(ck, m, got.data(), {{"momentum", got_mom.data()}});
  CHECK(got == p);
  CHECK(count_of(log.text(), "no CRC-32 of the header") == 1);
  CHECK(contains(log.text(), "1 of its 2 shard files"));
}

TEST_CASE("malformed crc32 metadata is a corrupt header, and the key is not user metadata") {
  TempDir dir;
  const std::vector<float> w = {1.0f, 2.0f, 3.0f};
  const std::string path = dir / "x.safetensors";
  write_safetensors(path, {{"w", {3}, w.data()}}, {{"k", "v"}, {kStCrcKey, "ignored"}});
  const StFile f = read_safetensors(path);
  CHECK(f.checksummed);
  CHECK(f.metadata == std::map<std::string, std::string>{{"k", "v"}});
  CHECK(read_safetensors_metadata(path) == f.metadata);
  // Each stored CRC must be 8 hex digits, one per tensor, none extra.
  for (const std::string& bad :
       {std::string("[1]"), std::string(R"({"w":"1234"})"), std::string(R"({})"),
        std::string(R"({"w":"00000000","x":"00000000"})"), std::string("not json")}) {
    CAPTURE(bad);
    uint64_t len = 0;
    nlohmann::json h = dtrain::testing::st_header(path, &len);
    h["__metadata__"][kStCrcKey] = bad;
    std::string text = h.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    const uint64_t n = text.size();
    std::string out(8, '\0');
    std::memcpy(out.data(), &n, 8);
    const std::string bad_path = dir / "bad.safetensors";
    std::ofstream(bad_path, std::ios::binary | std::ios::trunc)
        << out + text + dtrain::testing::read_text(path).substr(8 + len);
    CHECK(contains(user_error_of([&] { read_safetensors(bad_path); }), "corrupt header"));
  }
}
