// The `dtrain bench` subcommands on the command line: their options (gemm, step, comm, tp) and
// their dispatch, apart from cli.cc's other commands.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/bench.h"
#include "dtrain/bench_tp.h"

namespace dtrain {

// Ownership: CLI11 writes the parsed values into this object's members, so it must outlive
// app.parse() and not move after add(). Not thread-safe (one per command line).
class BenchCli {
 public:
  BenchCli() = default;
  BenchCli(const BenchCli&) = delete;
  BenchCli& operator=(const BenchCli&) = delete;

  // Adds `bench` and its subcommands to app.
  void add(CLI::App& app);
  // After app.parse(): the exit code of the bench subcommand that was parsed (running it), or
  // nullopt if none was. Throws UserError for bad input, as the other commands do.
  std::optional<int> run(const char* argv0, const std::string& log_level) const;

 private:
  void add_gemm(CLI::App* bench);
  void add_step(CLI::App* bench);
  void add_comm(CLI::App* bench);
  void add_tp(CLI::App* bench);
  int run_gemm() const;
  int run_comm(const char* argv0, const std::string& log_level) const;

  CLI::App* gemm_cmd_ = nullptr;
  std::string widths_ = "784,512,512,10";  // parsed as typed: an empty element is an error
  int64_t gemm_batch_ = 128;
  int gemm_threads_ = 1, gemm_iters_ = 0;
  std::string gemm_config_;
  std::vector<std::string> gemm_sets_;
  bool gemm_shapes_ = false;

  CLI::App* step_cmd_ = nullptr;
  std::string step_config_;
  std::vector<std::string> step_sets_;
  StepBenchOptions step_opts_;

  CLI::App* comm_cmd_ = nullptr;
  std::string comm_backend_ = "inproc", comm_op_ = "allreduce", comm_sizes_ = "1M,4M,16M,64M",
              comm_segment_ = "1M";
  std::string comm_dtype_ = "float32";
  int comm_nproc_ = 2, comm_iters_ = 0, comm_in_flight_ = 2;
  bool comm_json_ = false, comm_no_shm_ = false, comm_no_tcp_ = false, comm_worker_ = false;

  CLI::App* tp_cmd_ = nullptr;
  std::string tp_config_;
  std::vector<std::string> tp_sets_;
  std::string tp_sizes_ = "2,4";  // TpBenchOptions::tp, parsed as typed
  TpBenchOptions tp_opts_;
};

}  // namespace dtrain
