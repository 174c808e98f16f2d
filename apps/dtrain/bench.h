// `dtrain bench ...`: micro-benchmarks that bound what a training step can cost.
#pragma once

#include <cstdint>
#include <vector>

namespace dtrain {

// Times the GEMMs of one training step of an MLP (forward y = x W^T; backward dW = dy^T x and
// dx = dy W, skipping the first layer's dx, exactly as the Linear layer issues them) with
// `threads` BLAS threads, and prints the median step time, GFLOP/s and the samples/s bound.
int bench_gemm(const std::vector<int64_t>& widths, int64_t batch, int threads, int iters);

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
};

// Parses "1M,4M,16M,64M" (K/M/G suffixes, powers of 1024) into byte counts. UserError on junk.
std::vector<int64_t> parse_sizes(const std::string& text);

// Runs the benchmark on one rank (every rank calls it); rank 0 prints the table (or JSON lines
// {"op","backend","world_size","bytes","time_s","algbw_gbps","busbw_gbps"}).
void bench_comm_rank(Communicator& comm, const CommBenchOptions& o);

// In-process: nproc ranks as threads of this process.
int bench_comm_inproc(int nproc, const CommBenchOptions& o);
// One rank started by `dtrain bench comm --backend grpc` (through launch_local's environment).
int bench_comm_grpc_worker(const CommBenchOptions& o);

}  // namespace dtrain
