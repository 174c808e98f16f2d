#include "train/verify.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <system_error>

#include "comm/rendezvous/master_addr.h"
#include "data/dataset.h"
#include "launch/launcher.h"
#include "train/trainer.h"
#include "util/check.h"
#include "util/enum_names.h"
#include "util/fault.h"
#include "util/fs.h"
#include "util/strings.h"

namespace dtrain {

namespace fs = std::filesystem;

namespace {

std::string lr_text(double lr) {
  return fmt::format("{:g}", lr);
}

// The train.* cadence both sides run with: N steps (epochs unbounded), a loss record and a
// checkpoint every `every` steps, all kept.
void set_cadence(TrainConfig& t, int64_t steps, int64_t every) {
  t.epochs = 0;
  t.max_steps = steps;
  t.log_every = 1;
  t.eval_every = 0;
  t.checkpoint.every_steps = every;
  t.checkpoint.keep_last = steps + 1;
}

std::vector<std::string> cadence_sets(int64_t steps, int64_t every) {
  return {"train.epochs=0",
          "train.max_steps=" + std::to_string(steps),
          "train.log_every=1",
          "train.eval_every=0",
          "train.checkpoint.every_steps=" + std::to_string(every),
          "train.checkpoint.keep_last=" + std::to_string(steps + 1)};
}

// Step -> loss of a run's train records.
std::map<int64_t, double> read_losses(const fs::path& run) {
  std::map<int64_t, double> out;
  std::ifstream in(run / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.value("kind", "") == "train" && j.contains("loss") &&
        j["loss"].is_number())
      out[j["step"].get<int64_t>()] = j["loss"].get<double>();
  }
  return out;
}

// A run's checkpoint of `step`: the file, or the sharded folder.
std::string checkpoint_of(const fs::path& run, int64_t step) {
  const fs::path dir = run / "checkpoints";
  const fs::path file = dir / checkpoint_file_name(step);
  std::error_code ec;
  if (fs::exists(file, ec)) return file.string();
  const fs::path folder = dir / sharded_checkpoint_name(step);
  if (fs::exists(folder / "manifest.json", ec)) return folder.string();
  throw std::runtime_error("verify: the run in " + run.string() + " wrote no checkpoint of step " +
                           std::to_string(step));
}

TensorMap params_only(TensorMap m) {
  for (auto it = m.begin(); it != m.end();)
    it = it->first.rfind("optim.", 0) == 0 || it->first.rfind("comp.", 0) == 0 ||
                 it->first.rfind("replica.", 0) == 0
             ? m.erase(it)
             : std::next(it);
  return m;
}

// The tensors of a state the verdict compares: all, or the parameters only (unchecked_state).
TensorMap compared(const ReferencePlan& plan, TensorMap m) {
  return plan.unchecked_state.empty() ? m : params_only(std::move(m));
}

// A layout run's failure, whose rank logs the message names (run_verify keeps them).
struct LayoutFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct LayoutRefused : UserError {
  using UserError::UserError;
};

// Runs one side. The reference always runs in this process (it is one rank); the layout runs
// in-process or as gRPC ranks started the way dtrain launch starts them.
class Runner {
 public:
  Runner(const VerifyOptions& o, const Config& layout, std::vector<Fault> faults,
         std::vector<std::string> extra_sets = {})
      : o_(o),
        world_(layout.distributed.world_size),
        faults_(std::move(faults)),
        extra_sets_(std::move(extra_sets)) {}

  void reference(const Config& cfg, const fs::path& out) const {
    fresh(out);
    RunOptions ro;
    ro.out_dir = out.string();
    ro.evaluate = false;
    ro.stop = o_.stop;
    run_training(cfg, ro);
    check_stop();
  }

  void layout(const fs::path& out, int64_t steps, int64_t every, const std::string& resume) const {
    fresh(out);
    std::vector<std::string> sets = o_.sets;
    sets.insert(sets.end(), extra_sets_.begin(), extra_sets_.end());
    for (auto& s : cadence_sets(steps, every)) sets.push_back(std::move(s));
    if (!o_.grpc) {
      Config cfg = load_config(o_.config_path, sets);
      cfg.distributed.backend = Backend::kInproc;
      RunOptions ro;
      ro.out_dir = out.string();
      ro.resume = resume;
      ro.evaluate = false;
      ro.faults = faults_;
      ro.stop = o_.stop;
      run_training(cfg, ro);
      check_stop();
      return;
    }
    LaunchOptions lo;
    lo.nproc = static_cast<int>(world_);
    lo.master_port = o_.master_port;
    lo.log_dir = (out / "logs").string();
    lo.echo_rank0 = false;
    lo.child_argv = {o_.self_exe,
                     "run",
                     o_.config_path,
                     "--out",
                     out.string(),
                     "--no-progress",
                     "--no-eval",
                     "--log-level",
                     "warn",
                     "--set",
                     "distributed.backend=grpc"};
    for (const auto& s : sets) {
      lo.child_argv.push_back("--set");
      lo.child_argv.push_back(s);
    }
    if (!resume.empty()) {
      lo.child_argv.push_back("--resume");
      lo.child_argv.push_back(resume);
    }
    LaunchReport report;
    const int rc = launch_local(lo, &report);
    if (report.stop_signal != 0) throw VerifyInterrupted(report.stop_signal);
    if (rc == 2)
      throw LayoutRefused("verify: the layout's ranks refused their input; see " + lo.log_dir);
    if (rc != 0)
      throw LayoutFailed("verify: a layout run failed (exit " + std::to_string(rc) +
                         "); rank logs in " + lo.log_dir);
  }

 private:
  static void fresh(const fs::path& out) {
    std::error_code ec;
    fs::remove_all(out, ec);
    fs::create_directories(out);
  }

  // A signal stopped the run that just returned (it checkpointed and ended early).
  void check_stop() const {
    if (o_.stop != nullptr && o_.stop->signal.load() != 0)
      throw VerifyInterrupted(o_.stop->signal.load());
  }

  const VerifyOptions& o_;
  const int64_t world_;
  const std::vector<Fault> faults_;
  const std::vector<std::string> extra_sets_;  // ReferencePlan::layout_sets
};

// Restores the log level on every exit path (the runs log at warn and above only).
struct QuietLogs {
  spdlog::level::level_enum saved = spdlog::get_level();
  QuietLogs() {
    if (saved < spdlog::level::err) spdlog::set_level(spdlog::level::err);
  }
  ~QuietLogs() { spdlog::set_level(saved); }
};

struct WorkDir {
  static constexpr const char* kMarker = ".dtrain-verify";
  fs::path path;
  bool temporary = false;
  mutable bool keep = false;  // a layout run failed: its rank logs, which the error names, stay
  explicit WorkDir(const std::string& given) {
    if (!given.empty()) {
      path = given;
      // (the runs' summaries and manifests record their folders as JSON text: UTF-8 only)
      if (!valid_utf8(given))
        throw UserError("verify: --out '" + given +
                        "': the path is not valid UTF-8 (its runs record their folders as JSON "
                        "text); choose a UTF-8 folder name");
      std::error_code ec;
      if (fs::exists(path, ec) && !fs::is_directory(path, ec))
        throw UserError("verify: --out '" + given +
                        "' exists and is not a folder: give a new or empty folder");
      // verify replaces its runs' subfolders (layout, reference, ...) in --out: only in a folder
      // that is new, empty or verify's own (it holds the marker), never in a user's folder.
      if (fs::exists(path, ec) && !fs::is_empty(path, ec) && !fs::exists(path / kMarker, ec))
        throw UserError("verify: --out '" + given +
                        "' is a folder that holds files verify did not write; verify replaces "
                        "its subfolders, so choose a new or empty folder");
      fs::create_directories(path, ec);
      if (ec) throw UserError("verify: cannot create --out '" + given + "': " + ec.message());
      write_file_atomic((path / kMarker).string(),
                        "dtrain verify's work folder: its runs are replaced by the next verify\n");
      return;
    }
    std::string t = temp_folder_template("dtrain-verify");
    if (!valid_utf8(t))
      throw UserError("verify: the temp folder '" + t +
                      "' ($TMPDIR) is not valid UTF-8 (its runs record their folders as JSON "
                      "text): set TMPDIR to a UTF-8 folder, or give --out");
    make_temp_folder(t, "verify: cannot create a temp folder for its runs");
    path = t;
    temporary = true;
  }
  ~WorkDir() {
    std::error_code ec;
    if (temporary && !keep) fs::remove_all(path, ec);
  }
};

// The teacher-forced steps: step 1 from the initial state (a reference run whose learning rate is
// too small to move a float32 parameter), step k + 1 from the reference's checkpoint of step k.
void teacher_force(const Runner& run, const ReferencePlan& plan, const fs::path& dir, int64_t steps,
                   bool keep, VerifyReport& r) {
  const auto ref_losses = read_losses(dir / "reference");
  const auto free_losses = read_losses(dir / "layout");
  Config init = plan.reference;
  init.optimizer.lr = 1e-300;  // a zero update in float32: the parameters stay the initial ones
  set_cadence(init.train, 1, 1);
  run.reference(init, dir / "init");
  TensorMap from = params_only(read_checkpoint_tensors(checkpoint_of(dir / "init", 1)));
  for (int64_t k = 1; k <= steps; ++k) {
    TensorMap want = compared(plan, read_checkpoint_tensors(checkpoint_of(dir / "reference", k)));
    ForcedStep fs_row;
    fs_row.step = k;
    fs_row.loss_reference = ref_losses.count(k) ? ref_losses.at(k) : NAN;
    TensorMap got;
    if (k == 1) {  // the free run's first step starts from the same initial state
      got = compared(plan, read_checkpoint_tensors(checkpoint_of(dir / "layout", 1)));
      fs_row.loss_layout = free_losses.count(1) ? free_losses.at(1) : NAN;
    } else {
      const fs::path out = dir / ("forced-" + std::to_string(k));
      run.layout(out, k, 1, checkpoint_of(dir / "reference", k - 1));
      got = compared(plan, read_checkpoint_tensors(checkpoint_of(out, k)));
      const auto l = read_losses(out);
      fs_row.loss_layout = l.count(k) ? l.at(k) : NAN;
      std::error_code ec;
      if (!keep) fs::remove_all(out, ec);
    }
    fs_row.worst = worst(update_diffs(from, want, got, plan.slack_ulps));
    if (r.first_bad_step == 0 && !(fs_row.worst.rel <= r.tolerance)) r.first_bad_step = k;
    r.forced.push_back(std::move(fs_row));
    from = std::move(want);
  }
}

// How far one process drifts from itself in `steps` free-running steps when only the summation
// order changes: the reference with each batch summed in `parts` parts (gradient accumulation,
// the same global batch and math; parts is the batch's smallest prime factor, so an odd batch
// splits too), end states compared. -1 when the batch cannot be split into parts that sum the
// same rows (one row; data.drop_last, which drops each part's short rest).
double rounding_drift(const Runner& run, const Config& reference, const fs::path& dir,
                      int64_t steps, int64_t& parts) {
  const int64_t b = reference.data.batch_size;
  parts = 0;
  for (int64_t f = 2; f * f <= b; ++f)
    if (b % f == 0) {
      parts = f;
      break;
    }
  if (parts == 0 && b >= 2) parts = b;  // a prime batch: one row per part
  // (data.drop_last drops each micro-batch's short rest: parts would train other rows)
  if (parts == 0 || reference.data.drop_last ||
      reference.train.grad_accum_steps > std::numeric_limits<int64_t>::max() / parts)
    return -1.0;
  Config split = reference;
  split.data.batch_size /= parts;
  split.train.grad_accum_steps *= parts;
  set_cadence(split.train, steps, steps);
  run.reference(split, dir / "reference-split");
  return worst(tensor_diffs(read_checkpoint_tensors(checkpoint_of(dir / "reference", steps)),
                            read_checkpoint_tensors(checkpoint_of(dir / "reference-split", steps))))
      .rel;
}

// The first of the first `steps` optimizer steps whose global batch the `replicas` split
// unevenly (the sampler gives each replica a contiguous share; only an epoch's short last batch
// can be uneven, when its rows are no multiple of the replicas), or 0 when none is.
int64_t uneven_step(const Config& layout, int64_t replicas, int64_t steps) {
  if (replicas <= 1 || layout.data.drop_last) return 0;
  int64_t rows = train_rows_without_loading(layout.data);
  if (rows < 0) rows = load_data(layout.data, layout.seed).train.rows;  // (CSV: read to count)
  const int64_t global = layout.data.batch_size * replicas;
  if (rows <= 0 || global <= 0 || (rows % global) % replicas == 0) return 0;
  const int64_t batches = (rows + global - 1) / global;  // the short one last
  const int64_t k = std::max<int64_t>(1, layout.train.grad_accum_steps);
  const int64_t step = (batches + k - 1) / k;  // steps do not cross an epoch's end
  return step <= steps ? step : 0;
}

}  // namespace

ReferencePlan plan_reference(const Config& layout) {
  ReferencePlan p;
  const DistributedConfig& d = layout.distributed;
  const int64_t stages = std::max<int64_t>(1, d.pipeline.stages);
  const int64_t tp = std::max<int64_t>(1, d.tensor_parallel.size);
  if (d.world_size % (stages * tp) != 0)
    throw UserError(fmt::format(
        "verify: distributed.world_size {} is not a multiple of distributed.pipeline.stages {} x "
        "distributed.tensor_parallel.size {}",
        d.world_size, stages, tp));
  // Pipeline stages and tensor-parallel ranks split one replica's model; only the data axis
  // splits the batch.
  p.replicas = d.world_size / (stages * tp);
  Config& ref = p.reference = layout;
  ref.distributed.world_size = 1;
  ref.distributed.backend = Backend::kInproc;
  ref.distributed.strategy = StrategyKind::kDdp;
  ref.distributed.pipeline.stages = 1;
  ref.distributed.tensor_parallel.size = 1;
  ref.distributed.compression.type = CompressionType::kNone;
  ref.data.batch_size = layout.data.batch_size * p.replicas;
  const bool linear = layout.optimizer.scale_lr == ScaleLr::kLinear;
  ref.optimizer.lr = layout.optimizer.lr * (linear ? static_cast<double>(p.replicas) : 1.0);
  ref.optimizer.scale_lr = ScaleLr::kNone;

  std::string strategy = to_string(d.strategy);
  if (d.strategy == StrategyKind::kPipeline) strategy = "ddp";
  // With one replica Local SGD never averages (nor runs DiLoCo's outer step): it is one process,
  // whatever H, which the layout's runs then set to 1 so they may checkpoint after every step.
  if (d.strategy == StrategyKind::kLocalSgd && p.replicas == 1 && d.local_sgd.sync_every > 1)
    p.layout_sets.push_back("distributed.local_sgd.sync_every=1");
  // Nor does its outer optimizer keep anything but zeros: without it, the layout resumes from
  // the reference's checkpoints (which hold no outer_momentum) for teacher forcing.
  if (d.strategy == StrategyKind::kLocalSgd && p.replicas == 1 && d.local_sgd.outer_lr > 0.0) {
    p.layout_sets.push_back("distributed.local_sgd.outer_lr=0");
    // (outer_momentum is refused without an outer optimizer unless at its default)
    const double mu0 = Config{}.distributed.local_sgd.outer_momentum;
    if (d.local_sgd.outer_momentum != mu0)
      p.layout_sets.push_back(fmt::format("distributed.local_sgd.outer_momentum={}", mu0));
  }
  if (d.strategy == StrategyKind::kLocalSgd && p.replicas > 1) {
    const auto& l = d.local_sgd;
    const bool sgd = layout.optimizer.type == OptimizerType::kSgd;
    const bool clipped = layout.optimizer.clip_grad_norm > 0.0;
    if (l.sync_every == 1) p.slack_ulps = 2.0;
    if (l.sync_every > 1) {
      p.exact = false;
      p.teacher_forcing = false;
      p.teacher_forcing_skipped =
          "Local SGD's replicas hold different parameters between synchronisations";
      p.step_multiple = l.sync_every;
      p.divergence = fmt::format(
          "Local SGD with H = {} averages parameters every {} steps: in between, each replica "
          "follows its own gradients, so the model differs from one process's by design (less "
          "communication for that)",
          l.sync_every, l.sync_every);
    } else if (sgd && l.outer_lr == 0.0 && !clipped && layout.optimizer.momentum > 0.0 &&
               !l.sync_optimizer_state) {
      // Averaging after every step is linear in each replica's momentum, so the mean momentum
      // follows one process's and the parameters stay equal; each replica's own buffer does not.
      p.unchecked_state =
          "Local SGD keeps each replica's momentum (local_sgd.sync_optimizer_state false), so "
          "the optimizer state differs from one process's by design; parameters are compared";
    } else if (l.outer_lr > 0.0 || !sgd || clipped) {
      p.exact = false;
      // The outer momentum is state one process does not have: the layout runs free from step 0
      // rather than resuming from the reference's checkpoints, as for H > 1.
      if (l.outer_lr > 0.0) {
        p.teacher_forcing = false;
        p.teacher_forcing_skipped =
            "DiLoCo's outer momentum is state that one process's checkpoints do not hold";
      }
      p.divergence =
          l.outer_lr > 0.0
              ? "Local SGD with an outer optimizer (DiLoCo, outer_lr > 0) applies the averaged "
                "change through Nesterov momentum, which one process does not do"
          : clipped
              ? "Local SGD clips each replica's own gradient to optimizer.clip_grad_norm; "
                "the clip is not linear in the gradient, so the average of the clipped "
                "steps is not the clipped step of the averaged gradient"
              : "Local SGD averages the parameters after each replica's own " +
                    to_string(layout.optimizer.type) +
                    " step; that optimizer is not linear in the gradient, so the average is not "
                    "the step of the averaged gradient";
    }
  }
  // (Local SGD on one replica never synchronises, so it never compresses: run warns so.)
  const bool compresses = d.compression.type != CompressionType::kNone &&
                          !(d.strategy == StrategyKind::kLocalSgd && p.replicas == 1);
  if (compresses) {
    p.exact = false;
    p.divergence = (p.divergence.empty() ? "" : p.divergence + "; ") +
                   fmt::format(
                       "distributed.compression {} is lossy: the difference from the "
                       "uncompressed reference is the cost of compression{}",
                       to_string(d.compression.type),
                       d.compression.error_feedback
                           ? " (error feedback carries what was dropped to later steps)"
                           : "");
  }
  p.layout_text =
      fmt::format("{}, {} rank(s): {} data-parallel replica(s) x batch {}{}{}{}, lr {}{}", strategy,
                  d.world_size, p.replicas, layout.data.batch_size,
                  stages > 1 ? fmt::format(", {} pipeline stages", stages) : "",
                  tp > 1 ? fmt::format(", tensor-parallel size {}", tp) : "",
                  d.compression.type != CompressionType::kNone
                      ? ", compression " + to_string(d.compression.type)
                      : "",
                  lr_text(layout.optimizer.lr), linear ? " (scale_lr linear)" : "");
  p.reference_text =
      fmt::format("1 rank, ddp, batch {}, lr {}, {}, same model, data, seed and schedule",
                  ref.data.batch_size, lr_text(ref.optimizer.lr), to_string(layout.optimizer.type));
  return p;
}

double default_tolerance(const Config& layout) {
  return layout.optimizer.type == OptimizerType::kSgd ? 1e-3 : 5e-2;
}

VerifyReport run_verify(const VerifyOptions& o) {
  if (o.steps < 1 || o.steps > 100000) throw UserError("verify: --steps must be in [1, 100000]");
  if (o.tolerance && (*o.tolerance < 0.0 || !std::isfinite(*o.tolerance)))
    throw UserError("verify: --tolerance must be a finite number >= 0");
  if (o.master_port != 0) {
    if (!o.grpc) throw UserError("verify: --master-port is for --backend grpc (its ranks' port)");
    if (o.master_port < 1 || o.master_port > 65535)
      throw UserError("verify: --master-port must be in [1, 65535] (0, the default: a free one)");
    if (const std::string why = listen_problem("0.0.0.0", o.master_port); !why.empty())
      throw UserError("verify: --master-port " + std::to_string(o.master_port) + ": " + why);
  }
  const Config layout = load_config(o.config_path, o.sets);
  // (a fault on a rank the layout has not would never fire: a drill that cannot fail)
  check_fault_ranks(o.faults, layout.distributed.world_size);
  // A fault that ends a rank's process ends verify itself when the ranks are its threads: no
  // verdict, its work folder left behind.
  if (!o.grpc)
    for (const Fault& f : o.faults)
      if (f.kind == "kill" || f.kind == "kill_in_save" || f.kind == "drop")
        throw UserError("verify: the " + f.kind + " fault ends its rank's process" +
                        (f.kind == "drop" ? " (its group aborted)" : std::string()) +
                        ", and in-process ranks are threads of verify's own: use --backend "
                        "grpc, whose ranks are processes");
  check_input_files(layout);
  VerifyReport r;
  r.plan = plan_reference(layout);
  const ReferencePlan& plan = r.plan;
  r.tolerance = o.tolerance ? *o.tolerance : default_tolerance(layout);
  const int64_t m = plan.step_multiple;
  r.steps = (o.steps + m - 1) / m * m;
  if (const std::string why = fault_past(o.faults, r.steps); !why.empty())
    throw UserError(why + " (verify --steps " + std::to_string(r.steps) + ")");

  const WorkDir work(o.work_dir);
  const QuietLogs quiet;
  const Runner run(o, layout, o.faults, plan.layout_sets);
  Config ref = plan.reference;
  set_cadence(ref.train, r.steps, 1);
  try {
    run.reference(ref, work.path / "reference");
    run.layout(work.path / "layout", r.steps, m, "");
    if (plan.teacher_forcing) teacher_force(run, plan, work.path, r.steps, !work.temporary, r);
  } catch (const LayoutFailed&) {
    work.keep = true;
    throw;
  } catch (const LayoutRefused&) {
    work.keep = true;
    throw;
  }
  // Local SGD H = 1 with per-replica momentum: a step whose batch the replicas share unevenly
  // (an epoch's short last batch) weights their parameters, and with them momenta that differ,
  // by their shares: the free run leaves one process's trajectory there by design. Each step
  // from the same state (teacher forcing: every replica starts from the reference's momentum)
  // still agrees; the free run is judged up to the step before (state carried wrongly from step
  // to step, which teacher forcing cannot show, shows there).
  r.end_step = r.steps;
  if (!plan.unchecked_state.empty() && plan.teacher_forcing)
    if (const int64_t k = uneven_step(layout, plan.replicas, r.steps); k > 0) {
      r.end_step = k - 1;
      r.plan.free_run_note = fmt::format(
          "step {} splits its batch unevenly over the {} replicas (an epoch's short last batch): "
          "weighted by their shares, the replicas' own momenta no longer average to one "
          "process's, so the free run differs from there on by design; {}",
          k, plan.replicas,
          k > 1 ? fmt::format("the end state is judged at step {}", k - 1)
                : std::string("the steps from the same state decide"));
    }
  const int64_t at = std::max<int64_t>(r.end_step, 1);  // (step 0: shown, not judged)
  r.end_state = tensor_diffs(
      compared(plan, read_checkpoint_tensors(checkpoint_of(work.path / "reference", at))),
      compared(plan, read_checkpoint_tensors(checkpoint_of(work.path / "layout", at))));
  const auto lr = read_losses(work.path / "reference"), ll = read_losses(work.path / "layout");
  for (const auto& [step, loss] : lr)
    r.losses.push_back({step, loss, ll.count(step) ? ll.at(step) : NAN});
  bool end_ok = r.end_step == 0 || worst(r.end_state).rel <= r.tolerance;
  // Every step agrees from the same state, yet the free-running states drifted apart: either the
  // model's dynamics amplify rounding (ReLU kinks flip, a fast-moving trajectory), or state is
  // carried wrongly from step to step in a live run (which checkpoints would not show). One
  // process against itself tells them apart: the same global batch summed in two halves
  // (accumulation) changes only the summation order.
  if (plan.exact && r.first_bad_step == 0 && !end_ok) {
    r.noise_floor = rounding_drift(run, plan.reference, work.path, r.end_step, r.noise_parts);
    end_ok = worst(r.end_state).rel <= std::max(r.tolerance, kDriftFactor * r.noise_floor);
  }
  if (!plan.exact)
    r.verdict = "diverges as expected";
  else
    r.verdict = r.first_bad_step == 0 && end_ok ? "pass" : "fail";
  return r;
}

}  // namespace dtrain
