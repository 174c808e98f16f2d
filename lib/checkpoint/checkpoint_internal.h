// Internal to lib/checkpoint: what checkpoint.cc (files, manifests), checkpoint_dir.cc (the
// checkpoints folder: latest, retention, resolution), sharded_read.cc (reading a sharded folder
// back) and checkpoint_query.cc (header-only queries) share. Not part of the library's interface.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "nn/model.h"

namespace dtrain::checkpoint_internal {

inline constexpr const char* kFormatName = "dtrain-checkpoint";  // metadata / manifest "format"
inline constexpr const char* kManifest = "manifest.json";
// A sharded checkpoint's rank-<r>.safetensors "format" (its "format_version" is the manifest's,
// but 3 for a shard holding its stage's replicas' own Local SGD states: save_shard).
inline constexpr const char* kShardFormatName = "dtrain-checkpoint-shard";

// manifest.json's checksum key (since 2026-12-04): zlib's CRC-32, as 8 hex digits, of the rest of
// the manifest in canonical form (nlohmann::json's sorted keys, compact), so it does not depend on
// the file's spacing. The shards' ranges and save id are also checked against their own
// (checksummed) headers; this covers the rest: the parameter table, step and position, config.
inline constexpr const char* kManifestCrcKey = "crc32";
// dir's manifest.json, parsed, its checksum verified when it has one (UserError "... fails its
// CRC-32 check ..." when it does not match); json::exception when it is not JSON. *checksummed
// (when given) tells whether it had one.
nlohmann::json read_manifest(const std::string& dir, bool* checksummed = nullptr);
// Whether p is a sharded checkpoint's folder (a folder holding manifest.json).
bool is_sharded_dir(const std::filesystem::path& p);

// The integer metadata `key` of the file at `path`; UserError when it is missing or not one.
int64_t meta_int(const std::map<std::string, std::string>& md, const std::string& key,
                 const std::string& path);
// Refuses (UserError) a format version this dtrain cannot read: older than the oldest it still
// loads, or newer.
void check_format_version(int64_t version, const std::string& path);
// A sharded checkpoint's format and version, from its manifest (json::exception when malformed).
void check_manifest_format(const nlohmann::json& m, const std::string& dir);
// Refuses NaN or Inf in a loaded parameter or optimizer-state tensor of n floats: evaluating such
// weights prints a null loss, and training from them fails later with a message about the
// learning rate, far from the cause. The message names the tensor and the first bad index.
void check_finite(const float* v, int64_t n, const std::string& path, const std::string& name);

// Refuses (UserError naming `path`) metadata out of range, which a file without a header
// checksum (or a manifest without one) could carry: a step, position or optimizer step count
// below 0 or past 2^53, a world size outside 1 .. 2^20, a negative schedule horizon (which may
// be INT64_MAX: a run without a step limit); a config, progress or normaliser that is not a
// JSON object nesting at most 64 levels.
void check_meta_ranges(const CheckpointMeta& meta, const std::string& path);
// Files written before checksums existed (format versions 1 and 2) still load, unverified:
// warns "checkpoint 'path': <which> no CRC-32 checksums ...".
void warn_unchecksummed(const std::string& path, const std::string& which);
// The same for files with tensor checksums but none of their header (which = "the file has").
void warn_header_unchecksummed(const std::string& path, const std::string& which);
// "[begin, end) at offset", for messages.
std::string shard_range_str(const ShardRange& r);

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
  // The writing run's grid as the manifest records it ("layout"; dp = 0 when it records none).
  int64_t layout_dp = 0, layout_pp = 1, layout_tp = 1;
  std::vector<float> params;
  std::vector<std::vector<float>> state;  // per state_names entry, when read with state
};

// Reads the sharded checkpoint folder `dir`: the manifest, then every shard (CRCs verified),
// checked against the manifest (identity, ranges, exact cover of the flat layout) and for finite
// values. with_state: also the optimizer state the manifest lists. Throws UserError naming the
// first problem.
ShardedRead read_sharded(const std::string& dir, bool with_state);

// ReplicaState in a checkpoint file (replica_state.cc). Tensors "replica.rank<r>.<state>".
bool is_replica_tensor(const std::string& name);
// The tensors (pointing into r) and metadata save_checkpoint and save_shard add for r; nothing
// for world_size 0. DT_CHECKs r's consistency. (A file's format version is its writer's call.)
void add_replica_state(const ReplicaState& r, int64_t param_count, std::vector<StTensorRef>& refs,
                       std::map<std::string, std::string>& metadata);
// The file's ReplicaState, checked against its metadata and tensors (UserError naming `path`:
// a bad count, a name that is not a state's, a missing or misshapen tensor, a non-finite value);
// the names of the tensors it owns are appended to `owned`. With with_data their data is moved
// out of `f` into the result (the entries stay, empty).
ReplicaState read_replica_state(StFile& f, const std::string& path, int64_t param_count,
                                std::vector<std::string>& owned, bool with_data);

}  // namespace dtrain::checkpoint_internal
