#include "dtrain/launch_cmd.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <regex>

#include <spdlog/spdlog.h>

#include "checkpoint/checkpoint.h"
#include "comm/rendezvous/master_addr.h"
#include "launch/dist_env.h"
#include "launch/elastic.h"
#include "launch/launcher.h"
#include "train/loop.h"
#include "train/run_dir.h"
#include "train/stop.h"
#include "util/check.h"
#include "util/fault.h"
#include "util/fs.h"

namespace dtrain {

namespace fs = std::filesystem;

namespace {

// Data-parallel strategies only: their global batch is ranks x batch x accumulation.
void check_elastic_config(const Config& cfg, const std::string& flag) {
  const StrategyKind s = cfg.distributed.strategy;
  if (s == StrategyKind::kPipeline || cfg.distributed.pipeline.stages > 1 ||
      s == StrategyKind::kLocalSgd)
    throw UserError(flag +
                    " (elastic restarts) needs a data-parallel strategy (ddp, zero1, zero2, "
                    "fsdp) without a pipeline: its global batch is ranks x data.batch_size x "
                    "train.grad_accum_steps");
}

// The rank grid's rule for a launch of `world` ranks (`what` names them): tensor x pipeline must
// divide it, or every rank would refuse it once they met.
void check_rank_grid(const Config& cfg, int64_t world, const std::string& what) {
  const int64_t stages = pipeline_stages(cfg);
  const int64_t cell = cfg.distributed.tensor_parallel.size * stages;
  if (world % cell != 0)
    throw UserError(fmt::format(
        "{}: distributed.tensor_parallel.size {} x pipeline stages {} = {} must divide the "
        "number of ranks (a rank grid of tensor x pipeline x data)",
        what, cfg.distributed.tensor_parallel.size, stages, cell));
}

// Elastic layouts: every rank count from `min_world` to `max_world` (in steps of `step`, whole
// tensor x pipeline cells) a restart may run on keeps the global batch, else the job would end
// at the first such restart, after it had trained (README "Elastic restarts").
// `--nproc MIN:MAX` runs the whole cells of the ranks left (others are skipped); `--nnodes
// MIN:MAX` runs every rank of the nodes that check in, so a count of no whole cells is refused.
void check_batch_kept(const Config& cfg, const std::string& flag, int64_t min_world,
                      int64_t max_world, int64_t step, bool whole_cells_only) {
  const int64_t cell = cfg.distributed.tensor_parallel.size * pipeline_stages(cfg);
  // (--nproc 1:2 under tensor parallelism 2 was taken, and its first restart gave up: 0 ranks
  // left in whole cells)
  const int64_t smallest = (min_world + cell - 1) / cell * cell;
  if (whole_cells_only && smallest >= max_world)
    throw UserError(fmt::format(
        "{}: a restart after ranks are lost runs whole rank-grid cells of {} rank(s) "
        "(distributed.tensor_parallel.size x pipeline stages), and none fits from {} to fewer "
        "than {} ranks: give a range that spans at least two cells (such as {}:{}), or a fixed "
        "count",
        flag, cell, min_world, max_world, cell, 2 * cell));
  for (int64_t w = min_world; w < max_world; w += step) {
    if (w % cell != 0 && whole_cells_only) continue;
    check_rank_grid(cfg, w,
                    fmt::format("{}: a restart on {} rank(s) could not lay out its rank grid, so "
                                "the job would end there",
                                flag, w));
    try {
      keep_global_batch(cfg.data.batch_size, cfg.train.grad_accum_steps,
                        static_cast<int>(max_world / cell), static_cast<int>(w / cell));
    } catch (const UserError& e) {
      throw UserError(flag + ": a restart on " + std::to_string(w) + " rank(s) could not keep " +
                      "the global batch, so the job would end there: " + e.what());
    }
  }
}

// Node 0's launcher prepares the output folder (prepare_out_dir), holding its lock in `lock`.
// --overwrite: the launcher clears only its ranks' logs; the first attempt's rank 0 deletes the
// old run's files as training starts, once every rank's input passed its checks (a model too
// large, say, leaves the old run as it was). Restarts clear as before (restart_argv).
void prepare_node0_out_dir(const LaunchCmd& c, OutDirLock* lock) {
  prepare_out_dir(c.out_dir, !c.resume.empty() || c.overwrite, /*overwrite=*/false,
                  /*clear_logs=*/false, lock);
  if (!c.overwrite) return;
  check_checkpoints_are_ours(c.out_dir);
  // Only the ranks' own files: logs/ also holds what launched this launcher wrote there
  // (scripts/slurm.sbatch's launcher-<node>.log, open now) and whatever else a user keeps.
  // (launch/error_file.h's rank_log_path and rank_error_path)
  static const std::regex kRankFile(R"(rank-\d+\.(log|error\.json))");
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(c.out_dir) / "logs", ec)) {
    if (!std::regex_match(e.path().filename().string(), kRankFile)) continue;
    std::error_code rec;
    fs::remove(e.path(), rec);
    if (rec)
      throw UserError("--overwrite: cannot remove '" + e.path().string() + "': " + rec.message());
  }
}

// The config a restart runs: the file as launched. It may have been edited since (the next
// experiment's settings, a half-saved file), and a restart that read it again continued this job
// under other settings, or failed on a syntax error. When its bytes differ from the launch's (or
// it cannot be read), the restart's ranks read the launch's resolved config instead (config.json's
// form: absolute paths, --set applied; the ranks apply the same --set again), written to
// RUN/logs/launch-config-node<N>-<launcher pid>.json (nodes that share the folder may have
// launchers of one pid, each in its container). Copyable (a restart_argv capture).
class RestartConfig {
 public:
  RestartConfig(const Config& cfg, std::string path, const std::string& out_dir, int node_rank)
      : path_(std::move(path)),
        launched_(read_config(path_)),
        resolved_(config_to_json(cfg).dump(2) + "\n"),
        snapshot_((fs::path(out_dir) / "logs" /
                   fmt::format("launch-config-node{}-{}.json", node_rank, ::getpid()))
                      .string()) {}

  std::string path_for(int attempt) const {
    if (read_config(path_) == launched_) return path_;
    write_file_atomic(snapshot_, resolved_);
    spdlog::warn(
        "restart {}: {} has changed since the launch (or cannot be read now): the ranks run the "
        "config as launched, from {}",
        attempt, path_, snapshot_);
    return snapshot_;
  }

 private:
  static std::string read_config(const std::string& path) {
    try {
      return read_regular_file(path, uint64_t{64} << 20);
    } catch (const std::exception& e) {
      return std::string("\0unreadable: ", 14) + e.what();
    }
  }
  std::string path_, launched_, resolved_, snapshot_;
};

// Whether RUN/checkpoints holds a complete checkpoint (--resume auto's find).
bool has_checkpoint(const std::string& out_dir) {
  try {
    return !resolve_checkpoint((fs::path(out_dir) / "checkpoints").string(), true).empty();
  } catch (const std::exception&) {
    return false;
  }
}

// Before a warm start's restart (no checkpoint of this job yet), node 0 removes what its failed
// attempt left that rank 0 would take for a run already in the folder: metrics.jsonl, summary.json,
// config.json, and the remains of a save it died in. The folder held no run at launch (rank 0
// refuses another folder's checkpoint into one that does), so these are the failed attempt's.
void clear_failed_warm_start(const std::string& out_dir) {
  std::error_code ec;
  for (const char* f : kRunFiles) fs::remove(fs::path(out_dir) / f, ec);
  const fs::path ck = fs::path(out_dir) / "checkpoints";
  if (!fs::is_directory(ck, ec)) return;
  remove_incomplete_checkpoints(ck.string());
}

// The commands of the attempts after the first (lo.restart_argv, lo.resize_argv) and the first
// one's --resume. `cell`: the rank grid's tensor x pipeline ranks.
void set_attempt_commands(const Config& cfg, const LaunchCmd& c, int node_rank, int64_t cell,
                          LaunchOptions& lo) {
  const bool node0 = node_rank == 0;
  // A restart continues from the newest complete checkpoint this job's attempts wrote
  // (`--resume auto`), or, when they wrote none yet, starts as the first attempt did: a
  // checkpoint an earlier job left in the output folder is not this job's progress.
  // `latest` is replaced by a rename at every checkpoint, so its mtime tells.
  const fs::path latest = fs::path(c.out_dir) / "checkpoints" / "latest";
  const auto latest_mtime = [latest]() -> std::optional<fs::file_time_type> {
    std::error_code ec;
    const auto t = fs::last_write_time(latest, ec);
    return ec ? std::nullopt : std::optional<fs::file_time_type>(t);
  };
  const auto at_launch = latest_mtime();
  const std::vector<std::string> run_argv = c.run_argv;
  const std::string out_dir = c.out_dir;
  // --resume of a checkpoint outside this folder (a warm start): before the job's first own
  // checkpoint the failed attempt's records are this job's own, removed for the restart (rank 0
  // refused to resume another folder's checkpoint into a folder that holds a run). Judged by the
  // checkpoint --resume resolves to, as rank 0 judges it: "--resume RUN" names RUN's own.
  // The checkpoint it names is pinned now, for the first attempt and its restarts alike: "RUN" or
  // "RUN/checkpoints/latest" of a run still training moves on, and a restart that resolved it
  // again started from another checkpoint than the first attempt (a tester found it).
  std::string resume = c.resume;
  bool foreign_resume = false;
  if (!resume.empty() && resume != "auto") {
    try {
      resume = resolve_checkpoint(resume, false);
      foreign_resume = !path_is_within(resume, (fs::path(out_dir) / "checkpoints").string());
    } catch (const std::exception&) {  // (unresolvable here, another node's folder: as given)
    }
  }
  const RestartConfig config(cfg, run_argv.at(2), out_dir, node_rank);
  lo.restart_argv = [run_argv, resume, latest_mtime, at_launch, out_dir, node0, foreign_resume,
                     config](int attempt) {
    std::vector<std::string> argv = run_argv;
    argv[2] = config.path_for(attempt);
    const auto now = latest_mtime();
    // This job's own checkpoint: `latest` moved, or, where there was none at launch, a complete
    // one is there (its save died after the file, before `latest`: --resume auto finds it).
    const bool saved = (now && now != at_launch) || (!at_launch && has_checkpoint(out_dir));
    // A start again from the first attempt's point: its metrics and config go (its logs stay).
    if (!saved && node0 && resume.empty())
      prepare_out_dir(out_dir, false, /*overwrite=*/true, /*clear_logs=*/false);
    // A warm start's: its records, and what its interrupted first save left (temp files, a step
    // folder without its manifest); never a complete checkpoint.
    if (!saved && node0 && foreign_resume) clear_failed_warm_start(out_dir);
    if (saved || !resume.empty()) {
      argv.push_back("--resume");
      argv.push_back(saved ? "auto" : resume);
    }
    return argv;
  };
  if (!resume.empty()) {
    lo.child_argv.push_back("--resume");
    lo.child_argv.push_back(resume);
  }
  // The global batch is the full job's: all ranks of one node, or of the most nodes, over the
  // tensor-parallel ranks that share one sample (data-parallel replicas x batch x accumulation).
  const BatchPlan original{cfg.data.batch_size, cfg.train.grad_accum_steps};
  const int first_world = lo.nproc * lo.nnodes;
  lo.rank_multiple = static_cast<int>(cell);
  const auto restart = lo.restart_argv;
  const std::vector<std::string> first_argv = lo.child_argv;
  lo.resize_argv = [&cfg, restart, original, first_world, first_argv, cell](int attempt,
                                                                            int world) {
    const std::string which =
        attempt > 0 ? "restart " + std::to_string(attempt) : std::string("start");
    check_rank_grid(cfg, world, fmt::format("elastic {}: {} rank(s)", which, world));
    // Throws UserError when the global batch cannot be kept: the launch ends with it.
    const int first_dp = first_world / static_cast<int>(cell);
    const BatchPlan p = keep_global_batch(original.batch_size, original.grad_accum, first_dp,
                                          world / static_cast<int>(cell));
    const std::string change = describe_batch_change(original, p);
    spdlog::warn("elastic {}: {} rank(s) instead of {}; global batch {} kept{}{}", which, world,
                 first_world, original.batch_size * first_dp * original.grad_accum,
                 change.empty() ? "" : ": ", change);
    // The first attempt (elastic nodes, fewer than the most) runs the launch's own command.
    std::vector<std::string> argv = attempt > 0 ? restart(attempt) : first_argv;
    const int new_dp = world / static_cast<int>(cell);
    const bool linear = cfg.optimizer.scale_lr == ScaleLr::kLinear;
    if (linear && new_dp != first_dp)
      spdlog::warn(
          "elastic {}: learning rate {} x {} replica(s) kept (optimizer.scale_lr linear "
          "would scale it by {})",
          which, cfg.optimizer.lr, first_dp, new_dp);
    for (const std::string& s : resize_settings(p, cfg.optimizer.lr, linear, first_dp, new_dp)) {
      argv.push_back("--set");
      argv.push_back(s);
    }
    return argv;
  };
}

}  // namespace

int cmd_launch(const Config& cfg, const LaunchCmd& c) {
  if (c.nproc_given && c.nodes.nproc_per_node)
    throw UserError("--nproc and --nproc-per-node: give one (--nproc on one node)");
  const RankRange range = parse_rank_range(c.nproc, "--nproc");
  // --nnodes N or MIN:MAX (elastic: each attempt runs on the nodes there, at least MIN).
  NodeOverrides nodes = c.nodes;
  RankRange node_range;
  const auto env = current_environment();
  // torchrun's PET_ variables take its flags' forms: PET_NNODES may be MIN:MAX as --nnodes is,
  // and PET_NPROC_PER_NODE "auto" or "cpu" (PyTorchJob's default) takes --nproc (its default),
  // not the cores: a pod's CPU quota is not its cores, and the ranks decide the global batch.
  std::string nnodes_text = c.nnodes, nnodes_from = "--nnodes";
  if (nnodes_text.empty())
    if (const auto it = env.find("PET_NNODES");
        it != env.end() && it->second.find(':') != std::string::npos) {
      nnodes_text = it->second;
      nnodes_from = "PET_NNODES";
    }
  // An explicit --nproc wins over PET_NPROC_PER_NODE, as every flag wins over its variable.
  if (c.nproc_given) nodes.nproc_per_node = range.max;
  if (!nodes.nproc_per_node)
    if (const auto it = env.find("PET_NPROC_PER_NODE"); it != env.end()) {
      if (it->second == "auto" || it->second == "cpu") {
        nodes.nproc_per_node = range.max;
        spdlog::info("PET_NPROC_PER_NODE={}: {} rank(s) per node, as --nproc gives", it->second,
                     range.max);
      }
      if (it->second == "gpu")
        throw UserError(
            "PET_NPROC_PER_NODE=gpu: dtrain trains on CPUs; give a number, auto or cpu");
    }
  if (!nnodes_text.empty()) {
    node_range = parse_rank_range(nnodes_text, nnodes_from);
    nodes.nnodes = node_range.max;
    if (node_range.min < node_range.max && nodes.node_rank && *nodes.node_rank >= node_range.max)
      throw UserError("--node-rank " + std::to_string(*nodes.node_rank) + " with " + nnodes_from +
                      " " + nnodes_text + ": a node's id must be below the maximum node count " +
                      std::to_string(node_range.max));
  }
  const NodeEnv ne = resolve_node_env(env, nodes, range.max);
  const bool elastic_nodes = node_range.min < node_range.max;
  if (ne.nnodes > 1 && c.nproc_given)
    throw UserError("--nproc is the single-node form: with " + ne.nnodes_from +
                    " give --nproc-per-node");
  // Before any rank starts (the launcher then blamed whichever rank relayed the first abort).
  const int64_t world = static_cast<int64_t>(ne.nproc_per_node) * ne.nnodes;
  check_rank_grid(cfg, world,
                  fmt::format("{} rank(s) ({} node(s) x {})", world, ne.nnodes, ne.nproc_per_node));
  const int64_t cell = cfg.distributed.tensor_parallel.size * pipeline_stages(cfg);
  LaunchOptions lo;
  lo.nproc = ne.nproc_per_node;
  lo.nnodes = ne.nnodes;
  lo.node_rank = ne.node_rank;
  lo.master_addr = ne.master_addr;
  lo.master_port = ne.master_port;
  // A given port that another process holds on node 0 (another job's): said by the launcher,
  // before its ranks find it out apart -- rank 0 could not listen, while rank 1 reached the other
  // job's rank 0, whose refusal of its token (exit 2) the launch then blamed.
  if (ne.master_port != 0 && ne.node_rank == 0)
    if (const std::string why = listen_problem("0.0.0.0", ne.master_port); !why.empty())
      throw UserError("--master-port " + std::to_string(ne.master_port) + ": " + why);
  lo.max_restarts = c.max_restarts;
  if (c.max_restarts < 0)  // (before the output folder is made: launch_local checks it again)
    throw UserError("--max-restarts " + std::to_string(c.max_restarts) + ": must be >= 0");
  lo.preempt_signal = preempt_signal_number(cfg.train.preempt_signal);
  // (checked whether used or not: a value no launch could take is a typo either way)
  if (!(c.last_call_s >= 0 && c.last_call_s <= 1e7))
    throw UserError("--last-call: must be between 0 and 1e7 seconds");
  if (elastic_nodes) {
    check_elastic_config(cfg, nnodes_from + " " + nnodes_text);
    check_batch_kept(cfg, nnodes_from + " " + nnodes_text,
                     static_cast<int64_t>(node_range.min) * ne.nproc_per_node, world,
                     ne.nproc_per_node, /*whole_cells_only=*/false);
    lo.min_nnodes = node_range.min;
    lo.last_call_s = c.last_call_s;
  }
  if (range.min < range.max) {
    check_elastic_config(cfg, "--nproc MIN:MAX");
    if (c.max_restarts == 0)
      throw UserError("--nproc " + c.nproc +
                      ": elastic ranks act on restarts; give --max-restarts");
    check_batch_kept(cfg, "--nproc " + c.nproc, static_cast<int64_t>(range.min) * ne.nnodes, world,
                     ne.nnodes, /*whole_cells_only=*/true);
    lo.min_nproc = range.min;
  }
  if (c.max_restarts > 0 && cfg.train.checkpoint.every_steps == 0)
    spdlog::warn(
        "--max-restarts {}: train.checkpoint.every_steps is 0 (a checkpoint only at the end), so "
        "a restart finds none of this job's and starts over",
        c.max_restarts);
  const std::string token_file = c.token_file.empty() ? cfg.distributed.token_file : c.token_file;
  if (ne.nnodes > 1 || !c.token_file.empty()) lo.token = resolve_job_token(env, token_file);
  lo.run_id = c.rdzv_id;
  if (const auto it = env.find("PET_RDZV_ID"); lo.run_id.empty() && it != env.end())
    lo.run_id = it->second;  // (torchrun's PET_ spelling of its flag, as for the others)
  const bool node0 = ne.node_rank == 0;
  // One node prepares the output folder (shared by the nodes when checkpoints are to be
  // resumed): node 0, before its launcher checks in, so the others' ranks start after it.
  // The launcher holds the folder's lock for its ranks and their restarts (they do not lock).
  OutDirLock out_lock;
  // A DTRAIN_FAULT the ranks would refuse is refused here, before --overwrite clears the folder.
  if (const char* f = std::getenv("DTRAIN_FAULT"))
    check_fault_ranks(parse_faults(f, 0), static_cast<int64_t>(ne.nproc_per_node) * ne.nnodes);
  if (node0) {
    try {
      prepare_node0_out_dir(c, &out_lock);
    } catch (const UserError& e) {
      // Node 0 alone checks the folder: the other nodes hear why at their check-in.
      if (ne.nnodes > 1) refuse_launch(lo, e);
      throw;
    }
  }
  lo.log_dir = (fs::path(c.out_dir) / "logs").string();
  lo.inherit_fd = out_lock.fd();  // the ranks hold the folder's lock too, even past this process
  lo.child_argv = c.run_argv;
  if (c.overwrite) lo.child_argv.push_back("--overwrite");

  set_attempt_commands(cfg, c, ne.node_rank, cell, lo);
  LaunchReport report;
  const int rc = launch_local(lo, &report);
  if (rc == 0) std::cout << "every rank's log: " << c.out_dir << "/logs/rank-<r>.log" << std::endl;
  // A rank's user error (bad data or checkpoint) is the launch's user error; a job stopped by a
  // signal (the ranks checkpointed) exits with the ranks' code (128 + signal, or a requeue code).
  if (rc == 0 || rc == 2 || report.stopped) return rc;
  return 1;
}

}  // namespace dtrain
