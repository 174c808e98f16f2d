#include "dtrain/bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <string>

#include <type_traits>

#include "comm/communicator.h"
#include "comm/grpc_transport.h"
#include "comm/inproc_ranks.h"
#include "launch/dist_env.h"

#include "tensor/blas.h"
#include "util/check.h"
#include "util/rng.h"

namespace dtrain {

std::vector<int64_t> parse_sizes(const std::string& text) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t end = std::min(text.find(',', pos), text.size());
    const std::string tok = text.substr(pos, end - pos);
    char* stop = nullptr;
    const double v = std::strtod(tok.c_str(), &stop);
    int64_t mult = 1;
    const std::string suffix(stop ? stop : "");
    if (suffix == "K" || suffix == "k")
      mult = 1 << 10;
    else if (suffix == "M" || suffix == "m")
      mult = 1 << 20;
    else if (suffix == "G" || suffix == "g")
      mult = int64_t{1} << 30;
    else if (!suffix.empty() && suffix != "B")
      throw UserError("bad size '" + tok + "' (use e.g. 4M, 512K, 1G)");
    // Written so that NaN ("nan", "nanK": strtod reads them) fails too.
    if (tok.empty() || stop == tok.c_str() || !(v >= 0) || !(v * static_cast<double>(mult) <= 8e9))
      throw UserError("bad size '" + tok +
                      "' (use e.g. 4M, 512K, 1G; at most 8000000000 bytes, 7450M)");
    const double exact = v * static_cast<double>(mult);
    const int64_t bytes = static_cast<int64_t>(exact);
    if (bytes == 0)
      throw UserError("bad size '" + tok + "': at least 4 bytes (one float; sizes are bytes)");
    // Not rounded silently: the figures would be for another size than the one asked for.
    if (static_cast<double>(bytes) != exact || bytes % 4 != 0)
      throw UserError("bad size '" + tok + "': sizes are bytes of whole floats, a multiple of 4");
    out.push_back(bytes);
    pos = end + 1;
  }
  return out;
}

namespace {

// One collective of o.op over buffers of T (float or int64_t).
template <typename T>
void run_comm_op(Communicator& comm, const std::string& op, std::vector<T>& buf,
                 std::vector<T>& out, const std::vector<size_t>& counts) {
  if (op == "allreduce") {
    // int64: max, which costs what sum does (the same all-gather and loop) but cannot overflow
    // when the bench repeats it in place; float sums of ones only grow.
    comm.allreduce(buf.data(), buf.size(),
                   std::is_same_v<T, float> ? ReduceOp::kSum : ReduceOp::kMax);
  } else if (op == "reduce_scatter") {
    if constexpr (std::is_same_v<T, float>)
      comm.reduce_scatter(buf.data(), buf.size(), out.data(), ReduceOp::kSum, counts);
    else
      DT_CHECK_MSG(false, "no int64 reduce_scatter (the CLI refuses it)");
  } else if (op == "allgather") {
    comm.allgather(buf.data(), out.data(), counts);
  } else {
    comm.broadcast(buf.data(), buf.size(), 0);
  }
}

}  // namespace

void bench_comm_rank(Communicator& comm, const CommBenchOptions& o) {
  const int w = comm.size();
  const bool lead = comm.rank() == 0;
  const bool i64 = o.dtype == "int64";
  if (lead && !o.json)
    std::printf("# dtrain bench comm: op %s, dtype %s, backend %s, %d ranks\n%14s %12s %12s %12s\n",
                o.op.c_str(), o.dtype.c_str(), comm.backend().c_str(), w, "size(B)", "time(us)",
                "algbw(GB/s)", "busbw(GB/s)");
  for (const int64_t bytes : o.sizes_bytes) {
    const size_t n = static_cast<size_t>(bytes) / (i64 ? 8 : 4);
    // allgather / reduce_scatter: `bytes` is the full (gathered) buffer, as nccl-tests count it.
    std::vector<float> buf(i64 ? 0 : n, 1.0f), out(i64 ? 0 : n);
    std::vector<int64_t> buf64(i64 ? n : 0, 1), out64(i64 ? n : 0);
    const std::vector<size_t> counts = even_counts(n, w);
    const int iters =
        o.iters > 0 ? o.iters : (bytes <= (4 << 20) ? 20 : (bytes <= (16 << 20) ? 10 : 5));
    auto run = [&] {
      if (i64)
        run_comm_op(comm, o.op, buf64, out64, counts);
      else
        run_comm_op(comm, o.op, buf, out, counts);
    };
    run();  // warm-up (connections, buffers)
    std::vector<float> times;
    for (int i = 0; i < iters; ++i) {
      comm.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      run();
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    // The slowest rank decides: take each iteration's max over ranks, then the median.
    comm.allreduce(times.data(), times.size(), ReduceOp::kMax);
    std::sort(times.begin(), times.end());
    const double t = times[times.size() / 2];
    const double factor = o.op == "allreduce"   ? 2.0 * (w - 1) / w
                          : o.op == "broadcast" ? 1.0
                                                : static_cast<double>(w - 1) / w;
    const double algbw = t > 0 ? static_cast<double>(bytes) / t * 1e-9 : 0.0;
    if (!lead) continue;
    if (o.json)
      std::printf(
          "{\"op\": \"%s\", \"dtype\": \"%s\", \"backend\": \"%s\", \"world_size\": %d, "
          "\"bytes\": %lld, \"time_s\": %.6g, \"algbw_gbps\": %.4g, \"busbw_gbps\": %.4g}\n",
          o.op.c_str(), o.dtype.c_str(), comm.backend().c_str(), w, static_cast<long long>(bytes),
          t, algbw, algbw * factor);
    else
      std::printf("%14lld %12.1f %12.3f %12.3f\n", static_cast<long long>(bytes), t * 1e6, algbw,
                  algbw * factor);
    std::fflush(stdout);
  }
}

namespace {

CommOptions comm_options(const CommBenchOptions& o) {
  CommOptions c;
  c.segment_bytes = o.segment_bytes;
  c.sends_in_flight = o.sends_in_flight;
  return c;
}

}  // namespace

int bench_comm_inproc(int nproc, const CommBenchOptions& o) {
  if (nproc < 1 || nproc > 1024) throw UserError("--nproc must be in [1, 1024]");
  std::vector<std::string> errors(static_cast<size_t>(nproc));
  std::vector<std::exception_ptr> out_of_memory(static_cast<size_t>(nproc));
  // (threads that cannot be started are an error, not std::terminate: comm/inproc_ranks.h)
  run_inproc_ranks(
      nproc, comm_options(o),
      [&](Communicator& comm) {
        const auto r = static_cast<size_t>(comm.rank());
        try {
          bench_comm_rank(comm, o);
        } catch (const std::exception& e) {
          errors[r] = e.what();
          // Kept as it is: main reports an allocation failure as "out of memory", exit 2.
          if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr)
            out_of_memory[r] = std::current_exception();
          comm.abort(e.what());
        }
      },
      "lower --nproc, or run the ranks as processes (--backend grpc)");
  for (const auto& e : out_of_memory)
    if (e) std::rethrow_exception(e);
  for (const auto& e : errors)
    if (!e.empty()) throw CommError(e);
  return 0;
}

int bench_comm_grpc_worker(const CommBenchOptions& o) {
  const auto env = current_environment();
  const DistEnv de = resolve_dist_env(env, 1);
  set_blas_threads(1);
  GrpcOptions g;
  g.rank = de.rank;
  g.world_size = de.world_size;
  g.master_addr = de.master_addr;
  g.master_port = de.master_port;
  g.token = resolve_job_token(env, "");
  g.config_hash = "bench-comm";
  g.shm = o.shm;
  g.tcp = o.tcp;
  Communicator comm(connect_grpc(g), comm_options(o));
  bench_comm_rank(comm, o);
  return 0;
}

}  // namespace dtrain
