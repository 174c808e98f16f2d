// The gRPC transport (see grpc_transport.h and proto/dtrain.proto for the wire protocol).
//
// Thread model. Every rank runs one grpc::Server with callback-API services only, so incoming
// frames are handled on gRPC's own executor threads: InStream::OnReadDone parses a frame,
// validates it and copies its payload once, either into a buffer the receiver already posted
// with recv() or into a per-sender mailbox. That progress never depends on recv() being
// called. Outgoing data uses one client-side callback stream per peer (OutStream): send()
// queues the message and blocks until gRPC no longer needs the caller's memory; the stream
// writes chunks of the queued messages round-robin, one write in flight, so HTTP/2 flow
// control is the back-pressure and concurrent messages interleave chunk by chunk.
//
// Memory. By default a chunk's payload slice points into the caller's buffer (no copy on the
// send side); send() returns once gRPC released every such slice, i.e. the bytes left the
// process. The receive side copies each payload once out of gRPC's slices: into the recv's
// buffer if the recv is already waiting (or, arriving mid-message, takes over the rest), else
// into a pooled mailbox buffer that recv copies out of (recv_reduce reduces straight from it).
//
// Heartbeats. From the rendezvous on, a thread of its own sends a unary Health.Beat (with this
// rank's position for the desync report) to every peer each heartbeat_s / 3, at most one in
// flight per peer, and checks when each peer was last heard of. A peer silent for longer than
// heartbeat_s (or 3 of its own intervals) is failed as if its stream had ended: a frozen
// process (SIGSTOP) keeps its sockets open, so nothing else would notice before the collective
// deadline. Beats never enter the mailboxes, and stop when the transport aborts or shuts down.
//
// Failure. A peer's incoming stream ending (clean half-close, cancellation, or its process
// dying, which closes the socket) fails every pending and future recv from it that has no
// complete message waiting; a failed outgoing stream fails sends to it. A malformed frame, or
// abort(), fails everything: outgoing streams are cancelled and incoming streams finished, so
// peers notice at once too.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/security/server_credentials.h>
#include <malloc.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <compare>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <thread>

#include "comm/grpc_internal.h"
#include "comm/grpc_transport.h"
#include "comm/shm_ring.h"
#include "dtrain.grpc.pb.h"
#include "dtrain.pb.h"
#include "util/check.h"

namespace dtrain {
namespace {

using Clock = std::chrono::steady_clock;
namespace wire = ::dtrain::wire;

// How long the destructor waits for peers to acknowledge our half-close before cancelling.
constexpr auto kCloseGrace = std::chrono::seconds(2);
// After a stream failed, how long send() waits for gRPC to drop its references to the
// caller's memory before giving up (only relevant to zero-copy sends; normally milliseconds).
constexpr auto kReleaseGrace = std::chrono::seconds(30);
// Keepalive: notices a peer whose host vanished without closing the socket.
constexpr int kKeepaliveTimeMs = 10000;
constexpr int kKeepaliveTimeoutMs = 10000;
// Extra time a joining rank waits beyond its rendezvous timeout, so that rank 0's own timeout
// (which names the missing ranks) reaches it first when both started together.
constexpr auto kJoinSlack = std::chrono::seconds(5);
// Shared-memory path: each sender's ring in the receiver's segment, and the payload per record.
// 512 KiB records let the receiver start reducing while the sender still copies a 1 MiB
// segment; a 4 MiB ring holds a few collectives' segments in flight.
constexpr uint64_t kShmRingBytes = uint64_t{4} << 20;
constexpr uint64_t kShmChunkBytes = uint64_t{512} << 10;
// Before sleeping on a futex, a waiter polls this many rounds of ~64 pause instructions (a few
// microseconds each): a message that is about to arrive costs no system call. Kept short: the
// spinning thread takes a core from a compute thread.
constexpr int kShmSpinRounds = 16;
// A sleeping shared-memory waiter rechecks deadlines and failures at least this often.
constexpr auto kShmMaxSleep = std::chrono::milliseconds(50);

// ---- small helpers --------------------------------------------------------------------------

std::string strip_brackets(const std::string& host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    return host.substr(1, host.size() - 2);
  return host;
}

// "host:port", bracketing IPv6 literals.
std::string host_port(const std::string& host, int port) {
  const std::string h = strip_brackets(host);
  if (h.find(':') != std::string::npos) return fmt::format("[{}]:{}", h, port);
  return fmt::format("{}:{}", h, port);
}

bool is_wildcard(const std::string& host) {
  const std::string h = strip_brackets(host);
  return h.empty() || h == "0.0.0.0" || h == "::";
}

// Constant-time in the content of `got` (the time depends only on the lengths), so a client
// cannot find the token byte by byte.
bool token_equal(std::string_view expected, std::string_view got) {
  unsigned char diff = expected.size() == got.size() ? 0 : 1;
  const volatile char* g = got.data();
  for (size_t i = 0; i < expected.size(); ++i) {
    const char c = i < got.size() ? g[i] : 0;
    diff |= static_cast<unsigned char>(expected[i] ^ c);
  }
  return diff == 0;
}

// gRPC takes system_clock deadlines only.
std::chrono::system_clock::time_point wall(Clock::time_point t) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(t - Clock::now());
}

// Three significant digits: a deadline computed a moment before the call reads "0.5", not
// "0.499993".
std::string seconds_str(double s) {
  return fmt::format("{:.3g}", s);
}

std::string ranks_str(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

std::string read_pem(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(fmt::format("cannot read TLS {} file '{}'", what, path));
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

std::string status_str(const grpc::Status& s) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  const int code = static_cast<int>(s.error_code());
  const char* name = code >= 0 && code <= 16 ? kNames[code] : "UNKNOWN";
  return s.error_message().empty() ? name : fmt::format("{}: {}", name, s.error_message());
}

// The HTTP/2 and TCP knobs of `t` (0 = leave gRPC's default), for channels and the server.
template <typename Set>
void set_tuning_args(const GrpcTuning& t, Set set) {
  if (t.lookahead_bytes > 0) set(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, t.lookahead_bytes);
  if (t.max_frame_size > 0) set(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, t.max_frame_size);
  if (t.tcp_read_chunk > 0) {
    set(GRPC_ARG_TCP_READ_CHUNK_SIZE, t.tcp_read_chunk);
    set(GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, std::max(t.tcp_read_chunk, 4 << 20));
  }
}

std::string mismatch_msg(int src, int self, const MsgHeader& got, const MsgHeader& want) {
  return fmt::format("mismatched calls: rank {} sent {}, rank {} expected {}", src, describe(got),
                     self, describe(want));
}

// ---- frame codec ----------------------------------------------------------------------------
// A frame is a protobuf-encoded wire::Frame; see proto/dtrain.proto.

constexpr int kFieldSrc = 1, kFieldChannel = 2, kFieldPart = 3, kFieldOp = 4, kFieldTotal = 5,
              kFieldOffset = 6, kFieldPayload = 15;
constexpr size_t kMaxHeaderBytes = 96;  // 7 tags + 7 ten-byte varints

size_t put_varint(char* p, uint64_t v) {
  size_t n = 0;
  while (v >= 0x80) {
    p[n++] = static_cast<char>(v | 0x80);
    v >>= 7;
  }
  p[n++] = static_cast<char>(v);
  return n;
}

size_t put_field(char* p, int field, uint64_t v) {
  size_t n = put_varint(p, static_cast<uint64_t>(field) << 3);
  return n + put_varint(p + n, v);
}

// Everything of a frame up to and including the payload's length prefix.
size_t encode_frame_header(char* out, int src, const MsgHeader& h, uint64_t offset, uint64_t len) {
  size_t n = 0;
  n += put_field(out + n, kFieldSrc, static_cast<uint64_t>(static_cast<int64_t>(src)));
  n += put_field(out + n, kFieldChannel, h.channel);
  n += put_field(out + n, kFieldPart, h.part);
  n += put_field(out + n, kFieldOp, static_cast<uint32_t>(h.op));
  n += put_field(out + n, kFieldTotal, h.bytes);
  n += put_field(out + n, kFieldOffset, offset);
  n += put_varint(out + n, (uint64_t{kFieldPayload} << 3) | 2);
  n += put_varint(out + n, len);
  return n;
}

// Reads bytes across the slices of a received message without copying them.
class SliceCursor {
 public:
  explicit SliceCursor(const std::vector<grpc::Slice>& slices) : s_(slices) {
    for (const auto& sl : s_) remaining_ += sl.size();
    settle();
  }
  uint64_t remaining() const { return remaining_; }
  size_t slice() const { return i_; }
  size_t offset() const { return off_; }

  bool read_varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (remaining_ == 0) return false;
      const auto b = static_cast<uint8_t>(s_[i_].begin()[off_]);
      advance(1);
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return true;
    }
    return false;  // more than ten bytes
  }
  bool skip(uint64_t n) {
    if (n > remaining_) return false;
    while (n > 0) {
      const uint64_t take = std::min<uint64_t>(n, s_[i_].size() - off_);
      advance(take);
      n -= take;
    }
    return true;
  }

 private:
  void advance(uint64_t n) {
    off_ += n;
    remaining_ -= n;
    settle();
  }
  void settle() {
    while (i_ < s_.size() && off_ >= s_[i_].size()) {
      ++i_;
      off_ = 0;
    }
  }
  const std::vector<grpc::Slice>& s_;
  size_t i_ = 0, off_ = 0;
  uint64_t remaining_ = 0;
};

struct ParsedFrame {
  int src = 0;
  MsgHeader h;  // channel, part, op, bytes = total_bytes
  uint32_t op_raw = 0;
  uint64_t offset = 0;
  uint64_t len = 0;  // payload bytes
  size_t pay_slice = 0, pay_off = 0;
};

// Parses the header fields and locates the payload; nothing is copied. Returns "" or what is
// wrong with the frame.
std::string parse_frame(const std::vector<grpc::Slice>& slices, ParsedFrame* f) {
  SliceCursor c(slices);
  bool have_payload = false;
  while (c.remaining() > 0) {
    uint64_t tag;
    if (!c.read_varint(&tag)) return "truncated field tag";
    const uint64_t field = tag >> 3;
    const int type = static_cast<int>(tag & 7);
    if (field >= kFieldSrc && field <= kFieldOffset) {
      uint64_t v;
      if (type != 0 || !c.read_varint(&v)) return fmt::format("bad header field {}", field);
      switch (field) {
        case kFieldSrc:
          f->src = static_cast<int32_t>(static_cast<uint32_t>(v));
          break;
        case kFieldChannel:
          f->h.channel = v;
          break;
        case kFieldPart:
          f->h.part = v;
          break;
        case kFieldOp:
          f->op_raw = static_cast<uint32_t>(v);
          break;
        case kFieldTotal:
          f->h.bytes = v;
          break;
        case kFieldOffset:
          f->offset = v;
          break;
      }
      continue;
    }
    switch (type) {
      case 0: {
        uint64_t v;
        if (!c.read_varint(&v)) return "truncated varint";
        break;
      }
      case 1:
        if (!c.skip(8)) return "truncated fixed64";
        break;
      case 5:
        if (!c.skip(4)) return "truncated fixed32";
        break;
      case 2: {
        uint64_t len;
        if (!c.read_varint(&len) || len > c.remaining())
          return fmt::format("field {} is longer than the frame", field);
        if (field == kFieldPayload) {
          if (have_payload) return "payload appears twice";
          have_payload = true;
          f->len = len;
          f->pay_slice = c.slice();
          f->pay_off = c.offset();
        }
        c.skip(len);
        break;
      }
      default:
        return fmt::format("unsupported wire type {}", type);
    }
  }
  f->h.op = static_cast<CommOp>(f->op_raw);
  return "";
}

void copy_payload(const std::vector<grpc::Slice>& slices, const ParsedFrame& f, char* dst) {
  uint64_t left = f.len;
  size_t i = f.pay_slice, off = f.pay_off;
  while (left > 0) {
    const size_t take = std::min<uint64_t>(left, slices[i].size() - off);
    std::memcpy(dst, slices[i].begin() + off, take);
    dst += take;
    left -= take;
    ++i;
    off = 0;
  }
}

// ---- receive-side state -----------------------------------------------------------------------

struct Key {
  uint64_t channel = 0, part = 0;
  auto operator<=>(const Key&) const = default;
};

// Recycles mailbox buffers. Fresh large allocations are mmapped and page-faulted on first
// write, then unmapped on free; measured, that made the receiver several times slower than the
// copy itself (page faults are expensive in VMs). Collectives repeat the same message sizes, so a
// few retained buffers serve almost every message. Large buffers also ask for transparent huge
// pages, so that a fresh one costs 512x fewer faults.
class BufferPool {
 public:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  struct Buf {
    std::unique_ptr<char, Free> p;
    uint64_t cap = 0;
  };
  Buf get(uint64_t n) {
    if (n >= kMinPooled) {
      std::lock_guard<std::mutex> lk(mu_);
      // The smallest free buffer that fits, unless it is more than twice too big.
      const auto it = free_.lower_bound(n);
      if (it != free_.end() && it->first <= 2 * n) {
        Buf b{std::move(it->second), it->first};
        free_.erase(it);
        held_ -= b.cap;
        return b;
      }
    }
    Buf b;
    if (n >= kHugeMin) {
      b.cap = (n + kHuge - 1) / kHuge * kHuge;
      b.p.reset(static_cast<char*>(std::aligned_alloc(kHuge, b.cap)));
      if (b.p) madvise(b.p.get(), b.cap, MADV_HUGEPAGE);  // a hint: failure is harmless
    } else {
      b.cap = n;
      b.p.reset(static_cast<char*>(std::malloc(std::max<uint64_t>(n, 1))));
    }
    if (!b.p) throw std::bad_alloc();
    return b;
  }
  void put(Buf b) {
    if (b.cap < kMinPooled) return;
    std::lock_guard<std::mutex> lk(mu_);
    while (held_ + b.cap > kMaxHeld && !free_.empty()) {  // drop the smallest first
      held_ -= free_.begin()->first;
      free_.erase(free_.begin());
    }
    if (held_ + b.cap > kMaxHeld) return;
    held_ += b.cap;
    free_.emplace(b.cap, std::move(b.p));
  }

 private:
  static constexpr uint64_t kMinPooled = 64 << 10;
  static constexpr uint64_t kHuge = 2 << 20, kHugeMin = 4 << 20;
  static constexpr uint64_t kMaxHeld = uint64_t{256} << 20;
  std::mutex mu_;
  std::multimap<uint64_t, std::unique_ptr<char, Free>> free_;
  uint64_t held_ = 0;
};

// A message being or having been received into a mailbox buffer.
struct InMsg;

// A recv() waiting for a message: a stream delivers straight into `dest` (saving the mailbox
// copy) when the message's op and size match, either from its first chunk (the recv was posted
// before the message started) or from the next chunk on (the recv found it partly received,
// copied the prefix and redirected the rest).
struct Posted {
  MsgHeader h;
  char* dest = nullptr;
  bool taken = false;      // a stream is writing into dest
  bool done = false;       // dest holds the whole message
  bool abandoned = false;  // recv gave up (timeout, failure): drop the rest, never touch dest
  // Shared-memory path only: reduce the payload into dest (recv_reduce) instead of copying.
  bool reduce = false;
  Transport::Reduce op = Transport::Reduce::kSum;
};

// A message being or having been received into a mailbox buffer. All fields but buf's
// contents are guarded by Inbox::mu; buf is written only under it, too.
struct InMsg {
  MsgHeader h;  // as announced by the sender
  BufferPool::Buf buf;
  uint64_t received = 0;
  bool complete = false;
  std::shared_ptr<Posted> redirect;  // set: the rest goes to redirect->dest, buf is released
};

// Everything received from one sender. All fields are guarded by mu.
struct Inbox {
  std::mutex mu;
  std::condition_variable cv;
  std::map<Key, std::deque<std::shared_ptr<InMsg>>> msgs;  // per key in arrival order
  std::map<Key, std::shared_ptr<Posted>> posted;
  int live_streams = 0;
  bool connected = false;         // a stream from this sender was accepted
  std::string failed;             // no more messages will come from this sender, and why
  std::string aborted;            // the whole transport failed, and why
  std::atomic<bool> down{false};  // failed or aborted is set: read by senders without mu
};

// One message of one incoming stream whose chunks are still arriving.
struct Partial {
  MsgHeader h;
  uint64_t received = 0;
  std::shared_ptr<InMsg> msg;    // mailbox path
  std::shared_ptr<Posted> post;  // direct path
};

// ---- heartbeats -------------------------------------------------------------------------------

// One outgoing beat.
struct BeatCall {
  grpc::ClientContext ctx;
  wire::Heartbeat req;
  wire::HeartbeatAck ack;
};

// Beats in flight, shared with their completion callbacks so that those never touch the
// transport. calls[r] is the beat to rank r still in flight, if any.
struct BeatsInFlight {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::shared_ptr<BeatCall>> calls;
  int n = 0;
};

// What this rank last heard from a peer's heartbeats.
struct PeerHealth {
  bool beat = false;  // a beat arrived
  Clock::time_point heard;
  double interval_s = 0;  // the peer's beat interval, as it says
  CommPosition pos;       // `since` converted to this process's clock
};

// ---- send-side state ---------------------------------------------------------------------------

// Completion of one send(): done when every chunk has been handed to gRPC and gRPC released
// every slice that lends the caller's memory.
struct SendTicket {
  std::mutex mu;
  std::condition_variable cv;
  int64_t lent = 0;  // payload slices gRPC still holds
  bool all_chunked = false;
  std::string error;  // the stream failed before all chunks were handed over

  static void release(void* p) {
    auto* sp = static_cast<std::shared_ptr<SendTicket>*>(p);
    {
      std::lock_guard<std::mutex> lk((*sp)->mu);
      if (--(*sp)->lent == 0) (*sp)->cv.notify_all();
    }
    delete sp;
  }
};

struct OutMsg {
  MsgHeader h;
  const char* data = nullptr;
  uint64_t next = 0;  // next payload offset to chunk
  std::shared_ptr<SendTicket> ticket;
};

class GrpcTransport;

// Server side of one peer's Data.Stream: drains frames into the transport's mailboxes.
class InStream final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  InStream(GrpcTransport* t, grpc::CallbackServerContext* ctx, grpc::ByteBuffer* response, int src)
      : t_(t), ctx_(ctx), response_(response), src_(src) {}

  void start() {
    std::lock_guard<std::mutex> lk(mu_);
    StartRead(&buf_);
  }
  // Finishes the RPC once (later calls are ignored). Safe from any thread. gRPC never runs a
  // reaction inline from Finish/StartRead, so holding mu_ across them cannot deadlock.
  void finish(const grpc::Status& s);

  void OnReadDone(bool ok) override;
  void OnDone() override;

  int src() const { return src_; }
  std::map<Key, Partial> partial;  // touched only by this stream's reactions
  uint64_t frames = 0, bytes = 0;

 private:
  GrpcTransport* const t_;
  grpc::CallbackServerContext* const ctx_;
  grpc::ByteBuffer* const response_;
  const int src_;
  grpc::ByteBuffer buf_;
  std::mutex mu_;
  bool finished_ = false;
};

// Refuses an RPC before reading anything.
class RefuseStream final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  explicit RefuseStream(const grpc::Status& s) { Finish(s); }
  void OnDone() override { delete this; }
};

// Client side of our stream to one peer.
class OutStream final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  OutStream(int self, int dst, size_t chunk_bytes, bool copy_send)
      : self_(self), dst_(dst), chunk_(chunk_bytes), copy_(copy_send) {}

  void start(const std::shared_ptr<grpc::Channel>& channel, const std::string& token) {
    ctx_.AddMetadata(kGrpcTokenKey, token);
    ctx_.AddMetadata(kGrpcRankKey, std::to_string(self_));
    grpc::GenericStub stub(channel);
    stub.PrepareBidiStreamingCall(&ctx_, kGrpcStreamMethod, grpc::StubOptions(), this);
    StartRead(&ack_);
    StartCall();
    started_ = true;
  }

  // Queues m; throws CommError if the stream is down.
  void enqueue(const std::shared_ptr<OutMsg>& m) {
    std::lock_guard<std::mutex> lk(mu_);
    if (!error_.empty()) throw CommError(error_);
    if (done_ || closing_) throw CommError(fmt::format("connection to rank {} is closed", dst_));
    queue_.push_back(m);
    if (!writing_) write_next_locked();
  }

  // Fails queued messages with `why` and cancels the RPC.
  void fail(const std::string& why) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (error_.empty()) error_ = why;
      fail_queue_locked();
    }
    if (started_) ctx_.TryCancel();
  }
  // Half-closes once the queue is drained.
  void close() {
    std::lock_guard<std::mutex> lk(mu_);
    closing_ = true;
    if (started_ && !writing_ && !done_ && !writes_done_) {
      writes_done_ = true;
      StartWritesDone();
    }
  }
  void cancel() {
    if (started_) ctx_.TryCancel();
  }
  // True once OnDone ran (or the call never started).
  bool wait_done(Clock::time_point until) {
    std::unique_lock<std::mutex> lk(mu_);
    return cv_.wait_until(lk, until, [&] { return done_ || !started_; });
  }
  // "" while the stream is healthy, else why it failed.
  std::string error() {
    std::lock_guard<std::mutex> lk(mu_);
    return error_;
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lk(mu_);
    grpc::ByteBuffer().Swap(&cur_);  // drop our reference to the chunk's slices
    writing_ = false;
    if (!ok) return;  // the call failed; OnDone reports the status
    if (!queue_.empty()) {
      write_next_locked();
    } else if (closing_ && !writes_done_) {
      writes_done_ = true;
      StartWritesDone();
    }
  }
  void OnReadDone(bool /*ok*/) override {}  // the StreamAck, or the call ending
  void OnDone(const grpc::Status& s) override {
    std::lock_guard<std::mutex> lk(mu_);
    if (error_.empty() && !(s.ok() && writes_done_)) {
      // ABORTED carries a message the peer composed for us ("rank 1 closed its connection").
      error_ = s.error_code() == grpc::StatusCode::ABORTED
                   ? s.error_message()
                   : fmt::format("connection to rank {} lost: {}", dst_, status_str(s));
      spdlog::debug("rank {}: stream to rank {} ended: {}", self_, dst_, status_str(s));
    }
    if (error_.empty()) error_ = fmt::format("connection to rank {} is closed", dst_);
    fail_queue_locked();
    done_ = true;
    cv_.notify_all();  // last touch of *this: the owner may destroy it once done_ is seen
  }

 private:
  // Makes the next chunk of the front message (round-robin across queued messages) and writes
  // it. Requires mu_ and no write in flight.
  void write_next_locked() {
    std::shared_ptr<OutMsg> m = queue_.front();
    queue_.pop_front();
    const uint64_t off = m->next;
    const uint64_t len = std::min<uint64_t>(chunk_, m->h.bytes - off);
    char hdr[kMaxHeaderBytes];
    grpc::Slice slices[2] = {grpc::Slice(hdr, encode_frame_header(hdr, self_, m->h, off, len)),
                             grpc::Slice()};
    char* payload = const_cast<char*>(m->data) + off;
    const bool last = off + len >= m->h.bytes;
    {
      std::lock_guard<std::mutex> tl(m->ticket->mu);
      if (len > 0 && !copy_) {
        ++m->ticket->lent;
        slices[1] = grpc::Slice(payload, len, &SendTicket::release,
                                new std::shared_ptr<SendTicket>(m->ticket));
      } else if (len > 0) {
        slices[1] = grpc::Slice(payload, len);  // copies
      }
      if (last) {
        m->ticket->all_chunked = true;
        m->ticket->cv.notify_all();
      }
    }
    grpc::ByteBuffer(slices, len > 0 ? 2 : 1).Swap(&cur_);
    m->next = off + len;
    if (!last) queue_.push_back(std::move(m));
    writing_ = true;
    StartWrite(&cur_);
  }
  void fail_queue_locked() {
    for (auto& m : queue_) {
      std::lock_guard<std::mutex> tl(m->ticket->mu);
      m->ticket->error = error_;
      m->ticket->cv.notify_all();
    }
    queue_.clear();
  }

  const int self_, dst_;
  const size_t chunk_;
  const bool copy_;
  grpc::ClientContext ctx_;
  grpc::ByteBuffer ack_, cur_;
  std::atomic<bool> started_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<OutMsg>> queue_;
  bool writing_ = false, closing_ = false, writes_done_ = false, done_ = false;
  std::string error_;
};

// ---- rendezvous (rank 0) ---------------------------------------------------------------------

class Coordinator;

class JoinReactor final : public grpc::ServerUnaryReactor {
 public:
  JoinReactor(Coordinator* c, wire::JoinReply* reply) : c_(c), reply_(reply) {}
  void OnCancel() override;
  void OnDone() override { delete this; }
  wire::JoinReply* reply() { return reply_; }

 private:
  Coordinator* const c_;
  wire::JoinReply* const reply_;
};

// Collects the joins; answers all of them once every rank joined, or fails them all (timeout
// naming the missing ranks, or the first disagreement). Every JoinReactor it accepts is
// finished exactly once, under mu_.
class Coordinator {
 public:
  Coordinator(const GrpcOptions& o, Clock::time_point deadline)
      : world_(o.world_size),
        hash_(o.config_hash),
        timeout_s_(o.rendezvous_timeout_s),
        deadline_(deadline) {
    timer_ = std::thread([this] { timer_loop(); });
  }
  ~Coordinator() { shutdown("rank 0 shut down"); }

  grpc::ServerUnaryReactor* join(grpc::CallbackServerContext* ctx, const wire::JoinRequest* req,
                                 wire::JoinReply* reply) {
    auto* r = new JoinReactor(this, reply);
    std::lock_guard<std::mutex> lk(mu_);
    const int rank = req->rank();
    if (failure_) {
      r->Finish(*failure_);
    } else if (done_) {
      r->Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                             fmt::format("rank {} joined after the rendezvous completed", rank)));
    } else if (req->protocol_version() != kGrpcProtocolVersion) {
      fail_locked(r, fmt::format("rank {} speaks wire protocol {}, rank 0 speaks {}", rank,
                                 req->protocol_version(), kGrpcProtocolVersion));
    } else if (req->world_size() != world_) {
      fail_locked(r, fmt::format("rank {} says the world size is {}, rank 0 says {}", rank,
                                 req->world_size(), world_));
    } else if (rank < 0 || rank >= world_) {
      fail_locked(r, fmt::format("rank {} is out of range for world size {}", rank, world_));
    } else if (req->config_hash() != hash_) {
      fail_locked(r, fmt::format("rank {} has config hash {}, rank 0 has {}", rank,
                                 req->config_hash(), hash_));
    } else if (pending_.count(rank)) {
      fail_locked(r, fmt::format("rank {} joined twice (from {} and {})", rank, pending_[rank].peer,
                                 ctx->peer()));
    } else if (req->listen_address().empty()) {
      fail_locked(r, fmt::format("rank {} sent no listen address", rank));
    } else {
      pending_[rank] = Pending{r, req->listen_address(), ctx->peer(), req->shm_name()};
      spdlog::debug("rendezvous: rank {} joined from {} ({}/{})", rank, ctx->peer(),
                    pending_.size(), world_);
      if (static_cast<int>(pending_.size()) == world_) complete_locked();
    }
    return r;
  }

  void cancelled(JoinReactor* r) {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto it = pending_.begin(); it != pending_.end(); ++it) {
      if (it->second.r == r) {  // the joiner gave up (it will retry or fail on its own)
        pending_.erase(it);
        r->Finish(grpc::Status::CANCELLED);
        return;
      }
    }
  }

  void shutdown(const std::string& why) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!done_ && !failure_) fail_locked(nullptr, why);
      stop_ = true;
    }
    cv_.notify_all();
    if (timer_.joinable()) timer_.join();
  }

 private:
  struct Pending {
    JoinReactor* r = nullptr;
    std::string address, peer, shm_name;
  };

  void complete_locked() {
    wire::JoinReply table;
    for (const auto& [rank, p] : pending_) {
      wire::Peer* peer = table.add_peers();
      peer->set_rank(rank);
      peer->set_address(p.address);
      peer->set_shm_name(p.shm_name);
    }
    for (auto& [rank, p] : pending_) {
      *p.r->reply() = table;
      p.r->Finish(grpc::Status::OK);
    }
    pending_.clear();
    done_ = true;
    cv_.notify_all();
  }

  // Fails the rendezvous for everyone: pending joins, `r` (the join that revealed the problem)
  // and all later joins get the message.
  void fail_locked(JoinReactor* r, const std::string& why) {
    spdlog::debug("rendezvous failed: {}", why);
    failure_ = grpc::Status(grpc::StatusCode::ABORTED, why);
    for (auto& [rank, p] : pending_) p.r->Finish(*failure_);
    pending_.clear();
    if (r) r->Finish(*failure_);
    cv_.notify_all();
  }

  void timer_loop() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait_until(lk, deadline_, [&] { return stop_ || done_ || failure_; });
    if (stop_ || done_ || failure_) return;
    std::vector<int> missing;
    for (int r = 0; r < world_; ++r)
      if (!pending_.count(r)) missing.push_back(r);
    fail_locked(nullptr, fmt::format("rendezvous timed out after {} s: {} never joined",
                                     seconds_str(timeout_s_), ranks_str(missing)));
  }

  const int world_;
  const std::string hash_;
  const double timeout_s_;
  const Clock::time_point deadline_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int, Pending> pending_;
  bool done_ = false, stop_ = false;
  std::optional<grpc::Status> failure_;
  std::thread timer_;
};

void JoinReactor::OnCancel() {
  c_->cancelled(this);
}

// ---- the transport ----------------------------------------------------------------------------

class GrpcTransport final : public Transport {
 public:
  GrpcTransport(const GrpcOptions& o, const GrpcTuning& tune)
      : o_(o),
        tune_(tune),
        rank_(o.rank),
        world_(o.world_size),
        data_service_(this),
        health_service_(this),
        rendezvous_service_(this) {
    for (int r = 0; r < world_; ++r) {
      inboxes_.push_back(std::make_unique<Inbox>());
      shm_send_mu_.push_back(std::make_unique<std::mutex>());
      shm_read_mu_.push_back(std::make_unique<std::mutex>());
    }
    shm_out_.resize(world_);
    shm_names_.resize(world_);
    shm_src_.assign(world_, 0);
    shm_partial_.resize(world_);
    health_.resize(world_);
    beats_->calls.resize(world_);
  }

  ~GrpcTransport() override { shutdown(); }

  int rank() const override { return rank_; }
  int size() const override { return world_; }
  std::string backend() const override { return "grpc"; }
  const std::vector<std::string>& peers() const { return peers_; }
  std::vector<int> shm_peers() const {
    std::vector<int> out;
    for (int r = 0; r < world_; ++r)
      if (shm_out_[r]) out.push_back(r);
    return out;
  }
  GrpcRecvStats recv_stats() const {
    return GrpcRecvStats{n_direct_.load(), n_redirected_.load(), n_mailbox_.load()};
  }

  // Starts the server, joins, opens the streams; throws CommError.
  void connect();

  void send(int dst, const MsgHeader& h, const void* data) override;
  void recv(int src, const MsgHeader& h, void* data, Deadline deadline) override;
  void recv_reduce(int src, const MsgHeader& h, float* data, Reduce r, Deadline deadline) override;
  void abort(const std::string& why) override;

  // Server-side entry points (gRPC threads).
  grpc::ServerReadReactor<grpc::ByteBuffer>* open_in_stream(grpc::CallbackServerContext* ctx,
                                                            grpc::ByteBuffer* response);
  grpc::ServerUnaryReactor* on_join(grpc::CallbackServerContext* ctx, const wire::JoinRequest* req,
                                    wire::JoinReply* reply);
  grpc::ServerUnaryReactor* on_beat(grpc::CallbackServerContext* ctx, const wire::Heartbeat* req);
  std::vector<RankPosition> positions() const override;
  grpc::Status on_frame(InStream& s, const grpc::ByteBuffer& bb);
  void in_stream_ended(InStream& s, bool cancelled);
  void in_stream_done(InStream* s) {
    std::lock_guard<std::mutex> lk(in_mu_);
    in_streams_.erase(s);
  }

 private:
  class DataService final : public wire::Data::WithRawCallbackMethod_Stream<wire::Data::Service> {
   public:
    explicit DataService(GrpcTransport* t) : t_(t) {}
    grpc::ServerReadReactor<grpc::ByteBuffer>* Stream(grpc::CallbackServerContext* ctx,
                                                      grpc::ByteBuffer* response) override {
      return t_->open_in_stream(ctx, response);
    }

   private:
    GrpcTransport* const t_;
  };
  class HealthService final : public wire::Health::CallbackService {
   public:
    explicit HealthService(GrpcTransport* t) : t_(t) {}
    grpc::ServerUnaryReactor* Beat(grpc::CallbackServerContext* ctx, const wire::Heartbeat* req,
                                   wire::HeartbeatAck* /*ack*/) override {
      return t_->on_beat(ctx, req);
    }

   private:
    GrpcTransport* const t_;
  };
  class RendezvousService final : public wire::Rendezvous::CallbackService {
   public:
    explicit RendezvousService(GrpcTransport* t) : t_(t) {}
    grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx, const wire::JoinRequest* req,
                                   wire::JoinReply* reply) override {
      return t_->on_join(ctx, req, reply);
    }

   private:
    GrpcTransport* const t_;
  };

  bool authorized(const grpc::CallbackServerContext* ctx, const char* what) const;
  grpc::ChannelArguments channel_args() const;
  void start_server();
  void join();
  void open_streams();
  void wait_for_peers();
  void shutdown();
  // ---- heartbeats ----
  void start_heartbeats();  // once channels_ exist
  void stop_heartbeats();
  void heartbeat_loop();
  void send_beats();
  // Fails every peer not heard from for too long, judged from `baseline` on (when checking
  // started, or when this rank last got the CPU back after a stall).
  void check_peers(Clock::time_point now, Clock::time_point baseline);
  // Fails every pending and future recv from and send to `peer` with `why`, as if its stream
  // had ended (unless it already had).
  void fail_peer(int peer, const std::string& why);
  void finish_in_streams(const grpc::Status& s);
  // Logs, aborts the transport and returns the status for a malformed `kind` ("frame" on a
  // stream, "shared-memory record") from src.
  grpc::Status malformed(int src, const std::string& what, const char* kind);
  std::string check_frame(int src, const ParsedFrame& f,
                          const std::map<Key, Partial>& partial) const;
  // Delivers one validated chunk from src into the posted recv's buffer, a redirected one or
  // the mailbox. copy(dst) writes the chunk's payload to dst; flat, when not null, is the same
  // payload contiguous in memory (the shared-memory path), from which a posted recv_reduce
  // reduces directly.
  grpc::Status deliver(int src, std::map<Key, Partial>& partial, const ParsedFrame& f,
                       const std::function<void(char*)>& copy, const char* flat);

  // ---- shared-memory path (lib/comm/shm_ring.h) ----
  // Maps the segments of the peers that advertised one, before our streams open.
  void attach_shm();
  void send_shm(int dst, const MsgHeader& h, const void* data);
  void send_stream(int dst, const MsgHeader& h, const void* data);
  // "" or the mismatch between h and a message src sent on the same channel with another op
  // (src's calls disagreed with ours). Drains src's shared-memory ring first.
  std::string mismatch_from(int src, const MsgHeader& h);
  // recv / recv_reduce (red != null) of a message src writes through shared memory. The
  // calling thread drains src's ring itself; it sleeps on our segment's bell, which senders,
  // other draining threads and failures (in_stream_ended, abort) ring.
  void recv_shm(int src, const MsgHeader& h, void* data, const Reduce* red, Deadline deadline);
  // Delivers every record waiting in src's ring, unless another thread is already at it.
  // Throws CommError (after aborting) on a corrupt ring.
  void drain_shm(int src);
  void ring_shm_waiters() {
    if (shm_in_) shm_in_->ring_owner();
  }
  void deliver_local(const MsgHeader& h, const void* data);
  // Throws if, at the front of src's mailbox for key or on the same channel, a message
  // disagrees with h. Requires ib.mu.
  void check_mismatch_locked(Inbox& ib, int src, const MsgHeader& h);

  const GrpcOptions o_;
  const GrpcTuning tune_;
  const int rank_, world_;
  std::shared_ptr<grpc::ServerCredentials> server_creds_;
  std::shared_ptr<grpc::ChannelCredentials> channel_creds_;
  DataService data_service_;
  HealthService health_service_;
  RendezvousService rendezvous_service_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<grpc::Server> server_;
  std::string listen_address_;
  std::vector<std::string> peers_;
  std::vector<std::unique_ptr<Inbox>> inboxes_;
  BufferPool pool_;
  std::vector<std::unique_ptr<OutStream>> out_;  // null for self
  std::vector<std::shared_ptr<grpc::Channel>> channels_;

  std::unique_ptr<ShmSegment> shm_in_;                // our inbound rings; null: shm off
  std::vector<std::unique_ptr<ShmSegment>> shm_out_;  // peers' segments; null: use the stream
  std::vector<std::string> shm_names_;                // from the peer table
  std::vector<char> shm_src_;  // src writes to us through shm (fixed once connected)
  std::vector<std::unique_ptr<std::mutex>> shm_send_mu_;  // one writer per outgoing ring
  // One drainer per incoming ring; it guards the ring's unfinished messages too.
  std::vector<std::unique_ptr<std::mutex>> shm_read_mu_;
  std::vector<std::map<Key, Partial>> shm_partial_;

  std::mutex in_mu_;  // guards in_streams_ and closing_; ordered before InStream::mu_, Inbox::mu
  std::set<InStream*> in_streams_;
  bool closing_ = false;

  std::atomic<uint64_t> n_direct_{0}, n_redirected_{0}, n_mailbox_{0};

  std::mutex abort_mu_;
  std::string abort_reason_;
  std::atomic<bool> aborted_{false};

  std::vector<std::unique_ptr<wire::Health::Stub>> health_stubs_;  // null for self
  std::shared_ptr<BeatsInFlight> beats_ = std::make_shared<BeatsInFlight>();
  mutable std::mutex health_mu_;
  // The first peer this rank saw go down and when (-1: none yet), so that an error about a
  // later one -- a neighbour that failed because of it -- can name it. Taken after an inbox's
  // mu, never before.
  mutable std::mutex first_down_mu_;
  int first_down_ = -1;
  Clock::time_point first_down_at_{};
  void note_down(int peer);
  std::string first_down_note(int peer) const;
  std::vector<PeerHealth> health_;  // guarded by health_mu_
  std::mutex hb_mu_;                // guards hb_stop_
  std::condition_variable hb_cv_;
  bool hb_stop_ = false;
  // Every peer connected: silence counts (until shutdown). Guarded by hb_check_mu_, which is
  // held while peers are judged, so shutdown never races fail_peer's use of out_.
  std::mutex hb_check_mu_;
  bool hb_armed_ = false;
  Clock::time_point hb_armed_at_;  // when it was armed: silence counts from then at the earliest
  std::thread hb_thread_;
};

void InStream::finish(const grpc::Status& s) {
  std::lock_guard<std::mutex> lk(mu_);
  if (finished_) return;
  finished_ = true;
  if (s.ok()) {
    wire::StreamAck ack;
    ack.set_frames(frames);
    ack.set_bytes(bytes);
    const std::string b = ack.SerializeAsString();
    grpc::Slice sl(b);
    grpc::ByteBuffer(&sl, 1).Swap(response_);
  }
  Finish(s);
}

void InStream::OnReadDone(bool ok) {
  if (!ok) {  // the peer half-closed, or the call broke / was cancelled
    t_->in_stream_ended(*this, ctx_->IsCancelled());
    finish(grpc::Status::OK);
    return;
  }
  grpc::Status s = t_->on_frame(*this, buf_);
  grpc::ByteBuffer().Swap(&buf_);
  if (!s.ok()) {
    finish(s);
    return;
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (!finished_) StartRead(&buf_);
}

void InStream::OnDone() {
  t_->in_stream_done(this);
  delete this;
}

bool GrpcTransport::authorized(const grpc::CallbackServerContext* ctx, const char* what) const {
  const auto& md = ctx->client_metadata();
  const auto it = md.find(kGrpcTokenKey);
  const std::string_view got =
      it == md.end() ? std::string_view() : std::string_view(it->second.data(), it->second.size());
  if (token_equal(o_.token, got)) return true;
  spdlog::warn("rank {}: refused {} from {}: {} job token", rank_, what, ctx->peer(),
               it == md.end() ? "missing" : "wrong");
  return false;
}

grpc::ServerReadReactor<grpc::ByteBuffer>* GrpcTransport::open_in_stream(
    grpc::CallbackServerContext* ctx, grpc::ByteBuffer* response) {
  if (!authorized(ctx, "a data stream"))
    return new RefuseStream(
        grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong or missing job token"));
  const auto& md = ctx->client_metadata();
  const auto it = md.find(kGrpcRankKey);
  int src = -1;
  if (it != md.end()) {
    const std::string v(it->second.data(), it->second.size());
    char* end = nullptr;
    const long r = std::strtol(v.c_str(), &end, 10);
    if (!v.empty() && *end == '\0' && r >= 0 && r < world_ && r != rank_) src = static_cast<int>(r);
  }
  if (src < 0)
    return new RefuseStream(
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                     fmt::format("missing or invalid {} for world size {}", kGrpcRankKey, world_)));
  std::lock_guard<std::mutex> lk(in_mu_);
  if (closing_ || aborted_.load())
    return new RefuseStream(grpc::Status(grpc::StatusCode::ABORTED,
                                         fmt::format("rank {} closed its connection", rank_)));
  auto* s = new InStream(this, ctx, response, src);
  in_streams_.insert(s);
  {
    Inbox& ib = *inboxes_[src];
    std::lock_guard<std::mutex> il(ib.mu);
    ++ib.live_streams;
    ib.connected = true;
    ib.cv.notify_all();
  }
  spdlog::debug("rank {}: stream from rank {} ({}) accepted", rank_, src, ctx->peer());
  s->start();
  return s;
}

void GrpcTransport::in_stream_ended(InStream& s, bool cancelled) {
  Inbox& ib = *inboxes_[s.src()];
  std::lock_guard<std::mutex> lk(ib.mu);
  if (--ib.live_streams > 0 || !ib.failed.empty()) return;
  ib.failed = cancelled
                  ? fmt::format("connection to rank {} lost (its stream was cancelled)", s.src())
                  : fmt::format("rank {} closed its connection", s.src());
  ib.down = true;
  note_down(s.src());
  ib.cv.notify_all();
  ring_shm_waiters();
}

void GrpcTransport::note_down(int peer) {
  std::lock_guard<std::mutex> lk(first_down_mu_);
  if (first_down_ >= 0) return;
  first_down_ = peer;
  first_down_at_ = Clock::now();
}

std::string GrpcTransport::first_down_note(int peer) const {
  std::lock_guard<std::mutex> lk(first_down_mu_);
  if (first_down_ < 0 || first_down_ == peer) return "";
  return fmt::format(
      "; rank {} went down first, {} earlier: rank {} probably failed because of it", first_down_,
      seconds_str(std::chrono::duration<double>(Clock::now() - first_down_at_).count()), peer);
}

grpc::Status GrpcTransport::malformed(int src, const std::string& what, const char* kind) {
  const std::string why = fmt::format("malformed {} from rank {}: {}", kind, src, what);
  spdlog::error("rank {}: {}", rank_, why);
  abort(why);
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, why);
}

std::string GrpcTransport::check_frame(int src, const ParsedFrame& f,
                                       const std::map<Key, Partial>& partial) const {
  if (f.src != src)
    return fmt::format("it claims to come from rank {} on rank {}'s stream", f.src, src);
  if (!valid_op(f.op_raw)) return fmt::format("unknown op {}", f.op_raw);
  if (f.h.bytes > kGrpcMaxMessageBytes)
    return fmt::format("total bytes {} exceed the limit of {}", f.h.bytes, kGrpcMaxMessageBytes);
  if (f.len > f.h.bytes || f.offset > f.h.bytes - f.len)
    return fmt::format("offset {} + payload {} exceeds the total of {} bytes", f.offset, f.len,
                       f.h.bytes);
  const auto it = partial.find(Key{f.h.channel, f.h.part});
  if (it == partial.end()) {
    if (f.offset != 0)
      return fmt::format("chunk at offset {} of {} whose start never arrived", f.offset,
                         describe(f.h));
  } else {
    const Partial& p = it->second;
    if (f.h.op != p.h.op || f.h.bytes != p.h.bytes)
      return fmt::format("a chunk of {} says {}", describe(p.h), describe(f.h));
    if (f.offset != p.received)
      return fmt::format("chunk at offset {} of {}, expected offset {}", f.offset, describe(p.h),
                         p.received);
  }
  return "";
}

grpc::Status GrpcTransport::on_frame(InStream& s, const grpc::ByteBuffer& bb) try {
  std::vector<grpc::Slice> slices;
  if (!bb.Dump(&slices).ok()) return malformed(s.src(), "unreadable message", "frame");
  ParsedFrame f;
  if (std::string err = parse_frame(slices, &f); !err.empty())
    return malformed(s.src(), err, "frame");
  // Validate everything before touching any buffer.
  if (std::string err = check_frame(s.src(), f, s.partial); !err.empty())
    return malformed(s.src(), err, "frame");
  const grpc::Status st = deliver(
      s.src(), s.partial, f, [&](char* dst) { copy_payload(slices, f, dst); }, nullptr);
  if (st.ok()) {
    ++s.frames;
    s.bytes += f.len;
  }
  return st;
} catch (const std::exception& e) {  // bad_alloc for a huge message, mostly
  return malformed(s.src(), e.what(), "frame");
}

grpc::Status GrpcTransport::deliver(int src, std::map<Key, Partial>& partial, const ParsedFrame& f,
                                    const std::function<void(char*)>& copy, const char* flat) {
  const Key key{f.h.channel, f.h.part};
  auto it = partial.find(key);
  Inbox& ib = *inboxes_[src];
  if (it == partial.end()) {  // a new message: deliver directly if its recv is posted
    Partial p;
    p.h = f.h;
    bool overflow = false;
    {
      std::lock_guard<std::mutex> lk(ib.mu);
      if (!ib.aborted.empty()) return grpc::Status(grpc::StatusCode::ABORTED, ib.aborted);
      const auto q = ib.msgs.find(key);
      const auto post = ib.posted.find(key);
      if ((q == ib.msgs.end() || q->second.empty()) && post != ib.posted.end() &&
          !post->second->taken && post->second->h.op == f.h.op &&
          post->second->h.bytes == f.h.bytes && (flat || !post->second->reduce)) {
        post->second->taken = true;
        p.post = post->second;
        ++n_direct_;
      } else if (q == ib.msgs.end() && ib.msgs.size() >= kGrpcMaxBufferedMessages) {
        overflow = true;
      } else {
        p.msg = std::make_shared<InMsg>();
        p.msg->h = f.h;
        p.msg->buf = pool_.get(f.h.bytes);
        ib.msgs[key].push_back(p.msg);
        ib.cv.notify_all();  // a waiting recv may have to report a mismatch now
      }
    }
    if (overflow)
      return malformed(
          src,
          fmt::format("{} would be message {} buffered ahead of this rank's "
                      "receives, over the limit of {} (sequence numbers far ahead "
                      "of this rank's: a forged or broken peer)",
                      describe(f.h), kGrpcMaxBufferedMessages + 1, kGrpcMaxBufferedMessages),
          "frame");
    it = partial.emplace(key, std::move(p)).first;
  }
  Partial& p = it->second;
  const bool complete = p.received + f.len == p.h.bytes;
  {
    // Copies happen under the lock: recv may redirect the message into its own buffer or
    // abandon that buffer (timeout) at any moment, and must see whole chunks.
    std::lock_guard<std::mutex> lk(ib.mu);
    if (p.post) {
      if (!p.post->abandoned) {
        if (p.post->reduce)
          reduce_into(reinterpret_cast<float*>(p.post->dest + f.offset),
                      reinterpret_cast<const float*>(flat), f.len / sizeof(float), p.post->op);
        else
          copy(p.post->dest + f.offset);
      }
      if (complete) {
        p.post->done = true;
        const auto post = ib.posted.find(key);
        if (post != ib.posted.end() && post->second == p.post) ib.posted.erase(post);
      }
    } else if (p.msg->redirect) {
      Posted& post = *p.msg->redirect;
      if (!post.abandoned) copy(post.dest + f.offset);
      if (complete) {
        post.done = true;
        if (const auto q = ib.msgs.find(key); q != ib.msgs.end()) {
          const auto m = std::find(q->second.begin(), q->second.end(), p.msg);
          if (m != q->second.end()) q->second.erase(m);
          if (q->second.empty()) ib.msgs.erase(q);
        }
      }
    } else {
      copy(p.msg->buf.p.get() + f.offset);
      p.msg->complete = complete;
    }
    if (p.msg) p.msg->received = p.received + f.len;
    if (complete) ib.cv.notify_all();
  }
  p.received += f.len;
  if (complete) partial.erase(it);
  return grpc::Status::OK;
}

void GrpcTransport::check_mismatch_locked(Inbox& ib, int src, const MsgHeader& h) {
  // Any message from src on the same channel with another op means the ranks called different
  // collectives at this sequence number; the same key with another size is a mismatch too.
  for (auto it = ib.msgs.lower_bound(Key{h.channel, 0});
       it != ib.msgs.end() && it->first.channel == h.channel; ++it) {
    if (it->second.empty()) continue;
    const MsgHeader& got = it->second.front()->h;
    if (got.op != h.op || (it->first.part == h.part && got.bytes != h.bytes))
      throw CommError(mismatch_msg(src, rank_, got, h));
  }
}

void GrpcTransport::recv(int src, const MsgHeader& h, void* data, Deadline deadline) {
  DT_CHECK(src >= 0 && src < world_);
  if (shm_src_[src]) {
    recv_shm(src, h, data, nullptr, deadline);
    return;
  }
  const auto start = Clock::now();
  Inbox& ib = *inboxes_[src];
  const Key key{h.channel, h.part};
  std::shared_ptr<Posted> post;
  std::unique_lock<std::mutex> lk(ib.mu);
  // On every exit but success: make sure no stream writes into data after we return.
  auto unpost = [&] {
    if (!post) return;
    post->abandoned = true;
    const auto it = ib.posted.find(key);
    if (it != ib.posted.end() && it->second == post) ib.posted.erase(it);
  };
  for (;;) {
    if (post && post->taken) {
      if (post->done) break;  // delivered straight into data
    } else {
      try {
        check_mismatch_locked(ib, src, h);
      } catch (...) {
        unpost();
        throw;
      }
      const auto q = ib.msgs.find(key);
      if (q != ib.msgs.end() && !q->second.empty()) {
        InMsg& front = *q->second.front();
        if (front.complete) {
          std::shared_ptr<InMsg> m = std::move(q->second.front());
          q->second.pop_front();
          if (q->second.empty()) ib.msgs.erase(q);
          unpost();
          lk.unlock();
          if (h.bytes) std::memcpy(data, m->buf.p.get(), h.bytes);
          pool_.put(std::move(m->buf));
          bytes_recv_ += h.bytes;
          ++n_mailbox_;
          return;
        }
        if (!front.redirect) {
          // Partly received: copy what is there and have the stream write the rest into data
          // (otherwise the whole message would be copied twice).
          if (post) {
            const auto it = ib.posted.find(key);
            if (it != ib.posted.end() && it->second == post) ib.posted.erase(it);
          } else {
            post = std::make_shared<Posted>();
            post->h = h;
            post->dest = static_cast<char*>(data);
          }
          post->taken = true;
          front.redirect = post;
          ++n_redirected_;
          if (front.received) std::memcpy(data, front.buf.p.get(), front.received);
          pool_.put(std::move(front.buf));
          continue;
        }
        // else: the front message was redirected by a recv that gave up; it disappears once
        // its last chunk arrives.
      } else if (!post) {
        post = std::make_shared<Posted>();
        post->h = h;
        post->dest = static_cast<char*>(data);
        DT_CHECK_MSG(ib.posted.emplace(key, post).second,
                     "two concurrent recvs of " << describe(h) << " from rank " << src);
      }
    }
    if (!ib.aborted.empty()) {
      unpost();
      throw CommError(ib.aborted);
    }
    if (!ib.failed.empty()) {
      unpost();
      throw CommError(ib.failed + " (this rank was waiting for " + describe(h) + ")" +
                      first_down_note(src));
    }
    if (Clock::now() >= deadline) {
      unpost();
      const double s = std::chrono::duration<double>(deadline - start).count();
      throw CommError(fmt::format("recv timed out after {} s waiting for {} from rank {}",
                                  seconds_str(std::max(s, 0.0)), describe(h), src));
    }
    ib.cv.wait_until(lk, deadline);
  }
  bytes_recv_ += h.bytes;
}

void GrpcTransport::recv_reduce(int src, const MsgHeader& h, float* data, Reduce r,
                                Deadline deadline) {
  DT_CHECK(src >= 0 && src < world_);
  DT_CHECK_EQ(h.bytes % sizeof(float), 0u);
  if (shm_src_[src]) {
    recv_shm(src, h, data, &r, deadline);
    return;
  }
  {  // Already in the mailbox: reduce straight from it, saving a copy.
    Inbox& ib = *inboxes_[src];
    std::unique_lock<std::mutex> lk(ib.mu);
    const auto q = ib.msgs.find(Key{h.channel, h.part});
    if (q != ib.msgs.end() && !q->second.empty() && q->second.front()->complete &&
        q->second.front()->h.op == h.op && q->second.front()->h.bytes == h.bytes) {
      std::shared_ptr<InMsg> m = std::move(q->second.front());
      q->second.pop_front();
      if (q->second.empty()) ib.msgs.erase(q);
      lk.unlock();
      // new char[] storage is suitably aligned for float.
      reduce_into(data, reinterpret_cast<const float*>(m->buf.p.get()), h.bytes / sizeof(float), r);
      pool_.put(std::move(m->buf));
      bytes_recv_ += h.bytes;
      ++n_mailbox_;
      return;
    }
  }
  Transport::recv_reduce(src, h, data, r, deadline);
}

void GrpcTransport::deliver_local(const MsgHeader& h, const void* data) {
  Inbox& ib = *inboxes_[rank_];
  const Key key{h.channel, h.part};
  std::lock_guard<std::mutex> lk(ib.mu);
  const auto q = ib.msgs.find(key);
  const auto post = ib.posted.find(key);
  if ((q == ib.msgs.end() || q->second.empty()) && post != ib.posted.end() &&
      post->second->h.op == h.op && post->second->h.bytes == h.bytes) {
    if (h.bytes) std::memcpy(post->second->dest, data, h.bytes);
    post->second->taken = post->second->done = true;
    ++n_direct_;
    ib.posted.erase(post);
  } else {
    auto m = std::make_shared<InMsg>();
    m->h = h;
    m->buf = pool_.get(h.bytes);
    if (h.bytes) std::memcpy(m->buf.p.get(), data, h.bytes);
    m->complete = true;
    ib.msgs[key].push_back(std::move(m));
  }
  ib.cv.notify_all();
}

void GrpcTransport::send(int dst, const MsgHeader& h, const void* data) {
  DT_CHECK(dst >= 0 && dst < world_);
  if (aborted_.load()) {
    std::lock_guard<std::mutex> lk(abort_mu_);
    throw CommError(abort_reason_);
  }
  if (h.bytes > kGrpcMaxMessageBytes)
    throw CommError(fmt::format("cannot send {}: larger than the {}-byte message limit",
                                describe(h), kGrpcMaxMessageBytes));
  if (dst == rank_) {
    deliver_local(h, data);
    bytes_sent_ += h.bytes;
    return;
  }
  try {
    if (shm_out_[dst])
      send_shm(dst, h, data);
    else
      send_stream(dst, h, data);
  } catch (const CommError&) {
    // A peer that left after sending us another collective at this sequence number disagreed
    // with us before it went: say so, rather than only that it closed.
    if (std::string m = mismatch_from(dst, h); !m.empty()) throw CommError(m);
    throw;
  }
}

std::string GrpcTransport::mismatch_from(int src, const MsgHeader& h) {
  if (shm_src_[src]) {
    try {
      drain_shm(src);  // its last messages may still be in the ring
    } catch (const CommError&) {
    }
  }
  Inbox& ib = *inboxes_[src];
  std::lock_guard<std::mutex> lk(ib.mu);
  for (auto it = ib.msgs.lower_bound(Key{h.channel, 0});
       it != ib.msgs.end() && it->first.channel == h.channel; ++it)
    if (!it->second.empty() && it->second.front()->h.op != h.op)
      return mismatch_msg(src, rank_, it->second.front()->h, h);
  return "";
}

void GrpcTransport::send_stream(int dst, const MsgHeader& h, const void* data) {
  auto m = std::make_shared<OutMsg>();
  m->h = h;
  m->data = static_cast<const char*>(data);
  m->ticket = std::make_shared<SendTicket>();
  out_[dst]->enqueue(m);
  SendTicket& t = *m->ticket;
  std::unique_lock<std::mutex> lk(t.mu);
  // Wake up now and then: a stream that fails after our last chunk went out leaves the ticket
  // without an error (it is no longer queued), so the stream's own state and this transport's
  // abort are polled too, never waited on forever.
  while (!t.cv.wait_for(lk, std::chrono::milliseconds(100),
                        [&] { return (t.all_chunked && t.lent == 0) || !t.error.empty(); })) {
    lk.unlock();
    std::string why = out_[dst]->error();
    if (why.empty() && aborted_.load()) {
      std::lock_guard<std::mutex> al(abort_mu_);
      why = abort_reason_;
    }
    lk.lock();
    if (!why.empty() && t.error.empty()) t.error = why;
  }
  if (!t.error.empty()) {
    // gRPC drops our slices when the call is torn down; wait for that before the caller may
    // free the buffer.
    if (!t.cv.wait_for(lk, kReleaseGrace, [&] { return t.lent == 0; }))
      spdlog::error("rank {}: gRPC still references a failed send's buffer after {} s", rank_,
                    std::chrono::duration<double>(kReleaseGrace).count());
    throw CommError(t.error);
  }
  bytes_sent_ += h.bytes;
}

// ---- shared-memory path ------------------------------------------------------------------------

namespace {
void cpu_relax() {
  for (int i = 0; i < 64; ++i) __builtin_ia32_pause();
}
}  // namespace

void GrpcTransport::attach_shm() {
  if (!o_.shm) return;
  for (int r = 0; r < world_; ++r) {
    if (r == rank_ || shm_names_[r].empty()) continue;
    std::string why;
    shm_out_[r] = ShmSegment::open(shm_names_[r], r, world_, &why);
    if (shm_out_[r])
      shm_out_[r]->attach(rank_);
    else  // another host (the usual case) or no access: the stream carries the data
      spdlog::debug("rank {}: no shared memory to rank {}: {}", rank_, r, why);
  }
}

void GrpcTransport::send_shm(int dst, const MsgHeader& h, const void* data) {
  ShmSegment& seg = *shm_out_[dst];
  Inbox& peer = *inboxes_[dst];
  // A dead or closed peer is known from its stream to us: fail like a stream send would.
  auto check_peer = [&] {
    if (!peer.down.load()) return;
    std::lock_guard<std::mutex> lk(peer.mu);
    throw CommError(!peer.aborted.empty() ? peer.aborted
                                          : fmt::format("cannot send {} to rank {}: {}",
                                                        describe(h), dst, peer.failed));
  };
  check_peer();
  std::lock_guard<std::mutex> lk(*shm_send_mu_[dst]);
  const uint64_t chunk = std::min<uint64_t>(kShmChunkBytes, seg.max_payload());
  uint64_t off = 0;
  do {
    ShmRecord rec;
    rec.op = static_cast<uint32_t>(h.op);
    rec.channel = h.channel;
    rec.part = h.part;
    rec.total = h.bytes;
    rec.offset = off;
    rec.len = std::min<uint64_t>(chunk, h.bytes - off);
    for (int spins = 0;;) {
      const uint32_t seen = seg.space_bell(rank_);
      if (seg.try_write(rank_, rec, static_cast<const char*>(data) + off)) break;
      // The ring is full until dst drains it. Meanwhile keep our own rings moving, so that
      // ranks that all send before they receive cannot wait on each other.
      check_peer();
      for (int s = 0; s < world_; ++s)
        if (shm_src_[s]) drain_shm(s);
      if (spins++ < kShmSpinRounds)
        cpu_relax();
      else
        seg.wait_space(rank_, seen, std::chrono::milliseconds(1));
    }
    seg.ring_owner();
    off += rec.len;
  } while (off < h.bytes);
  bytes_sent_ += h.bytes;
}

void GrpcTransport::drain_shm(int src) {
  std::unique_lock<std::mutex> rl(*shm_read_mu_[src], std::try_to_lock);
  if (!rl.owns_lock()) return;  // another thread drains; it rings the bell when done
  bool any = false;
  for (;;) {
    ShmRecord rec;
    const char* payload = nullptr;
    std::string err;
    if (!shm_in_->peek(src, &rec, &payload, &err)) {
      if (err.empty()) break;
      throw CommError(malformed(src, err, "shared-memory record").error_message());
    }
    ParsedFrame f;
    f.src = src;
    f.op_raw = rec.op;
    f.h = MsgHeader{rec.channel, rec.part, static_cast<CommOp>(rec.op), rec.total};
    f.offset = rec.offset;
    f.len = rec.len;
    if (std::string e = check_frame(src, f, shm_partial_[src]); !e.empty())
      throw CommError(malformed(src, e, "shared-memory record").error_message());
    const grpc::Status st = deliver(
        src, shm_partial_[src], f,
        [&](char* dst) {
          if (f.len) std::memcpy(dst, payload, f.len);
        },
        payload);
    shm_in_->pop(src, rec);
    any = true;
    if (!st.ok()) break;  // aborted: recv reports it
  }
  rl.unlock();
  if (any) ring_shm_waiters();  // what we delivered may be what another thread waits for
}

void GrpcTransport::recv_shm(int src, const MsgHeader& h, void* data, const Reduce* red,
                             Deadline deadline) {
  const auto start = Clock::now();
  Inbox& ib = *inboxes_[src];
  const Key key{h.channel, h.part};
  std::shared_ptr<Posted> post;
  // On every exit but success: make sure no drainer writes into data after we return.
  auto unpost = [&] {
    if (!post) return;
    std::lock_guard<std::mutex> lk(ib.mu);
    post->abandoned = true;
    const auto it = ib.posted.find(key);
    if (it != ib.posted.end() && it->second == post) ib.posted.erase(it);
  };
  bool drained_after_failure = false;
  for (int spins = 0;;) {
    const uint32_t bell = shm_in_->bell();  // before looking: a later event changes it
    try {
      drain_shm(src);
    } catch (...) {
      unpost();
      throw;
    }
    std::shared_ptr<InMsg> ready;
    std::string error;
    {
      std::unique_lock<std::mutex> lk(ib.mu);
      if (post && post->done) break;  // delivered straight into data
      if (!post || !post->taken) {
        try {
          check_mismatch_locked(ib, src, h);
        } catch (const CommError& e) {
          error = e.what();
        }
        const auto q = ib.msgs.find(key);
        if (!error.empty()) {
        } else if (q != ib.msgs.end() && !q->second.empty()) {
          // Arrived before we posted (drained by another call). A message still arriving into
          // the mailbox is waited for: the rest of it comes in through a drain shortly.
          if (q->second.front()->complete) {
            ready = std::move(q->second.front());
            q->second.pop_front();
            if (q->second.empty()) ib.msgs.erase(q);
          }
        } else if (!post) {
          post = std::make_shared<Posted>();
          post->h = h;
          post->dest = static_cast<char*>(data);
          if (red) {
            post->reduce = true;
            post->op = *red;
          }
          DT_CHECK_MSG(ib.posted.emplace(key, post).second,
                       "two concurrent recvs of " << describe(h) << " from rank " << src);
        }
      }
      if (!ready && error.empty()) {
        if (!ib.aborted.empty()) {
          error = ib.aborted;
        } else if (!ib.failed.empty()) {
          // The peer's last messages may have landed after our drain: look once more.
          if (drained_after_failure)
            error = ib.failed + " (this rank was waiting for " + describe(h) + ")" +
                    first_down_note(src);
          drained_after_failure = true;
          spins = 0;
        } else if (Clock::now() >= deadline) {
          const double s = std::chrono::duration<double>(deadline - start).count();
          error = fmt::format("recv timed out after {} s waiting for {} from rank {}",
                              seconds_str(std::max(s, 0.0)), describe(h), src);
        }
      }
    }
    if (ready) {
      unpost();
      if (red)
        reduce_into(static_cast<float*>(data), reinterpret_cast<const float*>(ready->buf.p.get()),
                    h.bytes / sizeof(float), *red);
      else if (h.bytes)
        std::memcpy(data, ready->buf.p.get(), h.bytes);
      pool_.put(std::move(ready->buf));
      bytes_recv_ += h.bytes;
      ++n_mailbox_;
      return;
    }
    if (!error.empty()) {
      unpost();
      throw CommError(error);
    }
    if (spins++ < kShmSpinRounds) {
      cpu_relax();
    } else {
      const auto left =
          std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now());
      shm_in_->wait_bell(bell, std::clamp<std::chrono::microseconds>(
                                   left, std::chrono::microseconds(1), kShmMaxSleep));
    }
  }
  bytes_recv_ += h.bytes;
}

void GrpcTransport::abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> lk(abort_mu_);
    if (!abort_reason_.empty()) return;
    abort_reason_ = why.empty() ? "transport aborted" : why;
    aborted_ = true;
  }
  spdlog::debug("rank {}: transport aborted: {}", rank_, abort_reason_);
  for (auto& ib : inboxes_) {
    std::lock_guard<std::mutex> lk(ib->mu);
    ib->aborted = abort_reason_;
    ib->down = true;
    ib->cv.notify_all();
  }
  ring_shm_waiters();
  for (auto& o : out_)
    if (o) o->fail(abort_reason_);
  finish_in_streams(grpc::Status(grpc::StatusCode::ABORTED,
                                 fmt::format("rank {} aborted: {}", rank_, abort_reason_)));
}

void GrpcTransport::finish_in_streams(const grpc::Status& s) {
  std::lock_guard<std::mutex> lk(in_mu_);
  for (InStream* is : in_streams_) is->finish(s);
}

grpc::ServerUnaryReactor* GrpcTransport::on_join(grpc::CallbackServerContext* ctx,
                                                 const wire::JoinRequest* req,
                                                 wire::JoinReply* reply) {
  if (!authorized(ctx, "a rendezvous join") || !coordinator_) {
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    r->Finish(coordinator_
                  ? grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong or missing job token")
                  : grpc::Status(grpc::StatusCode::UNAVAILABLE, "not rank 0"));
    return r;
  }
  return coordinator_->join(ctx, req, reply);
}

grpc::ChannelArguments GrpcTransport::channel_args() const {
  grpc::ChannelArguments a;
  a.SetMaxSendMessageSize(-1);
  a.SetMaxReceiveMessageSize(-1);
  // Our own TCP connection per peer pair (ranks in one process would share one otherwise).
  a.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  a.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  a.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  a.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  a.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  a.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  a.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 1);  // turning it off halved throughput
  set_tuning_args(tune_, [&](const char* k, int v) { a.SetInt(k, v); });
  // Rendezvous: rank 0 may come up after us; retry connecting quickly.
  a.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  a.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  a.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return a;
}

void GrpcTransport::start_server() {
  grpc::ServerBuilder b;
  int data_port = 0, master_port = 0;
  const std::string data_addr = host_port(o_.bind, 0);
  b.AddListeningPort(data_addr, server_creds_, &data_port);
  std::string master_addr;
  if (rank_ == 0) {
    // Where rank 0 serves the rendezvous. MASTER_ADDR names this host as the other ranks see
    // it. A loopback MASTER_ADDR is bound as is (only local ranks can reach it anyway), and so
    // is one equal to our bind address. Otherwise it may be a hostname or an address behind NAT
    // that does not name a local interface, so listen on the wildcard of bind's address family:
    // reachable wherever MASTER_ADDR routes to; the job token guards the service.
    std::string host = o_.master_addr;
    if (!is_loopback_host(host) && strip_brackets(host) != strip_brackets(o_.bind))
      host = strip_brackets(o_.bind).find(':') != std::string::npos ? "::" : "0.0.0.0";
    master_addr = host_port(host, o_.master_port);
    b.AddListeningPort(master_addr, server_creds_, &master_port);
    b.RegisterService(&rendezvous_service_);
  }
  b.RegisterService(&data_service_);
  b.RegisterService(&health_service_);
  b.SetMaxReceiveMessageSize(kGrpcMaxFrameBytes);
  b.SetMaxSendMessageSize(-1);
  // A port held by another process must fail here, not be shared (gRPC sets SO_REUSEPORT).
  b.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  b.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  b.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  b.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, kKeepaliveTimeMs / 2);
  b.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  b.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 1);
  set_tuning_args(tune_, [&](const char* k, int v) { b.AddChannelArgument(k, v); });
  server_ = b.BuildAndStart();
  if (!server_ || data_port == 0 || (rank_ == 0 && master_port == 0)) {
    server_.reset();
    if (rank_ == 0 && master_port == 0)
      throw CommError(fmt::format(
          "rank 0 cannot listen on {} for the rendezvous (port in use or address not local?)",
          master_addr));
    throw CommError(fmt::format("rank {} cannot listen on {}", rank_, data_addr));
  }
  std::string host = o_.advertise;
  if (host.empty()) {
    host = o_.bind;
    if (is_wildcard(host)) {
      char name[256] = {};
      if (gethostname(name, sizeof(name) - 1) != 0)
        throw CommError("gethostname failed; set the advertise address");
      host = name;
    }
  }
  listen_address_ = host_port(host, data_port);
  spdlog::debug("rank {}: listening on {} (advertised as {}){}", rank_, data_addr, listen_address_,
                rank_ == 0 ? ", rendezvous on " + master_addr : "");
}

void GrpcTransport::join() {
  const auto start = Clock::now();
  const auto timeout = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(o_.rendezvous_timeout_s));
  const auto deadline = start + timeout + kJoinSlack;
  const std::string master = host_port(o_.master_addr, o_.master_port);
  auto channel = grpc::CreateCustomChannel(master, channel_creds_, channel_args());
  auto stub = wire::Rendezvous::NewStub(channel);
  wire::JoinRequest req;
  req.set_protocol_version(kGrpcProtocolVersion);
  req.set_rank(rank_);
  req.set_world_size(world_);
  req.set_listen_address(listen_address_);
  req.set_config_hash(o_.config_hash);
  if (shm_in_) req.set_shm_name(shm_in_->name());
  wire::JoinReply reply;
  auto backoff = std::chrono::milliseconds(100);
  for (;;) {
    grpc::ClientContext ctx;
    ctx.AddMetadata(kGrpcTokenKey, o_.token);
    ctx.set_wait_for_ready(true);  // rank 0 may not be up yet: gRPC reconnects with backoff
    ctx.set_deadline(wall(deadline));
    const grpc::Status s = stub->Join(&ctx, req, &reply);
    if (s.ok()) break;
    switch (s.error_code()) {
      case grpc::StatusCode::ABORTED:
      case grpc::StatusCode::FAILED_PRECONDITION:
        throw CommError(s.error_message());
      case grpc::StatusCode::UNAUTHENTICATED:
        throw CommError(
            fmt::format("rank 0 at {} refused this rank's job token (rank {})", master, rank_));
      case grpc::StatusCode::DEADLINE_EXCEEDED:
        throw CommError(fmt::format("rendezvous with rank 0 at {} timed out after {} s", master,
                                    seconds_str(o_.rendezvous_timeout_s)));
      case grpc::StatusCode::UNAVAILABLE:  // connection lost mid-call: rank 0 restarting?
      case grpc::StatusCode::CANCELLED:
        if (Clock::now() + backoff < deadline) {
          std::this_thread::sleep_for(backoff);
          backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
          continue;
        }
        [[fallthrough]];
      default:
        throw CommError(
            fmt::format("rendezvous with rank 0 at {} failed: {}", master, status_str(s)));
    }
  }
  if (reply.peers_size() != world_)
    throw CommError(
        fmt::format("rendezvous returned {} peers for world size {}", reply.peers_size(), world_));
  for (int r = 0; r < world_; ++r) {
    const wire::Peer& p = reply.peers(r);
    if (p.rank() != r || p.address().empty())
      throw CommError(fmt::format("rendezvous returned a bad peer table (entry {})", r));
    peers_.push_back(p.address());
    shm_names_[r] = p.shm_name();
  }
  std::string table;
  for (int r = 0; r < world_; ++r) table += fmt::format("{}{}={}", r ? ", " : "", r, peers_[r]);
  spdlog::debug("rank {}: peer table: {}", rank_, table);
}

void GrpcTransport::open_streams() {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(o_.connect_timeout_s));
  attach_shm();  // before our streams open: a peer that sees our stream sees the attachment
  out_.resize(world_);
  channels_.resize(world_);
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    channels_[r] = grpc::CreateCustomChannel(peers_[r], channel_creds_, channel_args());
  }
  // Beat from now on: a peer starts judging our silence once all its streams are up, and this
  // rank may still be connecting to others then.
  start_heartbeats();
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    if (!channels_[r]->WaitForConnected(wall(deadline)))
      throw CommError(fmt::format("cannot connect to rank {} at {} within {} s", r, peers_[r],
                                  seconds_str(o_.connect_timeout_s)));
    out_[r] = std::make_unique<OutStream>(rank_, r, tune_.chunk_bytes, tune_.copy_send);
    out_[r]->start(channels_[r], o_.token);
  }
}

void GrpcTransport::wait_for_peers() {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(o_.connect_timeout_s));
  std::vector<int> missing;
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    Inbox& ib = *inboxes_[r];
    std::unique_lock<std::mutex> lk(ib.mu);
    ib.cv.wait_until(lk, deadline,
                     [&] { return ib.connected || !ib.failed.empty() || !ib.aborted.empty(); });
    if (!ib.aborted.empty()) throw CommError(ib.aborted);
    if (!ib.failed.empty()) throw CommError(ib.failed);
    if (!ib.connected) missing.push_back(r);
  }
  if (!missing.empty())
    throw CommError(fmt::format("{} did not open their streams to rank {} within {} s",
                                ranks_str(missing), rank_, seconds_str(o_.connect_timeout_s)));
  for (int r = 0; r < world_; ++r)
    if (out_[r])
      if (std::string e = out_[r]->error(); !e.empty()) throw CommError(e);
  if (shm_in_) {
    // Every peer attached before opening the stream we just saw, or never will: from here on
    // the set of shared-memory senders is fixed and the name is no longer needed.
    std::string srcs;
    for (int r = 0; r < world_; ++r) {
      shm_src_[r] = r != rank_ && shm_in_->attached(r);
      if (shm_src_[r]) srcs += fmt::format("{}{}", srcs.empty() ? "" : ", ", r);
    }
    shm_in_->unlink();
    spdlog::debug("rank {}: shared memory from rank(s) [{}], to rank(s) [{}]", rank_, srcs,
                  fmt::join(shm_peers(), ", "));
  }
  std::lock_guard<std::mutex> lk(hb_check_mu_);
  hb_armed_ = true;
  hb_armed_at_ = Clock::now();
}

void GrpcTransport::connect() {
  if (!o_.tls_cert.empty()) {
    const std::string cert = read_pem(o_.tls_cert, "certificate");
    const std::string key = read_pem(o_.tls_key, "key");
    const std::string ca = read_pem(o_.tls_ca, "CA");
    // Mutual TLS: every rank presents its certificate and checks the other's against the CA.
    grpc::SslServerCredentialsOptions so(
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    so.pem_root_certs = ca;
    so.pem_key_cert_pairs.push_back({key, cert});
    server_creds_ = grpc::SslServerCredentials(so);
    grpc::SslCredentialsOptions co;
    co.pem_root_certs = ca;
    co.pem_private_key = key;
    co.pem_cert_chain = cert;
    channel_creds_ = grpc::SslCredentials(co);
  } else {
    server_creds_ = grpc::InsecureServerCredentials();
    channel_creds_ = grpc::InsecureChannelCredentials();
  }
  if (rank_ == 0) {
    const auto timeout = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(o_.rendezvous_timeout_s));
    coordinator_ = std::make_unique<Coordinator>(o_, Clock::now() + timeout);
  }
  start_server();
  if (o_.shm && world_ > 1) {
    if (const int n = sweep_orphaned_segments())
      spdlog::info(
          "rank {}: removed {} shared-memory segment(s) of dtrain processes that no "
          "longer exist",
          rank_, n);
    try {
      shm_in_ = ShmSegment::create(rank_, world_, kShmRingBytes);
    } catch (const CommError& e) {
      spdlog::warn("rank {}: no shared-memory path, using gRPC streams only: {}", rank_, e.what());
    }
  }
  join();
  open_streams();
  wait_for_peers();
}

void GrpcTransport::shutdown() {
  {
    std::lock_guard<std::mutex> lk(in_mu_);
    closing_ = true;
  }
  {
    // Keep beating while the streams close, but judge no peer any more.
    std::lock_guard<std::mutex> lk(hb_check_mu_);
    hb_armed_ = false;
  }
  // 1. Half-close our streams so peers see a clean close; cancel the ones that do not finish.
  const auto grace = Clock::now() + kCloseGrace;
  for (auto& o : out_)
    if (o) o->close();
  for (auto& o : out_)
    if (o && !o->wait_done(grace)) o->cancel();
  for (auto& o : out_) {
    if (o && !o->wait_done(Clock::now() + std::chrono::seconds(10))) {
      spdlog::error("rank {}: a gRPC stream did not finish after cancellation; leaking it", rank_);
      (void)o.release();  // gRPC still references it: freeing it would be worse
    }
  }
  // Peers have seen our streams close (or will not wait for them): a silence from now on is
  // not taken for a freeze.
  stop_heartbeats();
  // 2. Answer pending joins and incoming streams, then stop the server.
  if (coordinator_) coordinator_->shutdown(fmt::format("rank {} shut down", rank_));
  finish_in_streams(
      grpc::Status(grpc::StatusCode::ABORTED, fmt::format("rank {} closed its connection", rank_)));
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server_.reset();
  coordinator_.reset();
}

// ---- heartbeats ----------------------------------------------------------------------------

namespace {
Clock::duration secs_dur(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}
}  // namespace

void GrpcTransport::start_heartbeats() {
  if (!(o_.heartbeat_s > 0) || world_ < 2) return;
  health_stubs_.resize(world_);
  for (int r = 0; r < world_; ++r)
    if (r != rank_) health_stubs_[r] = wire::Health::NewStub(channels_[r]);
  hb_thread_ = std::thread([this] { heartbeat_loop(); });
}

void GrpcTransport::stop_heartbeats() {
  {
    std::lock_guard<std::mutex> lk(hb_mu_);
    hb_stop_ = true;
  }
  hb_cv_.notify_all();
  if (hb_thread_.joinable()) hb_thread_.join();
  std::vector<std::shared_ptr<BeatCall>> calls;
  {
    std::lock_guard<std::mutex> lk(beats_->mu);
    calls = beats_->calls;
  }
  for (auto& c : calls)  // unlocked: a cancelled call's callback may run inline
    if (c) c->ctx.TryCancel();
  calls.clear();
  // Cancelled calls complete promptly; their callbacks only touch beats_, so not waiting for
  // a stuck one would be safe too.
  std::unique_lock<std::mutex> lk(beats_->mu);
  if (!beats_->cv.wait_for(lk, std::chrono::seconds(5), [&] { return beats_->n == 0; }))
    spdlog::warn("rank {}: {} heartbeat call(s) still in flight at shutdown", rank_, beats_->n);
}

void GrpcTransport::heartbeat_loop() {
  const Clock::duration interval = secs_dur(o_.heartbeat_s / 3);
  // Peers are judged 4 times per beat interval, so a silence is noticed at most heartbeat_s / 12
  // after it exceeds heartbeat_s (judging once per interval made that up to heartbeat_s / 3).
  const Clock::duration tick = interval / 4;
  Clock::time_point next_beat = Clock::now();
  // Checking starts once every peer is connected; it restarts from scratch when this thread
  // got no CPU for much longer than it asked (this process was stopped, or starved): the
  // silence was ours, and peers' beats may still be queued in our sockets.
  std::optional<Clock::time_point> baseline;
  Clock::time_point last = Clock::now();
  std::unique_lock<std::mutex> lk(hb_mu_);
  while (!hb_stop_) {
    lk.unlock();
    const auto now = Clock::now();
    if (!aborted_.load()) {
      if (now >= next_beat) {
        send_beats();
        next_beat = now + interval;
      }
      std::lock_guard<std::mutex> ck(hb_check_mu_);
      if (hb_armed_) {
        if (!baseline) {
          baseline = hb_armed_at_;
        } else if (now - last > 2 * interval + std::chrono::seconds(1)) {
          spdlog::warn(
              "rank {}: the heartbeat thread got no CPU for {:.1f} s (process stopped or "
              "starved); judging peers' heartbeats afresh",
              rank_, std::chrono::duration<double>(now - last).count());
          baseline = now;
        }
        check_peers(now, *baseline);
      }
    }
    last = now;
    lk.lock();
    hb_cv_.wait_for(lk, tick, [&] { return hb_stop_; });
  }
}

void GrpcTransport::send_beats() {
  const auto now = Clock::now();
  const CommPosition pos = own_position();
  wire::Heartbeat beat;
  beat.set_src_rank(rank_);
  beat.set_interval_s(o_.heartbeat_s / 3);
  wire::Position* p = beat.mutable_position();
  p->set_completed(pos.completed);
  p->set_active(pos.active);
  p->set_op(static_cast<uint32_t>(pos.op));
  p->set_seq(pos.seq);
  p->set_count(pos.count);
  p->set_since_ms(static_cast<uint64_t>(std::max<int64_t>(
      0, std::chrono::duration_cast<std::chrono::milliseconds>(now - pos.since).count())));
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    auto call = std::make_shared<BeatCall>();
    {
      std::lock_guard<std::mutex> lk(beats_->mu);
      if (beats_->calls[r]) continue;  // the last one is still on its way (peer slow or frozen)
      beats_->calls[r] = call;
      ++beats_->n;
    }
    call->req = beat;
    call->ctx.AddMetadata(kGrpcTokenKey, o_.token);
    // A beat older than heartbeat_s is worthless to the peer.
    call->ctx.set_deadline(wall(now + secs_dur(o_.heartbeat_s)));
    // The callback may run inline: nothing is locked here.
    health_stubs_[r]->async()->Beat(&call->ctx, &call->req, &call->ack,
                                    [state = beats_, r](const grpc::Status&) {
                                      std::shared_ptr<BeatCall> done;
                                      std::lock_guard<std::mutex> lk(state->mu);
                                      done = std::move(state->calls[r]);
                                      --state->n;
                                      state->cv.notify_all();
                                    });
  }
}

void GrpcTransport::check_peers(Clock::time_point now, Clock::time_point baseline) {
  for (int r = 0; r < world_; ++r) {
    if (r == rank_ || inboxes_[r]->down.load()) continue;
    Clock::time_point heard;
    double limit = o_.heartbeat_s;
    {
      std::lock_guard<std::mutex> lk(health_mu_);
      const PeerHealth& h = health_[r];
      heard = h.beat ? std::max(h.heard, baseline) : baseline;
      limit = peer_silence_limit(o_.heartbeat_s, h.interval_s);
    }
    const double silent = std::chrono::duration<double>(now - heard).count();
    if (silent > limit)
      fail_peer(r, fmt::format("no heartbeat from rank {} for {} s: frozen or unreachable", r,
                               seconds_str(silent)));
  }
}

void GrpcTransport::fail_peer(int peer, const std::string& why) {
  {
    Inbox& ib = *inboxes_[peer];
    std::lock_guard<std::mutex> lk(ib.mu);
    if (!ib.failed.empty() || !ib.aborted.empty()) return;
    ib.failed = why;
    ib.down = true;
    note_down(peer);
    ib.cv.notify_all();
  }
  spdlog::error("rank {}: {}", rank_, why);
  ring_shm_waiters();
  if (out_[peer]) out_[peer]->fail(why);  // a send blocked on the peer's flow control fails too
}

grpc::ServerUnaryReactor* GrpcTransport::on_beat(grpc::CallbackServerContext* ctx,
                                                 const wire::Heartbeat* req) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (!authorized(ctx, "a heartbeat")) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong or missing job token"));
    return reactor;
  }
  const int src = req->src_rank();
  if (src < 0 || src >= world_ || src == rank_) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 fmt::format("heartbeat from invalid rank {}", src)));
    return reactor;
  }
  const auto now = Clock::now();
  const wire::Position& p = req->position();
  {
    std::lock_guard<std::mutex> lk(health_mu_);
    PeerHealth& h = health_[src];
    h.beat = true;
    h.heard = now;
    // As the peer says; check_peers bounds what it does (peer_silence_limit).
    h.interval_s = req->interval_s();
    h.pos.completed = p.completed();
    h.pos.active = p.active();
    h.pos.op = static_cast<CommOp>(p.op());
    h.pos.seq = p.seq();
    h.pos.count = p.count();
    // Capped (a day) so that a bogus value cannot overflow the clock arithmetic.
    h.pos.since = now - std::chrono::milliseconds(std::min<uint64_t>(p.since_ms(), 86400000));
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

std::vector<RankPosition> GrpcTransport::positions() const {
  std::vector<RankPosition> out(world_);
  const auto now = Clock::now();
  {
    std::lock_guard<std::mutex> lk(health_mu_);
    for (int r = 0; r < world_; ++r) {
      out[r].known = health_[r].beat;
      out[r].pos = health_[r].pos;
      out[r].heard = health_[r].heard;
    }
  }
  out[rank_] = RankPosition{true, own_position(), now};
  return out;
}

// gRPC allocates its TCP read buffers (up to a few MiB) with malloc on its own threads and frees
// them a moment later. With glibc's defaults each free trims the thread's heap (madvise, a TLB
// shootdown) and every buffer is page-faulted again: measured on loopback, that alone held the
// receiver to ~0.2 GB/s at 100% CPU, against 1.5-2.5 GB/s with trimming off. So a process that
// uses the gRPC transport keeps up to 256 MiB of freed heap and serves blocks up to 32 MiB from
// the heap instead of fresh mappings. This is process-wide (it also keeps the trainer's own
// large temporaries warm) and is done once, before any gRPC object exists.
void tune_malloc_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
  });
}

}  // namespace

std::unique_ptr<Transport> connect_grpc(const GrpcOptions& o, const GrpcTuning& tuning) {
  if (o.world_size < 1) throw UserError(fmt::format("world size {} < 1", o.world_size));
  if (o.rank < 0 || o.rank >= o.world_size)
    throw UserError(fmt::format("rank {} is out of range for world size {}", o.rank, o.world_size));
  if (o.master_port <= 0 || o.master_port > 65535)
    throw UserError(fmt::format("master port {} is not in 1..65535", o.master_port));
  if (o.master_addr.empty()) throw UserError("master address is empty");
  const int tls = !o.tls_cert.empty() + !o.tls_key.empty() + !o.tls_ca.empty();
  if (tls != 0 && tls != 3)
    throw UserError("TLS needs all three of certificate, key and CA (or none)");
  for (const char c : o.token)
    if (c < 0x20 || c > 0x7e) throw UserError("the job token must be printable ASCII");
  if (!(o.rendezvous_timeout_s > 0) || !(o.connect_timeout_s > 0))
    throw UserError("rendezvous and connect timeouts must be positive");
  if (!(o.heartbeat_s >= 0) || !std::isfinite(o.heartbeat_s))
    throw UserError(fmt::format("heartbeat interval {} s is not >= 0", o.heartbeat_s));
  if (o.heartbeat_s > 0 && o.heartbeat_s < 1 && o.rank == 0)
    spdlog::warn(
        "heartbeat_s {} s: a healthy rank that gets no CPU for that long (a loaded machine) is "
        "taken for frozen and fails the job",
        o.heartbeat_s);
  if (tuning.chunk_bytes == 0 || tuning.chunk_bytes > (64u << 20))
    throw UserError(fmt::format("chunk size {} is not in 1..64 MiB", tuning.chunk_bytes));
  if (tuning.tune_malloc) tune_malloc_once();
  auto t = std::make_unique<GrpcTransport>(o, tuning);
  t->connect();  // on failure t's destructor closes whatever was opened
  return t;
}

std::unique_ptr<Transport> connect_grpc(const GrpcOptions& opts) {
  return connect_grpc(opts, GrpcTuning{});
}

GrpcRecvStats grpc_recv_stats(const Transport& t) {
  const auto* g = dynamic_cast<const GrpcTransport*>(&t);
  if (!g) throw std::invalid_argument("not a gRPC transport");
  return g->recv_stats();
}

std::vector<int> grpc_shm_peers(const Transport& t) {
  const auto* g = dynamic_cast<const GrpcTransport*>(&t);
  if (!g) throw std::invalid_argument("not a gRPC transport");
  return g->shm_peers();
}

std::vector<std::string> grpc_peer_addresses(const Transport& t) {
  const auto* g = dynamic_cast<const GrpcTransport*>(&t);
  if (!g) throw std::invalid_argument("not a gRPC transport");
  return g->peers();
}

bool is_loopback_host(const std::string& host) {
  const std::string h = strip_brackets(host);
  return h == "localhost" || h == "::1" || h.rfind("127.", 0) == 0;
}

}  // namespace dtrain
