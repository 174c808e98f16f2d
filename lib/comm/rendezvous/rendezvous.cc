#include "comm/rendezvous/rendezvous.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "comm/grpc_internal.h"

namespace dtrain::grpc_detail {
namespace {
// Extra time a joining rank waits beyond its rendezvous timeout, so that rank 0's own timeout
// (which names the missing ranks) reaches it first when both started together.
constexpr auto kJoinSlack = std::chrono::seconds(5);
}  // namespace

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
    } else if (std::string why = join_refusal(*req, world_, hash_); !why.empty()) {
      fail_locked(r, why);
    } else if (pending_.count(rank)) {
      fail_locked(r, fmt::format("rank {} joined twice (from {} and {})", rank, pending_[rank].peer,
                                 ctx->peer()));
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

wire::JoinRequest decode_join_request(std::span<const char> bytes) {
  wire::JoinRequest req;
  if (bytes.size() > kMaxJoinRequestBytes)
    throw WireError(
        fmt::format("a join request of {} bytes (at most {})", bytes.size(), kMaxJoinRequestBytes));
  if (!req.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    throw WireError("not a JoinRequest");
  return req;
}

std::string join_refusal(const wire::JoinRequest& req, int world, const std::string& hash) {
  const int rank = req.rank();
  if (req.protocol_version() != kGrpcProtocolVersion)
    return fmt::format("rank {} speaks wire protocol {}, rank 0 speaks {}", rank,
                       req.protocol_version(), kGrpcProtocolVersion);
  if (req.world_size() != world)
    return fmt::format("rank {} says the world size is {}, rank 0 says {}", rank, req.world_size(),
                       world);
  if (rank < 0 || rank >= world)
    return fmt::format("rank {} is out of range for world size {}", rank, world);
  if (req.config_hash() != hash)
    return fmt::format("rank {} has config hash {}, rank 0 has {}", rank, req.config_hash(), hash);
  if (req.listen_address().empty()) return fmt::format("rank {} sent no listen address", rank);
  return "";
}

void JoinReactor::OnCancel() {
  c_->cancelled(this);
}

RendezvousHost::RendezvousHost(const GrpcOptions& o, Clock::time_point deadline)
    : token_(o.token),
      rank_(o.rank),
      coordinator_(std::make_unique<Coordinator>(o, deadline)),
      service_(this) {}

RendezvousHost::~RendezvousHost() = default;

void RendezvousHost::shutdown(const std::string& why) {
  coordinator_->shutdown(why);
}

grpc::ServerUnaryReactor* RendezvousHost::Service::Join(grpc::CallbackServerContext* ctx,
                                                        const wire::JoinRequest* req,
                                                        wire::JoinReply* reply) {
  if (!authorized(ctx, h_->token_, h_->rank_, "a rendezvous join")) {
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    r->Finish(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong or missing job token"));
    return r;
  }
  return h_->coordinator_->join(ctx, req, reply);
}

std::vector<PeerEntry> join_rendezvous(const GrpcOptions& o, const std::string& listen_address,
                                       const std::string& shm_name,
                                       const std::shared_ptr<grpc::ChannelCredentials>& creds,
                                       const grpc::ChannelArguments& args) {
  const int rank_ = o.rank, world_ = o.world_size;
  const auto start = Clock::now();
  const auto timeout = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(o.rendezvous_timeout_s));
  const auto deadline = start + timeout + kJoinSlack;
  const std::string master = host_port(o.master_addr, o.master_port);
  auto channel = grpc::CreateCustomChannel(master, creds, args);
  auto stub = wire::Rendezvous::NewStub(channel);
  wire::JoinRequest req;
  req.set_protocol_version(kGrpcProtocolVersion);
  req.set_rank(rank_);
  req.set_world_size(world_);
  req.set_listen_address(listen_address);
  req.set_config_hash(o.config_hash);
  req.set_shm_name(shm_name);
  wire::JoinReply reply;
  auto backoff = std::chrono::milliseconds(100);
  for (;;) {
    grpc::ClientContext ctx;
    ctx.AddMetadata(kGrpcTokenKey, o.token);
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
                                    seconds_str(o.rendezvous_timeout_s)));
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
  std::vector<PeerEntry> peers;
  for (int r = 0; r < world_; ++r) {
    const wire::Peer& p = reply.peers(r);
    if (p.rank() != r || p.address().empty())
      throw CommError(fmt::format("rendezvous returned a bad peer table (entry {})", r));
    peers.push_back(PeerEntry{p.address(), p.shm_name()});
  }
  std::string table;
  for (int r = 0; r < world_; ++r)
    table += fmt::format("{}{}={}", r ? ", " : "", r, peers[r].address);
  spdlog::debug("rank {}: peer table: {}", rank_, table);
  return peers;
}

}  // namespace dtrain::grpc_detail
