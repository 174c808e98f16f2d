#include "comm/rendezvous/rendezvous.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <string_view>

#include "comm/grpc_internal.h"
#include "comm/rendezvous/master_addr.h"
#include "comm/rendezvous/store_service.h"
#include "util/check.h"
#include "util/duration.h"
#include "util/rng.h"

namespace dtrain::grpc_detail {
namespace {
// Extra time a joining rank waits beyond its rendezvous timeout, so that rank 0's own timeout
// (which names the missing ranks) reaches it first when both started together.
constexpr auto kJoinSlack = std::chrono::seconds(5);
constexpr char kPrefix[] = "rdzv";
constexpr std::string_view kJoinKey = "rdzv/join/";
// A result: "ok" + the peer table; "failrefused: " + why (ranks that disagree: a launch or config
// mistake, which a restart repeats; a "fail" still, so that an older dtrain's rank shows the
// reason); "fail" + why (a timeout, a shutdown, a malformed join).
constexpr std::string_view kOk = "ok", kRefused = "failrefused: ", kFail = "fail";
// How long rank 0, shutting down, waits for the ranks that joined to fetch the result.
constexpr auto kAckGrace = std::chrono::seconds(2);
// A random id of one RendezvousHost's store, set before it serves: a rank that waits for the
// result looks at it every kRejoinCheck, and joins again when it changed (rank 0 restarted by
// hand meanwhile: its new store never saw this rank's join, and the rendezvous failed with
// "rank 1 never joined" on every rank, rank 1 included).
constexpr char kInstanceKey[] = "instance";
constexpr auto kRejoinCheck = std::chrono::seconds(1);
// (every 500 ranks a second more: each waiting rank asks rank 0's store twice per look)
constexpr int kRanksPerCheckSecond = 500;
}  // namespace

wire::JoinRequest decode_join_request(std::span<const char> bytes) {
  wire::JoinRequest req;
  if (bytes.size() > kMaxJoinRequestBytes)
    throw WireError(
        fmt::format("a join request of {} bytes (at most {})", bytes.size(), kMaxJoinRequestBytes));
  if (!req.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    throw WireError("not a JoinRequest");
  return req;
}

std::string join_refusal(const wire::JoinRequest& req, int world, const std::string& hash,
                         const std::function<std::string(const std::string&)>& difference) {
  const int rank = req.rank();
  if (req.protocol_version() != kGrpcProtocolVersion)
    return fmt::format("rank {} speaks wire protocol {}, rank 0 speaks {}", rank,
                       req.protocol_version(), kGrpcProtocolVersion);
  if (req.world_size() != world)
    return fmt::format("rank {} says the world size is {}, rank 0 says {}", rank, req.world_size(),
                       world);
  if (rank < 0 || rank >= world)
    return fmt::format("rank {} is out of range for world size {}", rank, world);
  if (req.config_hash() != hash) {
    std::string what =
        fmt::format("rank {} has config hash {}, rank 0 has {}", rank, req.config_hash(), hash);
    // (the run plan follows the hash, "<hash> (train.epochs ...)": equal hashes and two long
    // plans read as a contradiction unless said)
    const auto head = [](const std::string& h) { return h.substr(0, h.find(' ')); };
    if (head(req.config_hash()) == head(hash))
      what =
          fmt::format("rank {}'s run plan differs from rank 0's (the same config hash {}): ", rank,
                      head(hash)) +
          what;
    // (the hashes say that the configs differ, the details which keys: a rank started by hand
    // with another --set showed two hashes and nothing that told them apart)
    if (difference && !req.config_detail().empty()) {
      if (const std::string d = difference(req.config_detail()); !d.empty())
        what += fmt::format("; the keys that differ (rank 0's -> rank {}'s): {}", rank, d);
    } else if (difference) {
      what += fmt::format(
          "; rank {} sent no config to name the keys that differ by (one above {} KiB, or a "
          "dtrain before 2026-12-07): compare the ranks' config.json",
          rank, kMaxConfigDetailBytes >> 10);
    }
    return what;
  }
  if (req.listen_address().empty()) return fmt::format("rank {} sent no listen address", rank);
  if (req.tcp_port() < 0 || req.tcp_port() > 65535)
    return fmt::format("rank {} sent TCP data port {}", rank, req.tcp_port());
  return "";
}

std::string JoinCoordinator::on_set(const std::string& key, const std::string& value) {
  if (decided_ || key.rfind(kJoinKey, 0) != 0) return "";  // a late joiner finds itself missing
  // The same key set again is a retried Set whose first reply was lost (GrpcStore retries a set
  // after UNAVAILABLE), not a second join: each join takes a key of its own (add "joins").
  if (!join_keys_.insert(key).second) return "";
  wire::JoinRequest req;
  std::string failure;
  std::string_view kind = kRefused;
  try {
    req = decode_join_request(value);
    failure = join_refusal(req, world_, hash_, difference_);
  } catch (const WireError& e) {
    failure = fmt::format("a malformed join: {}", e.what());
    kind = kFail;
  }
  const int rank = req.rank();
  bool replaces = false;
  if (failure.empty() && joined_.count(rank)) {
    const Joined& was = joined_[rank];
    // A join again after the rank saw rank 0's store change (join_rendezvous): from the same
    // place, one this store had already; from elsewhere, a stale copy of a rank that has joined
    // (stopped, then continued), left to find itself missing from the result -- and a first join
    // after such a one replaces it (the copy joined this store before the rank's live process).
    const bool same = was.address == req.listen_address() && was.shm_name == req.shm_name() &&
                      was.tcp_port == req.tcp_port();
    if (same || req.rejoin()) return "";
    replaces = was.rejoin;
    if (!replaces)
      failure = fmt::format("rank {} joined twice (from {} and {})", rank, was.address,
                            req.listen_address());
  }
  if (!failure.empty()) {
    spdlog::debug("rendezvous failed: {}", failure);
    decided_ = true;
    return std::string(kind) + failure;
  }
  joined_[rank] = Joined{req.listen_address(), req.shm_name(), req.tcp_port(), req.rejoin()};
  if (replaces) return "";  // (the count is the same)
  spdlog::debug("rendezvous: rank {} joined from {} ({}/{})", rank, req.listen_address(),
                joined_.size(), world_);
  if (static_cast<int>(joined_.size()) < world_) return "";
  wire::JoinReply reply;
  for (const auto& [r, j] : joined_) {
    wire::Peer* peer = reply.add_peers();
    peer->set_rank(r);
    peer->set_address(j.address);
    peer->set_shm_name(j.shm_name);
    peer->set_tcp_port(j.tcp_port);
  }
  decided_ = true;
  return std::string(kOk) + reply.SerializeAsString();
}

bool JoinCoordinator::decide() {
  if (decided_) return false;
  decided_ = true;
  return true;
}

std::vector<int> JoinCoordinator::missing() const {
  std::vector<int> out;
  for (int r = 0; r < world_; ++r)
    if (!joined_.count(r)) out.push_back(r);
  return out;
}

RendezvousHost::RendezvousHost(const GrpcOptions& o, Clock::time_point deadline)
    : timeout_s_(o.rendezvous_timeout_s),
      deadline_(deadline),
      refusal_(o.refusal),
      coord_(o.world_size, o.config_hash, o.config_difference),
      store_([this](const std::string& k, const std::string& v) { on_set(k, v); }),
      service_(std::make_unique<StoreService>(&store_, o.token, fmt::format("rank {}", o.rank))) {
  store_.set(std::string(kPrefix) + "/" + kInstanceKey, random_hex());
  timer_ = std::thread([this] { timer_loop(); });
}

RendezvousHost::~RendezvousHost() {
  shutdown("rank 0 shut down");
}

grpc::Service* RendezvousHost::service() {
  return service_.get();
}

void RendezvousHost::on_set(const std::string& key, const std::string& value) {
  std::string result;
  {
    std::lock_guard<std::mutex> lk(mu_);
    result = coord_.on_set(key, value);
  }
  // Waiting for the last join lets every rank hear rank 0's refusal (one that joined later would
  // find no host and wait out its timeout); a disagreement refused on the way is said instead.
  if (!refusal_.empty() && result.rfind(kOk, 0) == 0) result = std::string(kRefused) + refusal_;
  if (!result.empty()) publish(result);
}

void RendezvousHost::finish(const std::string& result) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!coord_.decide()) return;
  }
  publish(result);
}

void RendezvousHost::publish(const std::string& result) {
  cv_.notify_all();
  try {
    store_.set(kRendezvousResultKey, result);
  } catch (const CommError&) {  // the store shut down meanwhile: its waiters heard why
  }
}

void RendezvousHost::timer_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait_until(lk, deadline_, [&] { return stop_ || coord_.decided(); });
  if (stop_ || coord_.decided()) return;
  const std::vector<int> missing = coord_.missing();
  lk.unlock();
  // Rank 0 runs this host: when its own join is missing, its MASTER_ADDR led elsewhere.
  const bool self_missing = !missing.empty() && missing.front() == 0;
  // The ranks that joined hear rank 0's refusal all the same (exit 2, not a timeout's 1).
  if (!refusal_.empty()) {
    finish(std::string(kRefused) + refusal_ +
           fmt::format(" (and {} never joined within {} s)", ranks_str(missing),
                       seconds_str(timeout_s_)));
    return;
  }
  // A rank given another token exits with its own error; rank 0 can only say it refused one.
  finish(std::string(kFail) +
         fmt::format("rendezvous timed out after {} s: {} never joined{}{}",
                     seconds_str(timeout_s_), ranks_str(missing),
                     self_missing ? " (rank 0 serves this rendezvous and runs, but its own join "
                                    "did not arrive: its MASTER_ADDR names another host?)"
                                  : "",
                     service_->refused_hint("rank")));
}

void RendezvousHost::shutdown(const std::string& why) {
  finish(std::string(kFail) + why);  // no-op once decided
  // Every rank that joined asks for the result right after its join: give the ones whose ask is
  // still on its way a moment to get it (they acknowledge), rather than the timeout.
  const auto until = Clock::now() + kAckGrace;
  try {
    while (store_.add(std::string(kPrefix) + "/acks", 0) <
               store_.add(std::string(kPrefix) + "/joins", 0) &&
           Clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } catch (const CommError&) {  // shut down already
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (timer_.joinable()) timer_.join();
  store_.shutdown(why);
}

std::vector<PeerEntry> decode_join_result(const std::string& result, int rank, int world,
                                          const std::string& listen_address) {
  DT_CHECK(rank >= 0 && rank < world);
  // Ranks that disagree (config, world size, rank numbers, dtrain versions): bad input, exit 2,
  // which launchers do not restart.
  if (result.rfind(kRefused, 0) == 0) throw UserError(result.substr(kRefused.size()));
  if (result.rfind(kFail, 0) == 0) throw CommError(result.substr(kFail.size()));
  wire::JoinReply reply;
  if (result.rfind(kOk, 0) != 0 || !reply.ParseFromString(result.substr(kOk.size())))
    throw CommError("rendezvous returned a malformed result");
  if (reply.peers_size() != world)
    throw CommError(
        fmt::format("rendezvous returned {} peers for world size {}", reply.peers_size(), world));
  std::vector<PeerEntry> peers;
  for (int r = 0; r < world; ++r) {
    const wire::Peer& p = reply.peers(r);
    if (p.rank() != r || p.address().empty() || p.tcp_port() < 0 || p.tcp_port() > 65535)
      throw CommError(fmt::format("rendezvous returned a bad peer table (entry {})", r));
    peers.push_back(PeerEntry{p.address(), p.shm_name(), p.tcp_port()});
  }
  // Joined after the last rank did (a restarted or duplicate process): not in the table.
  if (peers[rank].address != listen_address)
    throw CommError(fmt::format(
        "rank {} joined after the rendezvous completed: the job's rank {} is another process (a "
        "second process given RANK={}, or this rank restarted alone: restart every rank of a "
        "job together, as dtrain launch --max-restarts does)",
        rank, rank, rank));
  return peers;
}

std::vector<PeerEntry> join_rendezvous(const GrpcOptions& o, const std::string& listen_address,
                                       const std::string& shm_name, int tcp_port,
                                       const std::shared_ptr<grpc::ChannelCredentials>& creds,
                                       const grpc::ChannelArguments& args) {
  const int rank_ = o.rank, world_ = o.world_size;
  const auto start = Clock::now();
  const auto timeout = seconds_duration(o.rendezvous_timeout_s);
  auto deadline = start + timeout + kJoinSlack;  // (a join again waits as long again)
  const std::string master = host_port(o.master_addr, o.master_port);
  auto channel = grpc::CreateCustomChannel(master, creds, args);
  bool token_refused = false;  // (set by `error`: a user error, exit 2, not a failure)
  bool answered = false;       // rank 0's store took this rank's join

  // A wait for the result that ends before the deadline (slice_wait) is one look of several:
  // `error` notes its end (slice_timed_out) instead of naming a timeout.
  bool slice_wait = false, slice_timed_out = false;
  // What a failed store call means for the rendezvous.
  auto error = [&](const grpc::Status& st) {
    // (rank 0 gone, not back yet: as a wait's end, the next look retries)
    const grpc::StatusCode c = st.error_code();
    if (slice_wait && (c == grpc::StatusCode::DEADLINE_EXCEEDED ||
                       c == grpc::StatusCode::UNAVAILABLE || c == grpc::StatusCode::CANCELLED)) {
      slice_timed_out = true;
      return CommError("a wait for rank 0's store ended");
    }
    switch (st.error_code()) {
      case grpc::StatusCode::ABORTED:  // rank 0 shut down, or its store did
        return CommError(st.error_message());
      case grpc::StatusCode::UNAUTHENTICATED:
        token_refused = true;
        return CommError(
            fmt::format("rank 0 at {} refused this rank's job token (rank {})", master, rank_));
      case grpc::StatusCode::DEADLINE_EXCEEDED: {
        const double slack_s = std::chrono::duration<double>(kJoinSlack).count();
        std::string hint = master_addr_problem(o.master_addr, rank_ == 0);
        // Rank 0 never answered at all (not a report that did not come): who is at the port?
        if (hint.empty() && rank_ != 0 && !answered)
          hint = rendezvous_port_problem(o.master_addr, o.master_port);
        // (rank 0 joins its own store, through MASTER_ADDR as the others do)
        return CommError(fmt::format(
            "rendezvous with {} at {} timed out after {} s (rendezvous_timeout_s {} s, and "
            "{} s more for {} own report, which names the ranks missing){}",
            rank_ == 0 ? "this rank's own store" : "rank 0", master,
            seconds_str(o.rendezvous_timeout_s + slack_s), seconds_str(o.rendezvous_timeout_s),
            seconds_str(slack_s), rank_ == 0 ? "its" : "rank 0's",
            hint.empty() ? "" : "; " + hint));
      }
      default:
        return CommError(
            fmt::format("rendezvous with rank 0 at {} failed: {}", master, status_str(st)));
    }
  };
  auto store = std::make_unique<GrpcStore>(channel, o.token, deadline, error);
  auto rdzv = std::make_unique<PrefixStore>(kPrefix, *store);
  wire::JoinRequest req;
  req.set_protocol_version(kGrpcProtocolVersion);
  req.set_rank(rank_);
  req.set_world_size(world_);
  req.set_listen_address(listen_address);
  req.set_config_hash(o.config_hash);
  if (o.config_detail.size() <= kMaxConfigDetailBytes) req.set_config_detail(o.config_detail);
  req.set_shm_name(shm_name);
  req.set_tcp_port(tcp_port);
  int64_t n = 0;
  try {  // (the first call: where a token rank 0 does not share is refused)
    n = rdzv->add("joins", 1);
    answered = true;
  } catch (const CommError& e) {
    if (!token_refused) throw;
    throw UserError(std::string(e.what()) +
                    ": every rank needs the job's DTRAIN_JOB_TOKEN (else distributed.token_file); "
                    "dtrain launch gives its ranks one");
  }
  const auto check_every = kRejoinCheck * std::max(1, world_ / kRanksPerCheckSecond);
  // The store's instance now, "" when it cannot be told (a short wait: never the rendezvous's).
  const auto instance = [&]() -> std::string {
    slice_wait = true;
    std::string id;
    try {
      const auto until = std::min(deadline, Clock::now() + check_every);
      GrpcStore quick(channel, o.token, until, error);
      id = PrefixStore(kPrefix, quick).get(kInstanceKey, until);
    } catch (const CommError&) {
    }
    slice_wait = false;
    return id;
  };
  std::string joined = instance();
  // Keys of this process's own (a counter of rank 0's old store, a new store's: one number, two
  // ranks), so that only a retried set of this very join repeats one.
  const std::string self = random_hex();
  rdzv->set(fmt::format("join/{}-{}", n, self), req.SerializeAsString());
  std::string result;
  for (;;) {
    const auto until = std::min(deadline, Clock::now() + check_every);
    slice_wait = until < deadline;
    slice_timed_out = false;
    try {
      result = rdzv->get("result", until);
      break;
    } catch (const CommError&) {
      slice_wait = false;
      if (!slice_timed_out) throw;
    }
    const std::string now = instance();
    if (now.empty() || now == joined) continue;
    if (joined.empty()) {  // (the first read failed: the store this rank's join went to)
      joined = now;
      continue;
    }
    spdlog::warn(
        "rank 0's rendezvous store at {} is a new one (rank 0 restarted): joining it again",
        master);
    joined = now;
    // As long to wait again as the new rank 0 waits for its ranks.
    deadline = Clock::now() + timeout + kJoinSlack;
    store = std::make_unique<GrpcStore>(channel, o.token, deadline, error);
    rdzv = std::make_unique<PrefixStore>(kPrefix, *store);
    req.set_rejoin(true);
    rdzv->set(fmt::format("join/{}-{}", rdzv->add("joins", 1), self), req.SerializeAsString());
  }
  slice_wait = false;
  try {  // rank 0 may shut down now (a failed rendezvous); never wait long for it
    GrpcStore quick(channel, o.token, Clock::now() + std::chrono::seconds(1), error);
    PrefixStore(kPrefix, quick).add("acks", 1);
  } catch (const CommError&) {
  }
  std::vector<PeerEntry> peers = decode_join_result(result, rank_, world_, listen_address);
  std::string table;
  for (int r = 0; r < world_; ++r)
    table += fmt::format("{}{}={}", r ? ", " : "", r, peers[r].address);
  spdlog::debug("rank {}: peer table: {}", rank_, table);
  return peers;
}

}  // namespace dtrain::grpc_detail
