// Mailbox: everything one rank receives from one sender, shared by every transport: the
// in-process hub, the gRPC streams and the shared-memory rings deliver into it, and recv()
// takes from it. One matching rule and one mismatch message for all of them:
//
//  - Messages are keyed by (channel, part); messages under one key are taken in arrival order.
//  - A receive states the op and byte count it expects. A waiting message under its key with
//    another op or size, or any message on its channel with another op or another broadcast root
//    (parts_conflict), is a mismatch, reported at once as "mismatched calls: rank S sent <what>,
//    rank D expected <what>" (mismatch_msg).
//  - A receive posted before its message arrives gets the payload delivered straight into its
//    buffer (one copy, not two); one posted while its message is arriving takes over the rest.
//
// Producers deliver chunks (a message in one or more pieces, in offset order) through
// deliver(), with a Partials map of their own for messages still arriving. Failure of the
// sender (fail) or of the whole transport (abort) wakes every waiter.
#pragma once

#include <atomic>
#include <compare>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "comm/grpc/wire.h"
#include "comm/seq_window.h"
#include "comm/transport.h"

namespace dtrain {

struct MsgKey {
  uint64_t channel = 0, part = 0;
  auto operator<=>(const MsgKey&) const = default;
};

// "mismatched calls: rank 1 sent <got>, rank 0 expected <want>": the one mismatch message.
std::string mismatch_msg(int src, int self, const MsgHeader& got, const MsgHeader& want);

// Recycles mailbox buffers. Fresh large allocations are mmapped and page-faulted on first
// write, then unmapped on free; measured, that made the receiver several times slower than the
// copy itself (page faults are expensive in VMs). Collectives repeat the same message sizes, so a
// few retained buffers serve almost every message. Large buffers also ask for transparent huge
// pages, so that a fresh one costs 512x fewer faults. Thread-safe.
class BufferPool {
 public:
  struct Free {
    void operator()(char* p) const;
  };
  struct Buf {
    std::unique_ptr<char, Free> p;
    uint64_t cap = 0;
  };
  Buf get(uint64_t n);  // throws std::bad_alloc
  void put(Buf b);

 private:
  static constexpr uint64_t kMinPooled = 64 << 10;
  static constexpr uint64_t kHuge = 2 << 20, kHugeMin = 4 << 20;
  static constexpr uint64_t kMaxHeld = uint64_t{256} << 20;
  std::mutex mu_;
  std::multimap<uint64_t, std::unique_ptr<char, Free>> free_;
  uint64_t held_ = 0;
};

// A recv() waiting for a message: a producer delivers straight into `dest` when the message's
// op and size match, either from its first chunk (the recv was posted before the message
// started) or from the next chunk on (the recv found it partly received, copied the prefix and
// redirected the rest).
struct Posted {
  MsgHeader h;
  char* dest = nullptr;
  bool taken = false;      // a producer is writing into dest
  bool done = false;       // dest holds the whole message
  bool abandoned = false;  // recv gave up (timeout, failure): drop the rest, never touch dest
  // Producers writing a chunk into dest without the mailbox's lock (pin_direct); recv does not
  // return while there are any. interrupt (the last pinning producer's) makes a blocked one
  // return, ending its connection.
  int writers = 0;
  std::function<void()> interrupt;
  // Reduce the payload into dest (recv_reduce) instead of copying; only producers that can
  // reduce (deliver's `reduce`) take such a post.
  bool reduce = false;
  Transport::Reduce op = Transport::Reduce::kSum;
};

// A message being or having been received into a mailbox buffer. Guarded by Mailbox's mutex.
struct InMsg {
  MsgHeader h;  // as announced by the sender
  BufferPool::Buf buf;
  uint64_t received = 0;
  bool complete = false;
  std::shared_ptr<Posted> redirect;  // set: the rest goes to redirect->dest, buf is released
};

// One message of one producer whose chunks are still arriving.
struct Partial {
  MsgHeader h;
  uint64_t received = 0;
  std::shared_ptr<InMsg> msg;    // mailbox path
  std::shared_ptr<Posted> post;  // direct path
};
using Partials = std::map<MsgKey, Partial>;  // one per producer, touched only by it

// How received messages reached the caller's buffer (GrpcRecvStats): messages delivered
// straight into a posted buffer, redirected there part-way, or copied from the mailbox; and
// chunks a producer read from its socket straight into a posted buffer (pin_direct).
struct RecvCounters {
  std::atomic<uint64_t> direct{0}, redirected{0}, mailbox{0}, chunks_read_direct{0};
};

// The peers this rank saw go down and when, so that an error about a later one -- a neighbour
// that failed because of the first -- can name the first. A peer that said why it went down
// (its abort notice, excuse()) is never the first: its reason names the rank that failed, and
// its closed connections may reach this rank before the failed rank's do. Thread-safe.
class DownLog {
 public:
  void note(int peer);
  void excuse(int peer);
  // "" or "; rank 2 went down first, 0.3 s earlier: rank 1 probably failed because of it".
  std::string note_for(int peer) const;
  // The first peer noted and not excused, or -1.
  int first() const;

 private:
  struct Entry {
    int peer;
    std::chrono::steady_clock::time_point at;
  };
  // Unlocked helper: the first entry not excused and not `except`, or null.
  const Entry* first_locked(int except) const;
  mutable std::mutex mu_;
  std::vector<Entry> down_;  // in the order noted, a peer at most once
  std::set<int> excused_;
};

// How a receiving thread moves messages in and waits, when a producer is not a thread of its
// own (the shared-memory rings are drained by the receivers themselves).
class RecvPump {
 public:
  virtual ~RecvPump() = default;
  // Moves what has arrived into the mailbox. Called without the mailbox's lock before each
  // look at it. Throws CommError on a corrupt source.
  virtual void pump() = 0;
  // Sleeps until something may have changed, `deadline` at the latest.
  virtual void wait(Deadline deadline) = 0;
};

// What a producer may make a mailbox hold ahead of its receives; a message past a limit is
// malformed (deliver returns kOverflow), so a forged or broken peer cannot make the receiver
// buffer without bound. The in-process hub (trusted) has none.
struct MailboxLimits {
  size_t max_messages = SIZE_MAX;  // messages waiting, under distinct keys or the same one
  // Bytes of those messages; the first waiting message is always admitted (a message is at
  // most wire.h's kGrpcMaxMessageBytes).
  uint64_t max_bytes = UINT64_MAX;
  // The transport's, shared by its mailboxes: receives note their channel in it, and collective
  // sequence numbers too far ahead of this rank's are refused. Null: not judged.
  SeqWindow* window = nullptr;
};

class Mailbox {
 public:
  // self receives from src. down may be null.
  Mailbox(int self, int src, BufferPool* pool, RecvCounters* counters, DownLog* down,
          MailboxLimits limits);

  // ---- producer side ----
  // "" or what is wrong with chunk f, given the messages still arriving from this producer:
  // a claimed sender that is not src, a chunk whose start never arrived, or out of order.
  std::string check_chunk(const WireFrame& f, const Partials& partial) const;
  struct Delivery {
    enum Kind { kOk, kAborted, kOverflow } kind = kOk;
    std::string why;  // kAborted: the abort reason; kOverflow: what would have overflowed
  };
  // Reduces a chunk's payload (f.len / 4 floats) elementwise into dst.
  using ReduceFn = std::function<void(float* dst, Transport::Reduce op)>;
  // Delivers one checked chunk into a posted recv's buffer, a redirected one or the mailbox.
  // copy(dst) writes the chunk's payload to dst; reduce, when not null, reduces the same
  // payload into dst, so that a posted recv_reduce takes the message without a copy. A chunk for
  // a posted recv_reduce must start at a float boundary (and end at one unless it is the last):
  // else kOverflow, saying so (only a broken or forged peer sends that).
  Delivery deliver(Partials& partial, const WireFrame& f, const std::function<void(char*)>& copy,
                   const ReduceFn* reduce);
  // For a producer that can read a chunk's payload straight from its source (TCP) instead of
  // staging it: where f's payload belongs in a posted plain recv's buffer (not a recv_reduce),
  // or null when it must be staged and passed to deliver(). f must have passed check_chunk.
  // A non-null result pins that recv: it cannot return (done, timed out or failed) until
  // unpin_direct; a recv that gives up meanwhile calls `interrupt`, which must make the
  // producer's read return soon (shut its socket down).
  char* pin_direct(Partials& partial, const WireFrame& f, std::function<void()> interrupt);
  // After pin_direct: the payload was written (written) or the read failed (the producer then
  // ends its stream, which fails the mailbox).
  void unpin_direct(Partials& partial, const WireFrame& f, bool written);
  // Delivers a whole message at once (a rank to itself, the in-process hub).
  void deliver_whole(const MsgHeader& h, const void* data);

  // ---- receiver side ----
  // Receives (h.channel, h.part) into data, or reduces it into data when red is set (h.bytes
  // / 4 floats). Throws CommError on a mismatch (mismatch_msg), src's failure, an abort, or
  // `deadline`. pump, when set, moves messages in and waits instead of the condition variable.
  void recv(const MsgHeader& h, void* data, const Transport::Reduce* red, Deadline deadline,
            RecvPump* pump = nullptr);
  // "" or the mismatch between h and a message waiting on h's channel with another op.
  std::string mismatch_on_channel(const MsgHeader& h);

  // ---- state ----
  // No more messages will come from src, and why. The first reason stays; returns whether this
  // call set it. Wakes every waiter.
  bool fail(const std::string& why);
  // The whole transport failed: every pending and later recv fails with why.
  void abort(const std::string& why);
  bool down() const { return down_.load(); }
  // Why the whole transport aborted, and why src failed ("" = not).
  std::string aborted_reason() const;
  std::string failed_reason() const;
  // Streams from src: one more opened / one ended. The last one ending fails the mailbox with
  // `why` (unless it failed already).
  void stream_opened();
  void stream_ended(const std::string& why);
  // Waits until a stream from src was opened, the mailbox went down, or `deadline`. Returns ""
  // once connected, the reason it went down, or "timeout".
  std::string wait_connected(std::chrono::steady_clock::time_point deadline);

 private:
  std::string mismatch_locked(const MsgHeader& h) const;
  // Requires mu_. Records len more bytes of p (under key) as received: a completed message is
  // marked done for its recv, or leaves msgs_ when it was redirected.
  void account_locked(const MsgKey& key, Partial& p, uint64_t len);
  // Requires mu_. The recv posted for a new message h under key, marked taken, when h may go
  // straight into its buffer: nothing is waiting under key, op and size match, and the producer
  // can reduce if the recv is a recv_reduce (can_reduce). Else null.
  std::shared_ptr<Posted> claim_post_locked(const MsgKey& key, const MsgHeader& h, bool can_reduce);
  // "" or which of limits_ a new waiting message h would break.
  std::string over_limits_locked(const MsgHeader& h) const;
  // Requires mu_. Takes over the partly received front message into post's buffer.
  void redirect_locked(InMsg& front, std::shared_ptr<Posted>& post, const MsgHeader& h, void* data);
  std::shared_ptr<InMsg> new_msg_locked(const MsgHeader& h);

  const int self_, src_;
  BufferPool* const pool_;
  RecvCounters* const counters_;
  DownLog* const down_log_;
  const MailboxLimits limits_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<MsgKey, std::deque<std::shared_ptr<InMsg>>> msgs_;  // per key in arrival order
  size_t buffered_ = 0;                                        // messages in msgs_, all keys
  uint64_t buffered_bytes_ = 0;                                // their announced sizes
  std::map<MsgKey, std::shared_ptr<Posted>> posted_;
  int live_streams_ = 0;
  bool connected_ = false;         // a stream from src was opened
  std::string failed_;             // no more messages will come from src, and why
  std::string aborted_;            // the whole transport failed, and why
  std::atomic<bool> down_{false};  // failed_ or aborted_ is set: read without mu_
};

}  // namespace dtrain
