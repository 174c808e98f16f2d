// Reads a sharded checkpoint folder (manifest.json and its rank-<r>.safetensors files) back
// into the full flat layout, checking every shard against the manifest.

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <optional>
#include <set>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_internal.h"
#include "checkpoint/safetensors.h"
#include "util/check.h"
#include "util/fs.h"
#include "util/json_limits.h"
#include "util/strings.h"

namespace dtrain::checkpoint_internal {

namespace fs = std::filesystem;

// The values a shard's ranges ("[[b,e,o],...]", 4 values a range) may parse to: tensor
// parallelism gives a shard a range per row of each row-parallel weight, ~1M values for 4096 x
// 32 layers; a tree of 4M costs at most ~160 MB (util/json_limits.h).
constexpr int64_t kMaxRangeValues = 4'000'000;

void check_manifest_format(const nlohmann::json& m, const std::string& dir) {
  if (m.at("format").get<std::string>() != kFormatName)
    throw UserError("checkpoint '" + dir + "': manifest.json is not a dtrain manifest");
  const nlohmann::json& v = m.at("format_version");
  // (get<int64_t> would read 2.9 as 2 and true as 1)
  if (!v.is_number_integer())
    throw UserError("checkpoint '" + dir + "': manifest.json's format_version is " +
                    shown_text(v.dump(), 100) + ", not an integer: the file is corrupt");
  check_format_version(v.get<int64_t>(), dir);
}

nlohmann::json read_manifest(const std::string& dir, bool* checksummed) {
  // A manifest lists ranges per rank and tensor: far below this even for 1024 ranks.
  constexpr uint64_t kMaxManifestBytes = uint64_t{256} << 20;
  // It nests a few levels (ranks, tensors, ranges; the config): deeper is no manifest, and the
  // CRC check below copies and prints the tree, recursing once per level.
  constexpr int kMaxManifestDepth = 64;
  const std::string text =
      read_regular_file((fs::path(dir) / kManifest).string(), kMaxManifestBytes);
  if (const int depth = json_depth(text); depth > kMaxManifestDepth)
    throw UserError("checkpoint '" + dir + "': manifest.json nests its JSON " +
                    std::to_string(depth) + " levels deep (a manifest has a few): the " +
                    "file is corrupt or not a dtrain manifest");
  // A real manifest spends 6 or more bytes per value (a range [b,e,o] is 4 values in ~25 bytes;
  // tensor parallelism lists a range per row of each row-parallel weight and tensor rank: 8M
  // values for tp 8 x 4096 x 32 layers, in ~60 MB), text of "{}," 3: a million values plus one
  // per 5 bytes passes every manifest dtrain writes and stops what grows 30-fold in memory.
  const int64_t max_values = 1'000'000 + static_cast<int64_t>(text.size() / 5);
  nlohmann::json m;
  try {
    m = parse_limited_json(text, max_values);
  } catch (const JsonLimitError& e) {
    throw UserError("checkpoint '" + dir + "': manifest.json's JSON " + e.what() +
                    ": the file is corrupt or not a dtrain manifest");
  }
  const auto it = m.is_object() ? m.find(kManifestCrcKey) : m.end();
  if (checksummed != nullptr) *checksummed = it != m.end();
  if (it == m.end()) return m;
  const nlohmann::json stored = *it;
  nlohmann::json rest = m;
  rest.erase(kManifestCrcKey);
  const std::string computed = crc32_hex(rest.dump());
  if (!stored.is_string() || ascii_lower(stored.get<std::string>()) != computed)
    throw UserError("checkpoint '" + dir + "': manifest.json fails its CRC-32 check (stored " +
                    shown_text(stored.dump()) + ", computed \"" + computed +
                    "\"): the file is corrupt or was edited");
  return m;
}

namespace {

// Ranks above this in a manifest are damage, not a run (the transports stop at 1024 ranks).
constexpr int64_t kMaxCheckpointWorld = int64_t{1} << 20;

// A shard file is the one the manifest means: its own header names the rank and (shards written
// since 2026-12-03; older ones lack it) the step it was written for, so a shard swapped with
// another rank's or copied in from another step is refused instead of mixing parameters; and
// (since 2026-12-04) the save it belongs to, so one left by another run's save of the same step
// is refused too; a manifest without a save id is refused for a shard that has one.
void check_shard_identity(const std::string& dir, const std::string& file, const StFile& f,
                          int64_t rank, int64_t step, const std::string& save_id) {
  const auto meta = [&](const char* key) {
    const auto it = f.metadata.find(key);
    return it == f.metadata.end() ? std::optional<std::string>() : it->second;
  };
  const auto bad = [&](const std::string& what) {
    return UserError("checkpoint '" + dir + "': shard '" + file + "' " + what +
                     " (a shard file swapped or copied in from another checkpoint)");
  };
  // Its own format and version, as every shard has written them since the first.
  const auto fmt = meta("format");
  if (!fmt || *fmt != kShardFormatName)
    throw UserError("checkpoint '" + dir + "': shard '" + file + "' is not a dtrain shard (" +
                    (fmt ? "format=" + shown_text(*fmt) : std::string("no format")) +
                    " in its __metadata__, not " + kShardFormatName + ")");
  const std::string version = meta("format_version").value_or("");
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(version.data(), version.data() + version.size(), v);
  if (version.empty() || ec != std::errc() || end != version.data() + version.size())
    throw UserError("checkpoint '" + dir + "': shard '" + file + "' has format_version '" +
                    shown_text(version) + "', not a number");
  check_format_version(v, (fs::path(dir) / file).string());
  if (const auto r = meta("rank"); r && *r != std::to_string(rank))
    throw bad("was written by rank " + *r + ", the manifest lists it for rank " +
              std::to_string(rank));
  if (const auto st = meta("step"); st && *st != std::to_string(step))
    throw bad("was written at step " + *st + ", the manifest is step " + std::to_string(step));
  const auto id = meta("save_id");
  if (save_id.empty()) {  // a manifest from before save ids, unless its shard has one
    if (id)
      throw bad("belongs to save " + *id +
                ", the manifest names no save (an edited manifest, or one of another checkpoint)");
    return;
  }
  if (!id) throw bad("has no save id, the manifest's save is " + save_id);
  if (*id != save_id)
    throw bad("belongs to save " + *id + ", the manifest's save is " + save_id +
              " (another run's checkpoint of the same step?)");
}

// A [begin, end, offset] triple of a manifest or a shard header. Throws the JSON library's error.
ShardRange shard_range_of(const nlohmann::json& r) {
  return {r.at(0).get<int64_t>(), r.at(1).get<int64_t>(), r.at(2).get<int64_t>()};
}

// A manifest list entry's JSON error, named by its place ("params[3] is malformed: type must be
// number ...": the library's words name no key).
UserError entry_error(const std::string& dir, const char* list, size_t i,
                      const nlohmann::json::exception& e) {
  return UserError("checkpoint '" + dir + "': manifest.json's " + list + "[" + std::to_string(i) +
                   "] is malformed: " + json_error_text(e.what()));
}

// The manifest's parameter table ("params"): names distinct and possible for a parameter,
// shapes bounded, offsets contiguous from 0. Returns the values it lays out.
int64_t read_param_table(const nlohmann::json& params, const std::string& dir,
                         std::vector<ShardedRead::Entry>& table) {
  int64_t next = 0;
  std::set<std::string> names;
  size_t index = 0;
  for (const auto& e : params) try {
      ShardedRead::Entry en;
      en.name = e.at("name").get<std::string>();
      if (!names.insert(en.name).second)
        throw UserError("checkpoint '" + dir + "': the manifest lists tensor '" + en.name +
                        "' twice");
      // Names a full checkpoint (consolidate) could not hold: safetensors' reserved key, and
      // the optimizer state's prefix.
      if (en.name == "__metadata__" || en.name.rfind("optim.", 0) == 0)
        throw UserError("checkpoint '" + dir + "': the manifest lists a tensor named '" + en.name +
                        "', a name parameters cannot have");
      en.shape = e.at("shape").get<Shape>();
      en.offset = e.at("offset").get<int64_t>();
      en.numel = 1;
      for (int64_t d : en.shape) {
        // (a product past 2^40 values -- 4 TiB of floats -- is no checkpoint of this program,
        // and wrapping around would let a bad shape pass the offset checks)
        if (d < 0 || d > (int64_t{1} << 40) || __builtin_mul_overflow(en.numel, d, &en.numel) ||
            en.numel > (int64_t{1} << 40))
          throw UserError("checkpoint '" + dir + "': tensor '" + en.name + "' has a bad shape");
      }
      if (en.offset != next)
        throw UserError("checkpoint '" + dir + "': tensor '" + en.name + "' is at offset " +
                        std::to_string(en.offset) + ", expected " + std::to_string(next));
      next += en.numel;
      table.push_back(std::move(en));
      ++index;
    } catch (const nlohmann::json::exception& ex) {
      throw entry_error(dir, "params", index, ex);
    }
  return next;
}

// The manifest's shard list ("shards"): each shard's file, rank and ranges.
void read_shard_list(const nlohmann::json& shards, const std::string& dir,
                     std::vector<std::string>& files, std::vector<int64_t>& ranks,
                     std::vector<std::vector<ShardRange>>& ranges) {
  size_t index = 0;
  for (const auto& sh : shards) try {
      files.push_back(sh.at("file").get<std::string>());
      // (a file of the folder itself, before any is opened: "/etc/passwd" or "../x" was opened
      // and parsed by the size check)
      if (files.back().find('/') != std::string::npos)
        throw UserError("checkpoint '" + dir + "': shard file name '" + shown_text(files.back()) +
                        "' has a '/'");
      ranks.push_back(sh.at("rank").get<int64_t>());
      std::vector<ShardRange> rs;
      for (const auto& r : sh.at("ranges")) rs.push_back(shard_range_of(r));
      ranges.push_back(std::move(rs));
      ++index;
    } catch (const nlohmann::json::exception& ex) {
      throw entry_error(dir, "shards", index, ex);
    }
}

// Every element of the flat layout [0, P) in exactly one of the shards' ranges.
void check_ranges_cover(const std::vector<std::vector<ShardRange>>& ranges, int64_t P,
                        const std::string& dir) {
  std::vector<ShardRange> all;
  for (const auto& rs : ranges) all.insert(all.end(), rs.begin(), rs.end());
  std::sort(all.begin(), all.end(),
            [](const ShardRange& a, const ShardRange& b) { return a.begin < b.begin; });
  int64_t covered = 0;
  for (const auto& r : all) {
    if (r.begin != covered || r.end < r.begin || r.offset < 0)
      throw UserError("checkpoint '" + dir +
                      "': shard ranges do not cover the parameters exactly once (range " +
                      shard_range_str(r) + ", expected start " + std::to_string(covered) + ")");
    covered = r.end;
  }
  if (covered != P)
    throw UserError("checkpoint '" + dir + "': shard ranges cover " + std::to_string(covered) +
                    " of " + std::to_string(P) + " parameters");
}

// What the shard files hold bounds what is allocated: a manifest (edited, or of a format without
// its checksum) claiming more values -- P parameters, and with_state its `states` optimizer
// buffers -- than its shards can hold is refused before buffers are sized by it, not grown into
// until the machine's memory runs out.
void check_shards_hold(const std::vector<std::string>& files, const std::string& dir, int64_t P,
                       bool with_state, size_t states) {
  uintmax_t bytes = 0;
  for (const std::string& f : files) {
    const fs::path path = fs::path(dir) / f;
    std::error_code ec;
    const uintmax_t size = fs::file_size(path, ec);
    if (ec) (void)read_safetensors_metadata(path.string());  // its message for a missing file
    bytes += ec ? 0 : size;
  }
  const double copies = 1.0 + (with_state ? static_cast<double>(states) : 0.0);
  if (4.0 * static_cast<double>(P) * copies > static_cast<double>(bytes)) {
    // A shard cut short (an interrupted copy) is the likelier cause than a manifest that passed
    // its checksum: each file names itself if it is truncated or corrupt (reads bounded by the
    // files' own sizes), else the manifest is blamed.
    for (const std::string& f : files) (void)read_safetensors((fs::path(dir) / f).string());
    throw UserError(fmt::format(
        "checkpoint '{}': the manifest lists {} parameters{}, {:.0f} bytes of values, more than "
        "its {} shard file(s) hold ({} bytes): the manifest is corrupt or not these shards'",
        dir, P, with_state ? " and their optimizer state" : "",
        4.0 * static_cast<double>(P) * copies, files.size(), bytes));
  }
}

// A shard's own header records the ranges the manifest gives it ("global_ranges", since
// 2026-12-04; before, "ranges" alone, which are the rank's local layout under tensor parallelism
// and equal the manifest's only without it, tp = 1): a manifest edited, or from another
// checkpoint, would otherwise place the right values at the wrong offsets without any error.
void check_shard_ranges(const std::string& dir, const std::string& file, const StFile& f,
                        const std::vector<ShardRange>& manifest, int64_t tp) {
  auto it = f.metadata.find("global_ranges");
  if (it == f.metadata.end() && tp == 1) it = f.metadata.find("ranges");
  if (it == f.metadata.end()) return;
  std::vector<ShardRange> own;
  try {
    for (const auto& r : parse_limited_json(it->second, kMaxRangeValues))
      own.push_back(shard_range_of(r));
  } catch (const nlohmann::json::exception&) {
    throw UserError("checkpoint '" + dir + "': shard '" + file + "' has malformed ranges");
  } catch (const JsonLimitError& e) {
    throw UserError("checkpoint '" + dir + "': shard '" + file + "' has ranges whose JSON " +
                    e.what());
  }
  const auto text = [](const std::vector<ShardRange>& rs) {
    std::string t;
    for (const auto& r : rs) {
      if (!t.empty()) t += ' ';  // (not "..." + string: GCC 12 warns falsely, -Wrestrict)
      t += shard_range_str(r);
    }
    return t;
  };
  const auto same = [](const ShardRange& a, const ShardRange& b) {
    return a.begin == b.begin && a.end == b.end && a.offset == b.offset;
  };
  if (!std::equal(own.begin(), own.end(), manifest.begin(), manifest.end(), same))
    throw UserError("checkpoint '" + dir + "': shard '" + file + "' holds the ranges " + text(own) +
                    ", the manifest says " + text(manifest) +
                    " (an edited manifest, or one of another checkpoint)");
}

// Optimizer state names become tensor names (optim.<state>.<param>): distinct, non-empty words.
void check_state_names(const std::vector<std::string>& names, const std::string& dir) {
  std::set<std::string> seen;
  for (const auto& n : names) {
    const bool word = !n.empty() && std::all_of(n.begin(), n.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
    });
    if (!word || !seen.insert(n).second)
      throw UserError("checkpoint '" + dir + "': the manifest's optimizer_state lists '" + n + "'" +
                      (word ? " twice" : ", not a state name"));
  }
}

}  // namespace

ShardedRead read_sharded(const std::string& dir, bool with_state) {
  ShardedRead out;
  CheckpointMeta& meta = out.meta;
  std::vector<std::vector<ShardRange>> ranges;
  std::vector<std::string> files;
  std::vector<int64_t> shard_ranks;
  int64_t tp = 1;  // the writer's tensor-parallel size (layout.tp; older manifests: 1)
  bool manifest_checksummed = false;
  try {
    const nlohmann::json m = read_manifest(dir, &manifest_checksummed);
    check_manifest_format(m, dir);
    // (an integer, not 1.5 read as 1)
    const auto integer = [&](const char* key) {
      const nlohmann::json& v = m.at(key);
      if (!v.is_number_integer())
        throw UserError("checkpoint '" + dir + "': manifest.json's " + key + " is " + v.dump() +
                        ", not an integer");
      return v.get<int64_t>();
    };
    // (a string, named when it is not one: the JSON library's words name no key)
    const auto text = [&](const char* key) {
      const nlohmann::json& v = m.at(key);
      if (!v.is_string())
        throw UserError("checkpoint '" + dir + "': manifest.json's " + key + " is " + v.dump() +
                        ", not a string");
      return v.get<std::string>();
    };
    meta.step = integer("step");
    meta.epoch = integer("epoch");
    meta.batch = integer("batch");
    meta.optimizer_steps = integer("optimizer_steps");
    meta.optimizer = text("optimizer");
    meta.rng = text("rng");
    meta.config_hash = text("config_hash");
    meta.strategy = text("strategy");
    meta.world_size = integer("world_size");
    if (m.contains("config")) meta.config_json = m.at("config").dump();
    if (m.contains("schedule_steps")) meta.schedule_steps = integer("schedule_steps");
    if (m.contains("progress")) meta.progress_json = m.at("progress").dump();
    if (m.contains("normalizer")) meta.normalizer_json = m.at("normalizer").dump();
    if (m.contains("save_id")) meta.save_id = text("save_id");
    out.state_names = m.at("optimizer_state").get<std::vector<std::string>>();
    check_state_names(out.state_names, dir);
    out.param_count = integer("param_count");
    if (m.contains("layout")) {
      const nlohmann::json& l = m.at("layout");
      tp = l.value("tp", int64_t{1});
      out.layout_dp = l.value("dp", int64_t{0});
      out.layout_pp = l.value("pp", int64_t{1});
    }
    const int64_t next = read_param_table(m.at("params"), dir, out.table);
    if (next != out.param_count)
      throw UserError("checkpoint '" + dir + "': the parameter table holds " +
                      std::to_string(next) + " values, param_count says " +
                      std::to_string(out.param_count));
    read_shard_list(m.at("shards"), dir, files, shard_ranks, ranges);
  } catch (const nlohmann::json::exception& e) {
    throw UserError("checkpoint '" + dir +
                    "': manifest.json is malformed: " + json_error_text(e.what()));
  }
  check_meta_ranges(meta, dir);
  out.layout_tp = tp;
  if (tp < 1 || tp > kMaxCheckpointWorld)
    throw UserError("checkpoint '" + dir + "': the manifest's layout.tp is " + std::to_string(tp) +
                    ", not a tensor-parallel size");
  // (dp 0: no layout recorded; the grid must multiply out to the world size otherwise)
  if (out.layout_dp < 0 || out.layout_pp < 1 || out.layout_dp > kMaxCheckpointWorld ||
      out.layout_pp > kMaxCheckpointWorld ||  // (before the product: no overflow)
      (out.layout_dp != 0 && out.layout_dp * out.layout_pp * tp != meta.world_size))
    throw UserError("checkpoint '" + dir + "': the manifest's layout (dp " +
                    std::to_string(out.layout_dp) + ", pp " + std::to_string(out.layout_pp) +
                    ", tp " + std::to_string(tp) + ") is not a grid of its world size " +
                    std::to_string(meta.world_size));
  // One shard per rank that holds a distinct part (every rank for zero/fsdp, replica 0's stages
  // for a pipeline): at least one, at most world size.
  if (meta.world_size > kMaxCheckpointWorld)
    throw UserError("checkpoint '" + dir + "': world size " + std::to_string(meta.world_size) +
                    " in the manifest is above " + std::to_string(kMaxCheckpointWorld));
  if (files.empty() || static_cast<int64_t>(files.size()) > meta.world_size)
    throw UserError("checkpoint '" + dir + "': manifest lists " + std::to_string(files.size()) +
                    " shards for world size " + std::to_string(meta.world_size));
  const int64_t P = out.param_count;
  check_ranges_cover(ranges, P, dir);
  check_shards_hold(files, dir, P, with_state, out.state_names.size());
  out.params.assign(static_cast<size_t>(P), 0.0f);
  if (with_state)
    out.state.assign(out.state_names.size(), std::vector<float>(static_cast<size_t>(P), 0.0f));
  int64_t unchecksummed = 0, header_unchecksummed = 0;
  for (size_t r = 0; r < files.size(); ++r) {
    const StFile f = read_safetensors((fs::path(dir) / files[r]).string());  // verifies CRCs
    if (!f.checksummed)
      ++unchecksummed;
    else if (!f.header_checksummed)
      ++header_unchecksummed;
    check_shard_identity(dir, files[r], f, shard_ranks[r], meta.step, meta.save_id);
    check_shard_ranges(dir, files[r], f, ranges[r], tp);
    auto need = [&](const std::string& name) -> const std::vector<float>& {
      auto it = f.tensors.find(name);
      if (it == f.tensors.end())
        throw UserError("checkpoint '" + dir + "': shard '" + files[r] + "' has no tensor '" +
                        name + "'");
      return it->second.data;
    };
    const std::vector<float>& pv = need("params");
    const int64_t n = static_cast<int64_t>(pv.size());
    for (const auto& rg : ranges[r])  // (offset >= 0, end >= begin: checked above)
      if (rg.offset > n || rg.end - rg.begin > n - rg.offset)
        throw UserError("checkpoint '" + dir + "': shard '" + files[r] + "' holds " +
                        std::to_string(n) + " values, too few for its range " +
                        shard_range_str(rg));
    for (const auto& rg : ranges[r])
      std::copy(pv.begin() + rg.offset, pv.begin() + rg.offset + (rg.end - rg.begin),
                out.params.begin() + rg.begin);
    if (!with_state) continue;
    for (size_t k = 0; k < out.state_names.size(); ++k) {
      const std::vector<float>& sv = need("optim." + out.state_names[k]);
      if (static_cast<int64_t>(sv.size()) != n)
        throw UserError("checkpoint '" + dir + "': shard '" + files[r] + "' optim." +
                        out.state_names[k] + " has another size than its params");
      for (const auto& rg : ranges[r])
        std::copy(sv.begin() + rg.offset, sv.begin() + rg.offset + (rg.end - rg.begin),
                  out.state[k].begin() + rg.begin);
    }
  }
  if (!manifest_checksummed && unchecksummed == 0)
    spdlog::warn(
        "checkpoint '{}': manifest.json has no CRC-32 checksum (written by an older dtrain); its "
        "shards' ranges and save are still checked against their own headers",
        dir);
  if (unchecksummed > 0)
    warn_unchecksummed(dir, std::to_string(unchecksummed) + " of its " +
                                std::to_string(files.size()) + " shard files have");
  if (header_unchecksummed > 0)
    warn_header_unchecksummed(dir, std::to_string(header_unchecksummed) + " of its " +
                                       std::to_string(files.size()) + " shard files have");
  for (const auto& e : out.table) {
    check_finite(out.params.data() + e.offset, e.numel, dir, e.name);
    for (size_t k = 0; k < out.state.size(); ++k)
      check_finite(out.state[k].data() + e.offset, e.numel, dir,
                   "optim." + out.state_names[k] + "." + e.name);
  }
  return out;
}

}  // namespace dtrain::checkpoint_internal

namespace dtrain {

ShardReplicas read_shard_replicas(const std::string& dir, int rank, bool with_data) {
  using namespace checkpoint_internal;
  ShardReplicas out;
  const std::string file = shard_file_name(rank);
  const std::string path = (fs::path(dir) / file).string();
  StFile f;  // (with_data: the whole file, its checksums verified; else its metadata alone)
  if (with_data)
    f = read_safetensors(path);
  else
    f.metadata = read_safetensors_metadata(path);
  try {
    const nlohmann::json m = read_manifest(dir);
    if (with_data)
      check_shard_identity(dir, file, f, rank, m.at("step").get<int64_t>(),
                           m.value("save_id", std::string()));
    if (const auto l = m.find("layout"); l != m.end()) {
      out.dp = l->value("dp", int64_t{0});
      out.pp = l->value("pp", int64_t{1});
      out.tp = l->value("tp", int64_t{1});
    }
    auto it = f.metadata.find("global_ranges");
    if (it == f.metadata.end()) it = f.metadata.find("ranges");
    if (it != f.metadata.end())
      for (const auto& r : parse_limited_json(it->second, kMaxRangeValues))
        out.global_ranges.push_back(shard_range_of(r));
  } catch (const JsonLimitError& e) {
    throw UserError("checkpoint '" + dir + "': shard '" + file + "' has ranges whose JSON " +
                    e.what());
  } catch (const nlohmann::json::exception& e) {
    throw UserError("checkpoint '" + dir + "': manifest.json or shard '" + file +
                    "' is malformed: " + json_error_text(e.what()));
  }
  if (!with_data) {  // (what the metadata says; the tensors are checked when read)
    const auto w = f.metadata.find("replica_world_size");
    const auto n = f.metadata.find("replica_states");
    if (w != f.metadata.end() && n != f.metadata.end()) {
      out.state.world_size = meta_int(f.metadata, "replica_world_size", path);
      out.state.names = split(n->second, ',');
    }
    return out;
  }
  const auto p = f.tensors.find("params");
  if (p == f.tensors.end())
    throw UserError("checkpoint '" + dir + "': shard '" + file + "' has no tensor 'params'");
  std::vector<std::string> owned;
  out.state = read_replica_state(f, path, static_cast<int64_t>(p->second.data.size()), owned,
                                 /*with_data=*/true);
  return out;
}

bool holds_replica_states(const std::string& dir) {
  using namespace checkpoint_internal;
  try {
    if (!is_sharded_dir(dir)) return false;
    const nlohmann::json m = read_manifest(dir);
    for (const auto& sh : m.at("shards")) {
      const std::string file = sh.at("file").get<std::string>();
      if (file.find('/') != std::string::npos) return false;
      if (read_safetensors_metadata((fs::path(dir) / file).string()).count("replica_world_size"))
        return true;
    }
  } catch (const std::exception&) {  // (unreadable: the load says why)
  }
  return false;
}

}  // namespace dtrain
