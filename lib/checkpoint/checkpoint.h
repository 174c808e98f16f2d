// Training checkpoints (format version 2, or 3 with ReplicaState): one safetensors file holding the
// full flat parameter buffer split by the model's parameter table, the optimizer state under
// "optim.<state>.<param name>", the gradient-compression state under "comp.*"
// (CompressionState), and __metadata__ with everything else a bitwise-exact resume needs.
// Layout in README "Output files". Version 1 (no compression state) still loads.
//
// Files live in RUN/checkpoints/step-<N>.safetensors; RUN/checkpoints/latest names the newest
// complete one. Each file is written atomically, `latest` is updated only after the file is on
// disk, and pruning (keep_last) happens last, so a crash at any point leaves the previous
// checkpoint valid and named.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "nn/model.h"

namespace dtrain {

// Version 3 is version 2 plus Local SGD's per-rank optimizer state (ReplicaState), written only
// by a file that holds it: a dtrain that reads up to version 2 then refuses the file by its
// version, not by its unknown tensors. Every other file, shard and manifest is version 2.
inline constexpr int kCheckpointFormatVersion = 3;          // the newest version this dtrain reads
inline constexpr int kCheckpointFormatVersionPlain = 2;     // what a file without ReplicaState is
inline constexpr int kCheckpointFormatVersionReplicas = 3;  // what a file with it is
inline constexpr int kOldestCheckpointFormatVersion = 1;    // the oldest version that still loads

// Everything besides tensors. Stored as strings in __metadata__.
struct CheckpointMeta {
  int64_t step = 0;             // optimizer steps completed
  int64_t epoch = 0;            // sampler position of the next batch: epoch ...
  int64_t batch = 0;            // ... and global batch index within it
  int64_t optimizer_steps = 0;  // the optimizer's own step count (Adam bias correction)
  std::string optimizer;        // sgd | adam | adamw
  std::string rng;              // Rng::to_string() of the training RNG (dropout)
  std::string config_hash;
  std::string strategy = "ddp";
  int64_t world_size = 1;
  // Optional (absent in older files of the same format version: "" and 0). The resolved config
  // that wrote it (config.json's content, compact), so a resume can name the keys that changed;
  // and the step count the learning-rate schedule was laid out over, so a resume with another
  // train.max_steps / epochs keeps the schedule it started (README "Resuming").
  std::string config_json;
  int64_t schedule_steps = 0;
  // Optional too: the training loop's running totals that a resumed run continues (JSON object,
  // written by train/loop_save.cc: skipped steps and the sums of the train record in progress),
  // so its records and summary read as an uninterrupted run's. "" in older files.
  std::string progress_json;
  // Sharded checkpoints only: a random id drawn by rank 0 for one save and written into the
  // manifest and every shard's header, so a load refuses a shard left by another run's save of
  // the same step (a node-local folder that --overwrite could not clear, files copied together
  // from two runs). "" in files written before it existed: not checked.
  std::string save_id;
  // Optional too ("" in older files): the training data's normaliser (Normalizer::to_json), so
  // eval and predict scale inputs as training did, whatever the data files hold by then.
  std::string normalizer_json;
};

// The state distributed.compression carries from step to step (train/compression.h), as the
// run that wrote the file had it. Tensors "comp.residual.rank<r>" [residual_floats] for every rank
// r < world_size (error feedback on; the residuals are per rank) and "comp.q" [q_floats]
// (powersgd's warm start, global); metadata "compression" (the type), "compression_world_size",
// "compression_residual_floats", "compression_q_floats", "compression_rng" (powersgd's RNG). A
// version-1 file, or one written without compression, reads as type "none" and nothing else.
struct CompressionState {
  std::string type = "none";
  int64_t world_size = 0;                     // ranks of the writing run
  std::vector<std::vector<float>> residuals;  // [world_size], or empty (no error feedback)
  std::vector<float> q;                       // empty unless powersgd
  std::string rng;                            // "" unless powersgd
  std::string strategy;  // when read: the writing run's strategy (metadata "strategy")
};

// Optimizer state that differs from rank to rank and that one process has no counterpart of:
// Local SGD's when it is not averaged (distributed.local_sgd.sync_optimizer_state false), each
// replica's own momentum or Adam moments. The file's "optim.*" tensors hold rank 0's; tensors
// "replica.rank<r>.<state>" [param_count] hold rank r's, 1 <= r < world_size, in the flat
// layout; metadata "replica_world_size" and "replica_states" (the names, comma-separated)
// describe them. Absent (world_size 0) in files written without it. Weights-only loads, eval
// and the PyTorch names ignore them, as they ignore "optim.*".
struct ReplicaState {
  int64_t world_size = 0;
  std::vector<std::string> names;
  // [r - 1][k]: rank r's state names[k], param_count floats (read only when asked for).
  std::vector<std::vector<std::vector<float>>> ranks;
};

// A named optimizer state buffer in the full flat layout (size = model.param_count()).
struct StateBuffer {
  std::string name;  // "momentum", "exp_avg", ...
  float* data = nullptr;
};

// Sharded checkpoints (strategies zero1, zero2, fsdp; same format version): a folder
// RUN/checkpoints/step-<N>/ holding rank-<r>.safetensors per rank -- tensors "params" [n] and
// "optim.<state>" [n], the rank's shard: ranges of the flat layout packed at shard offsets --
// and manifest.json (format, version, CheckpointMeta fields, the parameter table, every rank's
// file and ranges), which rank 0 writes only after every rank's shard is on disk. A folder
// without manifest.json is incomplete and never loaded; `latest` moves only after the manifest.
struct ShardRange {
  int64_t begin = 0, end = 0;  // [begin, end) of the flat layout
  int64_t offset = 0;          // where it starts in the rank's shard tensors
};
std::string sharded_checkpoint_name(int64_t step);  // "step-<N>"
std::string shard_file_name(int rank);              // "rank-<r>.safetensors"
// Writes dir/rank-<rank>.safetensors atomically: params and each state buffer hold shard_size
// floats (padding included) laid out per `ranges`. Its header records rank, step, ranges,
// save_id (CheckpointMeta; "" writes none) and global_ranges: the ranges the manifest lists for
// this shard, those of the whole (unsliced) layout under tensor parallelism, where `ranges` are
// the rank's local layout (null: `ranges`). A load checks them all against the manifest.
// replicas (when given, world_size > 0): the stage's other replicas' state (ShardReplicas), of
// shard_size floats each.
void save_shard(const std::string& dir, int rank, int64_t step,
                const std::vector<ShardRange>& ranges, int64_t shard_size, const float* params,
                const std::vector<StateBuffer>& state, const std::string& save_id = "",
                const std::vector<ShardRange>* global_ranges = nullptr,
                const ReplicaState* replicas = nullptr);
// A pipeline's (or tensor-parallel) sharded checkpoint under Local SGD without
// sync_optimizer_state: the shard of each stage's first replica (rank-<r>.safetensors, dp 0) also
// holds the stage's other replicas' own state, as a ReplicaState over the stage's data axis
// ("replica.rank<i>.<state>" for replica i, 1 <= i < dp; each [n] in the shard's layout, as its
// "params"); world_size 0 when it holds none. read_shard_replicas reads one shard's, with the
// manifest's layout (dp 0: none recorded) and the shard's ranges in the whole layout, which tell
// a resume whether the replicas of its own layout can take it. UserError for a missing, corrupt
// or inconsistent shard.
struct ShardReplicas {
  ReplicaState state;
  int64_t dp = 0, pp = 1, tp = 1;
  std::vector<ShardRange> global_ranges;
};
// with_data false: the shard's metadata alone (state.ranks empty; world_size and names as its
// metadata says them, which the read with data checks against its tensors).
ShardReplicas read_shard_replicas(const std::string& dir, int rank, bool with_data = true);
// Whether the sharded checkpoint `dir` holds replicas' own optimizer states (ShardReplicas) in
// any shard its manifest lists: headers only. false for a file, or anything unreadable.
bool holds_replica_states(const std::string& dir);
// One shard of a manifest: the rank that wrote rank-<rank>.safetensors, its ranges, and where the
// rank sits in the writing run's layout (e.g. {"tp": 0, "dp": 1, "pp": 0}; informational: loads
// use the ranges only).
struct ManifestShard {
  int rank = 0;
  std::vector<ShardRange> ranges;
  nlohmann::json where = nlohmann::json::object();
};
// Writes dir/manifest.json atomically; the shards' ranges together must cover the flat layout
// exactly once. layout: the writing run's grid ({"tp", "dp", "pp"}), or null.
void write_manifest(const std::string& dir, const Model& model, const CheckpointMeta& meta,
                    const std::vector<ManifestShard>& shards,
                    const std::vector<std::string>& state_names,
                    const nlohmann::json& layout = nullptr);
// The same with shard r written by rank r.
void write_manifest(const std::string& dir, const Model& model, const CheckpointMeta& meta,
                    const std::vector<std::vector<ShardRange>>& ranges,
                    const std::vector<std::string>& state_names);

// What consolidate_checkpoint read: the metadata, and the writing run's grid as its manifest
// records it (dp = 0: a manifest without "layout", written before it was recorded).
struct ConsolidatedCheckpoint {
  CheckpointMeta meta;
  int64_t dp = 0, pp = 1, tp = 1;
};
// Writes the sharded checkpoint folder `dir` as one checkpoint file `out_path` (atomic), the
// format save_checkpoint writes: `dtrain eval`, `--resume` and Python's safetensors read it.
ConsolidatedCheckpoint consolidate_checkpoint(const std::string& dir, const std::string& out_path);
// "fsdp over 2 replicas x tensor parallel 2": the layout that wrote a consolidated checkpoint.
std::string describe_writer(const ConsolidatedCheckpoint& c);

// Writes `path` atomically. Throws std::runtime_error on I/O errors (old file untouched).
// comp must be consistent: residuals empty or world_size vectors of one size; so must replicas
// (world_size - 1 ranks of names.size() buffers of param_count floats, or world_size 0).
void save_checkpoint(const std::string& path, const Model& model, const float* params,
                     const std::vector<StateBuffer>& state, const CheckpointMeta& meta,
                     const CompressionState& comp = {}, const ReplicaState& replicas = {});

// The UserError load_checkpoint throws when the checkpoint's parameter table differs from the
// model's (a missing, extra or reshaped tensor): what callers that built the model from a config
// can add a hint to (another config, a label only the test data has), unlike a corrupt file.
class ModelMismatchError : public UserError {
 public:
  using UserError::UserError;
};

// Reads `path` -- a checkpoint file or a sharded checkpoint folder, whatever world size wrote it
// -- into params (and state buffers in the full layout, when given; pass {} to load weights
// only).
// Refuses with UserError, leaving params untouched: unreadable/corrupt/truncated files, another
// format or version, a parameter table that differs from `model` (missing, extra or reshaped
// tensors: the first difference is named; ModelMismatchError), or state buffers the file lacks
// (an optimizer with other state). The optimizer that wrote it is returned
// (CheckpointMeta::optimizer), not compared: Adam and AdamW keep the same buffers, and a resume
// refuses another optimizer after this load, before training. comp (when given) receives the file's
// compression state (type "none" for sharded folders: their strategies do not compress), and
// replicas its per-rank optimizer state (world_size 0 when it has none; sharded folders never do).
CheckpointMeta load_checkpoint(const std::string& path, const Model& model, float* params,
                               const std::vector<StateBuffer>& state,
                               CompressionState* comp = nullptr, ReplicaState* replicas = nullptr);

// Whether a checkpoint file's tensor is training state rather than a model parameter: optimizer
// state ("optim.*"), compression state ("comp.*") or a replica's own ("replica.*").
bool is_training_state_tensor(const std::string& name);

// RUN/checkpoints helpers (checkpoint_dir.cc).
// Before the checkpoint `name` in dir is replaced in place (a sharded folder is removed, then
// written anew): when dir/latest names it, latest is moved (atomic) to the newest complete
// checkpoint below its step, or removed when there is none, so a crash during the rewrite
// leaves `latest` on a complete checkpoint, never on the half-written one.
void release_latest(const std::string& dir, const std::string& name);
// Removes the checkpoint at `path` (a file, or a step folder: its manifest first, that removal
// synced to disk, then the shards), so an interrupted removal never leaves a folder that looks
// complete with shards missing. A symbolic link is removed, not what it names. Errors in ec.
void remove_checkpoint(const std::string& path, std::error_code& ec);
// A run that resumed from `resumed`, a checkpoint in dir (its own checkpoints folder) other than
// the one `latest` names (or with no `latest`), continues from there: latest is pointed at it
// (atomic), so a crash before the run's first checkpoint resumes (--resume auto) where it
// began, not from an abandoned timeline's newer steps. Nothing changes for a checkpoint
// outside dir.
void adopt_latest(const std::string& dir, const std::string& resumed);
// The step entry (step-<N>.safetensors or step-<N>) that dir/latest names when it names one that
// exists in dir: dir is then a dtrain checkpoints folder. "" otherwise (no latest, another
// tool's, or one naming nothing there). Never throws.
std::string latest_step_entry(const std::string& dir);
std::string checkpoint_file_name(int64_t step);  // "step-<N>.safetensors"
// Records `file_name` (a file or a sharded folder name) as the newest checkpoint in dir/latest
// (atomic), then deletes the oldest step-* files and folders beyond keep_last.
void commit_checkpoint(const std::string& dir, const std::string& file_name, int64_t keep_last);

// Removes what interrupted writes left in a checkpoints folder `dir`: temp files of atomic writes
// (".<name>.tmp.XXXXXX", util/fs.h) in it and in its sharded step-<N>/ folders. Only call it where
// nothing is being written there: rank 0 at the start of a run (before any rank saves), and
// commit_checkpoint, which does (rank 0 is the only writer of `dir` itself, and every shard of
// the checkpoint it commits is complete). Returns the number of files removed.
int64_t remove_orphaned_temp_files(const std::string& dir, bool include_step_folders);
// remove_orphaned_temp_files(dir, true), then the step-<N> folders without manifest.json (saves
// that were interrupted or failed: never loaded, and a save of that step again would find them in
// its way) that hold nothing but shard files (a folder with anything else is a user's) and are
// not the one `latest` names. The same condition: nothing is being written in dir. Returns the
// number of files and folders removed.
int64_t remove_incomplete_checkpoints(const std::string& dir);
// Whether `name` is one a sharded save writes inside its step-<N> folder: manifest.json,
// rank-<r>.safetensors, the temp files of those atomic writes, or NFS's .nfs<hex digits> for one of
// them removed while open.
bool is_step_folder_entry(const std::string& name);
// Resolves what --resume names: a checkpoint file, a sharded checkpoint folder (with
// manifest.json), a checkpoints folder (its `latest`), a run folder (its checkpoints/latest), or a
// `latest` file itself; a sharded checkpoint's manifest.json or rank-<r>.safetensors means its
// folder. A folder whose `latest` is missing resolves to its highest-numbered complete
// step-<N> checkpoint, with a warning.
// Returns "" when nothing is there and allow_missing is true; otherwise throws UserError.
std::string resolve_checkpoint(const std::string& path, bool allow_missing);
// The optimizer a resolved checkpoint's header (or manifest) names; "" when it cannot be read.
// Reads headers only: for naming the cause when a load fails on another optimizer's state.
std::string checkpoint_optimizer(const std::string& resolved);
// The optimizer state buffers a resolved checkpoint holds ("momentum", "outer_momentum", ...),
// sorted (empty: none); nullopt when it cannot be read. Reads a file whole: for naming the
// cause of a failed load.
std::optional<std::vector<std::string>> checkpoint_state_names(const std::string& resolved);
// The config a resolved checkpoint stores (config.json's content), read from its header or
// manifest only; "" when it has none (older files) or cannot be read (the load then says why).
// For checking a config against a checkpoint before the model is built and allocated.
std::string checkpoint_config_json(const std::string& resolved);
// The record of the model's inputs a resolved checkpoint stores (CheckpointMeta::normalizer_json:
// data/dataset.h input_record_json), from its header or manifest only; "" when it has none.
std::string checkpoint_input_record(const std::string& resolved);
// The shape a resolved checkpoint gives parameter `name` (a file's header, a sharded folder's
// manifest table), nullopt when it has none or cannot be read (the load then says why). Reads
// headers only: for sizing a model from its checkpoint (eval without the training labels).
std::optional<std::vector<int64_t>> checkpoint_param_shape(const std::string& resolved,
                                                           const std::string& name);
// What names a resolved checkpoint's content, from its header or manifest only: a file's header
// checksum ("crc:<8 hex>", which covers its tensors' checksums: the same bytes, the same id), a
// sharded folder's save id ("save:<16 hex>", drawn per save). "" when it has none (older files)
// or cannot be read. Written into summary.json (`checkpoint_id`), so a run folder can tell the
// summary of the checkpoint there from one of another run that a resume replaced it with.
std::string checkpoint_identity(const std::string& resolved);
// resolve_checkpoint, then a check that reads only headers (a file's safetensors header, a sharded
// folder's manifest.json): it is a dtrain checkpoint of this format version. For --resume and
// --checkpoint before any data is loaded, so "'X' is not a safetensors file (...)" comes first.
std::string check_checkpoint(const std::string& path, bool allow_missing);

}  // namespace dtrain
