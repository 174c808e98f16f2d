// Transport: moves tagged byte messages between the ranks of one job. It knows nothing about
// collectives (those are algorithms in collectives.h over any Transport) and nothing about
// rendezvous (a transport is built from an already-agreed peer table).
//
// Addressing: a message goes from `src` to `dst` under a key (channel, part). Collectives use
// channel = their sequence number; point-to-point messages use a channel with kP2PBit set. The
// receiver states what it expects (op and byte count) and a message that disagrees is an error
// at once (CommError naming both sides), never a hang or a silent overflow.
//
// Progress contract: send() may block for back-pressure, but never waits for the matching recv()
// to be called: every transport drains incoming messages into per-peer mailboxes on its own. So
// "all ranks send, then all ranks receive" cannot deadlock.
//
// Thread-safety: send() and recv() may be called from different threads concurrently (the
// communicator's worker thread and the pipeline's p2p calls), but calls for the same (peer, key)
// must not race. abort() may be called from any thread and wakes every waiter.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/deadline.h"

namespace dtrain {

inline constexpr uint64_t kP2PBit = uint64_t{1} << 63;
// A collective channel: its sequence number within its group in bits 0..39, the group's tag
// (subgroup.h: group id + 1; 0 = the whole job) in bits 40..62.
inline constexpr int kChannelGroupShift = 40;

// Operation codes carried in every message header, so mismatched calls are detected.
enum class CommOp : uint32_t {
  kAllReduce = 1,
  kReduceScatter = 2,
  kAllGather = 3,
  kBroadcast = 4,
  kBarrier = 5,
  kSendRecv = 6,
  kAllGatherV = 7,
};

// Element type of a collective's payload. It travels in bits 8..15 of the op code (typed_op),
// so every check that compares ops -- mailbox matching and the mismatch reports of every
// transport, the gRPC frame and shared-memory record headers, the desync positions -- compares
// element types too: a float32 allreduce against an int64 one of the same byte size fails at
// once with both sides named. kF32 is 0, so float32 op codes (and the wire) are what they were.
enum class DType : uint32_t { kF32 = 0, kI64 = 1, kBytes = 2 };
inline constexpr DType kLastDType = DType::kBytes;
const char* dtype_name(DType t);  // "float32" | "int64" | "bytes"
size_t dtype_size(DType t);       // 4 | 8 | 1

inline constexpr CommOp typed_op(CommOp base, DType t) {
  return static_cast<CommOp>(static_cast<uint32_t>(base) | (static_cast<uint32_t>(t) << 8));
}
inline constexpr CommOp base_op(CommOp op) {
  return static_cast<CommOp>(static_cast<uint32_t>(op) & 0xffu);
}
inline constexpr DType op_dtype(CommOp op) {
  return static_cast<DType>((static_cast<uint32_t>(op) >> 8) & 0xffu);
}
// True for the op codes this build sends: a known operation and element type, no other bits.
bool valid_op(uint32_t raw);

// "allreduce" for float32 ops (as before dtypes existed), "int64 allreduce", "bytes allgather".
std::string comm_op_name(CommOp op);
// Unit of a count of elements of op's type in messages: "floats" | "int64s" | "bytes".
const char* count_unit(CommOp op);

struct MsgHeader {
  uint64_t channel = 0;            // collective sequence number, or kP2PBit | user tag
  uint64_t part = 0;               // chunk / step index within the operation
  CommOp op = CommOp::kAllReduce;  // typed: carries the element type (typed_op)
  uint64_t bytes = 0;              // payload size
};

// A collective message's part id: (phase << 56) | (step << 32) | segment, unique within one
// collective. Steps below 2^24, segments below 2^32.
inline constexpr uint64_t part_id(uint64_t phase, uint64_t step, uint64_t seg) {
  return (phase << 56) | (step << 32) | seg;
}
inline constexpr uint64_t part_phase(uint64_t part) {
  return part >> 56;
}
inline constexpr uint64_t part_step(uint64_t part) {
  return (part >> 32) & 0xffffff;
}
inline constexpr uint64_t part_segment(uint64_t part) {
  return part & 0xffffffff;
}
// A broadcast's messages are of this phase and carry the root as their step, so ranks that name
// different roots for one broadcast fail as a mismatch (parts_conflict) instead of waiting.
inline constexpr uint64_t kBroadcastPhase = 3;
// The segment of the empty message with which a broadcast starts: each rank names its root to
// its right neighbour (ring_broadcast).
inline constexpr uint64_t kBroadcastHello = 0xffffffff;
// True when `got`, a message waiting on the channel `want` is received on, shows that the two
// ranks called the collective with different arguments the op and size do not reveal: broadcast
// parts of the same op naming different roots. (P2P channels: never.)
bool parts_conflict(const MsgHeader& got, const MsgHeader& want);

// Where a rank is in its communicator's collective sequence, for the desync report. Set by the
// Communicator through Transport::publish_position.
struct CommPosition {
  uint64_t completed = 0;  // collectives completed: the last completed seq is completed - 1
  bool active = false;     // inside the collective below (else idle since `since`)
  CommOp op = CommOp::kAllReduce;
  uint64_t seq = 0;
  uint64_t count = 0;                           // elements of the active collective
  std::chrono::steady_clock::time_point since;  // entered the collective, or finished the last
  // What the rank says it does outside collectives ("writing the checkpoint of step 2000"; ""
  // for nothing said): a peer waiting past its timeout sees why in the desync report.
  std::string activity;
};

// A rank's latest position as this rank knows it.
struct RankPosition {
  bool known = false;  // a report from that rank has arrived (always true for this rank)
  CommPosition pos;    // `since` is on this process's clock
  std::chrono::steady_clock::time_point heard;  // when the report arrived (this rank: now)
};

// A communication failure: timeout, dead or closed peer, mismatched calls, malformed frames.
// Reaches main() as exit code 1 with this message.
class CommError : public std::runtime_error {
 public:
  explicit CommError(const std::string& what) : std::runtime_error(what) {}
};

// An asynchronous send started by Transport::send_start.
class PendingSend {
 public:
  // Waits like wait() but swallows its error: a handle dropped on an exception path (the caller
  // may free the buffer right after) still never leaves the transport referencing freed memory.
  virtual ~PendingSend() = default;
  // Returns once the transport no longer references the data; rethrows the send's CommError.
  // Call at most once.
  virtual void wait() = 0;
};

class Transport {
 public:
  Transport() { position_.since = std::chrono::steady_clock::now(); }
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "inproc" | "grpc"

  // Sends h.bytes bytes from data to dst. Returns when data may be reused.
  virtual void send(int dst, const MsgHeader& h, const void* data) = 0;
  // Starts sending h.bytes bytes from data to dst and returns at once with a handle. The caller
  // must not modify or free data until the handle's wait() returned (or the handle was
  // destroyed, which waits too). Ordering is send()'s: messages to one dst are matched by key,
  // so several may be in flight. Errors: CommError from send_start (e.g. after abort) or from
  // wait(). The default sends synchronously and returns a completed handle; transports that
  // can overlap sends (gRPC streams) override it.
  virtual std::unique_ptr<PendingSend> send_start(int dst, const MsgHeader& h, const void* data);
  // Receives the message (h.channel, h.part) from src into data (h.bytes bytes). Throws
  // CommError if it does not arrive by `deadline`, if src failed, or if its op or byte count
  // differ from h.
  virtual void recv(int src, const MsgHeader& h, void* data, Deadline deadline) = 0;
  // As recv, but adds (op == sum) / applies the reduction elementwise into data, which holds
  // h.bytes / 4 floats. Transports that can reduce straight from their receive buffer override
  // it to save a copy.
  enum class Reduce { kSum, kMin, kMax, kProd };
  virtual void recv_reduce(int src, const MsgHeader& h, float* data, Reduce r, Deadline deadline);
  // send(dst, sh, sdata), then recv (red null) or recv_reduce (*red) of rh from src into
  // rdata: one ring step. Same contract and errors as the two calls; returns when both are done.
  // Transports that can overlap them override it: the receive is posted while the send is
  // under way, so the incoming message lands straight in rdata instead of in a mailbox buffer
  // first (one copy less per byte on the receiver).
  virtual void send_recv(int dst, const MsgHeader& sh, const void* sdata, int src,
                         const MsgHeader& rh, void* rdata, const Reduce* red, Deadline deadline);

  // Fails every pending and future call with `why` (used when this rank or a peer dies).
  virtual void abort(const std::string& why) = 0;

  // Desync report. The communicator states where this rank is; positions() returns every
  // rank's latest known position, in rank order, or nothing if this transport cannot learn the
  // others' (the default). gRPC learns them from heartbeats, inproc from the shared hub. Both
  // are cheap and never block on peers: they run on the failure path.
  virtual void publish_position(const CommPosition& p) {
    std::lock_guard<std::mutex> lk(position_mu_);
    position_ = p;
    position_.activity = activity_;
  }
  // Sets what this rank says it does (CommPosition::activity) until the next call; published at
  // once with its position.
  void set_activity(const std::string& what) {
    CommPosition p;
    {
      std::lock_guard<std::mutex> lk(position_mu_);
      activity_ = what;
      p = position_;
    }
    publish_position(p);
  }
  virtual std::vector<RankPosition> positions() const { return {}; }

  uint64_t bytes_sent() const { return bytes_sent_.load(std::memory_order_relaxed); }
  uint64_t bytes_recv() const { return bytes_recv_.load(std::memory_order_relaxed); }

 protected:
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> bytes_recv_{0};

  CommPosition own_position() const {
    std::lock_guard<std::mutex> lk(position_mu_);
    return position_;
  }

 private:
  mutable std::mutex position_mu_;
  CommPosition position_;
  std::string activity_;
};

// dst[i] = reduce(dst[i], src[i]) for n floats.
void reduce_into(float* dst, const float* src, size_t n, Transport::Reduce r);

// "allreduce seq 12 part 3 (4096 bytes)", "int64 allreduce seq 3 ..." for messages.
std::string describe(const MsgHeader& h);

}  // namespace dtrain
