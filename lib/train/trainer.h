// The training loop: data -> model -> optimizer -> metrics and checkpoints, for one process.
// Later strategies plug in at the gradient-synchronisation point; everything works on the flat
// parameter / gradient / state buffers of nn/model.h.
#pragma once

#include "train/run_dir.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "data/dataset.h"
#include "data/shared_splits.h"
#include "nn/model.h"
#include "util/fault.h"
#include "util/interrupt.h"
#include "util/rng.h"
#include "util/trace.h"

namespace dtrain {

struct RunOptions {
  std::string out_dir;  // where metrics.jsonl, summary.json, checkpoints/ go (created)
  std::string resume;   // "" (fresh), "auto" (RUN/checkpoints/latest if any), or a path
  // --overwrite: the run files out_dir holds (kRunFiles, checkpoints/) are deleted as training
  // starts (start_run_dir), once the data, the model and the memory check have passed: a run
  // refused for bad input leaves the old run as it was.
  bool overwrite = false;
  bool progress = false;      // draw a progress bar on stderr (interactive terminals)
  std::vector<Fault> faults;  // DTRAIN_FAULT (util/fault.h); empty in normal runs
  // --trace: Chrome trace-event file of the run. Every rank writes rank_trace_path(trace, r)
  // (util/trace.h); rank 0 merges them into `trace` at the end. "" = no tracing.
  std::string trace;
  // Safe interrupts (util/interrupt.h, train/stop.h): when set, the ranks stop after the step at
  // which any of them has seen a request (Local SGD: at the next synchronisation), checkpoint,
  // and return a summary with status "interrupted" and "interrupt_signal". nullptr: never stop
  // early. Not owned; must outlive the run.
  const StopRequest* stop = nullptr;
  // The run is what this process exists for (dtrain run): once its results are saved, the loop
  // sets stop->done_code, so a second signal exits with the run's code. False for runs that are
  // a step of something larger (dtrain verify's), whose process goes on after them.
  bool final_run = false;
  // false: no evaluation at all (dtrain verify compares parameters; the summary then has no test
  // figures).
  bool evaluate = true;
  // false: no checkpoint at the end of training (`dtrain bench step`, whose folder goes right
  // after: a 50M-parameter model's final save wrote 643 MB, and failed on a small $TMPDIR).
  bool final_save = true;
  // The job's rank processes on this machine (LOCAL_WORLD_SIZE of a gRPC rank) and the machine's
  // available memory when this one started (-1: unknown), for the memory check
  // (MemoryPlan::processes_here, machine_available).
  int processes_here = 1;
  int64_t machine_available = -1;
  // The data, loaded once for every in-process rank of the run (run_training sets it for its
  // ranks); nullptr: the rank loads its own. Not owned; must outlive the run.
  SharedSplits* data = nullptr;
  // Benchmarks (`dtrain bench step`): called by every rank on its own thread after each optimizer
  // step with (rank, step, the step's seconds as train_s counts them, its micro-batches: up to
  // train.grad_accum_steps, fewer at an epoch's end); its own time is not counted in train_s.
  // Must be thread-safe when several in-process ranks run. Empty: not called.
  std::function<void(int rank, int64_t step, double step_s, int64_t micro_batches)> after_step;
};

// Trains per `cfg` with the in-process backend (world_size ranks as threads of this process)
// and returns summary.json's content (also written to out_dir). Throws UserError for bad
// data/checkpoints and std::exception for runtime failures (the first failing rank's error).
nlohmann::json run_training(const Config& cfg, const RunOptions& opts);

// The step schedule shared by every training loop, for `replicas` data-parallel replicas of
// batch data.batch_size each: global batches per epoch (UserError when there are none),
// micro-batches per optimizer step (train.grad_accum_steps), steps per epoch, total steps
// (INT64_MAX when neither epochs nor max_steps bound them) and the base learning rate after
// optimizer.scale_lr.
struct StepPlan {
  int64_t batches_per_epoch = 0, accum = 1, steps_per_epoch = 0, total_steps = 0;
  double base_lr = 0.0;
};
StepPlan plan_steps(const Config& cfg, int64_t batches_per_epoch, int64_t train_rows, int replicas);

// Where a resumed run continues. resume_full_state resolves opts.resume (relative to
// ckpt_dir for "auto"); rank 0 reads the checkpoint -- a file or a sharded folder, any strategy
// and world size -- into the full-layout buffers `params` and `state` (param_count floats each)
// and broadcasts them, with the counters and every rank's training RNG state (set into `rng`).
// Collective. Not loaded: nothing changed, start fresh. comp (rank 0, when given) receives the
// checkpoint's compression state (compression_state.h restores it once the reducer exists).
struct ResumePoint {
  bool loaded = false;
  std::string from;  // the checkpoint's path (rank 0)
  int64_t step = 0, epoch = 0, batch = 0, optimizer_steps = 0;
  int64_t schedule_steps = 0;  // the checkpoint's schedule horizon; 0: not recorded
  int64_t global_batch = 0;    // samples per global batch of the saving run; 0: not known
  // Of the saving run (0: not known, no stored config): samples per optimizer step (global
  // batch x grad_accum_steps), the learning rate it trained at (after scale_lr, or the rate a
  // resume kept), and its optimizer.lr when scale_lr was linear (0: it was not).
  int64_t step_samples = 0;
  double base_lr = 0.0;
  double linear_lr = 0.0;
  std::string progress;    // rank 0: CheckpointMeta::progress_json ("" when not recorded)
  std::string normalizer;  // rank 0: CheckpointMeta::normalizer_json ("" when not recorded)
  // Rank 0: how many ranks of the saving run kept optimizer states of their own (Local SGD
  // without sync_optimizer_state, as its stored config says) that the checkpoint does not hold
  // (a dtrain before 2026-12-07 stored rank 0's alone); 0 when it holds them or there were none.
  int64_t lost_replica_states = 0;
};
ResumePoint resume_full_state(const Config& cfg, const RunOptions& opts, Communicator& comm,
                              const Model& model, const std::string& ckpt_dir,
                              const std::string& hash, float* params,
                              const std::vector<StateBuffer>& state, Rng& rng,
                              CompressionState* comp = nullptr, ReplicaState* replicas = nullptr);

// Every rank's training RNG state (dropout streams differ per rank) as the checkpoint stores
// it: Rng::to_string() of each rank in rank order, separated by ';', on rank 0 ("" elsewhere).
// Collective: the states travel as int64 words.
std::string gather_rng_states(Communicator& comm, const Rng& rng);

// Rank 0's start of a run in out_dir: locks ckpt_dir (OutDirLock::checkpoints_folder: held by
// the returned lock, which the caller keeps for the run; before --overwrite clears anything),
// creates it, removes what interrupted checkpoint writes left there (logged), writes config.json
// (a resumed run: after its checkpoint has loaded, write_run_config).
OutDirLock start_run_dir(const Config& cfg, const RunOptions& opts, const std::string& ckpt_dir);
// Writes the resolved config as out_dir/config.json (atomic).
void write_run_config(const Config& cfg, const std::string& out_dir);

// summary.json's interrupt keys for a run that ended after `stop_signal` (0: not interrupted):
// status, interrupted_by, interrupt_signal. Both training loops start their summary with them.
nlohmann::json interrupt_summary(int stop_signal);

// The step count the learning-rate schedule is laid out over: this run's total steps, or for a
// resumed run the horizon its checkpoint recorded, so that changing train.max_steps or
// train.epochs on resume continues the schedule the run started instead of restarting it
// (rank 0 logs both horizons when they differ).
int64_t schedule_horizon(const ResumePoint& rp, const StepPlan& plan, bool lead);

// Why a resumed run has nothing left to train ("" when it has): its checkpoint is at or past
// train.max_steps or train.epochs. `batch`: the checkpoint's place in its epoch in this run's
// global batches (TrainLoop::resumed_batch_index: rp.batch counts the writer's, which differ
// when the global batch changed). The loop then returns nothing_to_do_summary(), exit 0.
std::string nothing_left_reason(const Config& cfg, const ResumePoint& rp, const StepPlan& plan,
                                int64_t batch);
nlohmann::json nothing_to_do_summary(const std::string& why, const ResumePoint& rp);

// The --trace epilogue of a rank: writes its own trace file, waits for every rank (barrier), and
// rank 0 merges the per-rank files into opts.trace. No-op without --trace. Collective.
void finish_trace(const RunOptions& opts, Communicator& comm, const Tracer& tracer);

// Trains one rank of a job over `comm` (world size 1 included). Rank 0 writes the files and
// returns the summary; other ranks return their own counters. All ranks must call it with the
// same config (the distributed contract of communicator.h).
nlohmann::json train_rank(const Config& cfg, const RunOptions& opts, Communicator& comm);

// Model input/output sizes for `cfg` and loaded data: config values when set (checked against
// the data), else inferred. Throws UserError when they disagree.
struct ModelShape {
  int64_t in_features = 0;
  int64_t num_classes = 0;
  int64_t train_classes = 0;  // the training labels' max + 1 (0: text data, no labels)
  Shape sample;  // per-sample input shape ([1, 28, 28] for IDX images, [F] for CSV rows)
};
// speak: log its warnings (the data's labels); false for every rank of a job but rank 0.
// training: for a model about to be trained, which a label of data.test's above the training
// labels refuses (without model.num_classes); eval and predict take a checkpoint's width.
ModelShape resolve_model_shape(const Config& cfg, const DataSplits& data, bool speak = true,
                               bool training = false);

// The fp32 values one rank holds for n parameters under cfg's strategy over `replicas`
// data-parallel replicas: parameters, gradients and optimizer state (strategy.h's table);
// zero2/fsdp's unit gradients in flight and fsdp's gathered units, for units of at most `unit`
// parameters (0: n, one unit); Local SGD's anchor, outer momentum and compressed delta; and
// compression's buffers: the error-feedback residual and, under train.nonfinite skip, its
// per-step copy, and the elementwise compressors' work, decoding, messages and topk's order.
double training_state_floats(const Config& cfg, double n, int replicas, double unit = 0);

// summary.json's `format_version`: raised when a key changes meaning or goes away (added keys
// keep it).
inline constexpr int kSummaryFormatVersion = 1;

// What the ranks of one process hold, for check_training_memory.
struct MemoryPlan {
  // The layers [first, last) of each pipeline stage with ranks in this process: the rank's own
  // stage (one rank per process), or every stage (in-process ranks: they share the memory).
  std::vector<std::pair<size_t, size_t>> stages;
  int replicas = 1;    // data-parallel replicas (a sharded strategy's divisor)
  int ranks_here = 1;  // ranks of each of those stages in this process (replicas x tensor slices)
  // Processes of the job on this machine that each hold as much (gRPC ranks: LOCAL_WORLD_SIZE),
  // counted together against the machine's available memory: each rank alone sees all of it.
  int processes_here = 1;
  // The machine's available memory when this process started, before it or its siblings
  // allocated (-1: read it now): what the processes_here share.
  int64_t machine_available = -1;
  bool resume = false;  // a resume reads full-model copies
  // The part of what rank 0 gathers to checkpoint it (Local SGD's per-rank optimizer state)
  // that this process counts: all of it for rank 0's process alone (in-process ranks, or one
  // gRPC rank per machine; validate), a 1/processes_here share for each rank process on rank 0's
  // machine (they share its memory), nothing elsewhere.
  double gathered_share = 1.0;
  // A rank process (not in-process ranks, which the above counts whole) that is its stage's first
  // replica in a pipeline: under Local SGD with each replica's own state it holds its stage's
  // other replicas' while it writes a checkpoint (train/replica_state.h).
  bool stage_lead = false;
  // The parameters of those copies, -1: the model's. Tensor parallelism: the whole model's, not
  // the rank's slice (every rank reads the whole state, then keeps its shards).
  int64_t resume_params = -1;
  int blas_threads = 0;  // > 0: probe the address space (see below)
  // Rows of one batch at most, when the data is known (-1: data.batch_size, data.eval_batch_size):
  // a batch larger than the training set, or an evaluation batch larger than a rank's share of
  // the test set, holds only the rows there are. eval_rows 0: no evaluation.
  int64_t train_rows = -1;
  int64_t eval_rows = -1;
};

// Refuses (UserError, exit 2, with the numbers) a training run whose memory this process cannot
// allocate, before anything is: per rank, the fp32 parameters, gradients and optimizer state of
// the plan's layers that cfg's strategy holds over `replicas` data-parallel replicas (strategy.h's
// table), plus one training batch's activations (each layer's output, input
// gradient and saved state, Layer::state_values_per_sample: a pipeline stage's whole batch, as
// GPipe keeps it) and one evaluation batch's, held at once (output and
// Layer::eval_values_per_sample per row of data.eval_batch_size: an evaluation forward keeps
// every layer's output), times `ranks_here`
// (the in-process ranks of each stage), summed over the plan's stages (a pipeline's stages differ
// in size: each counts its own), plus the full-model copies a resume reads. The data is not counted
// (the CLI turns a failed allocation there into a clear message). Used by the training loop and by
// validate.
// Under an address-space limit (ulimit -v), when `blas_threads` > 0, the process must also be able
// to map what OpenBLAS maps at its first call (128 MiB per BLAS thread of each rank here, retried
// forever when the map fails): probed by reserving it. One rank per process probes (the probes of
// in-process ranks would count each other); blas_threads is what each rank runs with.
void check_training_memory(const Config& cfg, const Model& model, const MemoryPlan& plan);

// The same for dtrain eval and predict: the parameters (twice: the checkpoint's values are read
// beside them) and one evaluation batch of `rows` rows (min(data.eval_batch_size, the rows there
// are; -1: unknown)); for generate (`generate`), one sequence instead. Conv2d's im2col scratch
// counts, and under ulimit -v OpenBLAS's buffers for the config's BLAS threads
// (require_address_space): eval and predict spun forever at OpenBLAS's first call past them.
void check_eval_memory(const Config& cfg, const Model& model, int64_t rows, bool generate = false);

// What needs the memory require_address_space probes for; names its state in the refusal.
enum class MemoryTask {
  kTraining,    // state: parameters, gradients and optimizer state
  kEvaluation,  // state: the parameters and the checkpoint's values as they load
  kGeneration,  // the same, for one sequence
  kBench,       // state: parameters, gradients and the replay's copies of the step's operands
};

// Throws that refusal (UserError, with the numbers) when this process cannot map the state and
// activations plus OpenBLAS's buffers for `here` ranks of `threads` BLAS threads (ulimit -v).
// `batch` names the batch whose activations `acts` counts ("a batch of 128 (data.batch_size)").
void require_address_space(double state, double acts, const std::string& batch, int here,
                           int threads, MemoryTask task = MemoryTask::kTraining);

// 4-byte values per sample of layers [first, last): each layer's input and output plus what its
// state holds for training (backward's work included) or, `eval`, for an evaluation forward.
// The estimate check_training_memory, check_eval_memory and bench count activations with.
double activation_values_per_sample(const Model& model, size_t first, size_t last, bool eval);

// 4-byte values of layers [first, last)'s fixed-size work buffers (conv2d's im2col block).
double scratch_values(const Model& model, size_t first, size_t last);

// The OpenBLAS threads each rank of a run uses: runtime.threads, else the cores shared by the
// ranks on this machine (run_training's and run_grpc_rank's rule).
int run_blas_threads(const Config& cfg, int ranks_on_machine);

struct EvalResult {
  double loss = 0.0;      // mean per sample
  double accuracy = 0.0;  // fraction in [0, 1]
  int64_t samples = 0;
  // The first sample (row of d) whose output or loss is not finite, -1 when none: loss is then
  // not finite either.
  int64_t first_nonfinite = -1;
};
// Evaluates params on all rows of `d` in eval mode, in batches of `batch` rows.
EvalResult evaluate(const Model& model, const float* params, const Dataset& d, int64_t batch,
                    Loss loss);

}  // namespace dtrain
