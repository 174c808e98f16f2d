// `dtrain verify`: does a distributed configuration train the same model as one process?
//
// The reference is derived from the layout (plan_reference): one rank, the same model, data,
// seed and optimizer, and the layout's global batch (data-parallel replicas x data.batch_size,
// gradient accumulation unchanged), the learning rate after optimizer.scale_lr. Two checks:
//   1. teacher forcing: for each step k = 1..N, both sides start from the reference's state
//      after k - 1 steps (parameters, optimizer state, sampler position: the reference's
//      checkpoint, which the layout resumes from, resharding it) and take one step on the same
//      global batch; the difference of the two updates relative to the reference update's size
//      isolates each step's error, so float32 noise cannot compound, and names the first step,
//      tensor and element that disagree;
//   2. free running: the layout's own N steps against the reference's, per-tensor relative
//      difference of the end states and both loss curves.
// Both sides run the real training code (run_training, or dtrain run ranks over gRPC started as
// dtrain launch starts them), writing a checkpoint every step into the work folder.
//
// What a layout claims decides the verdict: ddp, zero1, zero2, fsdp and pipelines claim
// equality (within `tolerance`); Local SGD with H = 1, plain averaging and SGD claims it too
// (averaging SGD steps from equal parameters is DDP's step: the update is linear in the
// gradient); Local SGD otherwise and any compression are lossy by design: their divergence is
// measured and reported as expected, never as a failure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/compare.h"
#include "config/config.h"
#include "util/fault.h"
#include "util/interrupt.h"

namespace dtrain {

struct ReferencePlan {
  Config reference;        // the single-process config (train.* cadence set by run_verify)
  int64_t replicas = 1;    // the layout's data-parallel replicas
  bool exact = true;       // the layout claims equality with the reference
  std::string divergence;  // !exact: why it diverges by design
  // Teacher forcing needs a checkpoint after every step that holds all the layout's state; Local
  // SGD with H > 1 holds different parameters on its replicas between synchronisations, and
  // DiLoCo's outer momentum is state no reference checkpoint has, so these are free-running only
  // (teacher_forcing_skipped says why, for the report).
  bool teacher_forcing = true;
  std::string teacher_forcing_skipped;
  int64_t step_multiple = 1;  // N is rounded up to a multiple of this (Local SGD's H)
  // --set overrides for the layout's runs after the user's, that change nothing it computes (Local
  // SGD on one replica never averages: sync_every 1, so a checkpoint after every step is valid).
  std::vector<std::string> layout_sets;
  // Non-empty: the layout's optimizer state differs from one process's by design while its
  // parameters do not (Local SGD H = 1 with per-replica momentum): only parameters are compared,
  // and this says why.
  std::string unchecked_state;
  // > 0: the layout rounds each parameter to float32 once more than one process does (Local SGD
  // H = 1 averages the replicas' parameters, not their gradients), about an ulp of its value,
  // which next to an update of 1e-5 of it is far above the tolerance: each step's comparison
  // allows this many ulps of each value first.
  double slack_ulps = 0.0;
  // Non-empty (set by run_verify once it knows the data): the free run's end state differs by
  // design although each step agrees (see run_verify); this says why, and the verdict is the
  // teacher-forced steps'.
  std::string free_run_note;
  std::string layout_text, reference_text;  // one line each, for the report
};
// UserError for a layout with no single-process equivalent.
ReferencePlan plan_reference(const Config& layout);

// The default tolerance on relative differences, by optimizer. SGD: float32 summation order
// differs between layouts, measured at ~1e-7..1e-6 of an update on MLPs and up to 4.9e-5 on a
// small GPT; 1e-3 leaves a margin of 20 over that yet catches a gradient off by any factor that
// matters (0.3 to 0.7 for one rank's doubled). Adam/AdamW divide by sqrt(v) + eps:
// near eps, summation-order noise in a gradient is amplified (measured on Fashion-MNIST: 7e-3
// relative between two reduction orders where SGD gives 3e-7), so 5e-2.
double default_tolerance(const Config& layout);

// The end state of a layout whose every step agrees passes when it drifted at most this many
// times as far as one process drifts from itself under another summation order (a live-run state
// bug drifts by the size of an update from its first step on, orders of magnitude more).
inline constexpr double kDriftFactor = 10.0;

struct VerifyOptions {
  std::string config_path;
  std::vector<std::string> sets;    // the user's --set overrides of the layout
  int64_t steps = 8;                // N >= 1
  std::optional<double> tolerance;  // unset: default_tolerance; 0 asks for exact equality
  bool grpc = false;                // layout ranks as processes over gRPC (dtrain launch's way)
  std::string self_exe;             // grpc: the dtrain binary
  int master_port = 0;              // grpc: rank 0's rendezvous port (0: a free one per run)
  std::string work_dir;             // the runs; "" = a temporary folder, removed at the end
  // DTRAIN_FAULT for the layout's in-process runs (gRPC ranks read the variable themselves); the
  // reference never gets faults.
  std::vector<Fault> faults;
  // Set (dtrain verify: its InterruptGuard's): a signal stops the run under way softly, and
  // run_verify then throws VerifyInterrupted, after removing a temporary work folder.
  const StopRequest* stop = nullptr;
};

// Thrown by run_verify when a signal stopped it: nothing was verified.
class VerifyInterrupted : public std::runtime_error {
 public:
  explicit VerifyInterrupted(int sig)
      : std::runtime_error(std::string("verify: interrupted by ") + interrupt_signal_name(sig) +
                           "; nothing was verified"),
        signal(sig) {}
  int signal;
};

struct ForcedStep {
  int64_t step = 0;
  double loss_reference = 0.0, loss_layout = 0.0;
  TensorDiff worst;  // the worst tensor of the step's update difference
};
struct LossPoint {
  int64_t step = 0;
  double reference = 0.0, layout = 0.0;
};

struct VerifyReport {
  ReferencePlan plan;
  int64_t steps = 0;
  double tolerance = 0.0;
  std::vector<ForcedStep> forced;     // empty when !plan.teacher_forcing
  std::vector<TensorDiff> end_state;  // per tensor, after end_step free-running steps
  // The free run's step compared: N, or the step before one that leaves one process's trajectory
  // by design (ReferencePlan::free_run_note); 0: none judged (the end state at step 1 is shown).
  int64_t end_step = 0;
  std::vector<LossPoint> losses;  // free running
  int64_t first_bad_step = 0;     // first forced step over tolerance; 0: none
  // Measured only when every forced step passed but the end state did not: the end-state
  // difference between one process and itself with each batch summed in noise_parts parts (the
  // batch's smallest prime factor; how much the dynamics amplify rounding over N steps; -1: a
  // batch of one row, or data.drop_last, which would drop other rows in parts). The end state then
  // passes within kDriftFactor times it.
  double noise_floor = 0.0;
  int64_t noise_parts = 0;
  std::string verdict;  // "pass" | "fail" | "diverges as expected"
  bool failed() const { return verdict == "fail"; }
};

// Runs both sides and compares. Throws UserError for bad input (config, options), and
// std::runtime_error when a run fails (its logs are kept and named).
VerifyReport run_verify(const VerifyOptions& o);

nlohmann::json report_json(const VerifyReport& r);
// The table and verdict as printed by dtrain verify.
std::string report_text(const VerifyReport& r);

}  // namespace dtrain
