#include "checkpoint/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <regex>

#include "checkpoint/safetensors.h"
#include "util/check.h"
#include "util/fs.h"

namespace dtrain {

namespace fs = std::filesystem;

namespace {

const char* kFormatName = "dtrain-checkpoint";

int64_t meta_int(const StFile& f, const std::string& key, const std::string& path) {
  auto it = f.metadata.find(key);
  if (it == f.metadata.end())
    throw UserError("checkpoint '" + path + "': metadata has no '" + key + "'");
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

std::string meta_str(const StFile& f, const std::string& key, const std::string& path) {
  auto it = f.metadata.find(key);
  if (it == f.metadata.end())
    throw UserError("checkpoint '" + path + "': metadata has no '" + key + "'");
  return it->second;
}

}  // namespace

void save_checkpoint(const std::string& path, const Model& model, const float* params,
                     const std::vector<StateBuffer>& state, const CheckpointMeta& meta) {
  std::vector<StTensorRef> refs;
  refs.reserve(model.params().size() * (1 + state.size()));
  for (const auto& e : model.params()) refs.push_back({e.name, e.shape, params + e.offset});
  for (const auto& s : state)
    for (const auto& e : model.params())
      refs.push_back({"optim." + s.name + "." + e.name, e.shape, s.data + e.offset});
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
      {"param_count", std::to_string(model.param_count())},
  };
  write_safetensors(path, refs, md);
}

CheckpointMeta load_checkpoint(const std::string& path, const Model& model, float* params,
                               const std::vector<StateBuffer>& state) {
  const StFile f = read_safetensors(path);
  auto fmt = f.metadata.find("format");
  if (fmt == f.metadata.end() || fmt->second != kFormatName)
    throw UserError("checkpoint '" + path + "': not a dtrain checkpoint (no format=" +
                    std::string(kFormatName) + " in __metadata__)");
  const int64_t version = meta_int(f, "format_version", path);
  if (version != kCheckpointFormatVersion)
    throw UserError("checkpoint '" + path + "': format version " + std::to_string(version) +
                    ", this dtrain reads version " + std::to_string(kCheckpointFormatVersion));

  CheckpointMeta meta;
  meta.step = meta_int(f, "step", path);
  meta.epoch = meta_int(f, "epoch", path);
  meta.batch = meta_int(f, "batch", path);
  meta.optimizer_steps = meta_int(f, "optimizer_steps", path);
  meta.optimizer = meta_str(f, "optimizer", path);
  meta.rng = meta_str(f, "rng", path);
  meta.config_hash = meta_str(f, "config_hash", path);
  meta.strategy = meta_str(f, "strategy", path);
  meta.world_size = meta_int(f, "world_size", path);
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
  size_t expected_tensors = model.params().size() * (1 + state.size());
  for (const auto& e : model.params()) expect(e.name, e.shape);
  for (const auto& s : state)
    for (const auto& e : model.params()) expect("optim." + s.name + "." + e.name, e.shape);
  if (state.empty()) {
    // Weights only: ignore optimizer tensors, but reject unknown model tensors.
    expected_tensors = 0;
    for (const auto& [name, t] : f.tensors)
      if (name.rfind("optim.", 0) != 0) ++expected_tensors;
    if (expected_tensors != model.params().size())
      throw UserError("checkpoint '" + path + "' does not match the model: it has " +
                      std::to_string(expected_tensors) + " parameter tensors, the model " +
                      std::to_string(model.params().size()));
  } else if (f.tensors.size() != expected_tensors) {
    for (const auto& [name, t] : f.tensors) {
      bool known = model.find(name) != nullptr;
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

  for (const auto& e : model.params()) {
    const auto& t = f.tensors.at(e.name);
    std::copy(t.data.begin(), t.data.end(), params + e.offset);
  }
  for (const auto& s : state)
    for (const auto& e : model.params()) {
      const auto& t = f.tensors.at("optim." + s.name + "." + e.name);
      std::copy(t.data.begin(), t.data.end(), s.data + e.offset);
    }
  return meta;
}

std::string checkpoint_file_name(int64_t step) {
  return "step-" + std::to_string(step) + ".safetensors";
}

void commit_checkpoint(const std::string& dir, const std::string& file_name, int64_t keep_last) {
  DT_CHECK_GE(keep_last, 1);
  write_file_atomic((fs::path(dir) / "latest").string(), file_name + "\n");
  static const std::regex re(R"(step-(\d+)\.safetensors)");
  std::vector<std::pair<int64_t, fs::path>> found;
  for (const auto& ent : fs::directory_iterator(dir)) {
    std::smatch m;
    const std::string name = ent.path().filename().string();
    if (std::regex_match(name, m, re)) found.emplace_back(std::stoll(m[1].str()), ent.path());
  }
  std::sort(found.begin(), found.end());
  const int64_t excess = static_cast<int64_t>(found.size()) - keep_last;
  for (int64_t i = 0; i < excess; ++i) {
    if (found[static_cast<size_t>(i)].second.filename() == file_name) continue;
    std::error_code ec;
    fs::remove(found[static_cast<size_t>(i)].second, ec);
  }
}

std::string resolve_checkpoint(const std::string& path, bool allow_missing) {
  std::error_code ec;
  fs::path p(path);
  if (fs::is_regular_file(p, ec)) return p.string();
  if (fs::is_directory(p, ec)) {
    fs::path latest = p / "latest";
    if (!fs::exists(latest, ec) && fs::is_directory(p / "checkpoints", ec))
      latest = p / "checkpoints" / "latest";
    if (fs::exists(latest, ec)) {
      std::string name = read_file(latest.string());
      while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' '))
        name.pop_back();
      if (name.empty() || name.find('/') != std::string::npos)
        throw UserError("'" + latest.string() + "' does not name a checkpoint file");
      const fs::path file = latest.parent_path() / name;
      if (!fs::is_regular_file(file, ec))
        throw UserError("'" + latest.string() + "' names '" + name + "', which does not exist");
      return file.string();
    }
    if (allow_missing) return "";
    throw UserError("no checkpoint in '" + path + "' (no latest file)");
  }
  if (allow_missing) return "";
  throw UserError("checkpoint '" + path + "' does not exist");
}

}  // namespace dtrain
