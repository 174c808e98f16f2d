// The gRPC transport (see grpc_transport.h and proto/dtrain.proto for the wire protocol): the
// composition of its parts.
//
//   grpc/wire.h         frame codec (pure; fuzzable)
//   comm/mailbox.h      mailboxes: matching, mismatch reports, direct delivery
//   grpc/streams.h      the stream reactors (one client stream per ordered rank pair)
//   grpc/shm_path.h     the same-host shared-memory path
//   grpc/heartbeat.h    heartbeats: frozen and lost peers
//   rendezvous/         the store rank 0 hosts (set, get, wait, add) and the rendezvous on it
//
// Thread model. Every rank runs one grpc::Server with callback-API services only, so incoming
// frames are handled on gRPC's own executor threads: InStream::OnReadDone hands a frame to
// on_frame, which decodes and validates it and copies its payload once, either into a buffer
// the receiver already posted with recv() or into the sender's mailbox. That progress never
// depends on recv() being called. send() goes through the peer's path (PeerPath): itself, its
// OutStream, or shared memory.
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
#include "comm/grpc/wire.h"
#include "comm/grpc_internal.h"
#include "comm/grpc_transport.h"
#include "comm/mailbox.h"
#include "comm/rendezvous/rendezvous.h"
#include "comm/shm_ring.h"
#include "dtrain.grpc.pb.h"
#include "dtrain.pb.h"
#include "util/check.h"
#include "util/fault.h"

namespace dtrain {
namespace grpc_detail {
namespace {

// How long the destructor waits for peers to acknowledge our half-close before cancelling.
constexpr auto kCloseGrace = std::chrono::seconds(2);
// After a stream failed, how long send() waits for gRPC to drop its references to the
// caller's memory before giving up (only relevant to zero-copy sends; normally milliseconds).
constexpr auto kReleaseGrace = std::chrono::seconds(30);
// How often connecting rechecks whether a peer went down meanwhile.
constexpr auto kSetupSlice = std::chrono::milliseconds(50);
// Keepalive: notices a peer whose host vanished without closing the socket.
constexpr int kKeepaliveTimeMs = 10000;
constexpr int kKeepaliveTimeoutMs = 10000;

std::string read_pem(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(fmt::format("cannot read TLS {} file '{}'", what, path));
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
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

class GrpcTransport final : public Transport, private InStreamSink {
 public:
  GrpcTransport(const GrpcOptions& o, const GrpcTuning& tune);
  ~GrpcTransport() override { shutdown(); }

  int rank() const override { return rank_; }
  int size() const override { return world_; }
  std::string backend() const override { return "grpc"; }
  const std::vector<std::string>& peers() const { return peers_; }
  std::vector<int> shm_peers() const { return shm_ ? shm_->peers() : std::vector<int>{}; }
  GrpcRecvStats recv_stats() const {
    return GrpcRecvStats{counters_.direct.load(), counters_.redirected.load(),
                         counters_.mailbox.load()};
  }

  // Starts the server, joins, opens the streams; throws CommError.
  void connect();

  void send(int dst, const MsgHeader& h, const void* data) override;
  void recv(int src, const MsgHeader& h, void* data, Deadline deadline) override;
  void recv_reduce(int src, const MsgHeader& h, float* data, Reduce r, Deadline deadline) override;
  void send_recv(int dst, const MsgHeader& sh, const void* sdata, int src, const MsgHeader& rh,
                 void* rdata, const Reduce* red, Deadline deadline) override;
  void abort(const std::string& why) override;
  std::vector<RankPosition> positions() const override {
    return heartbeats_.positions(own_position());
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
  // A rank to itself: straight into its own mailbox.
  class SelfPath final : public PeerPath {
   public:
    explicit SelfPath(GrpcTransport* t) : t_(t) {}
    void send(int dst, const MsgHeader& h, const void* data) override {
      t_->mailbox(dst).deliver_whole(h, data);
    }
    void recv(int src, const MsgHeader& h, void* data, const Reduce* red,
              Deadline deadline) override {
      t_->mailbox(src).recv(h, data, red, deadline);
    }

   private:
    GrpcTransport* const t_;
  };
  // The gRPC streams: sends queue on the peer's OutStream, receives wait on its mailbox.
  class StreamPath final : public PeerPath {
   public:
    explicit StreamPath(GrpcTransport* t) : t_(t) {}
    void send(int dst, const MsgHeader& h, const void* data) override {
      t_->send_stream(dst, h, data);
    }
    void recv(int src, const MsgHeader& h, void* data, const Reduce* red,
              Deadline deadline) override {
      t_->mailbox(src).recv(h, data, red, deadline);
    }

   private:
    GrpcTransport* const t_;
  };

  Mailbox& mailbox(int src) { return *inboxes_[src]; }
  grpc::ChannelArguments channel_args() const;
  void set_credentials();
  void start_server();
  // Connects to every peer and opens this rank's streams; then waits for theirs. Both fail at
  // once when a peer is found down (setup_failure), else at `deadline`.
  void open_streams(Clock::time_point deadline);
  void wait_for_peers(Clock::time_point deadline);
  // "" or why connecting cannot succeed: this transport aborted, or a peer went down (one
  // found silent first: a rank that gave up because of it comes later).
  std::string setup_failure();
  // Dies here if a kill_in_connect fault names this rank and point (DTRAIN_FAULT).
  void fault_point(const char* at);
  void shutdown();
  void send_stream(int dst, const MsgHeader& h, const void* data) {
    wait_stream_send(dst, *start_stream_send(dst, h, data));
  }
  // Queues h on dst's stream (throws CommError if it is down); the ticket completes once gRPC
  // no longer references data.
  std::shared_ptr<SendTicket> start_stream_send(int dst, const MsgHeader& h, const void* data);
  // Waits for t; throws CommError if the send failed (once gRPC released data).
  void wait_stream_send(int dst, SendTicket& t);
  // Throws CommError if this transport aborted or h is above the message limit.
  void check_sendable(const MsgHeader& h);
  // After sending h to dst failed (in a catch block): throws the error to report.
  [[noreturn]] void rethrow_send_error(int dst, const MsgHeader& h);
  // Fails every pending and future recv from and send to `peer` with `why`, as if its stream
  // had ended (unless it already had).
  void fail_peer(int peer, const std::string& why);
  void finish_in_streams(const grpc::Status& s);
  // Logs and aborts the transport for a malformed `kind` ("frame" on a stream,
  // "shared-memory record") from src; returns the message.
  std::string malformed(int src, const std::string& what, const char* kind);
  void ring_shm_waiters() {
    if (shm_) shm_->ring_waiters();
  }

  // Server-side entry points (gRPC threads).
  grpc::ServerReadReactor<grpc::ByteBuffer>* open_in_stream(grpc::CallbackServerContext* ctx,
                                                            grpc::ByteBuffer* response);
  grpc::Status on_frame(InStream& s, const grpc::ByteBuffer& bb) override;
  void in_stream_ended(InStream& s, bool cancelled) override;
  void in_stream_done(InStream* s) override {
    std::lock_guard<std::mutex> lk(in_mu_);
    in_streams_.erase(s);
  }

  const GrpcOptions o_;
  const GrpcTuning tune_;
  const int rank_, world_;
  std::shared_ptr<grpc::ServerCredentials> server_creds_;
  std::shared_ptr<grpc::ChannelCredentials> channel_creds_;
  DataService data_service_;
  Heartbeats heartbeats_;
  std::unique_ptr<RendezvousHost> rendezvous_;  // rank 0 only
  std::unique_ptr<grpc::Server> server_;
  std::string listen_address_;
  std::vector<std::string> peers_;
  BufferPool pool_;
  RecvCounters counters_;
  DownLog down_log_;
  std::vector<std::unique_ptr<Mailbox>> inboxes_;
  std::vector<std::unique_ptr<OutStream>> out_;  // null for self
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::unique_ptr<ShmPath> shm_;  // null: shared memory off or unavailable
  SelfPath self_path_{this};
  StreamPath stream_path_{this};
  std::vector<PeerPath*> out_path_, in_path_;  // per peer: how data goes to / comes from it

  std::mutex in_mu_;  // guards in_streams_ and closing_; ordered before InStream::mu_ and mailboxes
  std::set<InStream*> in_streams_;
  bool closing_ = false;

  // What setup_failure has seen: peers failed for silence, in order, and the first one whose
  // connection closed, with when.
  std::mutex setup_mu_;
  std::vector<int> silent_;
  std::optional<int> closed_;
  Clock::time_point closed_at_;

  std::mutex abort_mu_;
  std::string abort_reason_;
  std::atomic<bool> aborted_{false};
};

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
                  }) {
  for (int r = 0; r < world_; ++r)
    inboxes_.push_back(std::make_unique<Mailbox>(rank_, r, &pool_, &counters_, &down_log_,
                                                 kGrpcMaxBufferedMessages));
  out_path_.assign(world_, &stream_path_);
  in_path_.assign(world_, &stream_path_);
  out_path_[rank_] = in_path_[rank_] = &self_path_;
}

grpc::ServerReadReactor<grpc::ByteBuffer>* GrpcTransport::open_in_stream(
    grpc::CallbackServerContext* ctx, grpc::ByteBuffer* response) {
  if (!authorized(ctx, o_.token, rank_, "a data stream"))
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

void GrpcTransport::send_recv(int dst, const MsgHeader& sh, const void* sdata, int src,
                              const MsgHeader& rh, void* rdata, const Reduce* red,
                              Deadline deadline) {
  DT_CHECK(dst >= 0 && dst < world_ && src >= 0 && src < world_);
  if (out_path_[dst] != &stream_path_)  // shared memory and self: nothing to overlap
    return Transport::send_recv(dst, sh, sdata, src, rh, rdata, red, deadline);
  DT_CHECK(!red || rh.bytes % sizeof(float) == 0);
  check_sendable(sh);
  std::shared_ptr<SendTicket> ticket;
  try {
    ticket = start_stream_send(dst, sh, sdata);
  } catch (const CommError&) {
    rethrow_send_error(dst, sh);
  }
  // Posted while our chunks go out: the peer's message (sent at the same moment in a ring step)
  // is delivered straight into rdata, reduced from gRPC's slices when red is set.
  std::exception_ptr recv_error;
  try {
    in_path_[src]->recv(src, rh, rdata, red, deadline);
  } catch (...) {
    recv_error = std::current_exception();
  }
  // Always waited for, also after a failed receive: the caller may free sdata once we return.
  try {
    wait_stream_send(dst, *ticket);
  } catch (const CommError&) {
    if (!recv_error) rethrow_send_error(dst, sh);
  }
  if (recv_error) std::rethrow_exception(recv_error);
  bytes_sent_ += sh.bytes;
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
  for (auto& ib : inboxes_) ib->abort(abort_reason_);
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
    b.RegisterService(rendezvous_->service());
  }
  b.RegisterService(&data_service_);
  b.RegisterService(heartbeats_.service());
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

std::string GrpcTransport::setup_failure() {
  if (aborted_.load()) {
    std::lock_guard<std::mutex> lk(abort_mu_);
    return abort_reason_;
  }
  std::lock_guard<std::mutex> lk(setup_mu_);
  // A peer found silent is the one that failed. One whose connection closed may only have
  // given up because of a silent one -- which every rank finds at about the same moment
  // (silence counts from the rendezvous for all of them) -- so it is reported only after a
  // short grace in which this rank may find the silent one itself.
  if (!silent_.empty()) return mailbox(silent_.front()).failed_reason();
  // The first peer that went down (mailboxes note it as they fail), not the lowest-numbered.
  if (!closed_ && down_log_.first() >= 0) {
    closed_ = down_log_.first();
    closed_at_ = Clock::now();
  }
  if (!closed_) return "";
  // A peer that gave up says why on our stream to it ("rank 0 aborted: connection to rank 1
  // lost ..."): that names the rank that failed.
  const int c = *closed_;
  if (static_cast<size_t>(c) < out_.size() && out_[c]) {
    std::string e = out_[c]->error();
    if (e.rfind(fmt::format("rank {} aborted: ", c), 0) == 0) return e;
  }
  const auto grace = heartbeats_.enabled() ? secs_dur(o_.heartbeat_s / 12) + kSetupSlice * 4
                                           : Clock::duration::zero();
  if (Clock::now() - closed_at_ < grace) return "";
  const std::string a = mailbox(*closed_).aborted_reason();
  return a.empty() ? mailbox(*closed_).failed_reason() : a;
}

void GrpcTransport::fault_point(const char* at) {
  if (fault_due_at(o_.faults, "kill_in_connect", rank_, at))
    die_by_fault(fmt::format("rank {} at '{}' while connecting", rank_, at));
}

void GrpcTransport::open_streams(Clock::time_point deadline) {
  out_.resize(world_);
  channels_.resize(world_);
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    channels_[r] = grpc::CreateCustomChannel(peers_[r], channel_creds_, channel_args());
    // Made before the heartbeats start, which may fail a peer (and its stream) at any moment.
    out_[r] = std::make_unique<OutStream>(rank_, r, tune_.chunk_bytes, tune_.copy_send);
  }
  // Beat from now on: peers judge our silence from the rendezvous on, and this rank may still
  // be connecting to others.
  heartbeats_.start(channels_);
  fault_point("channels");
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    // In short slices, so that a peer found dead meanwhile (its heartbeats stopped: it died
    // after the rendezvous) ends the wait at once instead of the deadline.
    for (;;) {
      if (std::string why = setup_failure(); !why.empty()) throw CommError(why);
      const auto now = Clock::now();
      if (now >= deadline)
        throw CommError(fmt::format("cannot connect to rank {} at {} within {} s", r, peers_[r],
                                    seconds_str(o_.connect_timeout_s)));
      if (channels_[r]->WaitForConnected(wall(std::min(deadline, now + kSetupSlice)))) break;
    }
    out_[r]->start(channels_[r], o_.token);
  }
}

void GrpcTransport::wait_for_peers(Clock::time_point deadline) {
  std::vector<int> missing;
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    for (;;) {
      if (std::string why = setup_failure(); !why.empty()) throw CommError(why);
      const auto now = Clock::now();
      const std::string why = mailbox(r).wait_connected(std::min(deadline, now + kSetupSlice));
      if (why.empty()) break;
      // Down: setup_failure reports it (perhaps after a grace).
      if (why != "timeout") std::this_thread::sleep_for(kSetupSlice);
      if (now >= deadline) {
        missing.push_back(r);
        break;
      }
    }
  }
  if (!missing.empty())
    throw CommError(fmt::format("{} did not open their streams to rank {} within {} s",
                                ranks_str(missing), rank_, seconds_str(o_.connect_timeout_s)));
  for (int r = 0; r < world_; ++r)
    if (out_[r])
      if (std::string e = out_[r]->error(); !e.empty()) throw CommError(e);
  if (shm_) {
    shm_->fix_senders();
    for (int r = 0; r < world_; ++r) {
      if (r == rank_) continue;
      if (shm_->sends_to(r)) out_path_[r] = shm_.get();
      if (shm_->receives_from(r)) in_path_[r] = shm_.get();
    }
  }
}

void GrpcTransport::set_credentials() {
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
}

void GrpcTransport::connect() {
  set_credentials();
  if (rank_ == 0)
    rendezvous_ =
        std::make_unique<RendezvousHost>(o_, Clock::now() + secs_dur(o_.rendezvous_timeout_s));
  start_server();
  if (o_.shm && world_ > 1) {
    if (const int n = sweep_orphaned_segments())
      spdlog::info(
          "rank {}: removed {} shared-memory segment(s) of dtrain processes that no "
          "longer exist",
          rank_, n);
    shm_ = ShmPath::create(ShmPath::Env{rank_, world_,
                                        [this](int r) -> Mailbox& { return mailbox(r); },
                                        [this](int src, const std::string& what) {
                                          return malformed(src, what, "shared-memory record");
                                        }});
  }
  const std::vector<PeerEntry> table = join_rendezvous(
      o_, listen_address_, shm_ ? shm_->name() : "", channel_creds_, channel_args());
  std::vector<std::string> shm_names;
  for (const PeerEntry& p : table) {
    peers_.push_back(p.address);
    shm_names.push_back(p.shm_name);
  }
  // Liveness from the rendezvous on: a peer silent for heartbeat_s from here is failed, also
  // while this rank still waits for its connection or its streams.
  heartbeats_.arm();
  fault_point("joined");
  const auto deadline = Clock::now() + secs_dur(o_.connect_timeout_s);
  try {
    // Before our streams open: a peer that sees our stream sees the attachment.
    if (shm_) shm_->attach(shm_names);
    open_streams(deadline);
    fault_point("streams");
    wait_for_peers(deadline);
  } catch (const CommError& e) {
    // Peers still connecting hear why (naming the rank that failed), not only that this rank
    // closed.
    abort(e.what());
    throw;
  }
}

void GrpcTransport::shutdown() {
  {
    std::lock_guard<std::mutex> lk(in_mu_);
    closing_ = true;
  }
  // Keep beating while the streams close, but judge no peer any more.
  heartbeats_.disarm();
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
  heartbeats_.stop();
  // 2. Answer pending joins and incoming streams, then stop the server.
  if (rendezvous_) rendezvous_->shutdown(fmt::format("rank {} shut down", rank_));
  finish_in_streams(
      grpc::Status(grpc::StatusCode::ABORTED, fmt::format("rank {} closed its connection", rank_)));
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server_.reset();
  rendezvous_.reset();
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
}  // namespace grpc_detail

using grpc_detail::GrpcTransport;
using grpc_detail::tune_malloc_once;

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
  const std::string h = grpc_detail::strip_brackets(host);
  return h == "localhost" || h == "::1" || h.rfind("127.", 0) == 0;
}

}  // namespace dtrain
