#include "launch/job_agent.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "comm/grpc/common.h"
#include "comm/rendezvous/store.h"
#include "comm/rendezvous/store_service.h"
#include "launch/agent_keys.h"
#include "launch/attempt_result.h"
#include "launch/check_in.h"
#include "launch/dist_env.h"
#include "util/check.h"

namespace dtrain {

namespace {

using grpc_detail::Clock;
using grpc_detail::GrpcStore;
using grpc_detail::host_port;
using grpc_detail::secs_dur;
using grpc_detail::status_str;
using launch_detail::check_in_problem;
using launch_detail::CheckIn;
using launch_detail::decode_outcome;
using launch_detail::encode_outcome;
using launch_detail::fmt_ids;
using launch_detail::gather_check_ins;
using launch_detail::job_shape;
using launch_detail::parse_check_in;

constexpr const char* kPrefix = launch_detail::kAgentPrefix;
using launch_detail::claim_node_rank;
using launch_detail::fixed_read_key;
using launch_detail::key_set;
using launch_detail::kRefused;
using launch_detail::refuse_after_read;
using launch_detail::refuse_node;
// Node 0's store instance, drawn by node 0 as it starts: a node 0 launcher started again (a pod
// replaced during the check-in) serves a new store, without the keys the others set in the old.
constexpr char kInstanceKey[] = "launch/instance";

// `value` (a check-in or members list that starts with kRefused) as this node's error: exit 2.
[[noreturn]] void throw_node0_refusal(const std::string& value) {
  throw UserError("node 0 refused this job: " + value.substr(std::strlen(kRefused)));
}

std::string key(int attempt, const std::string& rest) {
  return launch_detail::attempt_key(attempt, rest);
}

std::string this_host() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

}  // namespace

struct JobAgent::Impl {
  AgentOptions o;
  // Node 0: the store and its server. Others: a channel to it.
  std::unique_ptr<MemoryStore> mem;
  std::unique_ptr<grpc_detail::StoreService> service;
  std::unique_ptr<grpc::Server> server;
  std::shared_ptr<grpc::Channel> channel;
  std::map<int, int64_t> seen_failures, seen_stops;  // per attempt, entries already returned
  // The other nodes: when node 0 last answered a poll (unset: not yet polled this attempt). A
  // poll gives up after 1 s; node 0 is lost after lost_after_s without an answer, as node 0
  // gives up on the others (a 1-s pause of node 0's launcher ended the job).
  std::optional<Clock::time_point> heard_node0;
  int heard_attempt = -1;
  bool reported_failure = false;
  int reported_attempt = -1;
  // Elastic: the current attempt's member ids (fixed: every node), and node 0's watch on them.
  std::vector<int> members;
  struct Beat {
    int64_t count = -1;
    Clock::time_point changed;
  };
  std::map<int, Beat> beats;   // node 0: per member, the last alive/<id> count and when it moved
  std::set<int> lost;          // node 0: members of the current attempt found lost
  std::vector<int> survivors;  // node 0: the last attempt's members that were not lost

  // A call was refused for this node's job token (with_store): a user error, not a failure.
  bool token_refused = false;
  // This node has checked in once (join or rendezvous): node 0 no longer refuses bad input,
  // so an unanswered call is not explained by it.
  bool checked_in = false;

  bool elastic() const { return o.min_nodes > 0; }

  // Node 0: "; N call(s) with a wrong or missing job token were refused, ..." for a check-in that
  // timed out (a node given another token exits with its own error), else "".
  std::string refused_hint() const { return service ? service->refused_hint("node") : ""; }

  // The error for a check-in call that failed with `e`: UserError when this node's token was
  // refused (exit 2), else a failure.
  [[noreturn]] void throw_check_in_error(const std::string& what, const CommError& e) const {
    if (token_refused)
      throw UserError(what + e.what() +
                      ": give every node's launcher the job's DTRAIN_JOB_TOKEN (else --token-file "
                      "or distributed.token_file)");
    throw std::runtime_error(what + e.what());
  }

  std::string lost_text(int n) const {
    return "node " + std::to_string(n) + "'s launcher was lost: not heard from for " +
           grpc_detail::seconds_str(o.lost_after_s) + " s";
  }

  // Node 0: every member's outcome of `attempt`. A member that never reports (its machine
  // died, or its launcher was lost: silent for lost_after_s) failed there.
  std::vector<NodeOutcome> collect_outcomes(Store& s, int attempt, Clock::time_point deadline) {
    std::vector<NodeOutcome> all;
    for (int n : members) {
      readmit(s, n);
      const std::string k = key(attempt, "outcome/" + std::to_string(n));
      std::optional<std::string> v;
      while (!v) {
        // In slices, watching the launcher: one that died (SIGKILL, its machine) is lost after
        // lost_after_s instead of holding everyone to the deadline.
        const auto until = std::min(deadline, Clock::now() + std::chrono::milliseconds(200));
        try {
          v = s.get(k, until);
        } catch (const CommError&) {
          if (n != 0 && (lost.count(n) || silent(s, n))) {
            lost.insert(n);
            break;
          }
          if (Clock::now() >= deadline) break;
        }
      }
      if (v) {
        all.push_back(decode_outcome(*v, n));
        continue;
      }
      NodeOutcome gone;
      gone.reported = false;
      gone.kind = NodeOutcome::kFailed;
      gone.rc = 1;
      gone.when_ms = INT64_MAX;
      gone.cause = "node " + std::to_string(n) + "'s launcher did not report within " +
                   grpc_detail::seconds_str(o.report_timeout_s) + " s";
      const bool was_lost = lost.count(n) > 0;
      if (elastic()) lost.insert(n);  // no report in time: not a member any more either
      if (was_lost) {
        gone.killed = true;  // the likeliest cause: the rest failed for want of its ranks
        gone.when_ms = 0;
        gone.cause = lost_text(n);
      }
      all.push_back(gone);
    }
    return all;
  }

  // Node 0, elastic: the members left after `d` (outcomes by member): not the lost ones, nor
  // another node whose own rank was killed by a signal from outside (as a cluster loses a
  // node); no restart below min_nodes. Publishes the dropped ones before the decision.
  void settle_survivors(Store& s, int attempt, const std::vector<NodeOutcome>& all,
                        JobDecision& d) {
    survivors.clear();
    std::string dropped;
    for (size_t i = 0; i < members.size(); ++i) {
      const int n = members[i];
      const bool killed_here = n != 0 && all[i].kind == NodeOutcome::kFailed && all[i].killed;
      if (lost.count(n) || killed_here)
        dropped += std::to_string(n) + " ";
      else
        survivors.push_back(n);
    }
    s.set(key(attempt, "dropped"), dropped);
    if (d.restart && static_cast<int>(survivors.size()) < o.min_nodes) {
      d.restart = false;
      d.rc = 1;
      d.reason += "; " + std::to_string(survivors.size()) + " node(s) left, below the minimum " +
                  std::to_string(o.min_nodes);
    }
  }

  // Node 0, a job of fixed size: a restart needs every node's launcher, and one that never
  // reported (dead, its machine gone) will not start its ranks again: the restarted ranks would
  // only wait out their rendezvous timeout for them. No restart then; the job ends with a way on.
  void no_restart_without(const std::vector<NodeOutcome>& all, JobDecision& d) const {
    if (!d.restart) return;
    std::string missing;
    for (size_t i = 0; i < members.size(); ++i)
      if (!all[i].reported) missing += (missing.empty() ? "" : ", ") + std::to_string(members[i]);
    if (missing.empty()) return;
    d.restart = false;
    d.rc = 1;
    d.reason += "; not restarting: a job of fixed size (--nnodes " + std::to_string(o.nnodes) +
                ") needs every node, and node(s) " + missing +
                " did not report: start their launchers and the others again with --resume "
                "auto, or allow fewer nodes with --nnodes MIN:MAX";
  }

  // Node 0, a job of fixed size: member n, found lost in an earlier attempt (stopped, say), is
  // heard from again: a member like the others (its outcome and its reading of the decision are
  // waited for), no longer given up at once. (An elastic job drops lost members instead.)
  void readmit(Store& s, int n) {
    if (!elastic() && n != 0 && lost.count(n) && !silent(s, n)) lost.erase(n);
  }

  // Node 0: a member gone silent is lost; it is reported to the others as a failure. A member
  // that has reported its outcome of `attempt` is done, waiting for the decision (its poll, and
  // so its alive count, stopped with its ranks): not lost however long node 0's own ranks take
  // to end (a trace merged, a final evaluation) -- that ended finished jobs with exit 1.
  void watch_members(Store& s, int attempt, RemoteNews& news) {
    for (int n : members) {
      readmit(s, n);
      if (n == 0 || lost.count(n)) continue;
      if (key_set(s, key(attempt, "outcome/" + std::to_string(n))) || !silent(s, n)) continue;
      lost.insert(n);
      const std::string what = lost_text(n);
      const int64_t k = s.add(key(attempt, "failures"), 1);
      s.set(key(attempt, "failure/" + std::to_string(k)), "0 " + what);
      news.failures.push_back(what);
    }
  }

  // Node 0: whether member n's launcher has been silent for lost_after_s (reads alive/<n>).
  bool silent(Store& s, int n) {
    Beat& b = beats[n];
    const int64_t c = s.add(std::string(kPrefix) + "alive/" + std::to_string(n), 0);
    if (c != b.count) {
      b.count = c;
      b.changed = Clock::now();
    }
    return Clock::now() - b.changed > secs_dur(o.lost_after_s);
  }

  std::string where() const { return host_port(o.master_addr, o.port); }

  // Runs f on the store; calls that do not wait for keys give up after op_s seconds.
  template <typename F>
  auto with_store(double op_s, F f) {
    if (mem) return f(static_cast<Store&>(*mem));
    GrpcStore s(
        channel, o.token, Clock::now() + secs_dur(op_s), [this, op_s](const grpc::Status& st) {
          if (st.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
            token_refused = true;
            return CommError("node 0's launcher at " + where() + " refused this node's job token");
          }
          // (a raw "DEADLINE_EXCEEDED: Deadline Exceeded" after the whole wait said nothing)
          if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
              st.error_code() == grpc::StatusCode::UNAVAILABLE)
            return CommError("node 0's launcher at " + where() + " did not answer within " +
                             grpc_detail::seconds_str(op_s) +
                             (checked_in
                                  ? " s: has it, its machine or the network between gone down? ("
                                  : " s: is it running there, with this --master-addr and "
                                    "--master-port? It stops at once on bad input (an --out that "
                                    "holds a run, a config error): its own output says why (") +
                             status_str(st) + ")");
          return CommError("node 0's launcher at " + where() + ": " + status_str(st));
        });
    return f(static_cast<Store&>(s));
  }

  // Appends "<this node> <text>" to the attempt's list (entries <entry>/1, 2, ...), which the
  // others' polls read; a store that does not answer in 2 s is warned about.
  void append(int attempt, const char* list, const char* entry, const std::string& text) {
    try {
      with_store(2, [&](Store& s) {
        const int64_t n = s.add(key(attempt, list), 1);
        s.set(key(attempt, std::string(entry) + "/" + std::to_string(n)),
              std::to_string(o.node_rank) + " " + text);
        return 0;
      });
    } catch (const CommError& e) {
      spdlog::warn("could not tell the other nodes: {}", e.what());
    }
  }

  // The other nodes, checking in: node 0's store instance as the check-in finds it ("" for node
  // 0 itself, and from a node 0 of an older dtrain, which sets none: not watched then).
  std::string node0_instance(Store& s) const {
    if (o.node_rank == 0) return "";
    try {
      return s.get(kInstanceKey, Clock::now() + std::chrono::seconds(2));
    } catch (const CommError&) {
      return "";
    }
  }

  // Key `k` of node 0's store by `deadline`: watched (get_watching_node0) where `instance` is
  // known, else a plain wait.
  std::string get_from_node0(Store& s, const std::string& k, Clock::time_point deadline,
                             const std::string& instance, bool* restarted) {
    return instance.empty() ? s.get(k, deadline)
                            : get_watching_node0(s, k, deadline, instance, restarted);
  }

  // Whether node 0 started again since `instance` was read: what the check-in read may come from
  // the new store, which does not hold this node's check-in (node 0 and the rest would wait for
  // it to time out). Never for an unknown instance.
  bool node0_changed(Store& s, const std::string& instance, Clock::time_point deadline) {
    return !instance.empty() && s.get(kInstanceKey, deadline) != instance;
  }

  // The other nodes, checking in: key `k` of node 0's store by `deadline`, node 0 watched while
  // it waits -- gone (signalled, its machine down) after lost_after_s without an answer, instead
  // of the whole join timeout; started again since `instance` was read (*restarted, "": the
  // caller checks in again).
  std::string get_watching_node0(Store& s, const std::string& k, Clock::time_point deadline,
                                 const std::string& instance, bool* restarted) {
    auto answered = Clock::now();  // (node 0 answered the caller's last call)
    for (;;) {
      const auto slice = std::min(deadline, Clock::now() + secs_dur(o.lost_after_s));
      try {
        return s.get(k, slice);
      } catch (const CommError&) {
        if (Clock::now() >= deadline) throw;
      }
      // (a node 0 exiting answers "exited" at once, one started again may not listen yet:
      // retried until lost_after_s has passed without an answer)
      std::string now;
      for (;;) {
        try {
          now = with_store(o.lost_after_s, [&](Store& t) {
            return t.get(kInstanceKey, Clock::now() + secs_dur(o.lost_after_s));
          });
          answered = Clock::now();
          break;
        } catch (const CommError& e) {
          if (Clock::now() - answered >= secs_dur(o.lost_after_s))
            throw std::runtime_error("node 0's launcher at " + where() +
                                     " was lost during the check-in: no answer for " +
                                     grpc_detail::seconds_str(o.lost_after_s) + " s (" + e.what() +
                                     ")");
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
      }
      if (now != instance) {
        *restarted = true;
        return "";
      }
    }
  }

  // A node that read node 0's refuse_job: sets `read_key` so node 0 may exit, best effort and
  // within 2 s (the refusal is this node's error whether node 0 hears of it or not).
  void ack_refusal(const std::string& read_key) {
    try {
      with_store(2, [&](Store& s) {
        s.set(read_key, "1");
        return 0;
      });
    } catch (const CommError&) {
    }
  }

  // Node 0: collects every member's outcome (up to report_timeout_s), decides and publishes the
  // decision, then serves until the others have read it.
  JobDecision decide(int attempt, const NodeOutcome& mine, int max_restarts) {
    const auto deadline = Clock::now() + secs_dur(o.report_timeout_s);
    return with_store(o.report_timeout_s, [&](Store& s) {
      s.set(key(attempt, "outcome/0"), encode_outcome(mine));
      const std::vector<NodeOutcome> all = collect_outcomes(s, attempt, deadline);
      JobDecision d = decide_attempt(all, attempt, max_restarts);
      if (elastic())
        settle_survivors(s, attempt, all, d);
      else
        no_restart_without(all, d);
      s.set(key(attempt, "decision"),
            std::string(d.restart ? "1 " : "0 ") + std::to_string(d.rc) + " " + d.reason);
      // Keep serving until every node has the decision (or a short while passed): a node
      // that exits next must not leave the others unable to read it.
      std::vector<std::string> acks;
      for (int n : members)
        if (n != 0 && !lost.count(n)) acks.push_back(key(attempt, "ack/" + std::to_string(n)));
      if (!d.restart && !acks.empty()) {
        try {
          s.wait(acks, Clock::now() + std::chrono::seconds(10));
        } catch (const CommError&) {
        }
      }
      return d;
    });
  }

  // The other nodes: report this node's outcome and wait for node 0's decision. Node 0 may take
  // up to report_timeout_s (it waits for every node's outcome), but a node 0 that is gone (its
  // machine or launcher died with its ranks) is given up once it leaves a store call unanswered
  // for lost_after_s, as the liveness poll would, not after the whole report timeout: the wait
  // runs in slices of lost_after_s, and after each an idempotent read (retried while the
  // connection is down, answered at once by a live node 0) tells whether node 0 is still there.
  JobDecision await_decision(int attempt, const NodeOutcome& mine) {
    const auto deadline = Clock::now() + secs_dur(o.report_timeout_s) + std::chrono::seconds(10);
    const std::string my_outcome = key(attempt, "outcome/" + std::to_string(o.node_rank));
    // A store call that node 0 does not answer within lost_after_s: node 0 is gone.
    auto reach = [&](const std::function<void(Store&)>& f) {
      try {
        with_store(o.lost_after_s, [&](Store& s) {
          f(s);
          return 0;
        });
      } catch (const CommError& e) {
        throw CommError("node 0's launcher was lost: no answer for " +
                        grpc_detail::seconds_str(o.lost_after_s) + " s (" + e.what() + ")");
      }
    };
    reach([&](Store& s) { s.set(my_outcome, encode_outcome(mine)); });
    std::string v;
    for (;;) {
      const auto slice = std::min(deadline, Clock::now() + secs_dur(o.lost_after_s));
      try {
        v = with_store(o.lost_after_s,
                       [&](Store& s) { return s.get(key(attempt, "decision"), slice); });
        break;
      } catch (const CommError&) {
        if (Clock::now() >= deadline) throw;
      }
      reach([&](Store& s) { s.get(my_outcome, Clock::now() + secs_dur(o.lost_after_s)); });
    }
    JobDecision d;
    with_store(o.lost_after_s, [&](Store& s) {
      s.set(key(attempt, "ack/" + std::to_string(o.node_rank)), "1");
      return 0;
    });
    std::istringstream in(v);
    int restart = 0;
    in >> restart >> d.rc >> std::ws;
    std::getline(in, d.reason);
    d.restart = restart != 0;
    if (elastic() && d.restart) {
      const std::string dropped_v = with_store(o.lost_after_s, [&](Store& s) {
        return s.get(key(attempt, "dropped"), Clock::now() + secs_dur(o.lost_after_s));
      });
      std::istringstream dropped(dropped_v);
      int n = -1;
      while (dropped >> n)
        if (n == o.node_rank) {
          d.restart = false;
          d.rc = 1;
          d.reason =
              "node 0 dropped this node from the job, which goes on without it (" + d.reason + ")";
        }
    }
    return d;
  }
};

JobAgent::JobAgent(const AgentOptions& o) : impl_(std::make_unique<Impl>()), host_(this_host()) {
  DT_CHECK(o.nnodes >= 1 && o.node_rank >= 0 && o.node_rank < o.nnodes);
  DT_CHECK(o.min_nodes >= 0 && o.min_nodes <= o.nnodes);
  if (o.token.empty()) throw UserError("a multi-node launch needs the job token");
  impl_->o = o;
  for (int n = 0; n < o.nnodes; ++n) impl_->members.push_back(n);
  if (o.node_rank == 0) {
    impl_->mem = std::make_unique<MemoryStore>();
    impl_->mem->set(kInstanceKey, random_token());
    impl_->service =
        std::make_unique<grpc_detail::StoreService>(impl_->mem.get(), o.token, "node 0's launcher");
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
  // (attempt 0's check-in keys, as an elastic launcher's: a fixed and an elastic launcher of one
  // job read each other's shape and refuse, rather than wait for keys the other never writes)
  std::vector<std::string> keys;
  for (int n = 0; n < m.o.nnodes; ++n) keys.push_back(key(0, "join/" + std::to_string(n)));
  const std::string shape = job_shape(m.o);
  std::vector<std::string> hosts(static_cast<size_t>(m.o.nnodes));
  const bool node0 = m.o.node_rank == 0;
  for (bool restarted = true; restarted;) {
    restarted = false;
    try {
      m.with_store(m.o.join_timeout_s, [&](Store& s) {
        // (attempt 0's claim key, as an elastic launcher's: a duplicate --node-rank of either
        // kind is refused as such)
        claim_node_rank(s, key(0, "claim/" + std::to_string(m.o.node_rank)), m.o.node_rank,
                        m.o.lost_after_s);
        const std::string instance = m.node0_instance(s);
        s.set(keys[static_cast<size_t>(m.o.node_rank)],
              std::to_string(nproc_per_node) + " " + shape + " " + host_);
        for (int n = 0; n < m.o.nnodes; ++n) {
          std::string v;
          try {
            const std::string& k = keys[static_cast<size_t>(n)];
            v = m.get_from_node0(s, k, deadline, instance, &restarted);
            if (restarted) return 0;
          } catch (const CommError& e) {
            std::string missing;
            for (int k = n; k < m.o.nnodes; ++k) try {
                s.get(keys[static_cast<size_t>(k)], Clock::now() + std::chrono::milliseconds(100));
              } catch (const CommError&) {
                missing += (missing.empty() ? "" : ", ") + std::to_string(k);
              }
            throw std::runtime_error("node(s) " + missing + " did not check in within " +
                                     grpc_detail::seconds_str(m.o.join_timeout_s) + " s (" +
                                     e.what() + ")" + m.refused_hint());
          }
          if (n == 0 && v.starts_with(kRefused)) {
            m.ack_refusal(fixed_read_key(m.o.node_rank));
            throw_node0_refusal(v);
          }
          // Node 0's entry read: node 0 may exit now (refuse_after_read).
          if (n == 0 && !node0) s.set(fixed_read_key(m.o.node_rank), "1");
          const CheckIn c = parse_check_in(v);
          hosts[static_cast<size_t>(n)] = c.host;
          const char* self = node0 ? "node 0" : "this node";
          if (const std::string p = check_in_problem(n, c, nproc_per_node, shape, self);
              !p.empty()) {
            const UserError e(p);
            if (node0) refuse_node(s, 0, n, e);
            throw e;
          }
        }
        restarted = m.node0_changed(s, instance, deadline);
        return 0;
      });
    } catch (const CommError& e) {
      m.throw_check_in_error("joining the job: ", e);
    }
    if (restarted)
      spdlog::warn("node 0's launcher started again during the check-in: checking in again");
  }
  m.checked_in = true;
  return hosts;
}

Membership JobAgent::rendezvous(int attempt, int nproc_per_node) {
  Impl& m = *impl_;
  DT_CHECK(m.elastic());
  const auto deadline = Clock::now() + secs_dur(m.o.join_timeout_s);
  // (node 0 may come late, and closes the check-in after its last call)
  const auto node0_deadline = deadline + secs_dur(m.o.last_call_s + m.o.lost_after_s + 5);
  const std::string shape = job_shape(m.o);
  const std::string mine = std::to_string(nproc_per_node) + " " + shape + " " + host_;
  const bool node0 = m.o.node_rank == 0;
  std::string members;
  for (bool restarted = true; restarted;) {
    restarted = false;
    try {
      members = m.with_store(m.o.join_timeout_s + m.o.last_call_s + 10, [&](Store& s) {
        claim_node_rank(s, key(attempt, "claim/" + std::to_string(m.o.node_rank)), m.o.node_rank,
                        m.o.lost_after_s);
        // Node 0 is watched while this node waits for it, as in the fixed join: gone after
        // lost_after_s without an answer, or started again (a new instance: check in anew).
        const std::string instance = m.node0_instance(s);
        const auto get0 = [&](const std::string& k) {
          return m.get_from_node0(s, k, node0_deadline, instance, &restarted);
        };
        s.set(key(attempt, "join/" + std::to_string(m.o.node_rank)), mine);
        if (!node0) {
          // Node 0's own check-in, against this node's options: node 0 only reads the ids below
          // its --nnodes, so a node given a larger count would never be refused as such.
          const std::string v0 = get0(key(attempt, "join/0"));
          if (restarted) return std::string();
          if (v0.starts_with(kRefused)) {
            m.ack_refusal(key(attempt, "members-read/" + std::to_string(m.o.node_rank)));
            throw_node0_refusal(v0);
          }
          const CheckIn c0 = parse_check_in(v0);
          if (const std::string p = check_in_problem(0, c0, nproc_per_node, shape, "this node");
              !p.empty())
            throw UserError(p);
        } else {
          const std::vector<int> expected = attempt == 0 ? std::vector<int>{} : m.survivors;
          std::string list;
          const auto join_key = [attempt](int n) {
            return key(attempt, "join/" + std::to_string(n));
          };
          for (const auto& [n, v] : gather_check_ins(s, m.o, attempt, expected, deadline, join_key,
                                                     [&m] { return m.refused_hint(); })) {
            const CheckIn c = parse_check_in(v);
            if (const std::string p = check_in_problem(n, c, nproc_per_node, shape, "node 0");
                !p.empty())
              refuse_node(s, attempt, n, UserError(p));
            list += std::to_string(n) + " " + c.host + "\n";
          }
          s.set(key(attempt, "members"), list);
        }
        std::string v = get0(key(attempt, "members"));
        if (restarted) return std::string();
        if ((restarted = m.node0_changed(s, instance, node0_deadline))) return std::string();
        if (!node0) s.set(key(attempt, "members-read/" + std::to_string(m.o.node_rank)), "1");
        return v;
      });
    } catch (const CommError& e) {
      m.throw_check_in_error("checking in for attempt " + std::to_string(attempt + 1) + ": ", e);
    }
    if (restarted && attempt > 0)
      throw std::runtime_error(
          "node 0's launcher started again during attempt " + std::to_string(attempt + 1) +
          "'s check-in: it runs a new job from its first attempt; start this node's launcher "
          "again to join it");
    if (restarted)
      spdlog::warn("node 0's launcher started again during the check-in: checking in again");
  }
  if (members.starts_with(kRefused)) throw_node0_refusal(members);
  Membership r;
  std::istringstream in(members);
  int id = 0;
  std::string host;
  while (in >> id >> host) {
    if (id == m.o.node_rank) r.node_rank = static_cast<int>(r.nodes.size());
    r.nodes.push_back(id);
    r.hosts.push_back(host);
  }
  DT_CHECK(!r.nodes.empty() && r.nodes[0] == 0);
  if (std::find(r.nodes.begin(), r.nodes.end(), m.o.node_rank) == r.nodes.end())
    throw std::runtime_error(
        "node " + std::to_string(m.o.node_rank) + " checked in after node 0 had closed attempt " +
        std::to_string(attempt + 1) + "'s check-in (nodes " + fmt_ids(r.nodes) + " run it)");
  m.members = r.nodes;
  m.lost.clear();
  m.beats.clear();
  m.checked_in = true;
  return r;
}

std::vector<int> JobAgent::refuse_job(const std::string& why) {
  Impl& m = *impl_;
  DT_CHECK_EQ(m.o.node_rank, 0);
  Store& s = *m.mem;
  // Node 0's check-in is what a fixed launcher's join and an elastic one's rendezvous read
  // first; the members list is what an elastic one waits for after it.
  s.set(key(0, "join/0"), kRefused + why);
  s.set(key(0, "members"), kRefused + why);
  std::vector<int> unread;
  for (int n = 1; n < m.o.nnodes; ++n) unread.push_back(n);
  const auto deadline = Clock::now() + secs_dur(m.o.join_timeout_s);
  // Elastic: nodes above the minimum may never come (that is no fault), so once the minimum has
  // read it node 0 waits last_call_s for the rest, as its check-in would.
  std::optional<Clock::time_point> min_read_at;
  while (!unread.empty() && Clock::now() < deadline) {
    std::erase_if(unread, [&](int n) {
      return key_set(s, fixed_read_key(n)) ||
             key_set(s, key(0, "members-read/" + std::to_string(n)));
    });
    const int read = m.o.nnodes - static_cast<int>(unread.size());  // (node 0 included)
    if (m.elastic() && !min_read_at && read >= m.o.min_nodes) min_read_at = Clock::now();
    if (min_read_at && Clock::now() >= *min_read_at + secs_dur(m.o.last_call_s)) break;
    if (!unread.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return unread;
}

void JobAgent::report_failure(int attempt, const std::string& what) {
  Impl& m = *impl_;
  if (m.reported_attempt != attempt) m.reported_failure = false;
  m.reported_attempt = attempt;
  if (m.reported_failure) return;
  m.reported_failure = true;
  m.append(attempt, "failures", "failure", what);
}

void JobAgent::report_stop(int attempt, int sig) {
  impl_->append(attempt, "stops", "stop", std::to_string(sig));
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
  if (m.heard_attempt != attempt) {
    m.heard_attempt = attempt;
    m.heard_node0 = Clock::now();
    m.beats.clear();  // (node 0: its members' silence counts from their first poll of it)
    m.lost.clear();
  }
  try {
    m.with_store(1, [&](Store& s) {
      read_new(s, "failures", "failure", m.seen_failures[attempt],
               [&](const std::string& t) { news.failures.push_back(t); });
      read_new(s, "stops", "stop", m.seen_stops[attempt], [&](const std::string& t) {
        if (news.stop_signal == 0) news.stop_signal = std::atoi(t.c_str());
      });
      if (m.o.node_rank != 0) s.add(kPrefix + ("alive/" + std::to_string(m.o.node_rank)), 1);
      if (m.o.node_rank == 0) m.watch_members(s, attempt, news);
      return 0;
    });
    m.heard_node0 = Clock::now();
  } catch (const CommError& e) {
    const double silent_s = std::chrono::duration<double>(Clock::now() - *m.heard_node0).count();
    if (silent_s >= m.o.lost_after_s)
      news.lost = "no answer for " + grpc_detail::seconds_str(silent_s) + " s (" + e.what() + ")";
  }
  return news;
}

JobDecision JobAgent::finish(int attempt, const NodeOutcome& mine, int max_restarts) {
  Impl& m = *impl_;
  try {
    return m.o.node_rank == 0 ? m.decide(attempt, mine, max_restarts)
                              : m.await_decision(attempt, mine);
  } catch (const CommError& e) {
    throw std::runtime_error(std::string("the job's launchers could not agree on how attempt ") +
                             std::to_string(attempt + 1) + " ended: " + e.what());
  }
}

}  // namespace dtrain
