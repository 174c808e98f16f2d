// The rendezvous, on the store (rendezvous/store.h) that rank 0 hosts at MASTER_ADDR:MASTER_PORT.
// Every rank (rank 0 included) joins with (rank, world size, listen address, shared-memory
// segment name, TCP data port, config hash) under the job token and receives the peer table once
// all ranks have joined:
//
//   every rank:  n = add("rdzv/joins", 1); set("rdzv/join/<n>", JoinRequest);
//                get("rdzv/result")  -> "ok" + JoinReply | "fail" + the message
//   rank 0:      the Coordinator watches every join as it is set, refuses disagreements at once
//                (protocol version, world size, config hash, a duplicate or out-of-range rank),
//                and sets the result when the last rank joined, at the first refusal, or at its
//                rendezvous timeout (naming the ranks that never joined).
//
// So every rank reports the same message, and a rank never waits past its deadline.
#pragma once

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "comm/grpc/common.h"
#include "comm/grpc/wire.h"
#include "comm/grpc_transport.h"
#include "comm/rendezvous/store.h"
#include "dtrain.pb.h"

namespace dtrain::grpc_detail {

// Largest join request decode_join_request accepts (a real one is well under 1 KiB).
inline constexpr size_t kMaxJoinRequestBytes = 64 << 10;

// Decodes a serialized JoinRequest (the value of a join key). Pure; throws WireError if the
// bytes are not one. What it says is judged by join_refusal.
wire::JoinRequest decode_join_request(std::span<const char> bytes);

// "" or why rank 0 refuses a join, from the request alone against the job (world size, config
// hash): another wire protocol, world size or config hash, a rank out of range, no listen
// address. The refusal fails the rendezvous for every rank. (Two joins for one rank are the
// coordinator's to see.) Pure.
// `difference` (GrpcOptions::config_difference, may be empty) names the keys of a config that
// differs.
std::string join_refusal(const wire::JoinRequest& req, int world, const std::string& hash,
                         const std::function<std::string(const std::string&)>& difference = {});
// The largest config_detail a join carries (a join request is at most kMaxJoinRequestBytes).
inline constexpr size_t kMaxConfigDetailBytes = 32 << 10;

// Where rank 0 publishes the rendezvous result ("ok" + JoinReply | "failrefused: " + why |
// "fail" + why).
inline constexpr char kRendezvousResultKey[] = "rdzv/result";

// The coordinator's decisions, without threads, store or clock: it sees every set of the store
// in order and decides the rendezvous once (see the top of this file). Not thread-safe (the
// host calls it under its lock); what fuzz/rendezvous.cc drives.
class JoinCoordinator {
 public:
  JoinCoordinator(int world, std::string hash,
                  std::function<std::string(const std::string&)> difference = {})
      : world_(world), hash_(std::move(hash)), difference_(std::move(difference)) {}
  // Judges a set of the store: returns the result a join key's value decides ("ok" + the peer
  // table once the last rank joined, "failrefused: " + why at the first refusal, "fail" + why
  // for a malformed join), and "" while
  // undecided, for other keys and for everything once decided.
  std::string on_set(const std::string& key, const std::string& value);
  // Decides the rendezvous (a timeout, a shutdown) unless it was decided; whether this call did.
  bool decide();
  bool decided() const { return decided_; }
  // The ranks that have not joined, in order.
  std::vector<int> missing() const;

 private:
  struct Joined {
    std::string address, shm_name;
    int tcp_port = 0;
    bool rejoin = false;  // its join was one again (JoinRequest.rejoin)
  };
  const int world_;
  const std::string hash_;
  const std::function<std::string(const std::string&)> difference_;
  std::map<int, Joined> joined_;
  std::set<std::string> join_keys_;  // the join keys set so far (a retried Set repeats one)
  bool decided_ = false;
};

class StoreService;

// Rank 0's side: the store, its service, and the coordinator that watches the joins.
class RendezvousHost {
 public:
  // Fails the rendezvous, naming the ranks that never joined, at `deadline`; refuses it with
  // o.refusal, if set, when the last rank joined.
  RendezvousHost(const GrpcOptions& o, Clock::time_point deadline);
  ~RendezvousHost();
  grpc::Service* service();
  // Fails the rendezvous with `why` (unless it completed) and the store's waits, and stops.
  void shutdown(const std::string& why);

 private:
  void on_set(const std::string& key, const std::string& value);
  // Sets the result unless the rendezvous was decided (the first call wins), outside mu_.
  void finish(const std::string& result);
  void publish(const std::string& result);
  void timer_loop();

  const double timeout_s_;
  const Clock::time_point deadline_;
  const std::string refusal_;
  std::mutex mu_;
  std::condition_variable cv_;
  JoinCoordinator coord_;  // guarded by mu_
  bool stop_ = false;
  MemoryStore store_;
  std::unique_ptr<StoreService> service_;
  std::thread timer_;
};

// One entry of the peer table.
struct PeerEntry {
  std::string address;   // "host:port" of the rank's Data service
  std::string shm_name;  // its shared-memory segment, "" = none
  int tcp_port = 0;      // its TCP data port on the host of `address`, 0 = none
};

// The peer table in a rendezvous result (the value rank 0 sets under "rdzv/result": "ok" + a
// JoinReply, "failrefused: " + why or "fail" + why) for `rank` of `world` (0 <= rank < world),
// which joined from listen_address. Pure; throws UserError with rank 0's message for a refusal
// (ranks that disagree: join_refusal, a rank joined twice), CommError with it for a failure, when
// the result is malformed (not one peer per rank in rank order, an empty address), or when it lists
// another address for this rank (it joined after the rendezvous completed).
std::vector<PeerEntry> decode_join_result(const std::string& result, int rank, int world,
                                          const std::string& listen_address);

// Joins the rendezvous at o.master_addr:o.master_port (waiting for rank 0 to come up) and
// returns the peer table, in rank order. Throws CommError with what rank 0 or the network said.
std::vector<PeerEntry> join_rendezvous(const GrpcOptions& o, const std::string& listen_address,
                                       const std::string& shm_name, int tcp_port,
                                       const std::shared_ptr<grpc::ChannelCredentials>& creds,
                                       const grpc::ChannelArguments& args);

}  // namespace dtrain::grpc_detail
