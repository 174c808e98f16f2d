// train.init_from (init_from.h).
#include "train/init_from.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/compare.h"
#include "checkpoint/safetensors.h"
#include "util/check.h"

namespace dtrain {
namespace {

std::string shape_text(const std::vector<int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

// "'a', 'b', 'c' and 4 more".
std::string some_names(const std::vector<std::string>& names) {
  std::string s;
  const size_t shown = std::min<size_t>(names.size(), 4);
  for (size_t i = 0; i < shown; ++i) s += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > shown) s += fmt::format(" and {} more", names.size() - shown);
  return s;
}

}  // namespace

void read_init_weights(const std::string& path, const Model& whole, float* params) {
  const std::string where = "train.init_from '" + path + "'";
  std::map<std::string, StTensor> file;
  try {
    // (a checkpoint file, a sharded checkpoint folder, a run's or checkpoints folder as --resume
    // takes them, or any safetensors file)
    // (a sharded folder consolidated under $TMPDIR: the source may be a read-only store)
    std::error_code ec;
    StReadOptions options;
    options.convert = true;  // PyTorch's half, bfloat16 and double weights
    options.wanted = [](const std::string& name) { return !is_training_state_tensor(name); };
    file = read_checkpoint_file(resolve_checkpoint(path, false),
                                std::filesystem::temp_directory_path(ec).string(), options)
               .tensors;
  } catch (const UserError& e) {
    throw UserError(where + ": " + e.what());
  }
  const std::vector<ParamEntry>& table = whole.params();
  // A tied pair's other entry: either name serves both copies.
  std::vector<int> other(table.size(), -1);
  for (const TiedParam& t : whole.ties()) {
    other[t.primary] = static_cast<int>(t.mirror);
    other[t.mirror] = static_cast<int>(t.primary);
  }
  // The file's tensor for entry i (its own name, or a bare nn.Sequential's), or null.
  std::set<std::string> used;
  const auto lookup = [&](size_t i) -> const std::pair<const std::string, StTensor>* {
    const std::string& name = table[i].name;
    for (const std::string& n :
         {name, name.starts_with("layers.") ? name.substr(7) : std::string()}) {
      if (n.empty()) continue;
      if (const auto it = file.find(n); it != file.end()) return &*it;
    }
    return nullptr;
  };
  std::vector<std::string> missing;
  std::map<std::string, int> converted;  // tensors read from another dtype, by dtype
  for (size_t i = 0; i < table.size(); ++i) {
    const ParamEntry& e = table[i];
    const auto* t = lookup(i);
    if (t == nullptr && other[i] >= 0) t = lookup(static_cast<size_t>(other[i]));
    if (t == nullptr) {
      missing.push_back(e.name);
      continue;
    }
    if (t->second.shape != e.shape)
      throw UserError(fmt::format(
          "{}: tensor '{}' is {} there, the model's '{}' is {} (another model config: check "
          "model.*{} against the model the file holds)",
          where, t->first, shape_text(t->second.shape), e.name, shape_text(e.shape),
          e.name.ends_with("wpe.weight") ? ", model.block_size first (its positions)" : ""));
    if (!t->second.loaded)
      throw UserError(fmt::format(
          "{}: tensor '{}' is stored as {}; a parameter is read from F32, F16, BF16 or F64", where,
          t->first, t->second.dtype));
    DT_CHECK_EQ(static_cast<int64_t>(t->second.data.size()), e.numel);
    // (a NaN start fails the first step with a message about the data, after --overwrite has
    // cleared the old run)
    if (const auto bad = std::find_if(t->second.data.begin(), t->second.data.end(),
                                      [](float v) { return !std::isfinite(v); });
        bad != t->second.data.end())
      throw UserError(fmt::format(
          "{}: tensor '{}' holds a non-finite value ({} at flat index {}{})", where, t->first, *bad,
          bad - t->second.data.begin(),
          t->second.dtype == "F64" && std::isinf(*bad) ? ", stored as F64: beyond float32's range"
                                                       : ""));
    if (t->second.dtype != "F32" && !used.contains(t->first)) ++converted[t->second.dtype];
    std::copy(t->second.data.begin(), t->second.data.end(), params + e.offset);
    used.insert(t->first);
  }
  if (!missing.empty()) {
    std::vector<std::string> have;
    for (const auto& [n, t] : file)
      if (!is_training_state_tensor(n)) have.push_back(n + " " + shape_text(t.shape));
    throw UserError(fmt::format(
        "{}: the model's {} {} not in the file ({} of its {} parameters); the file holds {} "
        "model tensor(s){}{} (another model config, or names other than those README \"Models\" "
        "gives)",
        where, missing.size() == 1 ? "parameter" : "parameters",
        some_names(missing) + (missing.size() == 1 ? " is" : " are"), missing.size(), table.size(),
        have.size(), have.empty() ? "" : ": ", some_names(have)));
  }
  // A tied pair both of whose names the file holds must hold one tensor: two different ones are
  // an untied model's, which the tied copies' summed gradients would keep apart for ever.
  for (const TiedParam& t : whole.ties()) {
    const ParamEntry &a = table[t.primary], &b = table[t.mirror];
    if (!std::equal(params + a.offset, params + a.offset + a.numel, params + b.offset))
      throw UserError(fmt::format(
          "{}: '{}' and '{}' differ there, and this model ties them (one tensor): the file holds "
          "an untied model's weights; set model.tie_embeddings: false to start from them",
          where, a.name, b.name));
  }
  std::vector<std::string> unused;
  for (const auto& [n, t] : file)
    if (!used.contains(n) && !is_training_state_tensor(n)) unused.push_back(n);
  if (!unused.empty())
    spdlog::warn("{}: {} tensor(s) in the file are not the model's and were ignored: {}", where,
                 unused.size(), some_names(unused));
  // (F16 and BF16 widen exactly; F64 rounds, which a user comparing with the source should know)
  for (const auto& [dtype, n] : converted)
    spdlog::info("{}: {} tensor(s) stored as {} read as float32{}", where, n, dtype,
                 dtype == "F64" ? " (rounded to nearest)" : " (exactly)");
}

}  // namespace dtrain
