// The memory a run, an evaluation or a bench needs, estimated before anything is allocated, and
// the refusals when this process cannot hold it (trainer.h declares them: check_training_memory,
// check_eval_memory, require_address_space, training_state_floats, the activation estimates).
#include <algorithm>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "optim/optimizer.h"
#include "tensor/blas.h"
#include "train/compression.h"
#include "train/sharding.h"
#include "train/trainer.h"
#include "util/check.h"
#include "util/fs.h"

namespace dtrain {

namespace {

// The optimizer's state buffers per parameter (SGD momentum 1, Adam 2, plain SGD 0).
double optimizer_state_buffers(const Config& cfg) {
  return static_cast<double>(make_optimizer(cfg.optimizer, 0, 0)->state_names().size());
}

}  // namespace

double training_state_floats(const Config& cfg, double n, int replicas, double unit) {
  const double W = std::max(1, replicas);
  if (unit <= 0 || unit > n) unit = n;
  double k = optimizer_state_buffers(cfg);
  const StrategyKind s = cfg.distributed.strategy;
  const CompressionConfig& cc = cfg.distributed.compression;
  // (ddp builds its compressor at any world size; Local SGD only with replicas to average)
  const bool compress =
      cc.type != CompressionType::kNone && (s != StrategyKind::kLocalSgd || W > 1);
  if (s == StrategyKind::kLocalSgd && (cfg.distributed.local_sgd.outer_lr > 0 || compress))
    k += 1;  // the anchor (the parameters at the last synchronisation)
  if (s == StrategyKind::kLocalSgd && cfg.distributed.local_sgd.outer_lr > 0)
    k += 1;                                              // DiLoCo's outer momentum
  if (s == StrategyKind::kLocalSgd && compress) k += 1;  // the delta it compresses
  double floats = s == StrategyKind::kZero1   ? 2 * n + k * n / W
                  : s == StrategyKind::kZero2 ? n + (1 + k) * n / W
                  : s == StrategyKind::kFsdp  ? (2 + k) * n / W
                                              : (2 + k) * n;
  // zero2 and fsdp during backward (at any world size: one replica runs the same code): the
  // full gradients of the unit computing and of the reduce-scatters in flight
  // (ShardedState::kUnitsInFlight); fsdp also the gathered parameters of the unit computing and
  // the one prefetched -- or of every unit, which stays gathered until the step's last backward
  // without reshard_after_forward.
  constexpr double kUnitGrads = ShardedState::kUnitsInFlight + 1, kGatheredUnits = 2;
  if (s == StrategyKind::kZero2 || s == StrategyKind::kFsdp)
    floats += std::min(kUnitGrads * unit, n);
  if (s == StrategyKind::kFsdp)
    floats += cfg.distributed.fsdp.reshard_after_forward ? std::min(kGatheredUnits * unit, n) : n;
  // Compression's error-feedback residual (one value per gradient), and under train.nonfinite
  // skip the copy of it kept through each step to be put back if the step is skipped (the loop's
  // reducer_before; Local SGD compresses after the verdict and keeps none). PowerSGD's factors
  // are a rank-r sliver of that and not counted.
  if (compress && cc.error_feedback) {
    floats += n;
    if (cfg.train.nonfinite == Nonfinite::kSkip && s != StrategyKind::kLocalSgd) floats += n;
  }
  // The elementwise compressors' buffers (GradCompressor): the value compressed and this rank's
  // decoding (n each), every rank's message (W of them: compressed_message_bytes) and, for topk,
  // the selection order (n int64s).
  if (compress && cc.type != CompressionType::kPowersgd) {
    floats += 2 * n;
    floats += W * static_cast<double>(compressed_message_bytes(cc, static_cast<int64_t>(n))) / 4;
    if (cc.type == CompressionType::kTopk) floats += 2 * n;
  }
  return floats;
}

namespace {

const char* task_name(MemoryTask task) {
  switch (task) {
    case MemoryTask::kTraining:
      return "training";
    case MemoryTask::kEvaluation:
      return "evaluation";
    case MemoryTask::kGeneration:
      return "generation";
    case MemoryTask::kBench:
      return "the bench";
  }
  return "?";
}

const char* task_state(MemoryTask task) {
  switch (task) {
    case MemoryTask::kTraining:
      return "parameters, gradients and optimizer state";
    case MemoryTask::kEvaluation:
    case MemoryTask::kGeneration:
      return "the parameters and the checkpoint's values as they load";
    case MemoryTask::kBench:
      return "parameters, gradients and the replay's copies of the step's operands";
  }
  return "?";
}

}  // namespace

void require_address_space(double state, double acts, const std::string& batch, int here,
                           int threads, MemoryTask task) {
  // Under an address-space limit (ulimit -v) the rest must be mappable too: OpenBLAS's buffers
  // (128 MiB per BLAS thread of each rank, mapped at first use; OpenBLAS retries a failed map
  // forever, so a run past the limit spun instead of failing), the malloc arena of its worker
  // thread (64 MiB of address space, new then; the ranks' own exist already) and 32 MiB of
  // slack. Probed now, by reserving that much. (Measured without the probe: 1 rank hung at
  // 0.42 GB and ran at 0.45, 4 ranks hung at 1.0 and ran at 1.3.)
  const double mib = 1024.0 * 1024.0, gib = 1024.0 * mib;
  const double reserve = (here * threads * 128.0 + 64.0 + 32.0) * mib;
  if (address_space_allows(static_cast<int64_t>(std::min(state + acts + reserve, 0x1p62)))) return;
  const std::string model_part =
      state + acts > 0
          ? fmt::format("{:.2f} GiB for {}, {:.2f} GiB for the activations of {}, and ",
                        state / gib, task_state(task), acts / gib, batch)
          : std::string();
  throw UserError(fmt::format(
      "this process's address-space limit (ulimit -v: {:.0f} MiB, {:.0f} MiB of it in use) "
      "leaves less than the {:.2f} GiB {} needs: {}{:.0f} MiB for OpenBLAS (128 MiB per "
      "BLAS thread of each of the {} rank(s) in this process, {} thread(s) each, and its "
      "worker's heap); raise the limit or use a smaller model or batch",
      static_cast<double>(address_space_limit_bytes()) / mib,
      static_cast<double>(address_space_used_bytes()) / mib, (state + acts + reserve) / gib,
      task_name(task), model_part, reserve / mib, here, threads));
}

int run_blas_threads(const Config& cfg, int ranks_on_machine) {
  return cfg.runtime.threads > 0 ? static_cast<int>(cfg.runtime.threads)
                                 : std::max(1, hardware_cores() / std::max(1, ranks_on_machine));
}

double activation_values_per_sample(const Model& model, size_t first, size_t last, bool eval) {
  double v = 0;
  for (size_t i = first; i < last; ++i) {
    const Layer& l = model.layer(i);
    v += static_cast<double>(l.in_features() + l.out_features()) +
         (eval ? l.eval_values_per_sample() : l.state_values_per_sample());
  }
  return v;
}

double scratch_values(const Model& model, size_t first, size_t last) {
  double v = 0;
  for (size_t i = first; i < last; ++i) v += model.layer(i).scratch_values();
  return v;
}

namespace {

// The batch's rows: the configured size, or fewer when the data holds fewer (rows >= 0).
int64_t batch_rows(int64_t configured, int64_t rows) {
  return rows >= 0 ? std::min(configured, rows) : configured;
}

// The keys that set a model's size, by model type.
const char* size_keys(const Config& cfg) {
  const ModelType type = cfg.model.type;
  return type == ModelType::kGpt                     ? "model.n_layer, n_embd, block_size"
         : type == ModelType::kSequential            ? "model.layers"
         : cfg.model.complexity != Complexity::kNone ? "model.complexity"
                                                     : "model.hidden";
}

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The most parameters one zero2/fsdp unit of layers [first, last) can hold: a zero2 unit is a
// gradient bucket (at most bucket_mb, or one layer larger than that); an fsdp unit is
// layers_per_unit layers, or the whole range (unit: model).
double largest_unit(const Config& cfg, const Model& model, size_t first, size_t last) {
  double layer = 0;
  for (size_t i = first; i < last; ++i)
    layer = std::max(layer, static_cast<double>(model.layer_end(i) - model.layer_begin(i)));
  const double range =
      first < last ? static_cast<double>(model.layer_end(last - 1) - model.layer_begin(first))
                   : 0.0;
  if (cfg.distributed.strategy == StrategyKind::kZero2)
    return std::max(layer, static_cast<double>(bucket_cap_floats(cfg.distributed.ddp.bucket_mb)));
  if (cfg.distributed.fsdp.unit == FsdpUnit::kModel) return range;
  return static_cast<double>(cfg.distributed.fsdp.layers_per_unit) * layer;
}

}  // namespace

void check_training_memory(const Config& cfg, const Model& model, const MemoryPlan& plan) {
  int64_t avail = available_memory_bytes();
  if (avail < 0) return;
  // The job's other rank processes on this machine hold about as much each (their own stage
  // under a pipeline: an estimate), and each saw all of the machine's available memory as it
  // started: this process's share is what it may count on.
  const int procs = std::max(1, plan.processes_here);
  // (read when the process started: a rank that checks after its siblings allocated would
  // count their memory twice)
  const int64_t machine = procs == 1                    ? -1
                          : plan.machine_available >= 0 ? plan.machine_available
                                                        : machine_memory_available_bytes();
  const bool shared = machine >= 0 && machine / procs < avail;
  if (shared) avail = machine / procs;
  const double k = optimizer_state_buffers(cfg);
  const int per_stage = plan.ranks_here;
  const int here = per_stage * static_cast<int>(plan.stages.size());
  const int64_t train_batch = batch_rows(cfg.data.batch_size, plan.train_rows);
  const int64_t eval_batch = batch_rows(cfg.data.eval_batch_size, plan.eval_rows);
  double state = 0, train_acts = 0, eval_acts = 0;
  for (const auto& [first, last] : plan.stages) {
    const int64_t begin = first < last ? model.layer_begin(first) : 0;
    const int64_t end = first < last ? model.layer_end(last - 1) : 0;
    state += 4.0 *
             training_state_floats(cfg, static_cast<double>(end - begin), plan.replicas,
                                   largest_unit(cfg, model, first, last)) *
             per_stage;
    // (the training and the evaluation executors each grow their own work buffers)
    const double scratch = 4.0 * scratch_values(model, first, last) * per_stage;
    train_acts += 4.0 * activation_values_per_sample(model, first, last, false) *
                      static_cast<double>(train_batch) * per_stage +
                  scratch;
    eval_acts += 4.0 * activation_values_per_sample(model, first, last, true) *
                     static_cast<double>(eval_batch) * per_stage +
                 scratch;
  }
  // Local SGD's per-rank optimizer state (train/replica_state.h): the process of rank 0 holds the
  // other ranks' (W - 1) k n floats while it writes a checkpoint, and while a resume sends them
  // (in a pipeline: each stage's first replica its stage's others' while it writes, rank 0 all
  // stages' while a resume sends them).
  const bool own_states = cfg.distributed.strategy == StrategyKind::kLocalSgd &&
                          plan.replicas > 1 && !cfg.distributed.local_sgd.sync_optimizer_state;
  if (own_states && plan.gathered_share > 0)
    state += 4.0 * k * static_cast<double>(plan.replicas - 1) *
             static_cast<double>(model.param_count()) * plan.gathered_share;
  if (own_states && plan.stage_lead)
    for (const auto& [first, last] : plan.stages)
      if (first < last)
        state += 4.0 * k * static_cast<double>(plan.replicas - 1) *
                 static_cast<double>(model.layer_end(last - 1) - model.layer_begin(first));
  if (plan.resume)
    state +=
        4.0 * (1 + k) *
        static_cast<double>(plan.resume_params >= 0 ? plan.resume_params : model.param_count()) *
        here;
  // An evaluation runs with the training batch's activations still held (the executors keep
  // them from step to step): both count.
  // A GPT's activations grow with its context (attention's with its square): named with it.
  const std::string positions =
      cfg.model.type == ModelType::kGpt
          ? fmt::format(" of {} positions each (model.block_size)", cfg.model.block_size)
          : std::string();
  const std::string train_what =
      fmt::format("a batch of {} (data.batch_size){}", train_batch, positions);
  const std::string eval_what =
      fmt::format("an evaluation batch of {} (data.eval_batch_size){}", eval_batch, positions);
  if (state + train_acts + eval_acts <= static_cast<double>(avail)) {
    if (plan.blas_threads > 0)
      require_address_space(state, train_acts + eval_acts,
                            eval_acts > 0 ? train_what + " and " + eval_what : train_what, here,
                            plan.blas_threads);
    return;
  }
  // Under tensor parallelism `model` is one tensor rank's slice.
  const int64_t tp = cfg.distributed.tensor_parallel.size;
  const std::string slice =
      tp > 1 ? fmt::format(" in each of its {} tensor-parallel slices", tp) : std::string();
  // Training alone does not fit: the model, the batch or the layout must change. Else only the
  // evaluation batch on top does.
  const bool training_fits = state + train_acts <= static_cast<double>(avail);
  const std::string acts_text =
      training_fits
          ? fmt::format(
                "{:.1f} GiB for the activations of {} and {:.1f} GiB for the activations "
                "of {}, held at once while it evaluates",
                train_acts / kGiB, train_what, eval_acts / kGiB, eval_what)
          : fmt::format("{:.1f} GiB for the activations of {}", train_acts / kGiB, train_what);
  throw UserError(fmt::format(
      "the model has {} parameters{} ({}): training needs about {:.1f} GiB for parameters, "
      "gradients and optimizer state and {} ({} {} rank(s) in this process, strategy {}), more "
      "than the {:.1f} GiB {}; {}",
      model.distinct_param_count(), slice, size_keys(cfg), state / kGiB, acts_text, here,
      to_string(cfg.distributed.backend), to_string(cfg.distributed.strategy),
      static_cast<double>(avail) / kGiB,
      shared ? fmt::format("that is this process's share of the {:.1f} GiB available on this "
                           "machine to its {} rank processes (LOCAL_WORLD_SIZE), which start "
                           "together",
                           static_cast<double>(machine) / kGiB, procs)
             : std::string("this process can allocate"),
      training_fits ? "lower data.eval_batch_size"
                    : "use a smaller model or batch, or more ranks with a sharded strategy (fsdp) "
                      "or a pipeline"));
}

void check_eval_memory(const Config& cfg, const Model& model, int64_t rows, bool generate) {
  const int64_t avail = available_memory_bytes();
  if (avail < 0) return;
  // The parameters, and the checkpoint's values read beside them while they load (its optimizer
  // state too: the config's optimizer keeps k values per parameter).
  const double k = optimizer_state_buffers(cfg);
  const double params = (2.0 + k) * 4.0 * static_cast<double>(model.param_count());
  const int64_t batch = generate ? 1 : batch_rows(cfg.data.eval_batch_size, rows);
  // (scratch: conv2d's im2col block, as large as a batch's activations for wide convolutions)
  const size_t layers = model.num_layers();
  const double acts =
      4.0 * (activation_values_per_sample(model, 0, layers, true) * static_cast<double>(batch) +
             scratch_values(model, 0, layers));
  const std::string what =
      generate ? fmt::format("one sequence of model.block_size = {}", cfg.model.block_size)
               : fmt::format("an evaluation batch of {} (data.eval_batch_size)", batch);
  if (params + acts <= static_cast<double>(avail)) {
    // (OpenBLAS's buffers under ulimit -v: eval and predict spun at its first call past them)
    require_address_space(params, acts, what, 1, run_blas_threads(cfg, 1),
                          generate ? MemoryTask::kGeneration : MemoryTask::kEvaluation);
    return;
  }
  throw UserError(fmt::format(
      "the model has {} parameters ({}): {:.1f} GiB for them as they load and {:.1f} GiB for the "
      "activations of {} are more than the {:.1f} GiB this process can allocate; {}",
      model.distinct_param_count(), size_keys(cfg), params / kGiB, acts / kGiB, what,
      static_cast<double>(avail) / kGiB,
      generate || batch <= 1 ? "use a smaller model" : "lower data.eval_batch_size"));
}

}  // namespace dtrain
