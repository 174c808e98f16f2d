// The gRPC transport's data streams: one long-lived client stream per ordered rank pair.
//
// OutStream (client side) queues messages and writes them in chunks (frames, grpc/wire.h),
// round-robin across the queued messages, one write in flight, so HTTP/2 flow control is the
// back-pressure and concurrent messages interleave chunk by chunk. By default a chunk's payload
// slice points into the caller's buffer (no copy); the SendTicket completes once every chunk
// was handed to gRPC and gRPC released every such slice.
//
// InStream (server side) hands every frame to its sink (the transport), which validates it and
// copies the payload once into a mailbox (comm/mailbox.h). Both reactors live on gRPC's
// callback threads.
#pragma once

#include <fmt/format.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "comm/grpc/common.h"
#include "comm/mailbox.h"
#include "comm/transport.h"

namespace dtrain::grpc_detail {

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

class InStream;

// Where an InStream's frames and end go (the transport). Called on gRPC's threads.
class InStreamSink {
 public:
  virtual ~InStreamSink() = default;
  // Validates and delivers one frame; a non-OK status finishes the stream with it.
  virtual grpc::Status on_frame(InStream& s, const grpc::ByteBuffer& bb) = 0;
  // The peer half-closed, or the call broke / was cancelled.
  virtual void in_stream_ended(InStream& s, bool cancelled) = 0;
  // Last call for s, from its OnDone: s is deleted right after.
  virtual void in_stream_done(InStream* s) = 0;
};

// Server side of one peer's Data.Stream: drains frames into the transport's mailboxes.
class InStream final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  InStream(InStreamSink* t, grpc::CallbackServerContext* ctx, grpc::ByteBuffer* response, int src)
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
  Partials partial;  // touched only by this stream's reactions
  uint64_t frames = 0, bytes = 0;

 private:
  InStreamSink* const t_;
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
//
// Lifetime. gRPC ends the call -- and frees the state that StartWrite and StartWritesDone use
// -- as soon as no operation is outstanding, possibly while another thread is about to start
// one (send() queueing a message, close() half-closing at shutdown): that race was the rare
// "pure virtual method called" / SIGSEGV at shutdown. So the stream holds the call open
// (AddHold) from start() until it will never start another operation -- it half-closed, the
// call ended, failed or was cancelled -- and only then removes the hold (release_hold_locked),
// with no write in flight. Every Start* happens under mu_ while the hold is held.
class OutStream final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  OutStream(int self, int dst, size_t chunk_bytes, bool copy_send)
      : self_(self), dst_(dst), chunk_(chunk_bytes), copy_(copy_send) {}

  void start(const std::shared_ptr<grpc::Channel>& channel, const std::string& token);

  // Queues m; throws CommError if the stream is down.
  void enqueue(const std::shared_ptr<OutMsg>& m) {
    std::lock_guard<std::mutex> lk(mu_);
    if (!error_.empty()) throw CommError(error_);
    if (!held_ || closing_ || ended_)
      throw CommError(fmt::format("connection to rank {} is closed", dst_));
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
    cancel();
  }
  // Half-closes once the queue is drained.
  void close() {
    std::lock_guard<std::mutex> lk(mu_);
    closing_ = true;
    if (held_ && !writing_ && !writes_done_ && !ended_ && error_.empty()) {
      writes_done_ = true;
      StartWritesDone();
    }
    release_hold_locked();
  }
  void cancel() {
    if (started_) ctx_.TryCancel();
    std::lock_guard<std::mutex> lk(mu_);
    cancelled_ = true;
    release_hold_locked();
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

  void OnWriteDone(bool ok) override;
  void OnReadDone(bool ok) override;  // the StreamAck, or the call ending
  void OnDone(const grpc::Status& s) override;

 private:
  // Makes the next chunk of the front message (round-robin across queued messages) and writes
  // it. Requires mu_, the hold and no write in flight.
  void write_next_locked();
  void fail_queue_locked();
  // Removes the hold once no operation will be started any more and none is in flight (gRPC
  // then finishes the call and runs OnDone on its own thread, never inline). Requires mu_.
  void release_hold_locked();

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
  bool held_ = false;       // our hold on the call (see above)
  bool ended_ = false;      // a write failed or the read completed: the call is over
  bool cancelled_ = false;  // cancel() was called
  std::string error_;
};

}  // namespace dtrain::grpc_detail
