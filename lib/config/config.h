// The run configuration: plain structs with documented defaults. A YAML file is parsed and
// validated once (load_config) into a Config; nothing else in dtrain reads YAML. Every key is
// documented in README.md "Config reference"; keep the two in step.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace dtrain {

struct ModelConfig {
  std::string type = "mlp";  // only "mlp"
  // Preset that sets `hidden` (and nothing else): "" (none) | simple | medium | complex.
  //   simple: [128]   medium: [512, 512]   complex: [1024, 1024, 512, 256]
  // Giving both `complexity` and `hidden` is an error.
  std::string complexity;
  std::vector<int64_t> hidden = {512, 512};  // hidden layer widths, each >= 1; may be empty
  std::string activation = "relu";           // relu | gelu | tanh | sigmoid
  double dropout = 0.0;                      // after each hidden activation, in [0, 1)
  bool layer_norm = false;             // LayerNorm after each hidden Linear (before activation)
  std::string init = "auto";           // auto | kaiming | xavier (auto: kaiming for relu/gelu)
  std::string loss = "cross_entropy";  // cross_entropy | mse (mse on one-hot targets)
  int64_t input_features = 0;          // 0: inferred from the data
  int64_t num_classes = 0;             // 0: inferred from the data (max label + 1)
};

// One split's files. idx: images + labels. csv: path.
struct SplitFiles {
  std::string images;
  std::string labels;
  std::string path;
  bool empty() const { return images.empty() && labels.empty() && path.empty(); }
};

struct CsvOptions {
  // "auto": a first row with any non-numeric cell is a header. "true" | "false" force it.
  std::string header = "auto";
  // Label column: a header name, or a 0-based index as text; "" means the last column.
  std::string label_column;
  char delimiter = ',';
};

struct SyntheticOptions {
  int64_t samples = 10000;  // total, split by data.test_fraction (default 0.2 for synthetic)
  int64_t features = 32;
  int64_t classes = 4;
  double noise = 0.5;  // std-dev of the Gaussian around each class centre (centres ~ N(0,1))
  int64_t seed = -1;   // -1: the top-level seed
};

struct DataConfig {
  std::string format = "idx";  // idx | csv | synthetic
  SplitFiles train;
  SplitFiles test;  // optional: without it, test_fraction of train is held out
  // Fraction of the training data held out as the test set when `test` is not given. -1 means
  // the default: 0 for idx/csv (no test set), 0.2 for synthetic.
  double test_fraction = -1.0;
  int64_t batch_size = 128;  // per rank
  int64_t eval_batch_size = 1000;
  bool shuffle = true;
  bool drop_last = false;  // drop the last short global batch of each epoch
  // auto: scale for idx, standardize for csv/synthetic. scale: idx divides by 255; csv/synthetic
  // map each feature's train min..max to 0..1. standardize: (x - mean) / std per feature, train
  // statistics. none: raw values.
  std::string normalize = "auto";
  CsvOptions csv;
  SyntheticOptions synthetic;
};

struct ScheduleConfig {
  std::string type = "constant";  // constant | step | cosine
  int64_t warmup_steps = 0;       // linear warmup from lr/warmup_steps to lr over these steps
  int64_t step_size = 1000;       // step: multiply by gamma every step_size steps
  double gamma = 0.1;
  double min_lr = 0.0;  // cosine: final lr
};

struct OptimizerConfig {
  std::string type = "sgd";       // sgd | adam | adamw
  double lr = 0.01;               // > 0
  double momentum = 0.0;          // sgd, in [0, 1)
  bool nesterov = false;          // sgd, needs momentum > 0
  double weight_decay = 0.0;      // sgd/adam: L2 added to the gradient; adamw: decoupled
  double beta1 = 0.9;             // adam/adamw, in [0, 1)
  double beta2 = 0.999;           // adam/adamw, in [0, 1)
  double eps = 1e-8;              // adam/adamw, > 0
  std::string scale_lr = "none";  // none | linear (lr *= world_size)
  double clip_grad_norm = 0.0;    // 0: off; else clip the global gradient L2 norm to this
  ScheduleConfig schedule;
};

struct CheckpointConfig {
  int64_t every_steps = 0;  // 0: only at the end of training
  int64_t keep_last = 3;    // newest step-<N>.safetensors files kept; >= 1
};

struct TrainConfig {
  int64_t epochs = 10;           // >= 0
  int64_t max_steps = 0;         // 0: no limit; else stop after this many optimizer steps
  int64_t log_every = 100;       // steps between train records in metrics.jsonl (>= 1)
  int64_t eval_every = 0;        // 0: evaluate at the end of each epoch; else every N steps too
  int64_t grad_accum_steps = 1;  // micro-batches per optimizer step (>= 1)
  // A non-finite loss or gradient: abort (name the step and the first tensor) | skip (drop the
  // step on every rank, count it).
  std::string nonfinite = "abort";
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
  std::string unit = "layer";   // layer: layers_per_unit layers with parameters | model: one unit
  int64_t layers_per_unit = 1;  // >= 1, with unit: layer
  bool reshard_after_forward = true;  // free gathered parameters after forward, gather again
};

// Pipeline parallel: stages > 1 (or strategy pipeline, an alias of ddp with a pipeline whose
// stages default to 2) splits the model into stages; world_size = stages x data-parallel
// replicas, and distributed.strategy runs on the data axis of each stage.
struct PipelineConfig {
  int64_t stages = 1;             // S >= 1 (1: no pipeline), at most the model's Linear layers
  int64_t micro_batches = 4;      // M >= 1 per optimizer step (fewer when a batch has fewer rows)
  std::string schedule = "1f1b";  // gpipe | 1f1b
  std::string partition = "balanced";     // uniform (layer count) | balanced (estimated FLOPs)
  bool activation_checkpointing = false;  // keep stage inputs only, recompute in backward
};

struct CompressionConfig {
  std::string type = "none";   // none | fp16 | bf16 | int8 | topk | powersgd
  double ratio = 0.01;         // topk: fraction of gradient entries sent, in (0, 1]
  int64_t rank = 4;            // powersgd: rank of the low-rank factors, >= 1
  bool error_feedback = true;  // add what compression dropped to the next step's gradient
};

struct DistributedConfig {
  std::string backend = "inproc";  // inproc | grpc
  // Ranks. With backend grpc the launcher's environment (RANK, WORLD_SIZE, ...) overrides it.
  int64_t world_size = 1;  // >= 1
  // ddp | local_sgd | zero1 | zero2 | fsdp ("zero3" is read as fsdp) | pipeline (ddp with
  // distributed.pipeline, stages 2 unless given)
  std::string strategy = "ddp";
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
  TlsConfig tls;  // optional: all three files, or none
  DdpConfig ddp;
  LocalSgdConfig local_sgd;
  CompressionConfig compression;  // ddp only
  FsdpConfig fsdp;
  PipelineConfig pipeline;
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

// The input files a config names (data files, token file, TLS files): each non-empty path key
// with its (resolved) path, in config order.
std::vector<std::pair<std::string, std::string>> config_input_files(const Config& c);

// Checks, without reading them, that every input file of config_input_files exists and is a
// readable regular file. Throws UserError "WHERE: KEY: 'PATH' does not exist" (WHERE as in
// Config::origins) for the first that is not.
void check_input_files(const Config& c);

}  // namespace dtrain
