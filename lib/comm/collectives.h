// Collective algorithms over any Transport (gloo style: the algorithm never sees gRPC or
// threads). Bandwidth-optimal rings, chunked into segments so that sending, receiving and
// reducing overlap across neighbours. All functions are called by every rank of the transport
// with the same arguments (counts, root, op); `seq` must be the same on every rank and unique per
// collective (the Communicator assigns it). World size 1 returns at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/transport.h"

namespace dtrain {

enum class ReduceOp { kSum, kAvg, kMin, kMax, kProd };
const char* reduce_op_name(ReduceOp op);

struct CollCtx {
  Transport* t = nullptr;
  uint64_t seq = 0;
  Deadline deadline;
  size_t segment_floats = 256 * 1024;  // 1 MiB segments
  // Ring sends kept in flight per direction (Transport::send_start). 1: lock-step, each
  // segment's send and receive finish before the next segment starts (send_recv). Default 2:
  // on a quiet machine (2 ranks over gRPC streams, 4 alternated repetitions, 2026-12-02) it
  // was 1.09-1.14x lock-step's busbw at 4, 16 and 64 MiB, and 4 in flight no better. Only the
  // gRPC streams send asynchronously; shared memory, inproc and self send synchronously, for
  // which both settings run the same calls.
  size_t sends_in_flight = 2;
};

// Block partition of n elements over w ranks: sizes differ by at most one, lower ranks larger.
std::vector<size_t> even_counts(size_t n, int w);

// In place: every rank ends with the reduction of all ranks' data[0, n).
void ring_allreduce(const CollCtx& c, float* data, size_t n, ReduceOp op);
// In place over a full buffer laid out as blocks of `counts` (one per rank, summing to the
// buffer length): afterwards this rank's block holds the reduction of that block over all
// ranks; the other blocks hold partial sums (garbage to the caller).
void ring_reduce_scatter_inplace(const CollCtx& c, float* data, const std::vector<size_t>& counts,
                                 ReduceOp op, CommOp wire_op = CommOp::kReduceScatter);
// In place over a full buffer of blocks: each rank provides its own block; afterwards every rank
// has all blocks. Counts may differ per rank (allgatherv).
void ring_allgather_inplace(const CollCtx& c, float* data, const std::vector<size_t>& counts,
                            CommOp op = CommOp::kAllGather);
// Any element type: data holds elements of op's type (op carries it, typed_op), counts are in
// elements, segments are the context's segment bytes. Same message pattern as above.
void ring_allgather_inplace(const CollCtx& c, void* data, const std::vector<size_t>& counts,
                            CommOp op);
// data[0, n) of `root` is copied to every rank (pipelined chain along the ring).
void ring_broadcast(const CollCtx& c, float* data, size_t n, int root);
// The same for n elements of type t.
void ring_broadcast(const CollCtx& c, void* data, size_t n, int root, DType t);
// Exact int64 all-reduce (sum, min, max; DT_CHECK on any other op and when a partial sum in
// rank order overflows int64): a ring all-gather of every rank's n values, then the reduction in
// rank order, the same loops on every rank, so every rank ends with bitwise the same result.
// Cost: each rank sends and receives (w-1) n 8-byte words in w-1 ring steps and keeps w n words
// of scratch on its worker thread; against a ring reduce-scatter + all-gather (2 (w-1) n / w
// words, 2 (w-1) steps) that is fewer steps -- the better deal for the few words it carries
// (sample counts, flags, RNG words, step numbers) -- and w/2 times the bytes, which matters only
// for large n. Measured (dtrain bench comm --dtype, 4 in-process ranks on 2 busy cores): 8 B in
// 43-57 us against float32's 75-78 us; 1 MiB in 3.4 ms against 0.76 ms.
void allgather_reduce_i64(const CollCtx& c, int64_t* data, size_t n, ReduceOp op);
// Returns once every rank has entered the barrier.
void ring_barrier(const CollCtx& c);

}  // namespace dtrain
