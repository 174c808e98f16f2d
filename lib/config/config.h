// The run configuration: plain structs with documented defaults. A YAML file is parsed and
// validated once (load_config) into a Config; nothing else in dtrain reads YAML or compares
// config strings: every choice is an enum (config/enums.h and the option headers of nn, optim
// and data). Every key is declared once in config/schema.cc (type, default, check, hash, doc),
// which drives parsing, validation, config.json, the hash and README's "Config reference".
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/enums.h"
#include "data/options.h"
#include "nn/options.h"
#include "optim/options.h"

namespace dtrain {

struct CheckpointConfig {
  int64_t every_steps = 0;  // 0: only at the end of training
  int64_t keep_last = 3;    // newest step-<N>.safetensors files kept; >= 1
  bool async = false;       // copy the state, write it on a background thread (async_checkpoint.h)
};

struct TrainConfig {
  int64_t epochs = 10;           // >= 0
  int64_t max_steps = 0;         // 0: no limit; else stop after this many optimizer steps
  int64_t log_every = 100;       // steps between train records in metrics.jsonl (>= 1)
  int64_t eval_every = 0;        // 0: evaluate at the end of each epoch; else every N steps too
  int64_t grad_accum_steps = 1;  // micro-batches per optimizer step (>= 1)
  // A non-finite loss or gradient: abort (name the step and the first tensor) | skip (drop the
  // step on every rank, count it).
  Nonfinite nonfinite = Nonfinite::kAbort;
  // Preemption (README "Preemption"): this signal stops training like an interrupt, and the run
  // exits kExitPreempted (util/interrupt.h) once its checkpoint is written; SIGINT (and SIGTERM
  // when the signal is USR1) stay plain interrupts. The deadline bounds the stop after the
  // signal: 0 = none; else a rank still not done after that many seconds exits
  // (kExitPreempted, the previous checkpoint the newest complete one).
  PreemptSignal preempt_signal = PreemptSignal::kTerm;
  double preempt_save_timeout_s = 0.0;
  // A safetensors file of model weights (a dtrain checkpoint, or a PyTorch state_dict saved with
  // safetensors under the same names) that a fresh run starts from instead of its random
  // initialisation ("" = none): train/init_from.h. A resume loads its checkpoint instead.
  std::string init_from;
  CheckpointConfig checkpoint;
};

struct TlsConfig {
  std::string cert;  // PEM certificate of this rank
  std::string key;   // PEM private key
  std::string ca;    // PEM CA that signed every rank's certificate (mutual TLS)
  bool enabled() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

struct DdpConfig {
  // Gradient bucket size in MiB: a bucket's all-reduce starts as soon as backward has produced
  // all its gradients, overlapping communication with the rest of backward. > 0.
  double bucket_mb = 1.0;
};

struct LocalSgdConfig {
  int64_t sync_every = 8;             // H: local optimizer steps between parameter averages, >= 1
  bool sync_optimizer_state = false;  // also average momentum / Adam moments at each sync
  // Outer optimizer (DiLoCo): the averaged change since the last sync is a pseudo-gradient
  // applied with Nesterov momentum. outer_lr 0 = plain averaging.
  double outer_lr = 0.0;        // >= 0
  double outer_momentum = 0.9;  // in [0, 1)
};

// Sharded data parallel, strategy fsdp (zero3): parameters are sharded per unit, a unit being a
// group of consecutive layers that is all-gathered before its forward and backward.
struct FsdpConfig {
  FsdpUnit unit = FsdpUnit::kLayer;   // layer: layers_per_unit layers with parameters | model: one
  int64_t layers_per_unit = 1;        // >= 1, with unit: layer
  bool reshard_after_forward = true;  // free gathered parameters after forward, gather again
};

// Tensor parallel (Megatron-LM, model.type gpt only): size T > 1 splits every transformer
// block's attention heads and MLP columns over T ranks (nn/tp_gpt.h); world_size = T x
// data-parallel replicas x pipeline stages, tensor ranks fastest (comm/rank_grid.h).
struct TensorParallelConfig {
  int64_t size = 1;  // T >= 1 (1: none); divides n_head, 4 n_embd and the vocabulary 256
};

// Pipeline parallel: stages > 1 (or strategy pipeline, an alias of ddp with a pipeline whose
// stages default to 2) splits the model into stages; world_size = stages x data-parallel
// replicas, and distributed.strategy runs on the data axis of each stage.
struct PipelineConfig {
  int64_t stages = 1;         // S >= 1 (1: no pipeline), at most the model's Linear layers
  int64_t micro_batches = 4;  // M >= 1 per optimizer step (fewer when a batch has fewer rows)
  PipelineSchedule schedule = PipelineSchedule::k1f1b;
  PipelinePartition partition = PipelinePartition::kBalanced;  // uniform: layer count
  bool activation_checkpointing = false;  // keep stage inputs only, recompute in backward
};

struct CompressionConfig {
  CompressionType type = CompressionType::kNone;
  double ratio = 0.01;         // topk: fraction of gradient entries sent, in (0, 1]
  int64_t rank = 4;            // powersgd: rank of the low-rank factors, >= 1
  bool error_feedback = true;  // add what compression dropped to the next step's gradient
};

struct DistributedConfig {
  Backend backend = Backend::kInproc;
  // Ranks. With backend grpc the launcher's environment (RANK, WORLD_SIZE, ...) overrides it.
  int64_t world_size = 1;  // >= 1
  // "zero3" is read as fsdp; pipeline is ddp with distributed.pipeline, stages 2 unless given
  StrategyKind strategy = StrategyKind::kDdp;
  double timeout_s = 300.0;  // deadline of every collective and receive, > 0
  // gRPC: a peer not heard from for this long (heartbeats every heartbeat_s / 3) is declared
  // frozen or unreachable, > 0. Per host: not in the config hash.
  double heartbeat_s = 10.0;
  double rendezvous_timeout_s = 120.0;  // how long rank 0 waits for every rank to join, > 0
  std::string token_file;               // job token file (DTRAIN_JOB_TOKEN takes precedence)
  // Listen address of this rank's gRPC server: "" = loopback when MASTER_ADDR is a loopback
  // address (local launches), else all interfaces (0.0.0.0).
  std::string bind;
  // Same-host ranks of a gRPC job exchange tensors through shared memory (the gRPC streams stay
  // up for failure detection); false = gRPC streams only. Per host: not in the config hash.
  bool shm = true;
  bool tcp = true;  // data to peers not on shared memory over plain TCP (GrpcOptions::tcp)
  TlsConfig tls;    // optional: all three files, or none
  DdpConfig ddp;
  LocalSgdConfig local_sgd;
  CompressionConfig compression;  // ddp only
  FsdpConfig fsdp;
  PipelineConfig pipeline;
  TensorParallelConfig tensor_parallel;
};

struct RuntimeConfig {
  int64_t threads = 0;  // OpenBLAS threads; 0: all cores divided by the ranks on this machine
};

struct Config {
  int64_t seed = 42;
  ModelConfig model;
  DataConfig data;
  OptimizerConfig optimizer;
  TrainConfig train;
  DistributedConfig distributed;
  RuntimeConfig runtime;

  std::string source_path;  // the YAML file it came from ("" for in-memory)
  // Where each key given was set, by dotted path: "FILE:LINE:COL" of its value in the file, or
  // "--set TEXT" for an override. Keys left at their defaults are absent. For messages only.
  std::map<std::string, std::string> origins;
};

// Parses and validates. `overrides` are "key.path=value" strings (CLI --set); each value is parsed
// as YAML and replaces that key before validation. Relative data paths are resolved against the
// config file's folder. Throws UserError with FILE:LINE:COL and the key path for every problem a
// user can cause: YAML syntax, unknown keys (with a "did you mean" suggestion), wrong types,
// out-of-range or contradictory values. Files are not opened here (the data loader does).
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// Same from YAML text; `name` is used in messages in place of a file name.
Config parse_config(const std::string& yaml_text, const std::string& name,
                    const std::vector<std::string>& overrides = {});

// Canonical JSON of every field (defaults included). Stable across runs of the same dtrain.
nlohmann::json config_to_json(const Config& c);
// FNV-1a of the canonical JSON, minus fields that may differ between ranks or resumes without
// changing the math (train.epochs, train.max_steps, logging and checkpoint cadence, threads,
// and the per-host distributed settings: timeouts, token_file, bind, tls).
std::string config_hash(const Config& c);
// What config_hash hashes: config_to_json without the keys declared not_hashed (per-host
// settings, cadence), so two configs with equal hashes have equal hashed_config_json.
nlohmann::json hashed_config_json(const Config& c);

// The input files a config names (data files, token file, TLS files): each non-empty path key
// with its (resolved) path, in config order; of a path list each entry but the glob patterns
// (the data loader expands those and reports a pattern that matches nothing).
std::vector<std::pair<std::string, std::string>> config_input_files(const Config& c);

// Checks, without reading them, that every input file of config_input_files exists and is a
// readable regular file. Throws UserError "WHERE: KEY: 'PATH' does not exist" (WHERE as in
// Config::origins) for the first that is not. `without_training_files`: data.train's are not
// checked (dtrain eval and predict with data.test read them only when they are there).
// `training`: false for commands that do not train (eval, predict), which need no
// train.init_from.
void check_input_files(const Config& c, bool without_training_files = false, bool training = true);

}  // namespace dtrain
