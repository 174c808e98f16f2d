#include "comm/grpc/streams.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "comm/grpc/wire.h"
#include "comm/grpc_internal.h"
#include "dtrain.pb.h"

namespace dtrain::grpc_detail {

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

void OutStream::start(const std::shared_ptr<grpc::Channel>& channel, const std::string& token) {
  ctx_.AddMetadata(kGrpcTokenKey, token);
  ctx_.AddMetadata(kGrpcRankKey, std::to_string(self_));
  grpc::GenericStub stub(channel);
  // Under mu_ from before the call exists: no reaction may see the hold missing. gRPC runs no
  // reaction inline from StartCall (its callbacks are never inlined).
  std::lock_guard<std::mutex> lk(mu_);
  stub.PrepareBidiStreamingCall(&ctx_, kGrpcStreamMethod, grpc::StubOptions(), this);
  AddHold();
  held_ = true;
  StartRead(&ack_);
  StartCall();
  started_ = true;
}

void OutStream::OnWriteDone(bool ok) {
  std::lock_guard<std::mutex> lk(mu_);
  grpc::ByteBuffer().Swap(&cur_);  // drop our reference to the chunk's slices
  writing_ = false;
  if (!ok) {
    ended_ = true;  // the call failed; OnDone reports the status
  } else if (held_ && error_.empty() && !ended_) {
    if (!queue_.empty()) {
      write_next_locked();
    } else if (closing_ && !writes_done_) {
      writes_done_ = true;
      StartWritesDone();
    }
  }
  release_hold_locked();
}

void OutStream::OnReadDone(bool /*ok*/) {
  // The receiver answers (or the call breaks) only when the call ends: nothing more to write.
  std::lock_guard<std::mutex> lk(mu_);
  ended_ = true;
  release_hold_locked();
}

void OutStream::release_hold_locked() {
  if (!held_ || writing_) return;
  if (!(writes_done_ || ended_ || cancelled_ || !error_.empty())) return;
  held_ = false;
  RemoveHold();
}

void OutStream::OnDone(const grpc::Status& s) {
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

// Makes the next chunk of the front message (round-robin across queued messages) and writes
// it. Requires mu_ and no write in flight.
void OutStream::write_next_locked() {
  std::shared_ptr<OutMsg> m = queue_.front();
  queue_.pop_front();
  const uint64_t off = m->next;
  const uint64_t len = std::min<uint64_t>(chunk_, m->h.bytes - off);
  char hdr[kMaxFrameHeaderBytes];
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
void OutStream::fail_queue_locked() {
  for (auto& m : queue_) {
    std::lock_guard<std::mutex> tl(m->ticket->mu);
    m->ticket->error = error_;
    m->ticket->cv.notify_all();
  }
  queue_.clear();
}

}  // namespace dtrain::grpc_detail
