// Connecting and shutting down the gRPC transport: the server and its credentials, the
// rendezvous, opening the streams to every peer and waiting for theirs (failing fast when a
// peer is found down), and the orderly close. The data path is in ../grpc_transport.cc.
#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/security/server_credentials.h>
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
#include "comm/grpc/tls_files.h"
#include "comm/grpc/wire.h"
#include "comm/grpc_internal.h"
#include "comm/grpc_transport.h"
#include "comm/mailbox.h"
#include "comm/rendezvous/master_addr.h"
#include "comm/rendezvous/rendezvous.h"
#include "comm/shm_ring.h"
#include "dtrain.grpc.pb.h"
#include "dtrain.pb.h"
#include "util/check.h"
#include "util/fault.h"

#include "comm/grpc/transport_impl.h"

namespace dtrain {
namespace grpc_detail {
namespace {

// How long the destructor waits for peers to acknowledge our half-close before cancelling.
constexpr auto kCloseGrace = std::chrono::seconds(2);
// How often connecting rechecks whether a peer went down meanwhile.
constexpr auto kSetupSlice = std::chrono::milliseconds(50);
// Keepalive: notices a peer whose host vanished without closing the socket.
constexpr int kKeepaliveTimeMs = 10000;
constexpr int kKeepaliveTimeoutMs = 10000;
// How long an incoming connection may take to complete its handshake (start_server).
constexpr int kServerHandshakeTimeoutMs = 10000;
// How long a rank tries to open a TCP data connection before it keeps the gRPC stream instead
// (a peer's data port is up before the rendezvous, so only a firewall or a broken route waits).
constexpr auto kTcpConnectLimit = std::chrono::seconds(10);

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

}  // namespace

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
  // A connection that has not completed its HTTP/2 (and TLS) handshake in this time is closed
  // (gRPC's default: 120 s): silent connections to the rendezvous port, which any host that
  // reaches it may open without the token, held a descriptor each for two minutes.
  b.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, kServerHandshakeTimeoutMs);
  set_tuning_args(tune_, [&](const char* k, int v) { b.AddChannelArgument(k, v); });
  server_ = b.BuildAndStart();
  if (!server_ || data_port == 0 || (rank_ == 0 && master_port == 0)) {
    server_.reset();
    // A bind address given that gRPC cannot listen on (its ephemeral port cannot be taken):
    // that setting, not the rendezvous port, is what to fix.
    if (data_port == 0 && !o_.bind.empty() && !is_wildcard(o_.bind) && !is_loopback_host(o_.bind))
      throw UserError(fmt::format(
          "rank {} cannot listen on {}: distributed.bind '{}' is not an address of this host",
          rank_, data_addr, o_.bind));
    if (rank_ == 0 && master_port == 0) {
      const std::string why =
          listen_problem(master_addr.substr(0, master_addr.rfind(':')), o_.master_port);
      throw CommError(fmt::format("rank 0 cannot listen on {} for the rendezvous ({})", master_addr,
                                  why.empty() ? "port in use or address not local?" : why));
    }
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
  // A peer that aborted said why, naming the rank that failed.
  if (!peer_abort_.empty()) return peer_abort_;
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
  if (const int64_t ms = fault_stall_ms(o_.faults, rank_, at)) {
    spdlog::warn("rank {}: DTRAIN_FAULT: stalling {} ms at '{}' while connecting", rank_, ms, at);
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
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
    connect_tcp(r, deadline);
    out_[r]->start(channels_[r], o_.token);
  }
}

void GrpcTransport::connect_tcp(int r, Clock::time_point deadline) {
  if (!tcp_ || tcp_ports_[r] <= 0 || (shm_ && shm_->sends_to(r))) return;
  // Before our stream to r opens: r counts the connection among our streams first.
  const std::string host = peers_[r].substr(0, peers_[r].rfind(':'));
  const std::string why =
      tcp_->connect(r, host, tcp_ports_[r], std::min(deadline, Clock::now() + kTcpConnectLimit),
                    [this] { return setup_failure(); });
  if (why.empty()) {
    out_path_[r] = tcp_.get();
    return;
  }
  spdlog::warn(
      "rank {}: no TCP data connection to rank {} at {} ({}); its data goes over the "
      "gRPC stream",
      rank_, r, host_port(host, tcp_ports_[r]), why);
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
    throw CommError(
        fmt::format("{} did not open their streams to rank {} within {} s "
                    "(distributed.timeout_s)",
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
    const TlsFiles f = read_tls_files(o_.tls_cert, o_.tls_key, o_.tls_ca);
    const std::string &cert = f.cert, &key = f.key, &ca = f.ca;
    // Every rank dials rank 0 at master_addr and checks the name on rank 0's certificate: one
    // without it fails each handshake, seen only as a rendezvous timeout. (Other ranks' own
    // certificates need not name it: per-host certificates name their own hosts.)
    if (const std::string why = rank_ == 0 ? tls_name_problem(cert, o_.master_addr) : "";
        !why.empty())
      throw UserError("distributed.tls.cert '" + o_.tls_cert + "' " + why);
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
  if (o_.tcp && world_ > 1) {
    if (!o_.tls_cert.empty())
      spdlog::debug("rank {}: TLS is on, so data stays on the gRPC streams", rank_);
    else
      tcp_ =
          TcpPath::create(TcpPath::Env{rank_, world_, o_.token, o_.config_hash,
                                       [this](int r) -> Mailbox& { return mailbox(r); },
                                       [this](int src, const std::string& what) {
                                         return malformed(src, what, "chunk on the TCP connection");
                                       }},
                          o_.bind);
  }
  const std::vector<PeerEntry> table =
      join_rendezvous(o_, listen_address_, shm_ ? shm_->name() : "", tcp_ ? tcp_->port() : 0,
                      channel_creds_, channel_args());
  std::vector<std::string> shm_names;
  for (const PeerEntry& p : table) {
    peers_.push_back(p.address);
    shm_names.push_back(p.shm_name);
    tcp_ports_.push_back(p.tcp_port);
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
  // 0. The TCP connections end after their last byte; their readers stop (before the streams
  // close, so that a peer's mailbox never fails ahead of data still on its connection).
  if (tcp_) tcp_->close();
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

}  // namespace grpc_detail
}  // namespace dtrain
