#include "checkpoint/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <regex>
#include <set>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "util/check.h"
#include "util/fs.h"
#include "util/rng.h"

namespace dtrain {

namespace fs = std::filesystem;

namespace {

const char* kFormatName = "dtrain-checkpoint";

using Metadata = std::map<std::string, std::string>;

int64_t meta_int(const Metadata& md, const std::string& key, const std::string& path) {
  auto it = md.find(key);
  if (it == md.end()) throw UserError("checkpoint '" + path + "': metadata has no '" + key + "'");
  try {
    size_t used = 0;
    const long long v = std::stoll(it->second, &used);
    if (used != it->second.size()) throw std::invalid_argument("trailing");
    return v;
  } catch (const std::exception&) {
    throw UserError("checkpoint '" + path + "': metadata '" + key + "' is not an integer ('" +
                    it->second + "')");
  }
}

std::string meta_str(const Metadata& md, const std::string& key, const std::string& path) {
  auto it = md.find(key);
  if (it == md.end()) throw UserError("checkpoint '" + path + "': metadata has no '" + key + "'");
  return it->second;
}

std::map<std::string, std::string> file_metadata(const CheckpointMeta& meta, int64_t param_count,
                                                 const CompressionState& comp);

std::string residual_tensor_name(int64_t rank) {
  return "comp.residual.rank" + std::to_string(rank);
}
const char* kQTensor = "comp.q";

// Refuses a version this dtrain cannot read (older than the oldest it still loads, or newer).
void check_format_version(int64_t version, const std::string& path) {
  if (version < kOldestCheckpointFormatVersion || version > kCheckpointFormatVersion)
    throw UserError("checkpoint '" + path + "': format version " + std::to_string(version) +
                    ", this dtrain reads versions " +
                    std::to_string(kOldestCheckpointFormatVersion) + " to " +
                    std::to_string(kCheckpointFormatVersion));
}

// A checkpoint file's format and version (returned), from its safetensors metadata.
int64_t check_file_format(const Metadata& metadata, const std::string& path) {
  auto fmt = metadata.find("format");
  if (fmt == metadata.end() || fmt->second != kFormatName)
    throw UserError("checkpoint '" + path + "': not a dtrain checkpoint (no format=" +
                    std::string(kFormatName) + " in __metadata__)");
  const int64_t version = meta_int(metadata, "format_version", path);
  check_format_version(version, path);
  return version;
}

// A sharded checkpoint's format and version, from its manifest (json::exception when malformed).
void check_manifest_format(const nlohmann::json& m, const std::string& dir) {
  if (m.at("format").get<std::string>() != kFormatName)
    throw UserError("checkpoint '" + dir + "': manifest.json is not a dtrain manifest");
  check_format_version(m.at("format_version").get<int64_t>(), dir);
}

// Refuses NaN or Inf in a loaded parameter or optimizer-state tensor: evaluating such weights
// prints a null loss, and training from them fails later with a message about the learning
// rate, far from the cause. `index` is the first bad element's index within the tensor.
void check_finite(const float* v, int64_t n, const std::string& path, const std::string& name) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::isfinite(v[i])) continue;
    const char* what = std::isnan(v[i]) ? "nan" : v[i] > 0 ? "inf" : "-inf";
    throw UserError("checkpoint '" + path + "': tensor '" + name + "' holds a non-finite value (" +
                    what + ") at index " + std::to_string(i) +
                    ": the file is corrupt or was saved from a diverged run");
  }
}

// Files written before checksums existed (format versions 1 and 2) still load, unverified.
void warn_unchecksummed(const std::string& path, const std::string& which) {
  spdlog::warn(
      "checkpoint '{}': {} no CRC-32 checksums (written by an older dtrain); loading it "
      "unverified",
      path, which);
}

}  // namespace

void save_checkpoint(const std::string& path, const Model& model, const float* params,
                     const std::vector<StateBuffer>& state, const CheckpointMeta& meta,
                     const CompressionState& comp) {
  std::vector<StTensorRef> refs;
  refs.reserve(model.params().size() * (1 + state.size()) + comp.residuals.size() + 1);
  for (const auto& e : model.params()) refs.push_back({e.name, e.shape, params + e.offset});
  for (const auto& s : state)
    for (const auto& e : model.params())
      refs.push_back({"optim." + s.name + "." + e.name, e.shape, s.data + e.offset});
  DT_CHECK(comp.residuals.empty() ||
           static_cast<int64_t>(comp.residuals.size()) == comp.world_size);
  // Empty vectors are not stored (file_metadata records 0 floats).
  for (size_t r = 0; r < comp.residuals.size(); ++r) {
    DT_CHECK_EQ(comp.residuals[r].size(), comp.residuals[0].size());
    if (!comp.residuals[r].empty())
      refs.push_back({residual_tensor_name(static_cast<int64_t>(r)),
                      {static_cast<int64_t>(comp.residuals[r].size())},
                      comp.residuals[r].data()});
  }
  if (!comp.q.empty())
    refs.push_back({kQTensor, {static_cast<int64_t>(comp.q.size())}, comp.q.data()});
  const auto md = file_metadata(meta, model.param_count(), comp);
  write_safetensors(path, refs, md);
}

namespace {

// The compression record of a version-2 file, checked against its tensors: type, sizes and the
// names of the tensors it owns (copied into the result only when `with_data`).
CompressionState read_compression(const StFile& f, const std::string& path,
                                  std::vector<std::string>& owned, bool with_data) {
  CompressionState c;
  c.type = meta_str(f.metadata, "compression", path);
  c.world_size = meta_int(f.metadata, "compression_world_size", path);
  const int64_t rf = meta_int(f.metadata, "compression_residual_floats", path);
  const int64_t qf = meta_int(f.metadata, "compression_q_floats", path);
  c.rng = meta_str(f.metadata, "compression_rng", path);
  if (c.world_size < 0 || c.world_size > (int64_t{1} << 20) || rf < 0 || qf < 0)
    throw UserError("checkpoint '" + path + "': bad compression sizes in metadata");
  if (!c.rng.empty()) {
    try {
      Rng().from_string(c.rng);
    } catch (const UserError& e) {
      throw UserError("checkpoint '" + path + "': metadata 'compression_rng': " + e.what());
    }
  }
  auto take = [&](const std::string& name, int64_t n, std::vector<float>* out) {
    auto it = f.tensors.find(name);
    if (it == f.tensors.end() || it->second.shape != Shape{n})
      throw UserError("checkpoint '" + path + "': compression state needs tensor '" + name +
                      "' of shape [" + std::to_string(n) + "]");
    owned.push_back(name);
    if (with_data) *out = it->second.data;
  };
  if (rf > 0) {
    c.residuals.resize(static_cast<size_t>(c.world_size));
    for (int64_t r = 0; r < c.world_size; ++r)
      take(residual_tensor_name(r), rf, &c.residuals[static_cast<size_t>(r)]);
  }
  if (qf > 0) take(kQTensor, qf, &c.q);
  return c;
}

CheckpointMeta load_file_checkpoint(const std::string& path, const Model& model, float* params,
                                    const std::vector<StateBuffer>& state, CompressionState* comp) {
  const StFile f = read_safetensors(path);  // verifies the checksums the file carries
  const int64_t version = check_file_format(f.metadata, path);
  if (!f.checksummed) warn_unchecksummed(path, "the file has");

  CheckpointMeta meta;
  meta.step = meta_int(f.metadata, "step", path);
  meta.epoch = meta_int(f.metadata, "epoch", path);
  meta.batch = meta_int(f.metadata, "batch", path);
  meta.optimizer_steps = meta_int(f.metadata, "optimizer_steps", path);
  meta.optimizer = meta_str(f.metadata, "optimizer", path);
  meta.rng = meta_str(f.metadata, "rng", path);
  meta.config_hash = meta_str(f.metadata, "config_hash", path);
  meta.strategy = meta_str(f.metadata, "strategy", path);
  meta.world_size = meta_int(f.metadata, "world_size", path);
  if (auto it = f.metadata.find("config"); it != f.metadata.end()) meta.config_json = it->second;
  if (f.metadata.count("schedule_steps"))
    meta.schedule_steps = meta_int(f.metadata, "schedule_steps", path);
  if (meta.step < 0 || meta.epoch < 0 || meta.batch < 0 || meta.optimizer_steps < 0)
    throw UserError("checkpoint '" + path + "': negative step or position in metadata");

  // Check everything before touching params: a refused load changes nothing.
  auto expect = [&](const std::string& name, const Shape& shape) -> const StTensor& {
    auto it = f.tensors.find(name);
    if (it == f.tensors.end())
      throw UserError("checkpoint '" + path + "' does not match the model: no tensor '" + name +
                      "' (was it saved from another model?)");
    if (it->second.shape != shape)
      throw UserError("checkpoint '" + path + "' does not match the model: '" + name +
                      "' has shape " + shape_str(it->second.shape) + ", the model expects " +
                      shape_str(shape));
    return it->second;
  };
  std::vector<std::string> comp_tensors;
  CompressionState cs;
  if (version >= 2) cs = read_compression(f, path, comp_tensors, comp != nullptr);
  size_t expected_tensors = model.params().size() * (1 + state.size()) + comp_tensors.size();
  for (const auto& e : model.params()) expect(e.name, e.shape);
  for (const auto& s : state)
    for (const auto& e : model.params()) expect("optim." + s.name + "." + e.name, e.shape);
  if (state.empty()) {
    // Weights only: ignore optimizer and compression tensors, but reject unknown model tensors.
    expected_tensors = 0;
    for (const auto& [name, t] : f.tensors)
      if (name.rfind("optim.", 0) != 0 && name.rfind("comp.", 0) != 0) ++expected_tensors;
    if (expected_tensors != model.params().size())
      throw UserError("checkpoint '" + path + "' does not match the model: it has " +
                      std::to_string(expected_tensors) + " parameter tensors, the model " +
                      std::to_string(model.params().size()));
  } else if (f.tensors.size() != expected_tensors) {
    for (const auto& [name, t] : f.tensors) {
      bool known = model.find(name) != nullptr ||
                   std::find(comp_tensors.begin(), comp_tensors.end(), name) != comp_tensors.end();
      for (const auto& s : state)
        if (name.rfind("optim." + s.name + ".", 0) == 0) known = true;
      if (!known)
        throw UserError("checkpoint '" + path + "' does not match the run: unexpected tensor '" +
                        name + "' (another model or optimizer?)");
    }
    throw UserError("checkpoint '" + path +
                    "' does not match the run: " + std::to_string(f.tensors.size()) +
                    " tensors, expected " + std::to_string(expected_tensors));
  }

  for (const auto& e : model.params())
    check_finite(f.tensors.at(e.name).data.data(), e.numel, path, e.name);
  for (const auto& s : state)
    for (const auto& e : model.params()) {
      const std::string name = "optim." + s.name + "." + e.name;
      check_finite(f.tensors.at(name).data.data(), e.numel, path, name);
    }
  for (const auto& e : model.params()) {
    const auto& t = f.tensors.at(e.name);
    std::copy(t.data.begin(), t.data.end(), params + e.offset);
  }
  for (const auto& s : state)
    for (const auto& e : model.params()) {
      const auto& t = f.tensors.at("optim." + s.name + "." + e.name);
      std::copy(t.data.begin(), t.data.end(), s.data + e.offset);
    }
  cs.strategy = meta.strategy;
  if (comp) *comp = std::move(cs);
  return meta;
}

const char* kManifest = "manifest.json";

std::string shard_range_str(const ShardRange& r) {
  return "[" + std::to_string(r.begin) + ", " + std::to_string(r.end) + ") at " +
         std::to_string(r.offset);
}

// A sharded checkpoint read back into the full flat layout, without a model: the manifest's
// parameter table describes it.
struct ShardedRead {
  CheckpointMeta meta;
  struct Entry {
    std::string name;
    Shape shape;
    int64_t offset = 0, numel = 0;
  };
  std::vector<Entry> table;
  std::vector<std::string> state_names;
  int64_t param_count = 0;
  std::vector<float> params;
  std::vector<std::vector<float>> state;  // per state_names entry, when read with state
};

// Ranks above this in a manifest are damage, not a run (the transports stop at 1024 ranks).
constexpr int64_t kMaxCheckpointWorld = int64_t{1} << 20;

// A shard file is the one the manifest means: its own header names the rank and (shards written
// since 2026-12-03; older ones lack it) the step it was written for, so a shard swapped with
// another rank's or copied in from another step is refused instead of mixing parameters. (Its
// "ranges" are in the writer's local layout under tensor parallelism, so they are not compared.)
void check_shard_identity(const std::string& dir, const std::string& file, const StFile& f,
                          int64_t rank, int64_t step) {
  const auto meta = [&](const char* key) {
    const auto it = f.metadata.find(key);
    return it == f.metadata.end() ? std::optional<std::string>() : it->second;
  };
  const auto bad = [&](const std::string& what) {
    return UserError("checkpoint '" + dir + "': shard '" + file + "' " + what +
                     " (a shard file swapped or copied in from another checkpoint)");
  };
  if (const auto r = meta("rank"); r && *r != std::to_string(rank))
    throw bad("was written by rank " + *r + ", the manifest lists it for rank " +
              std::to_string(rank));
  if (const auto st = meta("step"); st && *st != std::to_string(step))
    throw bad("was written at step " + *st + ", the manifest is step " + std::to_string(step));
}

// Without tensor parallelism a shard's own header records the ranges the manifest gives it (the
// header's are local under tensor parallelism): a manifest edited, or from another checkpoint,
// would otherwise place the right values at the wrong offsets without any error.
void check_shard_ranges(const std::string& dir, const std::string& file, const StFile& f,
                        const std::vector<ShardRange>& manifest) {
  const auto it = f.metadata.find("ranges");
  if (it == f.metadata.end()) return;
  std::vector<ShardRange> own;
  try {
    for (const auto& r : nlohmann::json::parse(it->second))
      own.push_back({r.at(0).get<int64_t>(), r.at(1).get<int64_t>(), r.at(2).get<int64_t>()});
  } catch (const nlohmann::json::exception&) {
    throw UserError("checkpoint '" + dir + "': shard '" + file + "' has malformed ranges");
  }
  const auto text = [](const std::vector<ShardRange>& rs) {
    std::string t;
    for (const auto& r : rs) t += (t.empty() ? "" : " ") + shard_range_str(r);
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

ShardedRead read_sharded(const std::string& dir, bool with_state) {
  const std::string mpath = (fs::path(dir) / kManifest).string();
  ShardedRead out;
  CheckpointMeta& meta = out.meta;
  std::vector<std::vector<ShardRange>> ranges;
  std::vector<std::string> files;
  std::vector<int64_t> shard_ranks;
  int64_t tp = 1;  // the writer's tensor-parallel size (layout.tp; older manifests: 1)
  try {
    const nlohmann::json m = nlohmann::json::parse(read_file(mpath));
    check_manifest_format(m, dir);
    meta.step = m.at("step").get<int64_t>();
    meta.epoch = m.at("epoch").get<int64_t>();
    meta.batch = m.at("batch").get<int64_t>();
    meta.optimizer_steps = m.at("optimizer_steps").get<int64_t>();
    meta.optimizer = m.at("optimizer").get<std::string>();
    meta.rng = m.at("rng").get<std::string>();
    meta.config_hash = m.at("config_hash").get<std::string>();
    meta.strategy = m.at("strategy").get<std::string>();
    meta.world_size = m.at("world_size").get<int64_t>();
    if (m.contains("config")) meta.config_json = m.at("config").dump();
    if (m.contains("schedule_steps")) meta.schedule_steps = m.at("schedule_steps").get<int64_t>();
    out.state_names = m.at("optimizer_state").get<std::vector<std::string>>();
    check_state_names(out.state_names, dir);
    out.param_count = m.at("param_count").get<int64_t>();
    if (m.contains("layout")) tp = m.at("layout").value("tp", int64_t{1});
    int64_t next = 0;
    std::set<std::string> names;
    for (const auto& e : m.at("params")) {
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
        if (d < 0 || d > (int64_t{1} << 40))
          throw UserError("checkpoint '" + dir + "': tensor '" + en.name + "' has a bad shape");
        en.numel *= d;
      }
      if (en.offset != next)
        throw UserError("checkpoint '" + dir + "': tensor '" + en.name + "' is at offset " +
                        std::to_string(en.offset) + ", expected " + std::to_string(next));
      next += en.numel;
      out.table.push_back(std::move(en));
    }
    if (next != out.param_count)
      throw UserError("checkpoint '" + dir + "': the parameter table holds " +
                      std::to_string(next) + " values, param_count says " +
                      std::to_string(out.param_count));
    for (const auto& sh : m.at("shards")) {
      files.push_back(sh.at("file").get<std::string>());
      shard_ranks.push_back(sh.at("rank").get<int64_t>());
      std::vector<ShardRange> rs;
      for (const auto& r : sh.at("ranges"))
        rs.push_back({r.at(0).get<int64_t>(), r.at(1).get<int64_t>(), r.at(2).get<int64_t>()});
      ranges.push_back(std::move(rs));
    }
  } catch (const nlohmann::json::exception& e) {
    throw UserError("checkpoint '" + dir + "': manifest.json is malformed: " + e.what());
  }
  if (meta.step < 0 || meta.epoch < 0 || meta.batch < 0 || meta.optimizer_steps < 0)
    throw UserError("checkpoint '" + dir + "': negative step or position in the manifest");
  // One shard per rank that holds a distinct part (every rank for zero/fsdp, replica 0's stages
  // for a pipeline): at least one, at most world size.
  if (meta.world_size > kMaxCheckpointWorld)
    throw UserError("checkpoint '" + dir + "': world size " + std::to_string(meta.world_size) +
                    " in the manifest is above " + std::to_string(kMaxCheckpointWorld));
  if (files.empty() || static_cast<int64_t>(files.size()) > meta.world_size)
    throw UserError("checkpoint '" + dir + "': manifest lists " + std::to_string(files.size()) +
                    " shards for world size " + std::to_string(meta.world_size));
  // Every element of the flat layout exactly once.
  const int64_t P = out.param_count;
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
  out.params.assign(static_cast<size_t>(P), 0.0f);
  if (with_state)
    out.state.assign(out.state_names.size(), std::vector<float>(static_cast<size_t>(P), 0.0f));
  int64_t unchecksummed = 0;
  for (size_t r = 0; r < files.size(); ++r) {
    if (files[r].find('/') != std::string::npos)
      throw UserError("checkpoint '" + dir + "': shard file name '" + files[r] + "' has a '/'");
    const StFile f = read_safetensors((fs::path(dir) / files[r]).string());  // verifies CRCs
    if (!f.checksummed) ++unchecksummed;
    check_shard_identity(dir, files[r], f, shard_ranks[r], meta.step);
    if (tp == 1) check_shard_ranges(dir, files[r], f, ranges[r]);
    auto need = [&](const std::string& name) -> const std::vector<float>& {
      auto it = f.tensors.find(name);
      if (it == f.tensors.end())
        throw UserError("checkpoint '" + dir + "': shard '" + files[r] + "' has no tensor '" +
                        name + "'");
      return it->second.data;
    };
    const std::vector<float>& pv = need("params");
    const int64_t n = static_cast<int64_t>(pv.size());
    for (const auto& rg : ranges[r])
      if (rg.offset + (rg.end - rg.begin) > n)
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
  if (unchecksummed > 0)
    warn_unchecksummed(dir, std::to_string(unchecksummed) + " of its " +
                                std::to_string(files.size()) + " shard files have");
  for (const auto& e : out.table) {
    check_finite(out.params.data() + e.offset, e.numel, dir, e.name);
    for (size_t k = 0; k < out.state.size(); ++k)
      check_finite(out.state[k].data() + e.offset, e.numel, dir,
                   "optim." + out.state_names[k] + "." + e.name);
  }
  return out;
}

CheckpointMeta load_sharded_checkpoint(const std::string& dir, const Model& model, float* params,
                                       const std::vector<StateBuffer>& state) {
  ShardedRead rd = read_sharded(dir, !state.empty());
  if (rd.table.size() != model.params().size())
    throw UserError("checkpoint '" + dir + "' does not match the model: it has " +
                    std::to_string(rd.table.size()) + " parameter tensors, the model " +
                    std::to_string(model.params().size()));
  for (size_t i = 0; i < rd.table.size(); ++i) {
    const ParamEntry& e = model.params()[i];
    const auto& t = rd.table[i];
    if (t.name != e.name || t.shape != e.shape || t.offset != e.offset)
      throw UserError("checkpoint '" + dir + "' does not match the model: tensor " +
                      std::to_string(i) + " is '" + t.name + "' " + shape_str(t.shape) +
                      ", the model has '" + e.name + "' " + shape_str(e.shape));
  }
  std::vector<const std::vector<float>*> src;
  for (const auto& s : state) {
    auto it = std::find(rd.state_names.begin(), rd.state_names.end(), s.name);
    if (it == rd.state_names.end())
      throw UserError("checkpoint '" + dir + "' has no optimizer state '" + s.name +
                      "' (written by optimizer '" + rd.meta.optimizer + "')");
    src.push_back(&rd.state[static_cast<size_t>(it - rd.state_names.begin())]);
  }
  std::copy(rd.params.begin(), rd.params.end(), params);
  for (size_t i = 0; i < state.size(); ++i)
    std::copy(src[i]->begin(), src[i]->end(), state[i].data);
  return rd.meta;
}

std::map<std::string, std::string> file_metadata(const CheckpointMeta& meta, int64_t param_count,
                                                 const CompressionState& comp) {
  const size_t rf = comp.residuals.empty() ? 0 : comp.residuals[0].size();
  std::map<std::string, std::string> md = {
      {"format", kFormatName},
      {"format_version", std::to_string(kCheckpointFormatVersion)},
      {"step", std::to_string(meta.step)},
      {"epoch", std::to_string(meta.epoch)},
      {"batch", std::to_string(meta.batch)},
      {"optimizer", meta.optimizer},
      {"optimizer_steps", std::to_string(meta.optimizer_steps)},
      {"rng", meta.rng},
      {"config_hash", meta.config_hash},
      {"strategy", meta.strategy},
      {"world_size", std::to_string(meta.world_size)},
      {"param_count", std::to_string(param_count)},
      {"compression", comp.type},
      {"compression_world_size", std::to_string(comp.world_size)},
      {"compression_residual_floats", std::to_string(rf)},
      {"compression_q_floats", std::to_string(comp.q.size())},
      {"compression_rng", comp.rng},
  };
  if (!meta.config_json.empty()) md["config"] = meta.config_json;
  if (meta.schedule_steps > 0) md["schedule_steps"] = std::to_string(meta.schedule_steps);
  return md;
}

bool is_sharded_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec) && fs::is_regular_file(p / kManifest, ec);
}

}  // namespace

CheckpointMeta load_checkpoint(const std::string& path, const Model& model, float* params,
                               const std::vector<StateBuffer>& state, CompressionState* comp) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    if (!is_sharded_dir(path))
      throw UserError("checkpoint '" + path +
                      "' is a folder without manifest.json (an incomplete sharded checkpoint?)");
    if (comp) *comp = CompressionState{};
    return load_sharded_checkpoint(path, model, params, state);
  }
  return load_file_checkpoint(path, model, params, state, comp);
}

CheckpointMeta consolidate_checkpoint(const std::string& dir, const std::string& out_path) {
  if (!is_sharded_dir(dir))
    throw UserError("'" + dir + "' is not a sharded checkpoint (a folder with manifest.json)");
  const ShardedRead rd = read_sharded(dir, true);
  std::vector<StTensorRef> refs;
  for (const auto& e : rd.table) refs.push_back({e.name, e.shape, rd.params.data() + e.offset});
  for (size_t k = 0; k < rd.state_names.size(); ++k)
    for (const auto& e : rd.table)
      refs.push_back(
          {"optim." + rd.state_names[k] + "." + e.name, e.shape, rd.state[k].data() + e.offset});
  write_safetensors(out_path, refs, file_metadata(rd.meta, rd.param_count, CompressionState{}));
  return rd.meta;
}

std::string sharded_checkpoint_name(int64_t step) {
  return "step-" + std::to_string(step);
}
std::string shard_file_name(int rank) {
  return "rank-" + std::to_string(rank) + ".safetensors";
}

void save_shard(const std::string& dir, int rank, int64_t step,
                const std::vector<ShardRange>& ranges, int64_t shard_size, const float* params,
                const std::vector<StateBuffer>& state) {
  std::vector<StTensorRef> refs = {{"params", {shard_size}, params}};
  for (const auto& s : state) refs.push_back({"optim." + s.name, {shard_size}, s.data});
  nlohmann::json rj = nlohmann::json::array();
  for (const auto& r : ranges) rj.push_back({r.begin, r.end, r.offset});
  write_safetensors((fs::path(dir) / shard_file_name(rank)).string(), refs,
                    {{"format", "dtrain-checkpoint-shard"},
                     {"format_version", std::to_string(kCheckpointFormatVersion)},
                     {"rank", std::to_string(rank)},
                     {"step", std::to_string(step)},
                     {"ranges", rj.dump()}});
}

void write_manifest(const std::string& dir, const Model& model, const CheckpointMeta& meta,
                    const std::vector<std::vector<ShardRange>>& ranges,
                    const std::vector<std::string>& state_names) {
  std::vector<ManifestShard> shards;
  for (size_t r = 0; r < ranges.size(); ++r)
    shards.push_back({static_cast<int>(r), ranges[r], nlohmann::json::object()});
  write_manifest(dir, model, meta, shards, state_names);
}

void write_manifest(const std::string& dir, const Model& model, const CheckpointMeta& meta,
                    const std::vector<ManifestShard>& shard_list,
                    const std::vector<std::string>& state_names, const nlohmann::json& layout) {
  nlohmann::json table = nlohmann::json::array();
  for (const auto& e : model.params())
    table.push_back({{"name", e.name}, {"shape", e.shape}, {"offset", e.offset}});
  nlohmann::json shards = nlohmann::json::array();
  for (const ManifestShard& sh : shard_list) {
    nlohmann::json rj = nlohmann::json::array();
    for (const auto& g : sh.ranges) rj.push_back({g.begin, g.end, g.offset});
    nlohmann::json e = {{"rank", sh.rank}, {"file", shard_file_name(sh.rank)}, {"ranges", rj}};
    for (const auto& [k, v] : sh.where.items()) e[k] = v;
    shards.push_back(std::move(e));
  }
  const nlohmann::json m = {{"format", kFormatName},
                            {"format_version", kCheckpointFormatVersion},
                            {"step", meta.step},
                            {"epoch", meta.epoch},
                            {"batch", meta.batch},
                            {"optimizer", meta.optimizer},
                            {"optimizer_steps", meta.optimizer_steps},
                            {"optimizer_state", state_names},
                            {"rng", meta.rng},
                            {"config_hash", meta.config_hash},
                            {"strategy", meta.strategy},
                            {"world_size", meta.world_size},
                            {"param_count", model.param_count()},
                            {"params", table},
                            {"shards", shards}};
  nlohmann::json out = m;  // optional fields (checkpoint.h)
  if (!meta.config_json.empty()) out["config"] = nlohmann::json::parse(meta.config_json);
  if (meta.schedule_steps > 0) out["schedule_steps"] = meta.schedule_steps;
  if (!layout.is_null()) out["layout"] = layout;
  write_file_atomic((fs::path(dir) / kManifest).string(), out.dump(1) + "\n");
}

std::string checkpoint_file_name(int64_t step) {
  return "step-" + std::to_string(step) + ".safetensors";
}

namespace {

// A checkpoints folder's step entries: step-<N>.safetensors files and step-<N> sharded folders;
// group 1 is N (at most 18 digits, so std::stoll cannot overflow), group 2 the file extension.
const std::regex& step_entry_re() {
  static const std::regex re(R"(step-(\d{1,18})(\.safetensors)?)");
  return re;
}

}  // namespace

int64_t remove_orphaned_temp_files(const std::string& dir, bool include_step_folders) {
  static const std::regex tmp_re(R"(\..+\.tmp\.[A-Za-z0-9]{6})");
  int64_t removed = 0;
  std::error_code ec;
  auto sweep = [&](const fs::path& d) {
    for (const auto& ent : fs::directory_iterator(d, ec)) {
      const std::string name = ent.path().filename().string();
      std::error_code rec;
      if (std::regex_match(name, tmp_re) && ent.is_regular_file(rec) && fs::remove(ent.path(), rec))
        ++removed;
    }
  };
  sweep(dir);
  if (include_step_folders)
    for (const auto& ent : fs::directory_iterator(dir, ec))
      if (const std::string name = ent.path().filename().string(); ent.is_directory(ec)) {
        std::smatch m;
        if (std::regex_match(name, m, step_entry_re()) && !m[2].matched) sweep(ent.path());
      }
  return removed;
}

void commit_checkpoint(const std::string& dir, const std::string& file_name, int64_t keep_last) {
  DT_CHECK_GE(keep_last, 1);
  write_file_atomic((fs::path(dir) / "latest").string(), file_name + "\n");
  remove_orphaned_temp_files(dir, /*include_step_folders=*/false);
  const std::regex& re = step_entry_re();
  std::vector<std::pair<int64_t, fs::path>> found;
  for (const auto& ent : fs::directory_iterator(dir)) {
    std::smatch m;
    const std::string name = ent.path().filename().string();
    if (std::regex_match(name, m, re)) found.emplace_back(std::stoll(m[1].str()), ent.path());
  }
  // Oldest first. Steps above the one committed now are from a timeline this run abandoned (it
  // resumed from an earlier checkpoint): they count as older than every step of this one, so
  // keep_last removes them first instead of keeping them forever.
  std::smatch cur;
  const int64_t now = std::regex_match(file_name, cur, re) ? std::stoll(cur[1].str()) : INT64_MAX;
  std::sort(found.begin(), found.end(), [now](const auto& a, const auto& b) {
    return std::make_pair(a.first <= now, a.first) < std::make_pair(b.first <= now, b.first);
  });
  const int64_t excess = static_cast<int64_t>(found.size()) - keep_last;
  for (int64_t i = 0; i < excess; ++i) {
    if (found[static_cast<size_t>(i)].second.filename() == file_name) continue;
    std::error_code ec;
    fs::remove_all(found[static_cast<size_t>(i)].second, ec);
  }
}

namespace {

// The checkpoint a `latest` pointer file names, in the same folder.
std::string follow_latest(const fs::path& latest) {
  std::error_code ec;
  std::string name = read_file(latest.string());
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' '))
    name.pop_back();
  if (name.empty() || name.find('/') != std::string::npos)
    throw UserError("'" + latest.string() + "' does not name a checkpoint file");
  const fs::path file = latest.parent_path() / name;
  if (!fs::is_regular_file(file, ec) && !is_sharded_dir(file))
    throw UserError("'" + latest.string() + "' names '" + name + "', " +
                    (fs::is_directory(file, ec)
                         ? "a folder without manifest.json (an incomplete sharded checkpoint: the "
                           "save was interrupted)"
                         : "which does not exist"));
  return file.string();
}

// The highest-numbered complete checkpoint in `dir` (a step-<N>.safetensors file, written
// atomically, or a step-<N> folder with its manifest, written last), or "". For a folder whose
// `latest` was lost: the checkpoints are still there and --resume auto must not start over.
std::string newest_complete_step(const fs::path& dir) {
  const std::regex& re = step_entry_re();
  std::error_code ec;
  int64_t best = -1;
  std::string found;
  for (const auto& ent : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = ent.path().filename().string();
    if (!std::regex_match(name, m, re)) continue;
    const bool complete =
        m[2].matched ? fs::is_regular_file(ent.path(), ec) : is_sharded_dir(ent.path());
    const int64_t step = std::stoll(m[1].str());
    if (complete && step > best) {
      best = step;
      found = ent.path().string();
    }
  }
  return found;
}

}  // namespace

std::string resolve_checkpoint(const std::string& path, bool allow_missing) {
  std::error_code ec;
  fs::path p(path);
  // A `latest` file given by hand (tab completion offers it) is followed, not parsed as
  // safetensors: it holds a file name, never a checkpoint.
  if (p.filename() == "latest" && fs::is_regular_file(p, ec)) return follow_latest(p);
  // A file inside a sharded checkpoint (its manifest or a rank's shard) means that checkpoint.
  static const std::regex shard_re(R"(rank-\d+\.safetensors)");
  const std::string fname = p.filename().string();
  if ((fname == kManifest || std::regex_match(fname, shard_re)) && is_sharded_dir(p.parent_path()))
    return p.parent_path().string();
  if (fs::is_regular_file(p, ec) || is_sharded_dir(p)) return p.string();
  if (fs::is_directory(p, ec)) {
    fs::path latest = p / "latest";
    if (!fs::exists(latest, ec) && fs::is_directory(p / "checkpoints", ec))
      latest = p / "checkpoints" / "latest";
    if (fs::exists(latest, ec)) return follow_latest(latest);
    if (const std::string newest = newest_complete_step(latest.parent_path()); !newest.empty()) {
      spdlog::warn("no 'latest' file in '{}': using its newest complete checkpoint '{}'",
                   latest.parent_path().string(), newest);
      return newest;
    }
    if (fs::exists(p / shard_file_name(0), ec) ||
        std::regex_match(p.filename().string(), step_entry_re()))
      throw UserError("checkpoint '" + path +
                      "' is a folder without manifest.json (an incomplete sharded checkpoint: "
                      "the save was interrupted)");
    if (allow_missing) return "";
    throw UserError("no checkpoint in '" + path + "' (no latest file)");
  }
  if (fs::exists(p, ec))
    throw UserError("checkpoint '" + path + "' is not a regular file or a checkpoint folder");
  if (allow_missing) return "";
  throw UserError("checkpoint '" + path + "' does not exist");
}

std::string checkpoint_optimizer(const std::string& resolved) {
  try {
    if (is_sharded_dir(resolved))
      return nlohmann::json::parse(read_file((fs::path(resolved) / kManifest).string()))
          .value("optimizer", std::string());
    const auto meta = read_safetensors_metadata(resolved);
    const auto it = meta.find("optimizer");
    return it == meta.end() ? std::string() : it->second;
  } catch (const std::exception&) {
    return "";
  }
}

std::string check_checkpoint(const std::string& path, bool allow_missing) {
  const std::string resolved = resolve_checkpoint(path, allow_missing);
  if (resolved.empty()) return resolved;
  if (!is_sharded_dir(resolved)) {
    check_file_format(read_safetensors_metadata(resolved), resolved);
    return resolved;
  }
  try {
    check_manifest_format(
        nlohmann::json::parse(read_file((fs::path(resolved) / kManifest).string())), resolved);
  } catch (const nlohmann::json::exception& e) {
    throw UserError("checkpoint '" + resolved + "': manifest.json is malformed: " + e.what());
  }
  return resolved;
}

}  // namespace dtrain
