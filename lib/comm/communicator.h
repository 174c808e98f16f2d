// Communicator: the collectives a training strategy calls, over one Transport.
//
// Distributed contract (every caller must hold to it; violations are detected, not hung on):
//  - All ranks issue collectives in the same order with matching arguments (op, counts, root).
//    Each collective gets the next sequence number at the call; every message carries it with
//    the op and byte count, so ranks that disagree fail at once with both sides named.
//  - Collectives run one at a time, in call order, on the communicator's worker thread; the
//    *_async forms return at once with a Work handle, the plain forms wait. Buffers passed to an
//    async call must stay valid and untouched until its Work completes.
//  - Every collective has a deadline (timeout_s from when it starts running, not counting time
//    this process was stopped: a Ctrl-Z of the whole job is not a silent peer). A timeout, a dead
//    or closed peer or a mismatch throws CommError naming the op, its sequence number, the
//    element count and the peer; after a failure the communicator is unusable (every later call
//    fails with the first error) and the transport is aborted so peers fail fast too.
//  - Every rank publishes its position in the collective sequence (last completed seq, the
//    collective it is in and since when) to its transport. When a collective or receive fails,
//    rank 0 logs one table of every rank's latest position (desync_report), so ranks that
//    issued different collectives are visible at a glance.
//  - send()/recv() (point-to-point, for pipeline stages) run on the calling thread, outside the
//    collective sequence; messages between a pair with the same tag arrive in order, different
//    tags never mix.
// Thread-safety: the public methods may be called from one thread at a time (the rank's thread),
// except Work::wait, which any thread may call.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/collectives.h"
#include "comm/transport.h"
#include "util/trace.h"

namespace dtrain {

struct CommOptions {
  double timeout_s = 300.0;        // per collective and per recv (distributed.timeout_s)
  size_t segment_bytes = 1 << 20;  // ring pipelining segment
  size_t sends_in_flight = 2;      // ring sends in flight per direction (CollCtx::sends_in_flight)
  // The trace track (thread name) of this communicator's collectives: RankGrid names its axis
  // communicators "comm tp", "comm dp", "comm pp".
  std::string trace_track = "comm";
  // Deadlines (timeout_s, Work::wait) do not count time this process was stopped (deadline.h).
  // Null: the communicator makes its own; RankGrid's axis communicators share the world's.
  std::shared_ptr<PauseClock> pause_clock;
};

// Completion handle of an async collective.
class Work {
 public:
  // Waits until the collective finished; rethrows its failure. timeout_s < 0: wait as long as
  // the collective's own deadline allows. A wait that times out throws CommError.
  void wait(double timeout_s = -1.0);
  bool done() const;

 private:
  friend class Communicator;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::string what_;  // "allreduce seq 3 (1000 floats)"
  class Communicator* owner_ = nullptr;
  // The owner's pause clock, held: a Work waited on after its communicator went still has it.
  std::shared_ptr<PauseClock> pause_clock_;
};
using WorkPtr = std::shared_ptr<Work>;

class Communicator {
 public:
  Communicator(std::unique_ptr<Transport> transport, CommOptions opts = {});
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return transport_->rank(); }
  int size() const { return transport_->size(); }
  std::string backend() const { return transport_->backend(); }
  const CommOptions& options() const { return opts_; }
  // The underlying transport, for building group transports (subgroup.h) over it.
  Transport& transport() { return *transport_; }

  // In place over data[0, n).
  WorkPtr allreduce_async(float* data, size_t n, ReduceOp op = ReduceOp::kSum);
  void allreduce(float* data, size_t n, ReduceOp op = ReduceOp::kSum) {
    allreduce_async(data, n, op)->wait();
  }
  // in: the full buffer (sum of counts floats, same on every rank's call); out: this rank's
  // counts[rank] floats of the reduction. counts: one per rank (empty: even_counts(n)).
  void reduce_scatter(const float* in, size_t n, float* out, ReduceOp op = ReduceOp::kSum,
                      std::vector<size_t> counts = {});
  // In place variant for sharded strategies: `data` is the full buffer; afterwards this rank's
  // block (at the sum of the lower ranks' counts) holds the reduction.
  WorkPtr reduce_scatter_inplace_async(float* data, std::vector<size_t> counts, ReduceOp op);
  // in: this rank's counts[rank] floats; out: all blocks, in rank order (sum of counts floats).
  // Equal counts give allgather; unequal give allgatherv.
  void allgather(const float* in, float* out, std::vector<size_t> counts);
  WorkPtr allgather_inplace_async(float* data, std::vector<size_t> counts);
  // Root's data[0, n) to every rank, along the ring. Each rank first names its root to its
  // right neighbour, so ranks naming different roots fail as a mismatch at once, whichever
  // ranks disagree.
  void broadcast(float* data, size_t n, int root);
  void barrier();

  // int64 and raw bytes, for values that must not pass through float (sample counts, flags,
  // RNG words, step numbers, encoded messages). Same contracts as the float forms; the element
  // type travels in every message header, so a rank calling the float form against another's
  // int64 form of the same byte size fails as a mismatch. The int64 all-reduce is exact and
  // bitwise the same on every rank: sum (DT_CHECK when it overflows int64), min or max (kAvg,
  // kProd: DT_CHECK); it is an all-gather followed by the reduction in rank order, meant for small
  // n (cost in collectives.h: allgather_reduce_i64).
  WorkPtr allreduce_async(int64_t* data, size_t n, ReduceOp op = ReduceOp::kSum);
  void allreduce(int64_t* data, size_t n, ReduceOp op = ReduceOp::kSum) {
    allreduce_async(data, n, op)->wait();
  }
  void allgather(const int64_t* in, int64_t* out, std::vector<size_t> counts);
  void allgather(const uint8_t* in, uint8_t* out, std::vector<size_t> counts);
  WorkPtr allgather_inplace_async(int64_t* data, std::vector<size_t> counts);
  WorkPtr allgather_inplace_async(uint8_t* data, std::vector<size_t> counts);
  void broadcast(int64_t* data, size_t n, int root);
  void broadcast(uint8_t* data, size_t n, int root);
  // The sum of one double per rank, in rank order over an all-gather of their bytes: bitwise the
  // same on every rank, without the float all-reduce's rounding or its overflow past 3.4e38 (a
  // squared gradient norm above that is finite as a double, and clipping must still see it).
  double allreduce_sum(double v);

  // Point-to-point (pipeline activations): n floats to/from one peer under a user tag.
  void send(int dst, uint64_t tag, const float* data, size_t n);
  void recv(int src, uint64_t tag, float* data, size_t n);

  // Counters (payload bytes through the transport; seconds collectives spent running).
  uint64_t bytes_sent() const { return transport_->bytes_sent(); }
  uint64_t bytes_recv() const { return transport_->bytes_recv(); }
  double comm_seconds() const;
  uint64_t collectives_issued() const { return next_seq_; }

  // Records every collective this communicator runs as a complete event on its worker thread
  // ("comm"), with its sequence number and size; null stops recording. The tracer must outlive
  // its use: set null before destroying it.
  void set_tracer(Tracer* t) { tracer_.store(t); }

  // Fails everything now (this rank is giving up); peers notice.
  void abort(const std::string& why);

  // How this communicator's errors and desync report name rank r of it: "rank 3" by default;
  // the rank grid (rank_grid.h) names world ranks with their grid coordinates, and an axis
  // communicator's ranks by their world rank ("rank 5 (tp 0, dp 1, pp 1)"). Thread-safe.
  void set_rank_namer(std::function<std::string(int)> namer);
  // What this rank does outside collectives until the next call ("" for nothing), which peers
  // see in their desync report (Transport::set_activity). Thread-safe.
  void set_activity(const std::string& what) { transport_->set_activity(what); }
  std::string rank_name(int r) const;

  // One table of every rank's latest known position (rank, last completed seq, the collective
  // it is in, since when, when its report arrived); "" if the transport cannot tell (world size
  // 1, subgroups). Never waits for peers.
  std::string desync_report() const;
  // " (rank 0 said, 1.2 s ago: writing the checkpoint of step 50)" for the peers whose latest
  // report names an activity outside collectives ("" when none does): appended to a failed
  // collective's error, which a peer's long checkpoint write otherwise left unexplained.
  std::string peer_activities() const;

 private:
  friend class Work;
  // op is typed (typed_op): its element type names the count's unit in messages.
  WorkPtr enqueue(CommOp op, size_t count, std::function<void(const CollCtx&)> fn);
  // The element-type-independent bodies of the public forms; counts in elements of t.
  void allgather_typed(const void* in, void* out, std::vector<size_t> counts, DType t);
  WorkPtr allgather_inplace_typed(void* data, std::vector<size_t> counts, DType t);
  void broadcast_typed(void* data, size_t n, int root, DType t);
  void worker_loop();
  std::string failure() const;
  // abort(msg), and on rank 0 log the desync report (once).
  void fail(const std::string& msg);

  std::unique_ptr<Transport> transport_;
  CommOptions opts_;
  uint64_t next_seq_ = 0;
  std::map<std::pair<int, uint64_t>, uint64_t> p2p_sent_, p2p_recvd_;

  std::atomic<Tracer*> tracer_{nullptr};
  struct Task {
    CommOp op;
    size_t count;
    uint64_t seq;
    WorkPtr work;
    std::function<void(const CollCtx&)> fn;
  };
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  std::string failed_;                     // first failure, "" while healthy
  std::function<std::string(int)> namer_;  // set_rank_namer; guarded by mu_
  double comm_s_ = 0.0;
  uint64_t completed_ = 0;  // collectives completed (worker thread only)
  std::atomic<bool> reported_{false};
  std::thread worker_;
};

// For the owner of buffers that async collectives write (valid until their Work completes, the
// contract above), when it goes away: a Work still in flight means an exception is unwinding
// past the owner, so `comm` is aborted (this rank is failing: the collective must not wait for
// peers that may never come) and the Work waited for, its error swallowed (the exception being
// unwound is the one to report). Done Works and null ones cost nothing. Never throws.
void settle_before_free(Communicator& comm, const WorkPtr& w) noexcept;

// settle_before_free over `works` when the scope ends: for a function whose local list of
// in-flight collectives an exception may leave behind.
class SettleOnExit {
 public:
  SettleOnExit(Communicator& comm, const std::vector<WorkPtr>& works)
      : comm_(comm), works_(works) {}
  SettleOnExit(const SettleOnExit&) = delete;
  SettleOnExit& operator=(const SettleOnExit&) = delete;
  ~SettleOnExit() {
    for (const WorkPtr& w : works_) settle_before_free(comm_, w);
  }

 private:
  Communicator& comm_;
  const std::vector<WorkPtr>& works_;
};

}  // namespace dtrain
