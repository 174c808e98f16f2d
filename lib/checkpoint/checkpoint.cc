#include "checkpoint/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_internal.h"
#include "checkpoint/safetensors.h"
#include "util/check.h"
#include "util/fs.h"
#include "util/rng.h"
#include "util/strings.h"

namespace dtrain {

namespace fs = std::filesystem;

namespace {

using Metadata = std::map<std::string, std::string>;

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

}  // namespace

namespace checkpoint_internal {

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
                    shown_text(it->second) + "')");
  }
}

void check_format_version(int64_t version, const std::string& path) {
  if (version < kOldestCheckpointFormatVersion || version > kCheckpointFormatVersion)
    throw UserError("checkpoint '" + path + "': format version " + std::to_string(version) +
                    ", this dtrain reads versions " +
                    std::to_string(kOldestCheckpointFormatVersion) + " to " +
                    std::to_string(kCheckpointFormatVersion));
}

void check_meta_ranges(const CheckpointMeta& meta, const std::string& path) {
  constexpr int64_t kMax = int64_t{1} << 53;  // (steps stay exact as doubles and far from overflow)
  const auto in = [](int64_t v, int64_t lo, int64_t hi) { return v >= lo && v <= hi; };
  // (schedule_steps may be INT64_MAX: a run without a step limit lays its schedule out over it)
  if (!in(meta.step, 0, kMax) || !in(meta.epoch, 0, kMax) || !in(meta.batch, 0, kMax) ||
      !in(meta.optimizer_steps, 0, kMax) || meta.schedule_steps < 0)
    throw UserError("checkpoint '" + path +
                    "': a step, position or schedule horizon in its metadata is out of range "
                    "(step " +
                    std::to_string(meta.step) + ", epoch " + std::to_string(meta.epoch) +
                    ", batch " + std::to_string(meta.batch) + ", optimizer steps " +
                    std::to_string(meta.optimizer_steps) + ", schedule steps " +
                    std::to_string(meta.schedule_steps) + "): the file is corrupt");
  if (!in(meta.world_size, 1, int64_t{1} << 20))
    throw UserError("checkpoint '" + path + "': world size " + std::to_string(meta.world_size) +
                    " in its metadata is not 1 .. 2^20: the file is corrupt");
  // The config, progress and normaliser are JSON objects a few levels deep. Their readers copy
  // the parsed tree, recursing once per level: a crafted file nesting 10^5 levels would overflow
  // the stack, so they are checked here, before anything reads them.
  constexpr int kMaxMetaDepth = 64;
  for (const auto& [key, text] :
       {std::pair<const char*, const std::string&>{"config", meta.config_json},
        {"progress", meta.progress_json},
        {"normalizer", meta.normalizer_json}}) {
    if (text.empty()) continue;
    bool object = false;
    if (json_depth(text) <= kMaxMetaDepth) {
      try {
        object = nlohmann::json::parse(text).is_object();
      } catch (const nlohmann::json::exception&) {
      }
    }
    if (!object)
      throw UserError("checkpoint '" + path + "': its metadata '" + key +
                      "' is not a JSON object of at most " + std::to_string(kMaxMetaDepth) +
                      " levels: the file is corrupt or was not written by dtrain");
  }
}

void check_finite(const float* v, int64_t n, const std::string& path, const std::string& name) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::isfinite(v[i])) continue;
    const char* what = std::isnan(v[i]) ? "nan" : v[i] > 0 ? "inf" : "-inf";
    throw UserError("checkpoint '" + path + "': tensor '" + name + "' holds a non-finite value (" +
                    what + ") at index " + std::to_string(i) +
                    ": the file is corrupt or was saved from a diverged run");
  }
}

void warn_unchecksummed(const std::string& path, const std::string& which) {
  spdlog::warn(
      "checkpoint '{}': {} no CRC-32 checksums (written by an older dtrain); loading it "
      "unverified",
      path, which);
}

void warn_header_unchecksummed(const std::string& path, const std::string& which) {
  spdlog::warn(
      "checkpoint '{}': {} no CRC-32 of the header (written by a dtrain before 2026-12-03, or "
      "the key was removed); its step, position and shapes are loaded unverified",
      path, which);
}

std::string shard_range_str(const ShardRange& r) {
  // Appended piece by piece: GCC 12 warns falsely (-Wrestrict) on "literal" + std::string here.
  std::string s = "[";
  s += std::to_string(r.begin);
  s += ", ";
  s += std::to_string(r.end);
  s += ") at ";
  s += std::to_string(r.offset);
  return s;
}

bool is_sharded_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec) && fs::is_regular_file(p / kManifest, ec);
}

}  // namespace checkpoint_internal

using namespace checkpoint_internal;

namespace {

// A checkpoint file's format and version (returned), from its safetensors metadata.
int64_t check_file_format(const Metadata& metadata, const std::string& path) {
  auto fmt = metadata.find("format");
  if (fmt == metadata.end() || fmt->second != kFormatName)
    throw UserError("checkpoint '" + path +
                    "': not a dtrain checkpoint (no format=" + std::string(kFormatName) +
                    " in __metadata__; model weights from elsewhere, such as a PyTorch "
                    "state_dict, start a run through train.init_from)");
  const int64_t version = meta_int(metadata, "format_version", path);
  check_format_version(version, path);
  return version;
}

}  // namespace

void save_checkpoint(const std::string& path, const Model& model, const float* params,
                     const std::vector<StateBuffer>& state, const CheckpointMeta& meta,
                     const CompressionState& comp, const ReplicaState& replicas) {
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
  auto md = file_metadata(meta, model.param_count(), comp);
  add_replica_state(replicas, model.param_count(), refs, md);
  if (replicas.world_size > 0)
    md["format_version"] = std::to_string(kCheckpointFormatVersionReplicas);
  write_safetensors(path, refs, md, Links::kReplace);  // (a run folder's file)
}

namespace {

// The checkpoint's optimizer tensors ("optim.<buffer>.<param>") of buffers the run does not keep
// because a key turned them off since it was written (optimizer.momentum: "momentum"; Local
// SGD's outer optimizer, DiLoCo: "outer_momentum"): a resume drops them, as the sharded loader
// does (the resume's warning names the changed key). Only those buffers, of the model's own
// parameters: any other tensor stays unknown and is refused.
size_t dropped_state_tensors(const StFile& f, const Model& model,
                             const std::vector<StateBuffer>& state) {
  size_t n = 0;
  for (const auto& [name, t] : f.tensors) {
    if (name.rfind("optim.", 0) != 0) continue;
    const size_t dot = name.find('.', 6);
    if (dot == std::string::npos) continue;
    const std::string buffer = name.substr(6, dot - 6);
    const bool droppable = buffer == "momentum" || buffer == "outer_momentum";
    const bool kept = std::any_of(state.begin(), state.end(),
                                  [&](const StateBuffer& b) { return b.name == buffer; });
    n += droppable && !kept && model.find(name.substr(dot + 1)) != nullptr;
  }
  return n;
}

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
                                    const std::vector<StateBuffer>& state, CompressionState* comp,
                                    ReplicaState* replicas) {
  // Verifies the checksums of what it reads. A weights-only load (eval, predict, generate) reads
  // no optimizer, compression or replica state: that is most of the file, unused here.
  StReadOptions read;
  if (state.empty() && comp == nullptr)
    read.wanted = [](const std::string& name) { return !is_training_state_tensor(name); };
  StFile f = read_safetensors(path, read);
  const int64_t version = check_file_format(f.metadata, path);
  if (!f.checksummed)
    warn_unchecksummed(path, "the file has");
  else if (!f.header_checksummed)
    warn_header_unchecksummed(path, "the file has");

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
  if (auto it = f.metadata.find("progress"); it != f.metadata.end())
    meta.progress_json = it->second;
  if (auto it = f.metadata.find("normalizer"); it != f.metadata.end())
    meta.normalizer_json = it->second;
  check_meta_ranges(meta, path);

  // Check everything before touching params: a refused load changes nothing.
  auto expect = [&](const std::string& name, const Shape& shape) -> const StTensor& {
    auto it = f.tensors.find(name);
    if (it == f.tensors.end())
      throw ModelMismatchError("checkpoint '" + path + "' does not match the model: no tensor '" +
                               name + "' (was it saved from another model?)");
    if (it->second.shape != shape)
      throw ModelMismatchError("checkpoint '" + path + "' does not match the model: '" + name +
                               "' has shape " + shape_str(it->second.shape) +
                               ", the model expects " + shape_str(shape));
    return it->second;
  };
  std::vector<std::string> comp_tensors;
  CompressionState cs;
  if (version >= 2) cs = read_compression(f, path, comp_tensors, comp != nullptr);
  ReplicaState rs;
  if (version >= 3)
    rs = read_replica_state(f, path, model.param_count(), comp_tensors,
                            replicas != nullptr && !state.empty());
  size_t expected_tensors = model.params().size() * (1 + state.size()) + comp_tensors.size();
  for (const auto& e : model.params()) expect(e.name, e.shape);
  for (const auto& s : state)
    for (const auto& e : model.params()) expect("optim." + s.name + "." + e.name, e.shape);
  if (state.empty()) {
    // Weights only: ignore optimizer and compression tensors, but reject unknown model tensors.
    expected_tensors = 0;
    std::string unknown;  // (the first the model has no parameter of, named in the refusal)
    for (const auto& [name, t] : f.tensors)
      if (!is_training_state_tensor(name)) {
        ++expected_tensors;
        if (unknown.empty() && model.find(name) == nullptr) unknown = name;
      }
    if (expected_tensors != model.params().size())
      throw ModelMismatchError(
          "checkpoint '" + path + "' does not match the model: it has " +
          std::to_string(expected_tensors) + " parameter tensors, the model " +
          std::to_string(model.params().size()) +
          (unknown.empty() ? std::string()
                           : " ('" + shown_text(unknown, 200) + "' is none of the model's)"));
  } else if (f.tensors.size() != expected_tensors + dropped_state_tensors(f, model, state)) {
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
  if (replicas) *replicas = std::move(rs);
  return meta;
}

CheckpointMeta load_sharded_checkpoint(const std::string& dir, const Model& model, float* params,
                                       const std::vector<StateBuffer>& state) {
  ShardedRead rd = read_sharded(dir, !state.empty());
  if (rd.table.size() != model.params().size())
    throw ModelMismatchError("checkpoint '" + dir + "' does not match the model: it has " +
                             std::to_string(rd.table.size()) + " parameter tensors, the model " +
                             std::to_string(model.params().size()));
  for (size_t i = 0; i < rd.table.size(); ++i) {
    const ParamEntry& e = model.params()[i];
    const auto& t = rd.table[i];
    if (t.name != e.name || t.shape != e.shape || t.offset != e.offset)
      throw ModelMismatchError("checkpoint '" + dir + "' does not match the model: tensor " +
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
      {"format_version", std::to_string(kCheckpointFormatVersionPlain)},
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
  if (!meta.progress_json.empty()) md["progress"] = meta.progress_json;
  if (!meta.normalizer_json.empty()) md["normalizer"] = meta.normalizer_json;
  return md;
}

}  // namespace

bool is_training_state_tensor(const std::string& name) {
  return name.rfind("optim.", 0) == 0 || name.rfind("comp.", 0) == 0 || is_replica_tensor(name);
}

CheckpointMeta load_checkpoint(const std::string& path, const Model& model, float* params,
                               const std::vector<StateBuffer>& state, CompressionState* comp,
                               ReplicaState* replicas) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    if (!is_sharded_dir(path))
      throw UserError("checkpoint '" + path +
                      "' is a folder without manifest.json (an incomplete sharded checkpoint?)");
    if (comp) *comp = CompressionState{};
    if (replicas) *replicas = ReplicaState{};
    return load_sharded_checkpoint(path, model, params, state);
  }
  return load_file_checkpoint(path, model, params, state, comp, replicas);
}

ConsolidatedCheckpoint consolidate_checkpoint(const std::string& dir, const std::string& out_path) {
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
  return {rd.meta, rd.layout_dp, rd.layout_pp, rd.layout_tp};
}

std::string describe_writer(const ConsolidatedCheckpoint& c) {
  const std::string ranks = std::to_string(c.meta.world_size) + " rank(s)";
  if (c.dp == 0) return c.meta.strategy + ", " + ranks;  // (the manifest names no grid)
  std::string d;
  const auto part = [&](const std::string& p) { d += (d.empty() ? "" : " x ") + p; };
  if (c.dp > 1 || (c.pp == 1 && c.tp == 1))
    // (strategy "pipeline" is ddp on the data axis: the stages are named below)
    part((c.meta.strategy == "pipeline" && c.pp > 1 ? "ddp" : c.meta.strategy) +
         (c.dp > 1 ? " over " + std::to_string(c.dp) + " replicas" : ""));
  if (c.pp > 1) part("pipeline of " + std::to_string(c.pp) + " stages");
  if (c.tp > 1) part("tensor parallel " + std::to_string(c.tp));
  return d + ", " + ranks;
}

std::string sharded_checkpoint_name(int64_t step) {
  return "step-" + std::to_string(step);
}
std::string shard_file_name(int rank) {
  return "rank-" + std::to_string(rank) + ".safetensors";
}

void save_shard(const std::string& dir, int rank, int64_t step,
                const std::vector<ShardRange>& ranges, int64_t shard_size, const float* params,
                const std::vector<StateBuffer>& state, const std::string& save_id,
                const std::vector<ShardRange>* global_ranges, const ReplicaState* replicas) {
  std::vector<StTensorRef> refs = {{"params", {shard_size}, params}};
  for (const auto& s : state) refs.push_back({"optim." + s.name, {shard_size}, s.data});
  const auto json_of = [](const std::vector<ShardRange>& rs) {
    nlohmann::json rj = nlohmann::json::array();
    for (const auto& r : rs) rj.push_back({r.begin, r.end, r.offset});
    return rj.dump();
  };
  std::map<std::string, std::string> meta = {
      {"format", kShardFormatName},
      {"format_version", std::to_string(kCheckpointFormatVersionPlain)},
      {"rank", std::to_string(rank)},
      {"step", std::to_string(step)},
      {"ranges", json_of(ranges)},
      {"global_ranges", json_of(global_ranges != nullptr ? *global_ranges : ranges)}};
  if (!save_id.empty()) meta["save_id"] = save_id;
  // A shard holding its stage's replicas' own optimizer states is version 3, as such a file is:
  // a dtrain before it read the shard and ignored them, resuming inexactly without a word; it
  // refuses the shard by its version now (the manifest stays 2: every shard is checked).
  if (replicas != nullptr) add_replica_state(*replicas, shard_size, refs, meta);
  if (replicas != nullptr && replicas->world_size > 0)
    meta["format_version"] = std::to_string(kCheckpointFormatVersionReplicas);
  write_safetensors((fs::path(dir) / shard_file_name(rank)).string(), refs, meta, Links::kReplace);
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
                            {"format_version", kCheckpointFormatVersionPlain},
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
  if (!meta.progress_json.empty()) out["progress"] = nlohmann::json::parse(meta.progress_json);
  if (!meta.normalizer_json.empty())
    out["normalizer"] = nlohmann::json::parse(meta.normalizer_json);
  if (!meta.save_id.empty()) out["save_id"] = meta.save_id;
  if (!layout.is_null()) out["layout"] = layout;
  out[kManifestCrcKey] = crc32_hex(out.dump());  // (read_manifest: the canonical form)
  write_file_atomic((fs::path(dir) / kManifest).string(), out.dump(1) + "\n", Links::kReplace);
}

std::string check_checkpoint(const std::string& path, bool allow_missing) {
  const std::string resolved = resolve_checkpoint(path, allow_missing);
  if (resolved.empty()) return resolved;
  if (!is_sharded_dir(resolved)) {
    check_file_format(read_safetensors_metadata(resolved), resolved);
    return resolved;
  }
  try {
    check_manifest_format(read_manifest(resolved), resolved);
  } catch (const nlohmann::json::exception& e) {
    throw UserError("checkpoint '" + resolved +
                    "': manifest.json is malformed: " + json_error_text(e.what()));
  }
  return resolved;
}

}  // namespace dtrain
