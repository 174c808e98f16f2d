#include "comm/collectives.h"

#include <algorithm>
#include <deque>
#include <memory>

#include "util/check.h"

namespace dtrain {

namespace {

Transport::Reduce to_transport(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return Transport::Reduce::kSum;
    case ReduceOp::kMin:
      return Transport::Reduce::kMin;
    case ReduceOp::kMax:
      return Transport::Reduce::kMax;
    case ReduceOp::kProd:
      return Transport::Reduce::kProd;
  }
  return Transport::Reduce::kSum;
}

std::vector<size_t> offsets_of(const std::vector<size_t>& counts) {
  std::vector<size_t> off(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) off[i + 1] = off[i] + counts[i];
  return off;
}

size_t segments_of(size_t count, size_t seg) {
  return count == 0 ? 1 : (count + seg - 1) / seg;
}

int mod(int a, int w) {
  return ((a % w) + w) % w;
}

// Segment length in elements of op's type: the context's segment bytes, at least one element.
// Float32 gives segment_floats, as before dtypes existed.
size_t segment_elems(const CollCtx& c, CommOp op) {
  return std::max<size_t>(1, c.segment_floats * sizeof(float) / dtype_size(op_dtype(op)));
}

// Segment k of block b (counts in elements of es bytes): its message header and address.
struct SegMsg {
  MsgHeader h;
  char* p = nullptr;
};
SegMsg seg_msg(const CollCtx& c, char* data, const std::vector<size_t>& counts,
               const std::vector<size_t>& off, size_t es, size_t seg, CommOp op, uint64_t phase,
               int s, int b, size_t k) {
  const size_t n = counts[static_cast<size_t>(b)];
  const size_t lo = std::min(seg * k, n), hi = std::min(seg * (k + 1), n);
  return SegMsg{MsgHeader{c.seq, part_id(phase, static_cast<uint64_t>(s), k), op, (hi - lo) * es},
                data + (off[static_cast<size_t>(b)] + lo) * es};
}

// One ring pass over a buffer of elements of op's type (counts in elements): at each step s,
// send block send_block(s) to the right neighbour and receive block recv_block(s) from the
// left, segment by segment, reducing (float32 only) or copying.
//
// c.sends_in_flight == 1: segment k's send and receive are one send_recv, so segment k+1 starts
// only once both are done (lock-step). Above 1: up to that many sends are in flight (send_start)
// while later segments are received, so the link to the right never drains between segments.
// All in-flight sends are waited for at the end of the pass, not of each step: within a pass
// the block received at step s is recv_block(s) = send_block(s) - 1 (mod w), and the block sent
// at step s+j is send_block(s) - j, so a block still being sent is received into again only
// w-1 steps later, after the pass (no write-after-read); and the block sent at step s+1 is the
// one received (completely, synchronously) at step s. Across passes (reduce-scatter, then
// all-gather on the same buffer) there is such a hazard, hence the wait at the end. On an
// exception the deque's handles wait in their destructors before the buffer is given back.
template <typename SendBlock, typename RecvBlock>
void ring_pass(const CollCtx& c, char* data, const std::vector<size_t>& counts, CommOp op,
               uint64_t phase, SendBlock send_block, RecvBlock recv_block, bool reduce,
               Transport::Reduce r) {
  Transport& t = *c.t;
  const int w = t.size(), rank = t.rank();
  const int right = mod(rank + 1, w), left = mod(rank - 1, w);
  const std::vector<size_t> off = offsets_of(counts);
  const size_t es = dtype_size(op_dtype(op));
  DT_CHECK(!reduce || op_dtype(op) == DType::kF32);
  const size_t seg = segment_elems(c, op);
  const size_t depth = std::max<size_t>(1, c.sends_in_flight);
  std::deque<std::unique_ptr<PendingSend>> in_flight;
  auto receive = [&](const SegMsg& m) {
    if (reduce)
      t.recv_reduce(left, m.h, reinterpret_cast<float*>(m.p), r, c.deadline);
    else
      t.recv(left, m.h, m.p, c.deadline);
  };
  for (int s = 0; s < w - 1; ++s) {
    const int sb = send_block(s), rb = recv_block(s);
    const size_t ns = segments_of(counts[static_cast<size_t>(sb)], seg);
    const size_t nr = segments_of(counts[static_cast<size_t>(rb)], seg);
    const size_t nmax = std::max(ns, nr);
    for (size_t k = 0; k < nmax; ++k) {
      const bool sending = k < ns, receiving = k < nr;
      SegMsg sm, rm;
      if (sending) sm = seg_msg(c, data, counts, off, es, seg, op, phase, s, sb, k);
      if (receiving) rm = seg_msg(c, data, counts, off, es, seg, op, phase, s, rb, k);
      if (depth > 1) {
        if (sending) in_flight.push_back(t.send_start(right, sm.h, sm.p));
        if (receiving) receive(rm);  // posted while this and the earlier sends are under way
        while (in_flight.size() >= depth) {
          in_flight.front()->wait();
          in_flight.pop_front();
        }
      } else if (sending && receiving) {  // one call: the receive is posted during the send
        t.send_recv(right, sm.h, sm.p, left, rm.h, rm.p, reduce ? &r : nullptr, c.deadline);
      } else if (sending) {
        t.send(right, sm.h, sm.p);
      } else {
        receive(rm);
      }
    }
  }
  for (; !in_flight.empty(); in_flight.pop_front()) in_flight.front()->wait();
}

void check_counts(const Transport& t, const std::vector<size_t>& counts) {
  DT_CHECK_EQ(counts.size(), static_cast<size_t>(t.size()));
}

}  // namespace

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kProd:
      return "prod";
  }
  return "?";
}

std::vector<size_t> even_counts(size_t n, int w) {
  DT_CHECK_GE(w, 1);
  std::vector<size_t> c(static_cast<size_t>(w), n / static_cast<size_t>(w));
  for (size_t i = 0; i < n % static_cast<size_t>(w); ++i) ++c[i];
  return c;
}

void ring_reduce_scatter_inplace(const CollCtx& c, float* data, const std::vector<size_t>& counts,
                                 ReduceOp op, CommOp wire_op) {
  Transport& t = *c.t;
  check_counts(t, counts);
  const int w = t.size(), r = t.rank();
  if (w > 1) {
    // Step s: send block r-s-1, receive and reduce block r-s-2; after w-1 steps block r is
    // complete on rank r.
    ring_pass(
        c, reinterpret_cast<char*>(data), counts, wire_op, 1,
        [&](int s) { return mod(r - s - 1, w); }, [&](int s) { return mod(r - s - 2, w); }, true,
        to_transport(op));
  }
  if (op == ReduceOp::kAvg && w > 1) {
    const std::vector<size_t> off = offsets_of(counts);
    const float inv = 1.0f / static_cast<float>(w);
    float* mine = data + off[static_cast<size_t>(r)];
    for (size_t i = 0; i < counts[static_cast<size_t>(r)]; ++i) mine[i] *= inv;
  }
}

void ring_allgather_inplace(const CollCtx& c, void* data, const std::vector<size_t>& counts,
                            CommOp op) {
  Transport& t = *c.t;
  check_counts(t, counts);
  const int w = t.size(), r = t.rank();
  if (w == 1) return;
  // Step s: send block r-s, receive block r-s-1.
  ring_pass(
      c, static_cast<char*>(data), counts, op, 2, [&](int s) { return mod(r - s, w); },
      [&](int s) { return mod(r - s - 1, w); }, false, Transport::Reduce::kSum);
}

void ring_allgather_inplace(const CollCtx& c, float* data, const std::vector<size_t>& counts,
                            CommOp op) {
  DT_CHECK(op_dtype(op) == DType::kF32);
  ring_allgather_inplace(c, static_cast<void*>(data), counts, op);
}

void ring_allreduce(const CollCtx& c, float* data, size_t n, ReduceOp op) {
  Transport& t = *c.t;
  const int w = t.size();
  if (w == 1) return;
  const std::vector<size_t> counts = even_counts(n, w);
  ring_reduce_scatter_inplace(c, data, counts, op, CommOp::kAllReduce);
  ring_allgather_inplace(c, data, counts, CommOp::kAllReduce);
}

void ring_broadcast(const CollCtx& c, void* data, size_t n, int root, DType t) {
  Transport& tr = *c.t;
  const int w = tr.size(), r = tr.rank();
  DT_CHECK(root >= 0 && root < w);
  if (w == 1) return;
  const int right = mod(r + 1, w), left = mod(r - 1, w);
  const CommOp op = typed_op(CommOp::kBroadcast, t);
  const size_t es = dtype_size(t), seg = segment_elems(c, op);
  const size_t ns = segments_of(n, seg);
  const uint64_t root_id = static_cast<uint64_t>(root);
  // First every rank names its root to its right neighbour and checks its left one's: ranks
  // that disagree on the root fail as a mismatch one hop in (the contract in communicator.h),
  // whoever they think the root is -- where the chain alone would let a root that only sends
  // return, and ranks of which none thinks itself root all wait for data until the deadline.
  const MsgHeader hello{c.seq, part_id(kBroadcastPhase, root_id, kBroadcastHello), op, 0};
  tr.send(right, hello, nullptr);
  tr.recv(left, hello, nullptr, c.deadline);
  char* bytes = static_cast<char*>(data);
  for (size_t k = 0; k < ns; ++k) {
    const size_t b = std::min(seg * k, n), e = std::min(seg * (k + 1), n);
    MsgHeader h{c.seq, part_id(kBroadcastPhase, root_id, k), op, (e - b) * es};
    if (r != root) tr.recv(left, h, bytes + b * es, c.deadline);
    if (right != root) tr.send(right, h, bytes + b * es);
  }
}

void ring_broadcast(const CollCtx& c, float* data, size_t n, int root) {
  ring_broadcast(c, static_cast<void*>(data), n, root, DType::kF32);
}

void allgather_reduce_i64(const CollCtx& c, int64_t* data, size_t n, ReduceOp op) {
  DT_CHECK_MSG(op == ReduceOp::kSum || op == ReduceOp::kMin || op == ReduceOp::kMax,
               "int64 allreduce supports sum, min and max, not " << reduce_op_name(op));
  const int w = c.t->size(), r = c.t->rank();
  if (w == 1) return;
  const size_t W = static_cast<size_t>(w);
  // One scratch per thread (the communicator's worker), kept between calls: a fresh buffer
  // faults in its pages every time, which measured as much as the gather itself at 1 MiB.
  thread_local std::vector<int64_t> all;
  all.resize(n * W);
  std::copy(data, data + n, all.begin() + static_cast<std::ptrdiff_t>(n * static_cast<size_t>(r)));
  ring_allgather_inplace(c, static_cast<void*>(all.data()), std::vector<size_t>(W, n),
                         typed_op(CommOp::kAllReduce, DType::kI64));
  // Rank order, the same loops on every rank: every element is ((v0 . v1) . v2) ..., so every
  // rank ends with bitwise the same result.
  std::copy(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n), data);
  for (size_t q = 1; q < W; ++q) {
    const int64_t* v = all.data() + q * n;
    if (op == ReduceOp::kSum) {
      for (size_t i = 0; i < n; ++i) {
        int64_t sum = 0;
        const bool overflow = __builtin_add_overflow(data[i], v[i], &sum);
        DT_CHECK_MSG(!overflow, "int64 allreduce sum overflows at element " << i);
        data[i] = sum;
      }
    } else if (op == ReduceOp::kMin) {
      for (size_t i = 0; i < n; ++i) data[i] = std::min(data[i], v[i]);
    } else {
      for (size_t i = 0; i < n; ++i) data[i] = std::max(data[i], v[i]);
    }
  }
}

void ring_barrier(const CollCtx& c) {
  Transport& t = *c.t;
  const int w = t.size(), r = t.rank();
  if (w == 1) return;
  // w-1 rounds of a token passed around the ring: after round s each rank has heard
  // (transitively) from s+1 ranks, so after w-1 rounds from all of them.
  const int right = mod(r + 1, w), left = mod(r - 1, w);
  for (int s = 0; s < w - 1; ++s) {
    MsgHeader h{c.seq, part_id(4, static_cast<uint64_t>(s), 0), CommOp::kBarrier, 0};
    t.send(right, h, nullptr);
    t.recv(left, h, nullptr, c.deadline);
  }
}

}  // namespace dtrain
