#include "dtrain/cli.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>
#include <system_error>
#include <utility>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include "checkpoint/checkpoint.h"
#include "comm/grpc_transport.h"
#include "config/config.h"
#include "data/dataset.h"
#include "data/text.h"
#include "dtrain/bench_cli.h"
#include "dtrain/eval_cmd.h"
#include "dtrain/generate.h"
#include "dtrain/launch_cmd.h"
#include "dtrain/option_checks.h"
#include "dtrain/output_checks.h"
#include "dtrain/parse_errors.h"
#include "dtrain/validate_checks.h"
#include "dtrain/verify_cmd.h"
#include "launch/dist_env.h"
#include "launch/error_file.h"
#include "launch/launcher.h"
#include "nn/loss.h"
#include "nn/model.h"
#include "nn/registry.h"
#include "report/plot.h"
#include "tensor/blas.h"
#include "train/distributed.h"
#include "train/progress.h"
#include "train/run_dir.h"
#include "train/stop.h"
#include "train/trainer.h"
#include "train/verify.h"
#include "util/check.h"
#include "util/console_sink.h"
#include "util/fs.h"
#include "util/interrupt.h"
#include "util/stop_notice.h"
#include "util/strings.h"

namespace dtrain {

namespace fs = std::filesystem;

namespace {

void setup_logging(const std::string& level) {
  // A pipe (`2>&1 | tee run.log`): lines wait for its reader only so long (util/console_sink.h),
  // not for ever. Not under `dtrain launch`, whose pipe is the rank's log file: it reads it
  // promptly and drops console output of its own.
  std::shared_ptr<spdlog::logger> logger;
  if (std::getenv(kLauncherPidEnv) == nullptr)
    if (auto sink = pipe_console_sink())
      logger = std::make_shared<spdlog::logger>("dtrain", std::move(sink));
  if (!logger) logger = spdlog::stderr_color_mt("dtrain", console_color_mode());
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  spdlog::set_level(spdlog::level::from_str(level));
  route_grpc_logs_to_spdlog();  // raw gRPC lines only with --log-level debug
}

// --resume: its checkpoint is checked (headers only) before any data is loaded; "auto" may find
// none. Only the rank that reads it checks (rank 0: other hosts may not see the folder).
// A folder that holds a run takes only that run's own checkpoints: resuming another run's
// checkpoint into it would interleave two runs' metrics and let keep_last delete its checkpoints.
void check_resume_target(const std::string& resume, const std::string& out_dir) {
  if (resume.empty()) return;
  // summary.json records the checkpoint resumed from, as JSON text: UTF-8 only (refused here,
  // not when the summary is written after training).
  if (!valid_utf8(resume))
    throw UserError("--resume '" + resume +
                    "': the path is not valid UTF-8 (summary.json records it as JSON text); "
                    "rename it or link it under a UTF-8 name");
  if (resume == "auto") {
    check_checkpoint((fs::path(out_dir) / "checkpoints").string(), true);
    return;
  }
  const std::string path = check_checkpoint(resume, false);
  const std::vector<std::string> found = run_files_in(out_dir);
  if (found.empty() || path_is_within(path, (fs::path(out_dir) / "checkpoints").string())) return;
  throw UserError("output folder '" + out_dir + "' already holds a run (" + join(found, ", ") +
                  ") and --resume names a checkpoint of another folder ('" + path +
                  "'): continue that folder's own run with --resume auto, or resume into "
                  "another --out");
}

// RUN/checkpoints is a folder, or not there yet: a file of that name is not the run's, and the
// run could neither write its checkpoints nor --resume auto find them.
void check_checkpoints_folder(const std::string& out_dir) {
  const fs::path c = fs::path(out_dir) / "checkpoints";
  std::error_code ec;
  // --out naming a run's checkpoints folder (its `latest` is there): the run's files would mix
  // with the checkpoints, and keep_last would count this run's checkpoints/ among them.
  if (fs::is_regular_file(fs::path(out_dir) / "latest", ec))
    throw UserError("--out '" + out_dir +
                    "' is a checkpoints folder (it holds `latest`): give the run folder, or "
                    "another --out");
  check_out_folder("--out", out_dir);
  if (fs::exists(c, ec) && !fs::is_directory(c, ec))
    throw UserError("'" + c.string() +
                    "' is not a folder: a run keeps its checkpoints there; move it, or give "
                    "another --out");
}

std::string default_out_dir(const std::string& config_path) {
  return (fs::path("runs") / fs::path(config_path).stem()).string();
}

// The line a run ends with, for people (summary.json has the rest): the result, the time and
// where the files are.
std::string result_line(const nlohmann::json& s, const std::string& out_dir) {
  std::string res;
  if (s.contains("test_accuracy") && s["test_accuracy"].is_number())
    res = fmt::format("test accuracy {:.2f}%", 100.0 * s["test_accuracy"].get<double>());
  if (s.contains("test_loss") && s["test_loss"].is_number())
    res += fmt::format("{}test loss {:.4f}", res.empty() ? "" : ", ", s["test_loss"].get<double>());
  if (s.contains("test_bpb") && s["test_bpb"].is_number())
    res += fmt::format(", test bpb {:.4f}", s["test_bpb"].get<double>());
  if (res.empty() && s.contains("final_train_loss") && s["final_train_loss"].is_number())
    res = fmt::format("train loss {:.4f}", s["final_train_loss"].get<double>());
  if (res.empty()) res = "no loss recorded";
  return fmt::format(
      "done: {} after {} steps ({:.2f} epochs) in {:.1f} s; results in {}{} "
      "(summary.json, metrics.jsonl, checkpoints/)",
      res, s.value("steps", int64_t{0}), s.value("epochs", 0.0), s.value("wall_s", 0.0), out_dir,
      out_dir.ends_with('/') ? "" : "/");  // (--out r9/: "r9/", not "r9//")
}

// A run's exit code from its summary: kExitPreempted for a run stopped by its preemption signal
// (train.preempt_signal), 128 + the signal for another interrupted run, else 0.
int run_exit_code(const nlohmann::json& s) {
  if (s.value("status", std::string()) != "interrupted") return kExitOk;
  return stop_exit_code(s.value("interrupt_signal", 0), s.value("preempted", false));
}

// What `run` prints at its end; returns run_exit_code.
int finish_run(const nlohmann::json& s, const std::string& out_dir) {
  const std::string status = s.value("status", std::string("completed"));
  if (status == "nothing_to_do") {
    std::cout << s.value("reason", std::string("nothing to train")) << std::endl;
    return kExitOk;
  }
  if (status == "interrupted") {
    const int sig = s.value("interrupt_signal", 0);
    std::cout << (s.value("preempted", false) ? "preempted" : "interrupted") << " at step "
              << s.value("steps", int64_t{0}) << " (" << interrupt_signal_name(sig)
              << "); checkpoint " << s.value("checkpoint", "") << "; continue with --resume auto"
              << std::endl;
    return run_exit_code(s);
  }
  std::cout << result_line(s, out_dir) << std::endl;
  return kExitOk;
}

// A resume with nothing to train into an --out folder this run created leaves no folder behind:
// removes what the run wrote there (config.json, an empty checkpoints/) and the folder, and only
// those, so anything else found in it stays.
void remove_unused_out_dir(const std::string& dir) {
  std::error_code ec;
  fs::remove(fs::path(dir) / "config.json", ec);
  fs::remove(fs::path(dir) / "checkpoints", ec);  // only if empty
  fs::remove(dir, ec);                            // only if empty
}

int cmd_run(const Config& cfg, const std::string& config_path, std::string out,
            const std::string& resume, bool overwrite, const std::string& trace, bool no_progress,
            bool no_eval, const DistOverrides& flags) {
  RunOptions opts;
  opts.trace = trace;
  opts.evaluate = !no_eval;
  opts.out_dir = out.empty() ? default_out_dir(config_path) : std::move(out);
  opts.resume = resume;
  const auto env = current_environment();
  if (const std::string note = slurm_batch_shell_note(env); !note.empty() && !flags.any())
    spdlog::warn(note);
  const bool multiprocess = is_multiprocess(cfg, env, flags);
  // This rank's place among launched ranks (read once: the environment does not change).
  const std::optional<DistEnv> de =
      multiprocess ? std::optional<DistEnv>(
                         resolve_dist_env(env, static_cast<int>(cfg.distributed.world_size), flags))
                   : std::nullopt;
  const bool rank0 = !de || de->rank == 0;
  // Rank 0 alone checks the output folder (the other ranks skip it): in a job of processes it
  // refuses the job at the rendezvous, so they hear why at once instead of waiting out their
  // rendezvous timeout for a rank 0 that never came up.
  const auto refuse = [&](const UserError& e) {
    if (rank0 && de && de->world_size > 1)
      refuse_grpc_job(cfg, opts, env, flags, std::string("rank 0 refused the job: ") + e.what());
    throw e;
  };
  if (rank0) {
    try {
      check_checkpoints_folder(opts.out_dir);
      check_resume_target(resume, opts.out_dir);
    } catch (const UserError& e) {
      refuse(e);
    }
  }
  // The attempt (read before the output folder is made: a typo there leaves none behind): dtrain
  // launch's count, else torchrun's (a restart by torchrun --max-restarts).
  const char* restart = std::getenv("DTRAIN_RESTART_COUNT");
  const int64_t attempt = parse_restart_count(
      restart != nullptr ? restart : std::getenv("TORCHELASTIC_RESTART_COUNT"),
      restart != nullptr ? "DTRAIN_RESTART_COUNT" : "TORCHELASTIC_RESTART_COUNT");
  if (const char* f = std::getenv("DTRAIN_FAULT")) {
    opts.faults = parse_faults(f, attempt);
    check_fault_ranks(opts.faults, de ? de->world_size : cfg.distributed.world_size);
    if (attempt > 0)
      spdlog::info("restart attempt {}: DTRAIN_FAULT is ignored (faults fire in the first only)",
                   attempt);
  }
  // logs/ belongs to whatever launcher started this rank (dtrain launch, scripts/slurm.sbatch,
  // launch_local.sh), which may be writing to it now: only `dtrain launch --overwrite` clears it.
  std::error_code out_ec;  // (a looping or too long path: prepare_out_dir says so)
  const bool new_out_dir = !fs::exists(opts.out_dir, out_ec) && !out_ec;
  // The process that owns the run locks its folder: a single process, or rank 0 of a job whose
  // launcher (torchrun, Slurm) is not `dtrain launch`, which holds the lock for its ranks and
  // passes it to them as descriptor 3 (DTRAIN_LAUNCHER_PID alone, set by hand, proves nothing:
  // two runs wrote into one folder).
  OutDirLock out_lock;
  const bool launched = env.count(kLauncherPidEnv) != 0 && !new_out_dir &&
                        OutDirLock::inherited(kInheritedFd, opts.out_dir);
  const bool owner = rank0 && !launched;
  // Only the owner clears the folder for --overwrite, after taking its lock: another rank doing
  // it could delete what rank 0 already wrote, or the files of a job still running there (which
  // its rank 0 refuses to disturb). Whether the folder holds a run is the owner's check too.
  // The owner's deletion waits for training to start (RunOptions::overwrite): a run refused for
  // bad input (a model too large, a DTRAIN_FAULT typo) leaves the old run as it was.
  // The other ranks skip it: on other nodes they start while rank 0 has not yet cleared the
  // folder (--overwrite) or decided to resume, and a rank 1 that refused the old run there ended
  // a job node 0 had prepared.
  // (what every rank checks fails on every rank: not a refusal for rank 0 to wait and tell)
  check_out_dir_path(opts.out_dir);
  try {
    prepare_out_dir(opts.out_dir, !resume.empty() || overwrite || !rank0, /*overwrite=*/false,
                    /*clear_logs=*/false, owner ? &out_lock : nullptr);
    if (overwrite && owner) check_checkpoints_are_ours(opts.out_dir);
  } catch (const UserError& e) {
    refuse(e);
  }
  // (`dtrain launch` passes --overwrite to its first attempt's ranks for rank 0 to act on)
  opts.overwrite = overwrite && rank0;
  StopRequest stop;
  InterruptGuard interrupts(stop, preempt_signal_number(cfg.train.preempt_signal));
  // (said at once, not at the step's end: a warning on rank 0, which shows the run; info in the
  // other ranks' own logs)
  const StopNotice notice(stop, rank0);
  opts.stop = &stop;
  opts.final_run = true;   // a second signal after the results are saved keeps the run's code
  end_with_launcher(env);  // after the guard: the launcher's death is a stop it handles
  opts.progress = !no_progress && progress_bar_fits() && spdlog::get_level() <= spdlog::level::info;
  // A run that fails before writing anything (a --resume refused: another model, another
  // optimizer; a gRPC rank that never joined) leaves no empty folder behind that it created:
  // removes an empty checkpoints/ and the folder, only if empty. Of a gRPC job, rank 0 (the
  // ranks' folder may be shared: another rank's removal could race rank 0's first write).
  const bool cleans = new_out_dir && rank0;
  // (a stop while the data loads ends the process at once: the folder goes too, if still empty)
  if (cleans) remove_if_empty_at_abrupt_exit(opts.out_dir);
  nlohmann::json s;
  try {
    s = multiprocess ? run_grpc_rank(cfg, opts, env, flags) : run_training(cfg, opts);
  } catch (...) {
    if (cleans) {
      std::error_code ec;
      fs::remove(fs::path(opts.out_dir) / "checkpoints", ec);
      fs::remove(opts.out_dir, ec);
    }
    throw;
  }
  if (multiprocess && !rank0) return run_exit_code(s);  // only rank 0 reports; same exit code
  if (cleans && s.value("status", std::string()) == "nothing_to_do")
    remove_unused_out_dir(opts.out_dir);
  return finish_run(s, opts.out_dir);
}

}  // namespace

// cli.h: /proc/self/exe, else argv0.
std::string self_exe(const char* argv0) {
  std::error_code ec;
  const fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(argv0) : p.string();
}

namespace {

// A config path for a child (a rank, verify's runs): a leading '-' would read as an option there.
std::string child_operand(const std::string& path) {
  return !path.empty() && path[0] == '-' ? "./" + path : path;
}

// The command line: every subcommand's options, which CLI11's parse fills in, and the dispatch
// to the command that was given. One per process (cli_main); not copyable (CLI11 keeps pointers
// to the members).
class Cli {
 public:
  explicit Cli(CLI::App& app) {
    app.set_version_flag("--version", "dtrain 0.1.0");
    app.require_subcommand(1);
    app.fallthrough();  // global options (--log-level) may follow the subcommand
    app.add_option("--log-level", log_level_, "trace|debug|info|warn|error|off")
        ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}))
        ->capture_default_str();
    add_run(app);
    add_launch(app);
    add_verify(app);
    add_model_commands(app);
    add_file_commands(app);
    bench_.add(app);
  }
  Cli(const Cli&) = delete;
  Cli& operator=(const Cli&) = delete;

  // After a successful parse: runs the command given and returns its exit code. Throws what
  // the commands throw (UserError for bad input), which cli_main_impl maps to exit codes.
  int dispatch(const char* argv0);
  // Whether the command parsed writes its results to standard output (eval's JSON, predict's CSV,
  // generate's text, verify's verdict, bench's figures, ...): not `run` and `launch`, whose
  // results are the run folder's files and whose console lines are a log, nor `checkpoint
  // consolidate` and `plot`, whose results are the files they write (a "wrote" line aside).
  bool results_on_stdout() const {
    return !run_->parsed() && !launch_->parsed() && !consolidate_->parsed() && !plot_->parsed();
  }

 private:
  void add_config(CLI::App* c) {
    c->add_option("config", config_path_, "YAML config file")->required();
    c->add_option("--set", sets_,
                  "override a config key before validation: key.path=value (value is YAML, e.g. "
                  "model.hidden=[256,256]); repeatable")
        ->type_name("KEY=VALUE")
        ->allow_extra_args(false);  // one KEY=VALUE per --set: a config may follow it
  }
  void add_run(CLI::App& app);
  void add_launch(CLI::App& app);
  void add_verify(CLI::App& app);
  void add_model_commands(CLI::App& app);  // validate, eval, predict, generate
  void add_file_commands(CLI::App& app);   // checkpoint consolidate, plot
  int dispatch_launch(const Config& cfg, const char* argv0);

  std::string log_level_ = "info";
  std::string config_path_, out_, resume_, checkpoint_, input_, output_, trace_;
  std::string input_header_ = "auto";
  std::vector<std::string> sets_;
  bool no_progress_ = false, overwrite_ = false, no_eval_ = false;
  DistOverrides flags_;
  LaunchCmd lcmd_;
  int max_restarts_ = 0;
  VerifyOptions vopt_;
  std::string verify_backend_ = "inproc";
  bool verify_json_ = false;
  GenerateOptions gen_;
  std::string ckpt_in_;
  std::vector<std::string> plot_dirs_;
  std::string plot_labels_text_;  // --labels as typed (an empty name is refused, not dropped)
  std::string plot_out_;
  report::PlotOptions plot_opts_;
  BenchCli bench_;
  CLI::App *run_ = nullptr, *launch_ = nullptr, *verify_ = nullptr, *validate_ = nullptr,
           *eval_ = nullptr, *predict_ = nullptr, *generate_ = nullptr, *consolidate_ = nullptr,
           *plot_ = nullptr;
};

void Cli::add_run(CLI::App& app) {
  run_ = app.add_subcommand("run", "train a model as the config describes");
  add_config(run_);
  non_empty(run_->add_option("--out", out_, "output folder (default runs/<config file stem>)"));
  non_empty(run_->add_option(
      "--resume", resume_,
      "continue from a checkpoint: a .safetensors file, a checkpoints folder, a run "
      "folder, or 'auto' (the output folder's latest checkpoint, if any)"));
  run_->add_flag("--no-progress", no_progress_, "never draw the progress bar");
  run_->add_flag("--no-eval", no_eval_,
                 "never evaluate (the summary has no test figures; dtrain verify's runs use it)");
  run_->add_flag("--overwrite", overwrite_,
                 "the output folder may hold an earlier run: delete its summary, metrics, config "
                 "and checkpoints first (without it, such a folder is refused unless --resume)");
  non_empty(run_->add_option(
      "--trace", trace_,
      "write a Chrome trace-event timeline of every rank (forward, backward, each "
      "collective, optimizer, waits) to this JSON file; open it in ui.perfetto.dev"));
  decimal(run_->add_option("--rank", flags_.rank, "this process's rank (overrides RANK)"));
  decimal(run_->add_option("--world-size", flags_.world_size,
                           "ranks in the job (overrides WORLD_SIZE)"));
  decimal(run_->add_option("--local-rank", flags_.local_rank,
                           "rank on this machine (overrides LOCAL_RANK)"));
  run_->add_option("--master-addr", flags_.master_addr,
                   "rank 0's rendezvous host (overrides MASTER_ADDR)");
  decimal(run_->add_option("--master-port", flags_.master_port,
                           "rank 0's rendezvous port (overrides MASTER_PORT)"));
}

void Cli::add_launch(CLI::App& app) {
  launch_ = app.add_subcommand(
      "launch", "start the ranks of `dtrain run` over gRPC on this node (torchrun's environment)");
  launch_
      ->add_option("--nproc", lcmd_.nproc,
                   "ranks to start on this machine, or MIN:MAX (elastic: a restart continues "
                   "with the ranks left, at least MIN)")
      ->capture_default_str();
  launch_->add_option("--nnodes", lcmd_.nnodes,
                      "nodes in the job, one `dtrain launch` each (overrides PET_NNODES), or "
                      "MIN:MAX (elastic: each attempt runs on the nodes that checked in)");
  real_number(launch_->add_option(
                  "--last-call", lcmd_.last_call_s,
                  "with --nnodes MIN:MAX: once MIN nodes checked in, seconds node 0 waits for "
                  "more"))
      ->capture_default_str();
  decimal(launch_->add_option("--node-rank", lcmd_.nodes.node_rank,
                              "this node's index (overrides PET_NODE_RANK, JOB_COMPLETION_INDEX)"));
  decimal(launch_->add_option("--nproc-per-node", lcmd_.nodes.nproc_per_node,
                              "ranks per node (overrides PET_NPROC_PER_NODE)"));
  launch_->add_option("--master-addr", lcmd_.nodes.master_addr,
                      "node 0's host as every node reaches it (overrides PET_MASTER_ADDR, "
                      "MASTER_ADDR)");
  decimal(launch_->add_option(
      "--master-port", lcmd_.nodes.master_port,
      "rank 0's rendezvous port; the launchers use the next one (default on one "
      "node: a free one)"));
  non_empty(launch_->add_option(
      "--token-file", lcmd_.token_file,
      "file holding the job token (DTRAIN_JOB_TOKEN takes precedence); required "
      "with several nodes"));
  non_empty(launch_->add_option(
      "--rdzv-id", lcmd_.rdzv_id,
      "the job's id, given to the ranks as TORCHELASTIC_RUN_ID (overrides PET_RDZV_ID; "
      "default: a random one on one node, 'none' on several, as torchrun)"));
  add_config(launch_);
  non_empty(launch_->add_option("--out", out_, "output folder (default runs/<config file stem>)"));
  non_empty(
      launch_->add_option("--resume", resume_, "passed to every rank's `dtrain run --resume`"));
  launch_->add_flag(
      "--overwrite", overwrite_,
      "the output folder may hold an earlier run: delete it first (of logs/, the ranks' "
      "own rank-<r>.log and .error.json files)");
  non_empty(launch_->add_option("--trace", trace_, "passed to every rank's `dtrain run --trace`"));
  decimal(launch_->add_option(
              "--max-restarts", max_restarts_,
              "when a rank fails, start all ranks again from the newest complete checkpoint "
              "(--resume auto), at most this many times"))
      ->capture_default_str();
}

void Cli::add_verify(CLI::App& app) {
  verify_ = app.add_subcommand(
      "verify", "check that the config's layout trains what one process trains (exit 1 if not)");
  add_config(verify_);
  decimal(verify_->add_option("--steps", vopt_.steps, "optimizer steps compared"))
      ->capture_default_str();
  real_number(
      verify_->add_option("--tolerance", vopt_.tolerance,
                          "largest relative difference accepted (default: 1e-3 with SGD, 5e-2 with "
                          "Adam/AdamW; README \"dtrain verify\")"));
  verify_
      ->add_option("--backend", verify_backend_,
                   "the layout's ranks: threads of this process "
                   "(inproc) or processes over gRPC (grpc)")
      ->check(CLI::IsMember({"inproc", "grpc"}))
      ->capture_default_str();
  decimal(verify_->add_option("--master-port", vopt_.master_port,
                              "with --backend grpc: rank 0's rendezvous port for every run "
                              "(default: a free one)"));
  non_empty(
      verify_->add_option("--out", vopt_.work_dir,
                          "keep every run (checkpoints, metrics, logs) in this folder (default: a "
                          "temporary folder, removed)"));
  verify_->add_flag("--json", verify_json_, "print the report as one JSON object");
}

void Cli::add_model_commands(CLI::App& app) {
  validate_ = app.add_subcommand("validate", "parse and check a config, then exit");
  add_config(validate_);
  validate_->add_flag("--no-eval", no_eval_,
                      "check as for `run --no-eval`: no evaluation batch in the memory check");

  eval_ = app.add_subcommand("eval", "test loss and accuracy of a checkpoint");
  add_config(eval_);
  non_empty(
      eval_->add_option("--checkpoint", checkpoint_,
                        "checkpoint file, sharded checkpoint folder, or run/checkpoints folder"))
      ->required();

  predict_ = app.add_subcommand("predict", "class predictions and probabilities for CSV rows");
  add_config(predict_);
  non_empty(
      predict_->add_option("--checkpoint", checkpoint_,
                           "checkpoint file, sharded checkpoint folder, or run/checkpoints folder"))
      ->required();
  non_empty(predict_->add_option("--input", input_,
                                 "CSV of feature rows (no label column); - reads standard input"))
      ->required();
  non_empty(
      predict_->add_option("--output", output_, "CSV to write (default, or -: standard output)"));
  predict_
      ->add_option("--input-header", input_header_,
                   "whether --input's first row is a header: auto (a row of names, or the "
                   "training file's own column names, is one; numbers are data) | true | false")
      ->check(CLI::IsMember({"auto", "true", "false"}))
      ->capture_default_str();

  generate_ =
      app.add_subcommand("generate", "continue a prompt with text sampled from a gpt checkpoint");
  add_config(generate_);
  non_empty(generate_->add_option(
                "--checkpoint", gen_.checkpoint,
                "checkpoint file, sharded checkpoint folder, or run/checkpoints folder"))
      ->required();
  generate_->add_option("--prompt", gen_.prompt,
                        "text to continue (default: none, from a newline)");
  int64_range(generate_->add_option("--tokens", gen_.tokens, "bytes to generate"))
      ->capture_default_str();
  real_number(generate_->add_option("--temperature", gen_.temperature,
                                    "divides the logits; 0 = always the most likely byte"))
      ->capture_default_str();
  int64_range(
      generate_->add_option("--top-k", gen_.top_k, "sample among the K most likely bytes; 0 = all"))
      ->capture_default_str();
  int64_range(
      generate_->add_option("--seed", gen_.seed, "sampling seed (default: the config's seed)"));
}

void Cli::add_file_commands(CLI::App& app) {
  CLI::App* ckpt_cmd = app.add_subcommand("checkpoint", "convert checkpoints");
  ckpt_cmd->require_subcommand(1);
  consolidate_ = ckpt_cmd->add_subcommand(
      "consolidate",
      "write a sharded checkpoint (zero1/zero2/fsdp, pipeline, tensor parallel) as one "
      "safetensors file");
  consolidate_
      ->add_option("dir", ckpt_in_,
                   "sharded checkpoint folder (checkpoints/step-<N>), or a run or checkpoints "
                   "folder (its latest)")
      ->required();
  non_empty(consolidate_->add_option("-o,--output", output_, "file to write (.safetensors)"))
      ->required();

  plot_ = app.add_subcommand(
      "plot", "training loss and test accuracy against step for run folders, as SVG or PNG");
  plot_->add_option("runs", plot_dirs_, "run folders (the --out of dtrain run)")->required();
  non_empty(plot_->add_option("-o,--output", plot_out_, "image to write: FILE.svg or FILE.png"))
      ->required();
  plot_->add_option("--title", plot_opts_.title, "title above the panels");
  plot_
      ->add_option("--labels", plot_labels_text_,
                   "legend names, one per run, comma-separated (default: folder names)")
      ->allow_extra_args(false);  // one comma-separated argument: run folders may follow it
  decimal(plot_->add_option("--width", plot_opts_.width, "pixels, 480 to 8000"))
      ->capture_default_str();
  decimal(plot_->add_option("--height", plot_opts_.height, "pixels, 240 to 8000"))
      ->capture_default_str();
}

int Cli::dispatch(const char* argv0) {
  setup_logging(log_level_);
  if (const std::optional<int> rc = bench_.run(argv0, log_level_)) return *rc;
  if (consolidate_->parsed()) {
    const std::string path = resolve_checkpoint(ckpt_in_, false);
    check_consolidate_output(path, output_);
    ConsolidatedCheckpoint c;
    try {
      c = consolidate_checkpoint(path, output_);
    } catch (const std::bad_alloc&) {
      // (the generic advice -- a smaller model or batch, more ranks -- is no help here)
      uintmax_t bytes = 0;
      std::error_code ec;
      // (error codes throughout: nothing may throw over the message below)
      std::filesystem::recursive_directory_iterator it(path, ec), end;
      for (; !ec && it != end; it.increment(ec))
        if (std::error_code fe; it->is_regular_file(fe)) {
          const uintmax_t n = it->file_size(fe);
          if (!fe) bytes += n;
        }
      throw UserError(fmt::format(
          "consolidating '{}' holds the whole model's parameters and optimizer state in memory at "
          "once (its shards take {:.1f} MiB), more than this process could allocate (available "
          "memory, or the address-space limit ulimit -v): run it where there is more memory, or "
          "resume from the sharded folder as it is (any world size reads it)",
          path, static_cast<double>(bytes) / 1048576.0));
    }
    std::cout << "wrote " << output_ << ": step " << c.meta.step << ", written by "
              << describe_writer(c) << std::endl;
    if (holds_replica_states(path))  // (one state per parameter in the file: the first's)
      spdlog::warn(
          "the replicas' own optimizer states (Local SGD) are not in {}, only each "
          "stage's first replica's: resume from {} to continue each replica's own",
          output_, path);
    return kExitOk;
  }
  if (plot_->parsed()) {
    check_plot_output(plot_out_);
    std::vector<std::string> labels;
    if (!plot_labels_text_.empty()) labels = split(plot_labels_text_, ',');
    for (size_t i = 0; i < labels.size(); ++i)
      if (labels[i].empty())
        throw UserError("--labels '" + plot_labels_text_ + "': name " + std::to_string(i + 1) +
                        " is empty (one name per run folder, comma-separated)");
    report::plot_runs(plot_dirs_, labels, plot_out_, plot_opts_);
    std::cout << "wrote " << plot_out_ << std::endl;
    return kExitOk;
  }
  if (verify_->parsed()) {
    vopt_.config_path = child_operand(config_path_);
    vopt_.sets = sets_;
    vopt_.grpc = verify_backend_ == "grpc";
    if (!vopt_.work_dir.empty()) check_out_folder("verify: --out", vopt_.work_dir);
    vopt_.self_exe = self_exe(argv0);
    return cmd_verify(vopt_, verify_json_);
  }
  const Config cfg = load_config(config_path_, sets_);
  if (generate_->parsed()) {  // reads no data: the data files need not be here
    set_blas_threads(static_cast<int>(cfg.runtime.threads));
    // Printed as it is sampled: a long continuation shows its first words at once.
    TerminalEscaper esc;
    bool printed = false;  // (an error after the prompt starts a line of its own)
    try {
      generate_text(cfg, gen_, [&](const std::string& b) {
        printed = true;
        // Stop sampling once the output is gone (a full disk, a closed pipe, SIGPIPE ignored).
        if (!(std::cout << esc.push(b) << std::flush))
          throw std::runtime_error(
              "writing to standard output failed (disk full or the output "
              "closed): generation stopped");
      });
    } catch (...) {
      if (printed) std::cout << esc.finish() << std::endl;
      throw;
    }
    std::cout << esc.finish() << std::endl;
    return kExitOk;
  }
  // (eval and predict with test files: the training files only for what the checkpoint does not
  // store)
  // (train.init_from: not for a resume, which loads its own checkpoint, nor eval and predict)
  check_input_files(cfg, (eval_->parsed() || predict_->parsed()) && !cfg.data.test.empty(),
                    !eval_->parsed() && !predict_->parsed() && resume_.empty());
  if (validate_->parsed()) {
    // Text patterns are expanded by the loader, which the other commands run: validate does it
    // here, so a pattern matching nothing is refused there too.
    if (cfg.data.format == DataFormat::kText) {
      expand_text_paths(cfg.data.train.path, "data.train.path");
      if (!cfg.data.test.path.empty()) expand_text_paths(cfg.data.test.path, "data.test.path");
    }
    check_config_without_data(cfg, /*evaluate=*/!no_eval_);
    std::cout << config_path_ << ": ok (config hash " << config_hash(cfg) << ")" << std::endl;
    return kExitOk;
  }
  if (!trace_.empty())
    check_trace_output(trace_, out_.empty() ? default_out_dir(config_path_) : out_, config_path_,
                       resume_, cfg.data);
  if (predict_->parsed() && output_ == "-") output_.clear();  // (standard output)
  if (predict_->parsed())
    check_predict_output(output_, input_, checkpoint_, config_path_, cfg.data);
  // The weights a run starts from, inside the folder --overwrite clears: read, then deleted (a
  // restart before the first checkpoint would find them gone).
  if (const std::string out = out_.empty() ? default_out_dir(config_path_) : out_;
      overwrite_ && !cfg.train.init_from.empty() && path_is_within(cfg.train.init_from, out))
    throw UserError("train.init_from '" + cfg.train.init_from + "' is inside --out '" + out +
                    "', which --overwrite deletes: copy the weights elsewhere, or choose another "
                    "--out");
  if (overwrite_ && !resume_.empty())
    throw UserError(
        "--overwrite (start afresh, deleting what --out holds) and --resume (continue a run) "
        "contradict each other: give one of them");
  if (run_->parsed())
    return cmd_run(cfg, config_path_, out_, resume_, overwrite_, trace_, no_progress_, no_eval_,
                   flags_);
  if (launch_->parsed()) return dispatch_launch(cfg, argv0);
  if (eval_->parsed()) return cmd_eval(cfg, checkpoint_);
  if (predict_->parsed())
    return cmd_predict(cfg, checkpoint_, input_, output_,
                       input_header_ == "true"    ? CsvHeader::kTrue
                       : input_header_ == "false" ? CsvHeader::kFalse
                                                  : CsvHeader::kAuto);
  return kExitUser;
}

int Cli::dispatch_launch(const Config& cfg, const char* argv0) {
  lcmd_.nproc_given = launch_->count("--nproc") > 0;
  const std::string out_dir = out_.empty() ? default_out_dir(config_path_) : out_;
  check_checkpoints_folder(out_dir);  // once here, not as a rank log
  check_resume_target(resume_, out_dir);
  lcmd_.out_dir = out_dir;
  lcmd_.resume = resume_;
  lcmd_.overwrite = overwrite_;
  lcmd_.max_restarts = max_restarts_;
  lcmd_.run_argv = {self_exe(argv0), "run",     child_operand(config_path_),
                    "--out",         out_dir,   "--no-progress",
                    "--log-level",   log_level_};
  for (const auto& s : sets_) {
    lcmd_.run_argv.push_back("--set");
    lcmd_.run_argv.push_back(s);
  }
  if (!trace_.empty()) {
    lcmd_.run_argv.push_back("--trace");
    lcmd_.run_argv.push_back(fs::absolute(trace_).string());
  }
  return cmd_launch(cfg, lcmd_);
}

int cli_main_impl(int argc, char** argv, bool* results_on_stdout) {
  CLI::App app{"dtrain: train models from one YAML file, alone or data-parallel across ranks"};
  Cli cli(app);
  try {
    app.parse(argc, argv);
    *results_on_stdout = cli.results_on_stdout();
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help, --version
  } catch (const CLI::ParseError& e) {
    print_parse_error(app, e, argc, argv);
    return kExitUser;
  }

  // A failed rank's error also goes to its launcher's error file (torchrun's contract; dtrain
  // launch reads it to name the failure's cause).
  const auto failed = [](std::string_view message, int rc) {
    if (const char* path = std::getenv(kErrorFileEnv); path != nullptr && *path != '\0') {
      int rank = -1, world = -1;
      if (const char* r = std::getenv("RANK")) std::from_chars(r, r + std::strlen(r), rank);
      if (const char* w = std::getenv("WORLD_SIZE")) std::from_chars(w, w + std::strlen(w), world);
      write_error_file(path, message, rc, rank, world);  // (noexcept: never out of a handler)
    }
    return rc;
  };
  // (`run` and `verify` take these signals over to stop softly, `launch` to forward them)
  end_by_stop_signals_removing_temp_files();
  try {
    return cli.dispatch(argv[0]);
  } catch (const UserError& e) {
    std::cerr << "error: " << bounded_message(e.what()) << std::endl;
    return failed(e.what(), kExitUser);
  } catch (const AgreedInputError& e) {  // (deterministic: a restart would fail alike)
    std::cerr << "error: " << bounded_message(e.what()) << std::endl;
    return failed(e.what(), kExitUser);
  } catch (const PreemptedError& e) {
    std::cerr << "error: " << bounded_message(e.what()) << std::endl;
    return failed(e.what(), kExitPreempted);
  } catch (const InternalError& e) {
    std::cerr << "internal error (a dtrain bug; please report): " << bounded_message(e.what())
              << std::endl;
    return failed(e.what(), kExitRuntime);
  } catch (const std::bad_alloc&) {
    // Sizes dtrain can predict (the model's state) are checked before training; this is what
    // it cannot (data, activations, another process taking the memory).
    const char* msg =
        "out of memory (an allocation failed): the model, data or batch does not fit in this "
        "machine's memory or the process's address-space limit (ulimit -v); use a smaller model "
        "or data.batch_size, or more ranks";
    std::cerr << "error: " << msg << std::endl;
    return failed(msg, kExitUser);
  } catch (const std::system_error& e) {
    // std::thread's failure to start one: name the limits rather than print errno's text alone.
    const std::string msg =
        bounded_message(e.what()) +
        (e.code() == std::errc::resource_unavailable_try_again
             ? " (a thread could not be started: the address-space limit, ulimit -v, or the "
               "process limit, ulimit -u, leaves no room for it; raise them or use fewer "
               "in-process ranks)"
             : "");
    std::cerr << "error: " << msg << std::endl;
    return failed(msg, kExitRuntime);
  } catch (const std::exception& e) {
    std::cerr << "error: " << bounded_message(e.what()) << std::endl;
    return failed(e.what(), relays_input_abort(e.what()) ? kExitUser : kExitRuntime);
  }
}

}  // namespace

int cli_main(int argc, char** argv) {
  bool results_on_stdout = true;
  const int rc = cli_main_impl(argc, argv, &results_on_stdout);
  // Results go to standard output (eval's JSON, predict's CSV, generate's text): a write that
  // failed there (a full disk, a closed pipe) must not end in success. (A training run's console
  // is its log: a run whose `| tee` went away still finished, its results in its folder.)
  std::cout.flush();
  const bool failed = !std::cout || std::fflush(stdout) != 0 || std::ferror(stdout) != 0;
  if (rc == kExitOk && failed && results_on_stdout) {
    std::cerr << "error: writing to standard output failed (disk full or the output closed)"
              << std::endl;
    return kExitRuntime;
  }
  return rc;
}

}  // namespace dtrain
