#include "launch/job_agent.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <sstream>

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "comm/grpc/common.h"
#include "comm/rendezvous/store.h"
#include "comm/rendezvous/store_service.h"
#include "util/check.h"

namespace dtrain {

namespace {

using grpc_detail::Clock;
using grpc_detail::GrpcStore;
using grpc_detail::host_port;
using grpc_detail::secs_dur;
using grpc_detail::status_str;

constexpr char kPrefix[] = "launch/";

std::string key(int attempt, const std::string& rest) {
  return std::string(kPrefix) + "a" + std::to_string(attempt) + "/" + rest;
}

std::string this_host() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

// Outcome <-> store value: "kind rc killed when_ms cause...".
std::string encode(const NodeOutcome& o) {
  return std::to_string(static_cast<int>(o.kind)) + " " + std::to_string(o.rc) + " " +
         (o.killed ? "1" : "0") + " " + std::to_string(o.when_ms) + " " + o.cause;
}

NodeOutcome decode_outcome(const std::string& s, int node) {
  std::istringstream in(s);
  int kind = -1, killed = 0;
  NodeOutcome o;
  in >> kind >> o.rc >> killed >> o.when_ms;
  if (!in || kind < 0 || kind > 3)
    throw std::runtime_error("node " + std::to_string(node) +
                             "'s launcher sent a malformed report");
  o.kind = static_cast<NodeOutcome::Kind>(kind);
  o.killed = killed != 0;
  std::getline(in >> std::ws, o.cause);
  return o;
}

}  // namespace

JobDecision decide_attempt(const std::vector<NodeOutcome>& outcomes, int attempt,
                           int max_restarts) {
  JobDecision d;
  const NodeOutcome* cause = nullptr;
  const NodeOutcome* stopped = nullptr;
  bool user_error = false;
  for (const NodeOutcome& o : outcomes) {
    if (o.kind == NodeOutcome::kStopped && stopped == nullptr) stopped = &o;
    if (o.kind == NodeOutcome::kUserError) user_error = true;
    if (o.kind == NodeOutcome::kFailed || o.kind == NodeOutcome::kUserError) {
      // A rank killed by a signal did not fail on its own account of a peer: prefer it, then
      // the earliest.
      if (cause == nullptr || (o.killed && !cause->killed) ||
          (o.killed == cause->killed && o.when_ms < cause->when_ms))
        cause = &o;
    }
  }
  if (stopped != nullptr) {
    d.rc = stopped->rc;
    d.reason = stopped->cause;
    return d;
  }
  if (cause == nullptr) return d;  // every node ok
  d.reason = cause->cause;
  if (user_error) {
    d.rc = 2;
  } else if (attempt < max_restarts) {
    d.restart = true;
  } else {
    d.rc = 1;
  }
  return d;
}

struct JobAgent::Impl {
  AgentOptions o;
  // Node 0: the store and its server. Others: a channel to it.
  std::unique_ptr<MemoryStore> mem;
  std::unique_ptr<grpc_detail::StoreService> service;
  std::unique_ptr<grpc::Server> server;
  std::shared_ptr<grpc::Channel> channel;
  std::map<int, int64_t> seen_failures, seen_stops;  // per attempt, entries already returned
  bool reported_failure = false;
  int reported_attempt = -1;

  std::string where() const { return host_port(o.master_addr, o.port); }

  // Runs f on the store; calls that do not wait for keys give up after op_s seconds.
  template <typename F>
  auto with_store(double op_s, F f) {
    if (mem) return f(static_cast<Store&>(*mem));
    GrpcStore s(channel, o.token, Clock::now() + secs_dur(op_s), [this](const grpc::Status& st) {
      if (st.error_code() == grpc::StatusCode::UNAUTHENTICATED)
        return CommError("node 0's launcher at " + where() + " refused this node's job token");
      return CommError("node 0's launcher at " + where() + ": " + status_str(st));
    });
    return f(static_cast<Store&>(s));
  }
};

JobAgent::JobAgent(const AgentOptions& o) : impl_(std::make_unique<Impl>()), host_(this_host()) {
  DT_CHECK(o.nnodes >= 1 && o.node_rank >= 0 && o.node_rank < o.nnodes);
  if (o.token.empty()) throw UserError("a multi-node launch needs the job token");
  impl_->o = o;
  if (o.node_rank == 0) {
    impl_->mem = std::make_unique<MemoryStore>();
    impl_->service =
        std::make_unique<grpc_detail::StoreService>(impl_->mem.get(), o.token, /*self=*/0);
    grpc::ServerBuilder b;
    int bound = 0;
    const std::string any = o.master_addr.find(':') != std::string::npos ? "::" : "0.0.0.0";
    b.AddListeningPort(host_port(any, o.port), grpc::InsecureServerCredentials(), &bound);
    b.RegisterService(impl_->service.get());
    b.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    impl_->server = b.BuildAndStart();
    if (!impl_->server || bound == 0)
      throw UserError("node 0's launcher cannot listen on port " + std::to_string(o.port) +
                      " (--master-port + 1): is it in use?");
  } else {
    grpc::ChannelArguments a;
    a.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    a.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
    a.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    a.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    a.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    impl_->channel = grpc::CreateCustomChannel(host_port(o.master_addr, o.port),
                                               grpc::InsecureChannelCredentials(), a);
  }
}

JobAgent::~JobAgent() {
  if (impl_->server) {
    impl_->mem->shutdown("node 0's launcher exited");
    impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
}

std::vector<std::string> JobAgent::join(int nproc_per_node) {
  Impl& m = *impl_;
  const auto deadline = Clock::now() + secs_dur(m.o.join_timeout_s);
  std::vector<std::string> keys;
  for (int n = 0; n < m.o.nnodes; ++n) keys.push_back(kPrefix + ("join/" + std::to_string(n)));
  std::vector<std::string> hosts(static_cast<size_t>(m.o.nnodes));
  try {
    m.with_store(m.o.join_timeout_s, [&](Store& s) {
      s.set(keys[static_cast<size_t>(m.o.node_rank)], std::to_string(nproc_per_node) + " " + host_);
      for (int n = 0; n < m.o.nnodes; ++n) {
        std::string v;
        try {
          v = s.get(keys[static_cast<size_t>(n)], deadline);
        } catch (const CommError& e) {
          std::string missing;
          for (int k = n; k < m.o.nnodes; ++k) try {
              s.get(keys[static_cast<size_t>(k)], Clock::now() + std::chrono::milliseconds(100));
            } catch (const CommError&) {
              missing += (missing.empty() ? "" : ", ") + std::to_string(k);
            }
          throw std::runtime_error("node(s) " + missing + " did not check in within " +
                                   grpc_detail::seconds_str(m.o.join_timeout_s) + " s (" +
                                   e.what() + ")");
        }
        std::istringstream in(v);
        int per = 0;
        in >> per >> std::ws;
        std::getline(in, hosts[static_cast<size_t>(n)]);
        if (per != nproc_per_node)
          throw UserError("node " + std::to_string(n) + " (" + hosts[static_cast<size_t>(n)] +
                          ") runs " + std::to_string(per) + " rank(s) per node, this node " +
                          std::to_string(nproc_per_node) + ": give every node the same " +
                          "--nproc-per-node");
      }
      return 0;
    });
  } catch (const CommError& e) {
    throw std::runtime_error(std::string("joining the job: ") + e.what());
  }
  return hosts;
}

void JobAgent::report_failure(int attempt, const std::string& what) {
  Impl& m = *impl_;
  if (m.reported_attempt != attempt) m.reported_failure = false;
  m.reported_attempt = attempt;
  if (m.reported_failure) return;
  m.reported_failure = true;
  try {
    m.with_store(2, [&](Store& s) {
      const int64_t n = s.add(key(attempt, "failures"), 1);
      s.set(key(attempt, "failure/" + std::to_string(n)),
            std::to_string(m.o.node_rank) + " " + what);
      return 0;
    });
  } catch (const CommError& e) {
    spdlog::warn("could not tell the other nodes: {}", e.what());
  }
}

void JobAgent::report_stop(int attempt, int sig) {
  Impl& m = *impl_;
  try {
    m.with_store(2, [&](Store& s) {
      const int64_t n = s.add(key(attempt, "stops"), 1);
      s.set(key(attempt, "stop/" + std::to_string(n)),
            std::to_string(m.o.node_rank) + " " + std::to_string(sig));
      return 0;
    });
  } catch (const CommError& e) {
    spdlog::warn("could not tell the other nodes: {}", e.what());
  }
}

RemoteNews JobAgent::poll(int attempt) {
  Impl& m = *impl_;
  RemoteNews news;
  // Each entry is "<node> <text>": another node's entries only.
  auto read_new = [&](Store& s, const std::string& counter, const std::string& entry, int64_t& seen,
                      const std::function<void(const std::string&)>& use) {
    const int64_t n = s.add(key(attempt, counter), 0);
    for (; seen < n; ++seen) {
      const std::string v = s.get(key(attempt, entry + "/" + std::to_string(seen + 1)),
                                  Clock::now() + std::chrono::seconds(1));
      std::istringstream in(v);
      int node = -1;
      std::string rest;
      in >> node >> std::ws;
      std::getline(in, rest);
      if (node != m.o.node_rank) use(rest);
    }
  };
  try {
    m.with_store(1, [&](Store& s) {
      read_new(s, "failures", "failure", m.seen_failures[attempt],
               [&](const std::string& t) { news.failures.push_back(t); });
      read_new(s, "stops", "stop", m.seen_stops[attempt], [&](const std::string& t) {
        if (news.stop_signal == 0) news.stop_signal = std::atoi(t.c_str());
      });
      return 0;
    });
  } catch (const CommError& e) {
    news.lost = e.what();
  }
  return news;
}

JobDecision JobAgent::finish(int attempt, const NodeOutcome& mine, int max_restarts) {
  Impl& m = *impl_;
  const auto deadline = Clock::now() + secs_dur(m.o.report_timeout_s);
  try {
    return m.with_store(m.o.report_timeout_s, [&](Store& s) {
      s.set(key(attempt, "outcome/" + std::to_string(m.o.node_rank)), encode(mine));
      JobDecision d;
      if (m.o.node_rank == 0) {
        std::vector<NodeOutcome> all;
        for (int n = 0; n < m.o.nnodes; ++n) {
          std::string v;
          try {
            v = s.get(key(attempt, "outcome/" + std::to_string(n)), deadline);
          } catch (const CommError&) {
            // A node that never reports (its machine died): the attempt failed there.
            NodeOutcome lost;
            lost.kind = NodeOutcome::kFailed;
            lost.rc = 1;
            lost.when_ms = INT64_MAX;
            lost.cause = "node " + std::to_string(n) + "'s launcher did not report within " +
                         grpc_detail::seconds_str(m.o.report_timeout_s) + " s";
            all.push_back(lost);
            continue;
          }
          all.push_back(decode_outcome(v, n));
        }
        d = decide_attempt(all, attempt, max_restarts);
        s.set(key(attempt, "decision"),
              std::string(d.restart ? "1 " : "0 ") + std::to_string(d.rc) + " " + d.reason);
        // Keep serving until every node has the decision (or a short while passed): a node
        // that exits next must not leave the others unable to read it.
        std::vector<std::string> acks;
        for (int n = 1; n < m.o.nnodes; ++n)
          acks.push_back(key(attempt, "ack/" + std::to_string(n)));
        if (!d.restart && !acks.empty()) {
          try {
            s.wait(acks, Clock::now() + std::chrono::seconds(10));
          } catch (const CommError&) {
          }
        }
        return d;
      }
      const std::string v = s.get(key(attempt, "decision"), deadline + std::chrono::seconds(10));
      s.set(key(attempt, "ack/" + std::to_string(m.o.node_rank)), "1");
      std::istringstream in(v);
      int restart = 0;
      in >> restart >> d.rc >> std::ws;
      std::getline(in, d.reason);
      d.restart = restart != 0;
      return d;
    });
  } catch (const CommError& e) {
    throw std::runtime_error(std::string("the job's launchers could not agree on how attempt ") +
                             std::to_string(attempt + 1) + " ended: " + e.what());
  }
}

}  // namespace dtrain
