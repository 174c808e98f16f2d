// `dtrain bench ...`: micro-benchmarks that bound what a training step can cost.
#pragma once

#include <cstdint>
#include <vector>

#include "config/config.h"
#include "tensor/blas.h"

namespace dtrain {

// The GEMMs of one training step, in the order it issues them, and what the step processes.
struct StepGemms {
  std::vector<GemmCall> calls;
  int64_t batch = 0;              // samples per step
  int64_t tokens_per_sample = 0;  // a language model's positions per sample; 0: not a text model
  double flops() const;           // sum of the calls' 2 M N K
};

// The GEMMs of one MLP step over `widths` (input first), as the Linear layer issues them:
// forward y = x W^T; backward dW += dy^T x and dx = dy W, skipping the first layer's dx.
// UserError for fewer than two widths, a width or batch below 1.
StepGemms mlp_step_gemms(const std::vector<int64_t>& widths, int64_t batch);

// The GEMMs that one training step of `cfg`'s model actually issues (lib/tensor/blas.h's
// GemmRecorder around forward, loss and backward of the first data.batch_size training rows,
// after one unrecorded step has sized every buffer). Loads the config's data. A step this
// process cannot hold (the model and its gradients, a batch's activations and the replay's
// copies of them; under ulimit -v OpenBLAS's buffers for `blas_threads` threads) is refused
// (UserError naming `who`) before they are allocated.
StepGemms record_step_gemms(const Config& cfg, int blas_threads, const std::string& who);

// Times `s.calls` back to back with nothing around them (`threads` BLAS threads, the median of
// `iters` steps; 0: as many as fit in about 5 s, 10 to 300), on one arena laid out as the
// recorded operands were (calls that shared memory share it), and prints a line and the JSON
// {"gemm_step_ms", "gflops", "bound_samples_per_s", "blas_core", "gemm_calls", "gemm_flops",
// "batch", "unit", "bound_per_s"[, "tokens_per_sample", "bound_tokens_per_s"]}; unit is
// "samples/s", or "tokens/s" for a text model (bound_per_s is in it). shapes: first a table of
// the step's GEMM time by shape (each call timed alone over up to 30 more steps).
int bench_gemm(const StepGemms& s, int threads, int iters, bool shapes = false);

struct StepBenchOptions {
  int64_t steps = 600;  // optimizer steps of the run (>= 2 x block)
  int block = 20;       // steps between bursts of as many GEMM replays
};

// The config's real training run (one rank, in-process, as `dtrain run` trains it, without
// evaluation; a temp output folder) with its step's recorded GEMMs (record_step_gemms) replayed
// `block` times after every `block` steps, on the same thread. Machine speed on a shared VM swings
// by up to 2x over seconds; within one block (tens of milliseconds) step and replay see the same
// machine, so the median of the per-block ratios (replay / step) is the step's fraction of its
// GEMM bound. The first block is a warm-up. A step of `train.grad_accum_steps` micro-batches
// counts that many replays. Prints a line and JSON {"step_ms", "gemm_step_ms",
// "fraction_of_bound", "fraction_p25", "fraction_p75", "blocks", "block", "unit", "per_s",
// "bound_per_s", "train_samples_per_s", "blas_core", "gemm_calls"}. UserError for a config of
// more than one rank or bad options.
int bench_step(const Config& cfg, const StepBenchOptions& o);

}  // namespace dtrain

#include <string>

namespace dtrain {

class Communicator;

struct CommBenchOptions {
  std::string op = "allreduce";   // allreduce | reduce_scatter | allgather | broadcast
  std::string dtype = "float32";  // float32 | int64 (no reduce_scatter)
  std::vector<int64_t> sizes_bytes = {1 << 20, 4 << 20, 16 << 20, 64 << 20};
  int iters = 0;  // 0: by size (more for small messages)
  bool json = false;
  bool shm = true;  // grpc backend: same-host shared memory (false: gRPC streams only)
  bool tcp = true;  // grpc backend: the TCP data path for peers not on shared memory
  size_t segment_bytes = 1 << 20;  // the rings' segment (CommOptions::segment_bytes)
  size_t sends_in_flight = 2;      // CommOptions::sends_in_flight
};

// Parses "1M,4M,16M,64M" (K/M/G suffixes, powers of 1024) into byte counts, each a whole
// multiple of 4 (floats). UserError on junk.
std::vector<int64_t> parse_sizes(const std::string& text);

// Runs the benchmark on one rank (every rank calls it); rank 0 prints the table (or JSON lines
// {"op","backend","world_size","bytes","time_s","algbw_gbps","busbw_gbps"}).
void bench_comm_rank(Communicator& comm, const CommBenchOptions& o);

// In-process: nproc ranks as threads of this process.
int bench_comm_inproc(int nproc, const CommBenchOptions& o);
// One rank started by `dtrain bench comm --backend grpc` (through launch_local's environment).
int bench_comm_grpc_worker(const CommBenchOptions& o);

}  // namespace dtrain
