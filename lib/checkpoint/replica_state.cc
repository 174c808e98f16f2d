// ReplicaState in a checkpoint file (checkpoint.h): every rank's own optimizer state beyond rank
// 0's, as tensors "replica.rank<r>.<state>" [param_count] and metadata "replica_world_size" and
// "replica_states".
#include <cctype>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "checkpoint/checkpoint_internal.h"
#include "util/check.h"
#include "util/strings.h"

namespace dtrain::checkpoint_internal {

namespace {

constexpr const char* kPrefix = "replica.";
constexpr const char* kWorldKey = "replica_world_size";
constexpr const char* kNamesKey = "replica_states";
constexpr int64_t kMaxWorld = int64_t{1} << 20;  // as check_meta_ranges bounds world_size

std::string tensor_name(int64_t rank, const std::string& state) {
  return kPrefix + fmt::format("rank{}.", rank) + state;
}

// A state name as optimizers spell them: letters, digits and '_' (so a name cannot smuggle the
// separator of the list or of the tensor names).
bool plain_name(const std::string& n) {
  if (n.empty() || n.size() > 64) return false;
  for (const char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

}  // namespace

bool is_replica_tensor(const std::string& name) {
  return name.rfind(kPrefix, 0) == 0;
}

void add_replica_state(const ReplicaState& r, int64_t param_count, std::vector<StTensorRef>& refs,
                       std::map<std::string, std::string>& metadata) {
  if (r.world_size == 0) return;
  DT_CHECK(r.world_size >= 2 && !r.names.empty());
  DT_CHECK_EQ(static_cast<int64_t>(r.ranks.size()), r.world_size - 1);
  for (size_t i = 0; i < r.ranks.size(); ++i) {
    DT_CHECK_EQ(r.ranks[i].size(), r.names.size());
    for (size_t k = 0; k < r.names.size(); ++k) {
      DT_CHECK_EQ(static_cast<int64_t>(r.ranks[i][k].size()), param_count);
      refs.push_back({tensor_name(static_cast<int64_t>(i) + 1, r.names[k]),
                      {param_count},
                      r.ranks[i][k].data()});
    }
  }
  metadata[kWorldKey] = std::to_string(r.world_size);
  metadata[kNamesKey] = join(r.names, ",");
}

ReplicaState read_replica_state(StFile& f, const std::string& path, int64_t param_count,
                                std::vector<std::string>& owned, bool with_data) {
  ReplicaState r;
  const auto w = f.metadata.find(kWorldKey);
  const auto n = f.metadata.find(kNamesKey);
  if (w == f.metadata.end() && n == f.metadata.end()) return r;
  const auto bad = [&](const std::string& why) {
    return UserError(fmt::format("checkpoint '{}': its per-rank optimizer state {}", path, why));
  };
  if (w == f.metadata.end() || n == f.metadata.end())
    throw bad(fmt::format("has metadata '{}' without '{}'",
                          w == f.metadata.end() ? kNamesKey : kWorldKey,
                          w == f.metadata.end() ? kWorldKey : kNamesKey));
  r.world_size = meta_int(f.metadata, kWorldKey, path);
  if (r.world_size < 2 || r.world_size > kMaxWorld)
    throw bad(fmt::format("is for {} ranks (2 to {} can have one)", r.world_size, kMaxWorld));
  r.names = split(n->second, ',');
  std::set<std::string> seen;
  for (const std::string& s : r.names) {
    if (!plain_name(s)) throw bad(fmt::format("names a state '{}'", shown_text(s)));
    if (!seen.insert(s).second) throw bad(fmt::format("names the state '{}' twice", s));
  }
  if (r.names.empty()) throw bad("names no state");
  if (with_data) r.ranks.resize(static_cast<size_t>(r.world_size - 1));
  for (int64_t rank = 1; rank < r.world_size; ++rank)
    for (const std::string& s : r.names) {
      const std::string name = tensor_name(rank, s);
      const auto it = f.tensors.find(name);
      if (it == f.tensors.end() || it->second.shape != Shape{param_count})
        throw bad(fmt::format("needs tensor '{}' of shape [{}]{}", name, param_count,
                              it == f.tensors.end() ? ", which the file lacks" : ""));
      owned.push_back(name);
      if (!with_data) continue;
      check_finite(it->second.data.data(), param_count, path, name);
      // (moved out of the file's tensors, which the caller only counts and names from here on:
      // the state of W - 1 ranks is held once, not twice)
      r.ranks[static_cast<size_t>(rank - 1)].push_back(std::move(it->second.data));
    }
  return r;
}

}  // namespace dtrain::checkpoint_internal
