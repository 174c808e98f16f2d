// The gRPC transport (see grpc_transport.h and proto/dtrain.proto for the wire protocol): the
// composition of its parts, and its data path. The class is declared in grpc/transport_impl.h;
// connecting and shutting down are in grpc/transport_setup.cc.
//
//   grpc/wire.h         frame codec (pure; fuzzable)
//   comm/mailbox.h      mailboxes: matching, mismatch reports, direct delivery
//   grpc/streams.h      the stream reactors (one client stream per ordered rank pair)
//   grpc/shm_path.h     the same-host shared-memory path
//   grpc/tcp_path.h     the plain TCP data path (grpc/tcp_wire.h: its byte layout)
//   grpc/heartbeat.h    heartbeats: frozen and lost peers
//   rendezvous/         the store rank 0 hosts (set, get, wait, add) and the rendezvous on it
//
// Thread model. Every rank runs one grpc::Server with callback-API services only, so incoming
// frames are handled on gRPC's own executor threads: InStream::OnReadDone hands a frame to
// on_frame, which decodes and validates it and copies its payload once, either into a buffer
// the receiver already posted with recv() or into the sender's mailbox. That progress never
// depends on recv() being called (nor does the TCP path's, whose reader threads deliver the same
// way). send() goes through the peer's path (PeerPath): itself, its OutStream, a TCP
// connection, or shared memory.
//
// Failure. A peer's incoming stream ending (clean half-close, cancellation, or its process
// dying, which closes the socket) fails every pending and future recv from it that has no
// complete message waiting; a failed outgoing stream fails sends to it; a peer silent past
// heartbeat_s is failed the same way. A malformed frame, or abort(), fails everything: outgoing
// streams are cancelled and incoming streams finished, so peers notice at once too.
#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/security/server_credentials.h>
#include <malloc.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <thread>

#include "comm/grpc/common.h"
#include "comm/grpc/heartbeat.h"
#include "comm/grpc/peer_path.h"
#include "comm/grpc/shm_path.h"
#include "comm/grpc/streams.h"
#include "comm/grpc/tcp_path.h"
#include "comm/grpc/wire.h"
#include "comm/grpc_internal.h"
#include "comm/grpc_transport.h"

#include "comm/mailbox.h"
#include "comm/rendezvous/rendezvous.h"
#include "comm/shm_ring.h"
#include "dtrain.grpc.pb.h"
#include "dtrain.pb.h"
#include "util/check.h"
#include "util/exit_deadline.h"
#include "util/fault.h"
#include "util/strings.h"

#include "comm/grpc/transport_impl.h"

namespace dtrain {
namespace grpc_detail {
namespace {

// After a stream failed, how long send() waits for gRPC to drop its references to the
// caller's memory before giving up (only relevant to zero-copy sends; normally milliseconds).
constexpr auto kReleaseGrace = std::chrono::seconds(30);

}  // namespace

GrpcTransport::GrpcTransport(const GrpcOptions& o, const GrpcTuning& tune)
    : o_(o),
      tune_(tune),
      rank_(o.rank),
      world_(o.world_size),
      data_service_(this),
      heartbeats_(o.rank, o.world_size, o.heartbeat_s, o.token,
                  Heartbeats::Hooks{
                      [this](int r) { return inboxes_[r]->down(); },
                      [this](int r, const std::string& why) { fail_peer(r, why); },
                      [this] { return own_position(); },
                      [this] { return aborted_.load(); },
                      [this](int r, const std::string& why) { peer_aborted(r, why); },
                  }) {
  for (int r = 0; r < world_; ++r)
    inboxes_.push_back(std::make_unique<Mailbox>(
        rank_, r, &pool_, &counters_, &down_log_,
        MailboxLimits{kGrpcMaxBufferedMessages, kGrpcMaxBufferedBytes, &seq_window_}));
  out_path_.assign(world_, &stream_path_);
  in_path_.assign(world_, &stream_path_);
  out_path_[rank_] = in_path_[rank_] = &self_path_;
}

grpc::ServerReadReactor<grpc::ByteBuffer>* GrpcTransport::open_in_stream(
    grpc::CallbackServerContext* ctx, grpc::ByteBuffer* response) {
  if (!authorized(ctx, o_.token, fmt::format("rank {}", rank_), "a data stream"))
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
  mailbox(src).stream_opened();
  spdlog::debug("rank {}: stream from rank {} ({}) accepted", rank_, src, ctx->peer());
  s->start();
  return s;
}

void GrpcTransport::in_stream_ended(InStream& s, bool cancelled) {
  mailbox(s.src()).stream_ended(
      cancelled ? fmt::format("connection to rank {} lost (its stream was cancelled)", s.src())
                : fmt::format("rank {} closed its connection", s.src()));
  ring_shm_waiters();
}

std::string GrpcTransport::malformed(int src, const std::string& what, const char* kind) {
  const std::string why = fmt::format("malformed {} from rank {}: {}", kind, src, what);
  spdlog::error("rank {}: {}", rank_, why);
  abort(why);
  return why;
}

grpc::Status GrpcTransport::on_frame(InStream& s, const grpc::ByteBuffer& bb) try {
  auto bad = [&](const std::string& what) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, malformed(s.src(), what, "frame"));
  };
  std::vector<grpc::Slice> slices;
  if (!bb.Dump(&slices).ok()) return bad("unreadable message");
  std::vector<std::span<const char>> pieces;
  pieces.reserve(slices.size());
  for (const grpc::Slice& sl : slices)
    pieces.emplace_back(reinterpret_cast<const char*>(sl.begin()), sl.size());
  WireFrame f;
  try {
    f = decode_frame(pieces);
  } catch (const WireError& e) {
    return bad(e.what());
  }
  // Validate everything before touching any buffer.
  Mailbox& box = mailbox(s.src());
  if (std::string err = box.check_chunk(f, s.partial); !err.empty()) return bad(err);
  // A posted recv_reduce reduces straight from gRPC's slices (no copy into a mailbox buffer).
  const Mailbox::ReduceFn reduce = [&](float* dst, Reduce op) {
    reduce_frame_payload(pieces, f, dst, op);
  };
  const Mailbox::Delivery d = box.deliver(
      s.partial, f, [&](char* dst) { copy_frame_payload(pieces, f, dst); }, &reduce);
  if (d.kind == Mailbox::Delivery::kOverflow) return bad(d.why);
  if (d.kind == Mailbox::Delivery::kAborted) return grpc::Status(grpc::StatusCode::ABORTED, d.why);
  ++s.frames;
  s.bytes += f.len;
  return grpc::Status::OK;
} catch (const std::exception& e) {  // bad_alloc for a huge message, mostly
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, malformed(s.src(), e.what(), "frame"));
}

void GrpcTransport::recv(int src, const MsgHeader& h, void* data, Deadline deadline) {
  DT_CHECK(src >= 0 && src < world_);
  in_path_[src]->recv(src, h, data, nullptr, deadline);
  bytes_recv_ += h.bytes;
}

void GrpcTransport::recv_reduce(int src, const MsgHeader& h, float* data, Reduce r,
                                Deadline deadline) {
  DT_CHECK(src >= 0 && src < world_);
  DT_CHECK_EQ(h.bytes % sizeof(float), 0u);
  in_path_[src]->recv(src, h, data, &r, deadline);
  bytes_recv_ += h.bytes;
}

void GrpcTransport::check_sendable(const MsgHeader& h) {
  seq_window_.note(h.channel);
  if (aborted_.load()) {
    std::lock_guard<std::mutex> lk(abort_mu_);
    throw CommError(abort_reason_);
  }
  if (h.bytes > kGrpcMaxMessageBytes)
    throw CommError(fmt::format("cannot send {}: larger than the {}-byte message limit",
                                describe(h), kGrpcMaxMessageBytes));
}

void GrpcTransport::rethrow_send_error(int dst, const MsgHeader& h) {
  // A peer that left after sending us another collective at this sequence number disagreed
  // with us before it went: say so, rather than only that it closed.
  in_path_[dst]->flush(dst);
  if (std::string m = mailbox(dst).mismatch_on_channel(h); !m.empty()) throw CommError(m);
  throw;
}

void GrpcTransport::send(int dst, const MsgHeader& h, const void* data) {
  DT_CHECK(dst >= 0 && dst < world_);
  check_sendable(h);
  try {
    out_path_[dst]->send(dst, h, data);
  } catch (const CommError&) {
    rethrow_send_error(dst, h);
  }
  bytes_sent_ += h.bytes;
}

// A stream send's ticket as a PendingSend: wait() throws the stream's CommError as is (PathSend
// reports it). Several messages queued on one OutStream are written chunk by chunk round-robin;
// with the default 1 MiB segments and 1 MiB chunks every message is one chunk, so they go out in
// FIFO order, the order the receiver posts its receives in.
class GrpcTransport::StreamSend final : public PendingSend {
 public:
  StreamSend(GrpcTransport* t, int dst, std::shared_ptr<SendTicket> ticket)
      : t_(t), dst_(dst), ticket_(std::move(ticket)) {}
  ~StreamSend() override {
    if (waited_) return;
    try {
      t_->wait_stream_send(dst_, *ticket_);
    } catch (...) {  // reported (if at all) by whatever made the caller drop this handle
    }
  }
  void wait() override {
    DT_CHECK(!waited_);
    waited_ = true;
    t_->wait_stream_send(dst_, *ticket_);
  }

 private:
  GrpcTransport* const t_;
  const int dst_;
  const std::shared_ptr<SendTicket> ticket_;
  bool waited_ = false;
};

std::unique_ptr<PendingSend> GrpcTransport::StreamPath::send_start(int dst, const MsgHeader& h,
                                                                   const void* data) {
  return std::make_unique<StreamSend>(t_, dst, t_->start_stream_send(dst, h, data));
}

// Errors and accounting are send()'s: check_sendable and a failed start throw from send_start,
// a failed send from wait() (through rethrow_send_error), and bytes_sent_ counts the message
// once it completed. The inner handle's destructor waits (swallowing errors) if wait() was not
// called.
class GrpcTransport::PathSend final : public PendingSend {
 public:
  PathSend(GrpcTransport* t, int dst, const MsgHeader& h, std::unique_ptr<PendingSend> inner)
      : t_(t), dst_(dst), h_(h), inner_(std::move(inner)) {}
  void wait() override {
    try {
      inner_->wait();
    } catch (const CommError&) {
      t_->rethrow_send_error(dst_, h_);
    }
    t_->bytes_sent_ += h_.bytes;
  }

 private:
  GrpcTransport* const t_;
  const int dst_;
  const MsgHeader h_;
  const std::unique_ptr<PendingSend> inner_;
};

std::unique_ptr<PendingSend> GrpcTransport::send_start(int dst, const MsgHeader& h,
                                                       const void* data) {
  DT_CHECK(dst >= 0 && dst < world_);
  PeerPath* const path = out_path_[dst];
  if (!path->overlaps()) return Transport::send_start(dst, h, data);
  check_sendable(h);
  try {
    return std::make_unique<PathSend>(this, dst, h, path->send_start(dst, h, data));
  } catch (const CommError&) {
    rethrow_send_error(dst, h);
  }
}

void GrpcTransport::send_recv(int dst, const MsgHeader& sh, const void* sdata, int src,
                              const MsgHeader& rh, void* rdata, const Reduce* red,
                              Deadline deadline) {
  DT_CHECK(dst >= 0 && dst < world_ && src >= 0 && src < world_);
  if (!out_path_[dst]->overlaps())  // shared memory and self: nothing to overlap
    return Transport::send_recv(dst, sh, sdata, src, rh, rdata, red, deadline);
  DT_CHECK(!red || rh.bytes % sizeof(float) == 0);
  const std::unique_ptr<PendingSend> send = send_start(dst, sh, sdata);
  // Posted while our chunks go out: the peer's message (sent at the same moment in a ring step)
  // is delivered straight into rdata, reduced on arrival when red is set.
  std::exception_ptr recv_error;
  try {
    in_path_[src]->recv(src, rh, rdata, red, deadline);
  } catch (...) {
    recv_error = std::current_exception();
  }
  // Always waited for, also after a failed receive: the caller may free sdata once we return.
  try {
    send->wait();
  } catch (const CommError&) {
    if (!recv_error) throw;
  }
  if (recv_error) std::rethrow_exception(recv_error);
  bytes_recv_ += rh.bytes;
}

std::shared_ptr<SendTicket> GrpcTransport::start_stream_send(int dst, const MsgHeader& h,
                                                             const void* data) {
  auto m = std::make_shared<OutMsg>();
  m->h = h;
  m->data = static_cast<const char*>(data);
  m->ticket = std::make_shared<SendTicket>();
  out_[dst]->enqueue(m);
  return m->ticket;
}

void GrpcTransport::wait_stream_send(int dst, SendTicket& t) {
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
}

void GrpcTransport::abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> lk(abort_mu_);
    if (!abort_reason_.empty()) return;
    abort_reason_ = why.empty() ? "transport aborted" : why;
    aborted_ = true;
  }
  spdlog::debug("rank {}: transport aborted: {}", rank_, abort_reason_);
  std::vector<int> listening;  // peers not known to be down: they hear why
  for (int r = 0; r < world_; ++r)
    if (r != rank_ && !inboxes_[r]->down()) listening.push_back(r);
  for (auto& ib : inboxes_) ib->abort(abort_reason_);
  ring_shm_waiters();
  // Peers hear why before they see our connections close (which could otherwise make them
  // blame this rank, not the one it names).
  heartbeats_.announce_abort(abort_reason_, listening, kAbortNoticeWait);
  if (tcp_) tcp_->abort(abort_reason_);
  for (auto& o : out_)
    if (o) o->fail(abort_reason_);
  finish_in_streams(grpc::Status(grpc::StatusCode::ABORTED,
                                 fmt::format("rank {} aborted: {}", rank_, abort_reason_)));
}

void GrpcTransport::finish_in_streams(const grpc::Status& s) {
  std::lock_guard<std::mutex> lk(in_mu_);
  for (InStream* is : in_streams_) is->finish(s);
}

void GrpcTransport::peer_aborted(int peer, const std::string& why) {
  const std::string reason = fmt::format("rank {} aborted: {}", peer, why);
  down_log_.excuse(peer);
  {
    std::lock_guard<std::mutex> lk(setup_mu_);
    if (peer_abort_.empty()) peer_abort_ = reason;
  }
  // Its streams and connection close next; sends to it fail then, with its reason from the
  // stream's status. Only receives are failed here (out_ may not exist yet during setup).
  if (mailbox(peer).fail(reason)) spdlog::debug("rank {}: {}", rank_, reason);
  ring_shm_waiters();
}

void GrpcTransport::fail_peer(int peer, const std::string& why) {
  if (!mailbox(peer).fail(why)) return;
  {
    std::lock_guard<std::mutex> lk(setup_mu_);
    silent_.push_back(peer);
  }
  spdlog::error("rank {}: {}", rank_, why);
  ring_shm_waiters();
  if (out_[peer]) out_[peer]->fail(why);  // a send blocked on the peer's flow control fails too
  if (tcp_) tcp_->fail(peer, why);
}

namespace {

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
}  // namespace grpc_detail

using grpc_detail::GrpcTransport;
using grpc_detail::tune_malloc_once;

namespace {

// A rank holds about 4 descriptors per peer (its gRPC channel and stream, a TCP data connection
// each way) besides its own (listeners, shared memory, logs, data and checkpoint files):
// measured 19, 27 and 35 for 2, 4 and 6 ranks. Too few made every rank fail after its timeouts
// with a wrong cause ("no heartbeat from rank 3: frozen", "MASTER_ADDR is not an address of this
// host"). Raises the soft limit to the hard one where needed (as Go's runtime does); refuses when
// the hard limit is too low.
void ensure_descriptor_limit(int world_size, int rank) {
  const rlim_t need = 4 * static_cast<rlim_t>(world_size) + 64;
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY ||
      lim.rlim_cur >= need)
    return;
  if (lim.rlim_max == RLIM_INFINITY || lim.rlim_max >= need) {
    const rlim_t old = lim.rlim_cur;
    lim.rlim_cur = lim.rlim_max == RLIM_INFINITY ? need : lim.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &lim) == 0) {
      spdlog::debug("rank {}: open-file limit raised from {} to {} (its hard limit)", rank, old,
                    lim.rlim_cur);
      return;
    }
  }
  throw UserError(fmt::format(
      "rank {}: the open-file limit (ulimit -n) is {}, and a rank of a job of {} ranks needs "
      "about {} descriptors (4 per peer, and its own files): raise it (ulimit -n {}, or the "
      "hard limit: ulimit -Hn, LimitNOFILE in systemd, --ulimit nofile in docker)",
      rank, lim.rlim_cur, world_size, need, need));
}

}  // namespace

std::unique_ptr<Transport> connect_grpc(const GrpcOptions& o, const GrpcTuning& tuning) {
  if (o.world_size < 1) throw UserError(fmt::format("world size {} < 1", o.world_size));
  if (o.rank < 0 || o.rank >= o.world_size)
    throw UserError(fmt::format("rank {} is out of range for world size {}", o.rank, o.world_size));
  if (o.master_port <= 0 || o.master_port > 65535)
    throw UserError(fmt::format("master port {} is not in 1..65535", o.master_port));
  if (o.master_addr.empty()) throw UserError("master address is empty");
  ensure_descriptor_limit(o.world_size, o.rank);
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
  try {
    t->connect();
  } catch (const std::exception& e) {
    // t's destructor closes whatever was opened -- within a bound: gRPC's shutdown waited
    // forever for threads that never started (ulimit -u), and the rank said nothing.
    const ExitDeadline bound(kFailedTeardownS, dynamic_cast<const UserError*>(&e) ? 2 : 1,
                             e.what());
    t.reset();
    throw;
  }
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

std::vector<int> grpc_tcp_peers(const Transport& t) {
  const auto* g = dynamic_cast<const GrpcTransport*>(&t);
  if (!g) throw std::invalid_argument("not a gRPC transport");
  return g->tcp_peers();
}

int grpc_tcp_port(const Transport& t) {
  const auto* g = dynamic_cast<const GrpcTransport*>(&t);
  if (!g) throw std::invalid_argument("not a gRPC transport");
  return g->tcp_port();
}

std::vector<std::string> grpc_peer_addresses(const Transport& t) {
  const auto* g = dynamic_cast<const GrpcTransport*>(&t);
  if (!g) throw std::invalid_argument("not a gRPC transport");
  return g->peers();
}

bool is_loopback_host(const std::string& host) {
  // (names in any case, and with a root's trailing dot: LOCALHOST and localhost. are loopback,
  // and a rank 0 given them listened on every interface)
  std::string h = ascii_lower(grpc_detail::strip_brackets(host));
  if (h.size() >= 2 && h.back() == '.') h.pop_back();
  return h == "localhost" || h.ends_with(".localhost") || h == "::1" || h.rfind("127.", 0) == 0;
}

}  // namespace dtrain
