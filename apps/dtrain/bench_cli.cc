// The `dtrain bench` subcommands on the command line (bench_cli.h).
#include "dtrain/bench_cli.h"

#include <stdlib.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <iostream>
#include <limits>
#include <stdexcept>
#include <system_error>

#include <spdlog/spdlog.h>

#include "config/config.h"
#include "dtrain/cli.h"
#include "dtrain/option_checks.h"
#include "launch/launcher.h"
#include "tensor/blas.h"
#include "train/loop.h"
#include "util/check.h"
#include "util/fs.h"
#include "util/interrupt.h"
#include "util/strings.h"

namespace dtrain {

namespace fs = std::filesystem;

namespace {

// A comma-separated list of integers as typed (CLI11's delimiter drops empty elements: "4,,5"
// ran as 4,5 and "" as nothing): every element a whole number.
std::vector<int64_t> parse_int_list(const std::string& option, const std::string& text) {
  std::vector<int64_t> out;
  for (const std::string& t : split(text, ',')) {
    int64_t v = 0;
    const char* end = t.data() + t.size();
    const auto [p, ec] = std::from_chars(t.data(), end, v);
    if (ec == std::errc::result_out_of_range && p == end)
      throw UserError(option + " '" + text + "': '" + t + "' is out of range");
    if (t.empty() || ec != std::errc() || p != end)
      throw UserError(option + " '" + text + "': '" + t +
                      "' is not a whole number (a comma-separated list, e.g. 784,512,10)");
    out.push_back(v);
  }
  return out;
}

// Refuses (UserError) sizes whose buffers `nproc` ranks on this machine cannot hold, before any
// rank allocates: each holds its buffer and output of the largest size, and its transport about
// one more (messages staged in mailboxes). A failed allocation in a rank said "use a smaller
// model or data.batch_size", and filled buffers past memory ended in the kernel's OOM killer.
// In-process ranks share this process's memory (and address-space limit); gRPC ranks are
// processes of their own, each under the limit, all in the machine's memory.
void check_comm_bench_memory(const CommBenchOptions& o, int nproc, bool processes) {
  if (nproc < 1 || o.sizes_bytes.empty()) return;
  const int64_t largest = *std::max_element(o.sizes_bytes.begin(), o.sizes_bytes.end());
  const double per_rank = 3.0 * static_cast<double>(largest);
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  // ranks: how many the need is for (1: "a rank needs", else "N ranks need")
  const auto refuse = [&](int ranks, int64_t avail, const std::string& where) {
    throw UserError(fmt::format(
        "bench comm: {} about {:.2f} GiB to move {} bytes ({}), more than the {:.2f} GiB {}; "
        "use smaller --sizes or fewer --nproc",
        ranks == 1 ? std::string("a rank needs") : std::to_string(ranks) + " ranks need",
        per_rank * ranks / kGiB, largest,
        ranks == 1 ? "its buffer, its output and its transport's copy"
                   : "each its buffer, its output and its transport's copy",
        static_cast<double>(avail) / kGiB, where));
  };
  const auto short_of = [&](int64_t avail, int ranks) {
    return avail >= 0 && per_rank * ranks > static_cast<double>(avail);
  };
  if (!processes) {
    if (const int64_t avail = available_memory_bytes(); short_of(avail, nproc))
      refuse(nproc, avail, "this process can allocate");
    return;
  }
  if (const int64_t avail = available_memory_bytes(); short_of(avail, 1))
    refuse(1, avail, "a process can allocate here");
  if (const int64_t avail = machine_memory_available_bytes(); short_of(avail, nproc))
    refuse(nproc, avail, "this machine has available");
}

}  // namespace

void BenchCli::add(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "micro-benchmarks");
  bench->require_subcommand(1);
  add_gemm(bench);
  add_step(bench);
  add_comm(bench);
  add_tp(bench);
}

void BenchCli::add_gemm(CLI::App* bench) {
  gemm_cmd_ = bench->add_subcommand(
      "gemm",
      "time the GEMMs of one training step (an MLP's by --widths, or a config's model as a step "
      "issues them): the bound on step time");
  CLI::Option* widths_opt =
      gemm_cmd_->add_option("--widths", widths_, "MLP layer widths, input first, comma-separated")
          ->allow_extra_args(false)
          ->capture_default_str();
  CLI::Option* batch_opt =
      int64_range(gemm_cmd_->add_option("--batch", gemm_batch_, "rows per step (--widths)")
                      ->capture_default_str());
  gemm_cmd_
      ->add_option("--config", gemm_config_,
                   "YAML config: its model's step on a batch of data.batch_size training rows")
      ->excludes(widths_opt)
      ->excludes(batch_opt);
  gemm_cmd_->add_option("--set", gemm_sets_, "override a config key (as for run); repeatable")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);  // one KEY=VALUE per --set: a config may follow it
  decimal(gemm_cmd_->add_option("--threads", gemm_threads_, "BLAS threads (0: all cores)")
              ->capture_default_str());
  decimal(
      gemm_cmd_
          ->add_option("--iters", gemm_iters_, "timed steps (0: as many as fit in ~5 s, 10 to 300)")
          ->capture_default_str());
  gemm_cmd_->add_flag("--shapes", gemm_shapes_, "also print the step's GEMM time by shape");
}

void BenchCli::add_step(CLI::App* bench) {
  step_cmd_ = bench->add_subcommand(
      "step",
      "a config's real 1-rank training run with its step's GEMMs replayed between blocks of "
      "steps: the step's fraction of its GEMM bound, measured side by side");
  step_cmd_->add_option("config", step_config_, "YAML config (one rank)")->required();
  step_cmd_->add_option("--set", step_sets_, "override a config key (as for run); repeatable")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);  // one KEY=VALUE per --set: a config may follow it
  int64_range(
      step_cmd_->add_option("--steps", step_opts_.steps, "optimizer steps")->capture_default_str());
  decimal(
      step_cmd_->add_option("--block", step_opts_.block, "steps per block (and replays after it)")
          ->capture_default_str());
}

void BenchCli::add_comm(CLI::App* bench) {
  comm_cmd_ = bench->add_subcommand(
      "comm", "collective bandwidth table (nccl-tests style: size, time, algbw, busbw)");
  comm_cmd_->add_option("--backend", comm_backend_, "inproc | grpc")
      ->check(CLI::IsMember({"inproc", "grpc"}))
      ->capture_default_str();
  decimal(comm_cmd_->add_option("--nproc", comm_nproc_, "ranks")->capture_default_str());
  comm_cmd_->add_option("--op", comm_op_, "allreduce | reduce_scatter | allgather | broadcast")
      ->check(CLI::IsMember({"allreduce", "reduce_scatter", "allgather", "broadcast"}))
      ->capture_default_str();
  comm_cmd_->add_option("--dtype", comm_dtype_, "float32 | int64 (int64: no reduce_scatter)")
      ->check(CLI::IsMember({"float32", "int64"}))
      ->capture_default_str();
  comm_cmd_->add_option("--sizes", comm_sizes_, "message sizes, e.g. 1M,4M,16M,64M")
      ->capture_default_str();
  decimal(comm_cmd_->add_option("--iters", comm_iters_, "timed iterations per size (0: by size)"));
  comm_cmd_->add_flag("--json", comm_json_, "one JSON object per size instead of the table");
  comm_cmd_
      ->add_option("--segment", comm_segment_,
                   "ring segment: bytes per message of a ring step (K/M suffixes)")
      ->capture_default_str();
  decimal(comm_cmd_
              ->add_option("--in-flight", comm_in_flight_,
                           "ring sends in flight per direction, 1..16 (1: lock-step segments)")
              ->capture_default_str());
  comm_cmd_->add_flag("--no-shm", comm_no_shm_, "grpc: no same-host shared memory");
  comm_cmd_->add_flag("--no-tcp", comm_no_tcp_,
                      "grpc: no TCP data path (with --no-shm: gRPC streams only)");
  comm_cmd_->add_flag("--worker", comm_worker_, "internal: run as one launched rank")->group("");
}

void BenchCli::add_tp(CLI::App* bench) {
  tp_cmd_ = bench->add_subcommand(
      "tp",
      "a tensor-parallel GPT step's regions timed on T in-process ranks: what sequence "
      "parallelism and a vocabulary-parallel head could save (README \"Tensor parallelism\")");
  tp_cmd_->add_option("config", tp_config_, "YAML config of a gpt")->required();
  tp_cmd_->add_option("--set", tp_sets_, "override a config key (as for run); repeatable")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);  // one KEY=VALUE per --set: a config may follow it
  tp_cmd_->add_option("--tp", tp_sizes_, "tensor-parallel sizes, comma-separated")
      ->allow_extra_args(false)
      ->capture_default_str();
  decimal(tp_cmd_->add_option("--iters", tp_opts_.iters, "timed repetitions per region")
              ->capture_default_str());
  tp_cmd_->add_flag("--json", tp_opts_.json, "one JSON object per size instead of the table");
}

std::optional<int> BenchCli::run(const char* argv0, const std::string& log_level) const {
  if (comm_cmd_->parsed()) return run_comm(argv0, log_level);
  if (gemm_cmd_->parsed()) return run_gemm();
  if (step_cmd_->parsed()) return bench_step(load_config(step_config_, step_sets_), step_opts_);
  if (tp_cmd_->parsed()) {
    TpBenchOptions o = tp_opts_;
    o.tp.clear();
    for (const int64_t t : parse_int_list("--tp", tp_sizes_))
      o.tp.push_back(static_cast<int>(  // (bench_tp checks; the clamp keeps the sign and value
          std::clamp<int64_t>(t, std::numeric_limits<int>::min(), 1 << 20)));  // users typed)
    return bench_tp(load_config(tp_config_, tp_sets_), o);
  }
  return std::nullopt;
}

int BenchCli::run_gemm() const {
  // Checked here too: with --config the threads are set before bench_gemm's own check.
  if (gemm_threads_ < 0 || gemm_threads_ > 1024)
    throw UserError("bench gemm: --threads must be in [0, 1024]");
  if (gemm_config_.empty()) {
    if (!gemm_sets_.empty()) throw UserError("bench gemm: --set needs --config");
    return bench_gemm(mlp_step_gemms(parse_int_list("--widths", widths_), gemm_batch_),
                      gemm_threads_, gemm_iters_, gemm_shapes_);
  }
  const Config cfg = load_config(gemm_config_, gemm_sets_);
  // The whole model's step on one rank: a tensor-parallel slice's or a pipeline stage's GEMMs are
  // not what it records (their bound is the step's over the ranks, at best).
  if (cfg.distributed.tensor_parallel.size > 1 || pipeline_stages(cfg) > 1)
    spdlog::warn(
        "bench gemm --config: times the whole model's step on one rank at data.batch_size {}; "
        "distributed.tensor_parallel.size {} and {} pipeline stage(s) are not applied (one "
        "rank's share is about 1/{} of it)",
        cfg.data.batch_size, cfg.distributed.tensor_parallel.size, pipeline_stages(cfg),
        cfg.distributed.tensor_parallel.size * pipeline_stages(cfg));
  set_blas_threads(gemm_threads_);
  // (--threads 0: OpenBLAS's default, every core)
  const int threads = gemm_threads_ > 0 ? gemm_threads_ : hardware_cores();
  return bench_gemm(record_step_gemms(cfg, threads, "bench gemm --config"), gemm_threads_,
                    gemm_iters_, gemm_shapes_);
}

// inproc: threads of this process. grpc: this process launches --nproc copies of itself as
// `bench comm --worker` ranks (their logs in a temporary folder, kept on failure).
int BenchCli::run_comm(const char* argv0, const std::string& log_level) const {
  CommBenchOptions o;
  o.op = comm_op_;
  o.dtype = comm_dtype_;
  if (o.dtype == "int64" && o.op == "reduce_scatter")
    throw UserError("bench comm: --dtype int64 has no reduce_scatter");
  o.sizes_bytes = parse_sizes(comm_sizes_);
  if (o.dtype == "int64")
    for (const int64_t b : o.sizes_bytes)
      if (b % 8 != 0)
        throw UserError("bench comm: --dtype int64 moves 8-byte values: size " + std::to_string(b) +
                        " is not a multiple of 8");
  o.iters = comm_iters_;
  o.json = comm_json_;
  o.shm = !comm_no_shm_;
  o.tcp = !comm_no_tcp_;
  std::vector<int64_t> seg;
  try {
    seg = parse_sizes(comm_segment_);
  } catch (const UserError& e) {
    throw UserError(std::string("bench comm: --segment: ") + e.what());
  }
  if (seg.size() != 1 || seg[0] < 4 || seg[0] > (int64_t{64} << 20))
    throw UserError("bench comm: --segment must be one size from 4 bytes to 64M, got '" +
                    comm_segment_ + "'");
  o.segment_bytes = static_cast<size_t>(seg[0]);
  if (comm_in_flight_ < 1 || comm_in_flight_ > 16)
    throw UserError("bench comm: --in-flight must be in 1..16, got " +
                    std::to_string(comm_in_flight_));
  o.sends_in_flight = static_cast<size_t>(comm_in_flight_);
  if (comm_iters_ < 0) throw UserError("--iters must be >= 0 (0: by size)");
  // (the launcher for its workers, all on this machine; inproc: its threads)
  if (!comm_worker_ && comm_nproc_ >= 1 && comm_nproc_ <= 1024)
    check_comm_bench_memory(o, comm_nproc_, comm_backend_ == "grpc");
  if (comm_backend_ == "inproc") {
    if (comm_no_shm_ || comm_no_tcp_)
      throw UserError(
          "bench comm: --no-shm and --no-tcp choose a gRPC data path: give --backend "
          "grpc (in-process ranks share memory)");
    return bench_comm_inproc(comm_nproc_, o);
  }
  if (comm_worker_) return bench_comm_grpc_worker(o);
  if (comm_nproc_ < 1 || comm_nproc_ > 1024) throw UserError("--nproc must be in [1, 1024]");
  std::string tmpl = temp_folder_template("dtrain-bench");
  make_temp_folder(tmpl, "bench comm: cannot create a temp folder for the rank logs");
  LaunchOptions lo;
  lo.nproc = comm_nproc_;
  lo.log_dir = tmpl;
  lo.child_argv = {self_exe(argv0), "bench",       "comm",        "--worker",
                   "--backend",     "grpc",        "--op",        comm_op_,
                   "--sizes",       comm_sizes_,   "--iters",     std::to_string(comm_iters_),
                   "--log-level",   log_level,     "--dtype",     comm_dtype_,
                   "--segment",     comm_segment_, "--in-flight", std::to_string(comm_in_flight_)};
  if (comm_json_) lo.child_argv.push_back("--json");
  if (comm_no_shm_) lo.child_argv.push_back("--no-shm");
  if (comm_no_tcp_) lo.child_argv.push_back("--no-tcp");
  LaunchReport report;
  const int rc = launch_local(lo, &report);
  // Kept for a failure only: a stop (Ctrl-C, SIGTERM) is the person's, and ends with its code
  // (130, 143), as dtrain launch and bench step do.
  std::error_code ec;
  if (rc == 0 || report.stopped)
    fs::remove_all(tmpl, ec);
  else
    std::cerr << "rank logs kept in " << tmpl << std::endl;
  if (rc == 0 || rc == 2 || report.stopped) return rc;
  return kExitRuntime;
}

}  // namespace dtrain
