// The rendezvous: every rank (rank 0 included) joins rank 0 with (rank, world size, listen
// address, shared-memory segment name, job token, config hash) and receives the peer table once
// all ranks have joined. Rank 0 hosts the service (RendezvousHost) at MASTER_ADDR:MASTER_PORT;
// join_rendezvous is every rank's side. A disagreement (protocol version, world size, config
// hash, duplicate or out-of-range rank) or a timeout fails the rendezvous for every rank with
// the same message.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/grpc/common.h"
#include "comm/grpc/wire.h"
#include "comm/grpc_transport.h"
#include "dtrain.grpc.pb.h"

namespace dtrain::grpc_detail {

// Largest join request decode_join_request accepts (a real one is well under 1 KiB).
inline constexpr size_t kMaxJoinRequestBytes = 64 << 10;

// Decodes a serialized JoinRequest (what Rendezvous.Join carries). Pure; throws WireError if the
// bytes are not one. What it says is judged by join_refusal.
wire::JoinRequest decode_join_request(std::span<const char> bytes);

// "" or why rank 0 refuses a join, from the request alone against the job (world size, config
// hash): another wire protocol, world size or config hash, a rank out of range, no listen
// address. The refusal fails the rendezvous for every rank. (Two joins for one rank are the
// coordinator's to see.) Pure.
std::string join_refusal(const wire::JoinRequest& req, int world, const std::string& hash);

class Coordinator;

// Rank 0's rendezvous service: a Coordinator behind the token check.
class RendezvousHost {
 public:
  // Fails the rendezvous, naming the ranks that never joined, at `deadline`.
  RendezvousHost(const GrpcOptions& o, Clock::time_point deadline);
  ~RendezvousHost();
  grpc::Service* service() { return &service_; }
  // Fails pending and later joins with `why` (unless the rendezvous completed) and stops.
  void shutdown(const std::string& why);

 private:
  class Service final : public wire::Rendezvous::CallbackService {
   public:
    explicit Service(RendezvousHost* h) : h_(h) {}
    grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx, const wire::JoinRequest* req,
                                   wire::JoinReply* reply) override;

   private:
    RendezvousHost* const h_;
  };
  const std::string token_;
  const int rank_;
  std::unique_ptr<Coordinator> coordinator_;
  Service service_;
};

// One entry of the peer table.
struct PeerEntry {
  std::string address;   // "host:port" of the rank's Data service
  std::string shm_name;  // its shared-memory segment, "" = none
};

// Joins the rendezvous at o.master_addr:o.master_port (waiting for rank 0 to come up) and
// returns the peer table, in rank order. Throws CommError with what rank 0 or the network said.
std::vector<PeerEntry> join_rendezvous(const GrpcOptions& o, const std::string& listen_address,
                                       const std::string& shm_name,
                                       const std::shared_ptr<grpc::ChannelCredentials>& creds,
                                       const grpc::ChannelArguments& args);

}  // namespace dtrain::grpc_detail
