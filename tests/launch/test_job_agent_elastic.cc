// The launchers' elastic membership (job_agent.h, --nnodes MIN:MAX): agents of one job on
// loopback as threads: who takes part in an attempt, node ranks given anew, a lost launcher
// noticed and left out of the restart, the minimum.
#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "launch/job_agent.h"
#include "launch/launcher.h"
#include "test_util.h"
#include "util/check.h"

using namespace dtrain;
using dtrain::testing::contains;

namespace {

AgentOptions elastic_options(int node, int port, int min_nodes, int max_nodes) {
  AgentOptions o;
  o.nnodes = max_nodes;
  o.min_nodes = min_nodes;
  o.node_rank = node;
  o.master_addr = "127.0.0.1";
  o.port = port;
  o.token = "elastic-agent-test";
  o.join_timeout_s = 10;
  o.report_timeout_s = 10;
  o.last_call_s = 0.5;
  o.lost_after_s = 1;
  return o;
}

NodeOutcome killed_outcome(const std::string& cause) {
  NodeOutcome o;
  o.kind = NodeOutcome::kFailed;
  o.rc = 1;
  o.killed = true;
  o.when_ms = 5;
  o.cause = cause;
  return o;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

TEST_CASE("close_check_in: the most nodes at once, else the minimum after the last call") {
  // All three of at most 3: close at once, last call or not.
  CHECK(close_check_in({0, 1, 2}, {}, 2, 3, 0, 30, 10));
  // Below the minimum: never, however long.
  CHECK_FALSE(close_check_in({0}, {}, 2, 3, 1e9, 30, 10));
  // The minimum: only once the last call is over.
  CHECK_FALSE(close_check_in({0, 2}, {}, 2, 3, 29.9, 30, 10));
  CHECK(close_check_in({0, 2}, {}, 2, 3, 30, 30, 10));
  // A survivor of the last attempt that has not rejoined yet is waited for past the last call,
  // but not longer than lost_after_s beyond it.
  CHECK_FALSE(close_check_in({0, 2}, {0, 1, 2}, 2, 3, 35, 30, 10));
  CHECK(close_check_in({0, 1, 2}, {0, 1, 2}, 2, 4, 30, 30, 10));
  CHECK(close_check_in({0, 2}, {0, 1, 2}, 2, 3, 40, 30, 10));
}

TEST_CASE("JobAgent elastic: two of at most three nodes run the attempt, numbered anew") {
  const int port = pick_free_port();
  JobAgent a0(elastic_options(0, port, 2, 3));
  // Node 2 (id 2) comes; node 1 never does: after the last call nodes 0 and 2 run attempt 0,
  // node 2 as node rank 1.
  auto f2 = std::async(std::launch::async, [&] {
    JobAgent a2(elastic_options(2, port, 2, 3));
    return a2.rendezvous(0, 2);
  });
  const auto t0 = std::chrono::steady_clock::now();
  const Membership m0 = a0.rendezvous(0, 2);
  CHECK(seconds_since(t0) >= 0.5);  // the last call was waited for
  CHECK(m0.nodes == std::vector<int>{0, 2});
  CHECK(m0.node_rank == 0);
  const Membership m2 = f2.get();
  CHECK(m2.nodes == std::vector<int>{0, 2});
  CHECK(m2.hosts.size() == 2);
  CHECK(m2.node_rank == 1);
}

TEST_CASE("JobAgent elastic: all of at most three close the check-in at once") {
  const int port = pick_free_port();
  AgentOptions o0 = elastic_options(0, port, 1, 3);
  o0.last_call_s = 30;  // would be noticed
  JobAgent a0(o0);
  auto f1 = std::async(std::launch::async, [&] {
    JobAgent a(elastic_options(1, port, 1, 3));
    return a.rendezvous(0, 1).node_rank;
  });
  auto f2 = std::async(std::launch::async, [&] {
    JobAgent a(elastic_options(2, port, 1, 3));
    return a.rendezvous(0, 1).node_rank;
  });
  const auto t0 = std::chrono::steady_clock::now();
  const Membership m = a0.rendezvous(0, 1);
  CHECK(seconds_since(t0) < 10);
  CHECK(m.nodes == std::vector<int>{0, 1, 2});
  CHECK(f1.get() == 1);
  CHECK(f2.get() == 2);
}

TEST_CASE("JobAgent elastic: node 0 gone or started again during the check-in: found at once") {
  // (the fixed join's watch, test_job_agent.cc: a node waited out the join timeout plus the last
  // call for a node 0 that was gone, and one started again left it out: "checked in after node 0
  // had closed")
  const auto three = [](int node, int port) {
    AgentOptions o = elastic_options(node, port, 3, 3);
    o.join_timeout_s = 60;
    return o;
  };
  SUBCASE("node 0's launcher stopped: node 1 fails within lost_after_s, not 60 s") {
    const int port = pick_free_port();
    auto a0 = std::make_unique<JobAgent>(three(0, port));
    auto f1 = std::async(std::launch::async, [&] {
      JobAgent a1(three(1, port));
      std::string e = "<no error>";
      const auto t0 = std::chrono::steady_clock::now();
      try {
        a1.rendezvous(0, 1);  // node 0 never checks in, node 2 never comes
      } catch (const std::runtime_error& x) {
        e = x.what();
      }
      return std::make_pair(e, seconds_since(t0));
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // node 1 checked in, waiting
    a0.reset();
    const auto [e, took] = f1.get();
    CHECK_MESSAGE(contains(e, "was lost during the check-in: no answer for 1 s"), e);
    CHECK(took < 15);
  }
  SUBCASE("node 0's launcher started again: node 1 checks in anew and all three run") {
    const int port = pick_free_port();
    auto a0 = std::make_unique<JobAgent>(three(0, port));
    auto f1 = std::async(std::launch::async, [&] {
      JobAgent a1(three(1, port));
      return a1.rendezvous(0, 1).nodes;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    a0.reset();
    a0 = std::make_unique<JobAgent>(three(0, port));
    auto f2 = std::async(std::launch::async, [&] {
      JobAgent a2(three(2, port));
      return a2.rendezvous(0, 1).nodes;
    });
    CHECK(a0->rendezvous(0, 1).nodes == std::vector<int>{0, 1, 2});
    CHECK(f1.get() == std::vector<int>{0, 1, 2});
    CHECK(f2.get() == std::vector<int>{0, 1, 2});
  }
}

TEST_CASE("JobAgent elastic: a lost launcher is noticed, dropped, and the rest restart smaller") {
  const int port = pick_free_port();
  JobAgent a0(elastic_options(0, port, 2, 3));
  // Node 1 runs both attempts; node 2's launcher disappears during attempt 0 (it polls a few
  // times, then its agent is gone without a report).
  auto f1 = std::async(std::launch::async, [&] {
    JobAgent a1(elastic_options(1, port, 2, 3));
    const Membership m = a1.rendezvous(0, 1);
    RemoteNews n;
    for (int i = 0; i < 200 && n.failures.empty(); ++i) {
      n = a1.poll(0);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    NodeOutcome remote;
    remote.kind = NodeOutcome::kFailed;
    remote.rc = 1;
    remote.when_ms = INT64_MAX - 1;
    remote.cause = n.failures.empty() ? "" : n.failures[0];
    const JobDecision d = a1.finish(0, remote, 0);
    const Membership again = d.restart ? a1.rendezvous(1, 1) : Membership{};
    return std::make_tuple(m, n, d, again);
  });
  auto f2 = std::async(std::launch::async, [&] {
    JobAgent a2(elastic_options(2, port, 2, 3));
    a2.rendezvous(0, 1);
    for (int i = 0; i < 3; ++i) a2.poll(0);
  });
  const Membership m = a0.rendezvous(0, 1);
  REQUIRE(m.nodes == std::vector<int>{0, 1, 2});
  f2.get();
  // Node 0 polls as its launcher does; node 2 is silent from now on.
  RemoteNews n;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 300 && n.failures.empty(); ++i) {
    n = a0.poll(0);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  REQUIRE(n.failures.size() == 1);
  CHECK(contains(n.failures[0], "node 2's launcher was lost"));
  CHECK(seconds_since(t0) < 5);
  NodeOutcome remote;
  remote.kind = NodeOutcome::kFailed;
  remote.rc = 1;
  remote.when_ms = INT64_MAX - 1;
  remote.cause = n.failures[0];
  const JobDecision d = a0.finish(0, remote, 1);
  CHECK(d.restart);
  CHECK(contains(d.reason, "node 2's launcher was lost"));
  // Attempt 1: nodes 0 and 1 only (node 2 is not waited for beyond the last call).
  const Membership again = a0.rendezvous(1, 1);
  CHECK(again.nodes == std::vector<int>{0, 1});
  const auto [m1, n1, d1, again1] = f1.get();
  CHECK(m1.node_rank == 1);
  REQUIRE(n1.failures.size() == 1);
  CHECK(contains(n1.failures[0], "node 2's launcher was lost"));  // node 0 told node 1
  CHECK(d1.restart);
  CHECK(again1.nodes == std::vector<int>{0, 1});
  CHECK(again1.node_rank == 1);
}

TEST_CASE("JobAgent elastic: a killed rank's node leaves, and no restart below the minimum") {
  {
    // Node 1's own rank was killed from outside: node 0 restarts without it, node 1 is told to go.
    const int port = pick_free_port();
    JobAgent a0(elastic_options(0, port, 1, 2));
    auto f1 = std::async(std::launch::async, [&] {
      JobAgent a1(elastic_options(1, port, 1, 2));
      a1.rendezvous(0, 1);
      return a1.finish(0, killed_outcome("rank 1 on node 1 (h) failed: killed by signal SIGKILL"),
                       0);
    });
    REQUIRE(a0.rendezvous(0, 1).nodes.size() == 2);
    const JobDecision d = a0.finish(0, NodeOutcome{}, 2);
    CHECK(d.restart);
    const JobDecision d1 = f1.get();
    CHECK_FALSE(d1.restart);
    CHECK(d1.rc == 1);
    CHECK(contains(d1.reason, "node 0 dropped this node from the job"));
    CHECK(a0.rendezvous(1, 1).nodes == std::vector<int>{0});
  }
  {
    // With a minimum of 2 the same loss ends the job, saying why.
    const int port = pick_free_port();
    JobAgent a0(elastic_options(0, port, 2, 2));
    auto f1 = std::async(std::launch::async, [&] {
      JobAgent a1(elastic_options(1, port, 2, 2));
      a1.rendezvous(0, 1);
      return a1.finish(0, killed_outcome("rank 1 on node 1 (h) failed: killed by signal SIGKILL"),
                       0);
    });
    a0.rendezvous(0, 1);
    const JobDecision d = a0.finish(0, NodeOutcome{}, 2);
    CHECK_FALSE(d.restart);
    CHECK(d.rc == 1);
    CHECK(contains(d.reason, "1 node(s) left, below the minimum 2"));
    CHECK_FALSE(f1.get().restart);
  }
}

TEST_CASE("JobAgent elastic: too few nodes by the join timeout, and a node too late") {
  std::string e = "<no error>";
  {
    AgentOptions o = elastic_options(0, pick_free_port(), 2, 3);
    o.join_timeout_s = 1;
    JobAgent alone(o);
    try {
      alone.rendezvous(0, 1);
    } catch (const std::runtime_error& x) {
      e = x.what();
    }
    CHECK(contains(e, "only 1 node(s) (0) checked in for attempt 1 within 1 s, at least 2 needed"));
  }
  // Attempt 1 closes with nodes 0 and 1; node 2 checks in after that and is told so. (A host
  // with the default join timeout: node 1 may take its time to check in.)
  const int port = pick_free_port();
  JobAgent a0(elastic_options(0, port, 2, 3));
  auto f1 = std::async(std::launch::async, [&] {
    JobAgent a1(elastic_options(1, port, 2, 3));
    return a1.rendezvous(1, 1).nodes;
  });
  CHECK(a0.rendezvous(1, 1).nodes == std::vector<int>{0, 1});
  CHECK(f1.get() == std::vector<int>{0, 1});
  JobAgent late(elastic_options(2, port, 2, 3));
  e = "<no error>";
  try {
    late.rendezvous(1, 1);
  } catch (const std::runtime_error& x) {
    e = x.what();
  }
  CHECK(contains(e, "node 2 checked in after node 0 had closed attempt 2's check-in"));
}

TEST_CASE("JobAgent elastic: a node refused by node 0, which then exits, learns why at once") {
  const int port = pick_free_port();
  AgentOptions o1 = elastic_options(1, port, 1, 2);
  o1.join_timeout_s = 60;
  auto f1 = std::async(std::launch::async, [&] {
    JobAgent a1(o1);
    try {
      a1.rendezvous(0, 3);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  AgentOptions o0 = elastic_options(0, port, 1, 2);
  o0.last_call_s = 5;  // node 1 is there before the last call: the check-in closes at once
  std::string e0 = "<no error>";
  try {
    JobAgent a0(o0);
    a0.rendezvous(0, 2);
  } catch (const UserError& e) {
    e0 = e.what();
  }
  CHECK(contains(e0, "runs 3 rank(s) per node, node 0 2"));
  REQUIRE(f1.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  const std::string e1 = f1.get();
  // Node 1 reads node 0's check-in itself (or node 0's refusal, whichever comes first).
  CHECK_MESSAGE(
      (contains(e1, "node 0 refused this job: node 1") ||
       (contains(e1, "node 0 (") && contains(e1, "runs 2 rank(s) per node, this node 3"))),
      e1);
  CHECK(contains(e1, "give every node the same --nproc-per-node"));
}

TEST_CASE("JobAgent: node 0's refusal of the whole job reaches an elastic node at its check-in") {
  const int port = pick_free_port();
  AgentOptions o0 = elastic_options(0, port, 1, 2);
  o0.join_timeout_s = 60;
  const auto t0 = std::chrono::steady_clock::now();
  auto a0 = std::make_unique<JobAgent>(o0);
  auto refused =
      std::async(std::launch::async, [&] { return a0->refuse_job("--out holds a run"); });
  std::string e1 = "<no error>";
  {
    AgentOptions o1 = elastic_options(1, port, 1, 2);
    o1.join_timeout_s = 60;
    JobAgent a1(o1);
    try {
      a1.rendezvous(0, 2);
    } catch (const UserError& e) {
      e1 = e.what();
    }
  }
  REQUIRE(refused.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
  CHECK(refused.get().empty());
  CHECK(e1 == "node 0 refused this job: --out holds a run");
  CHECK(seconds_since(t0) < 20);
}

TEST_CASE("JobAgent: an elastic node 0's refusal waits the last call past the minimum, not more") {
  // Nodes above --nnodes' minimum may never come: node 0 waited its whole join timeout for them.
  const int port = pick_free_port();
  AgentOptions o0 = elastic_options(0, port, 1, 3);
  o0.join_timeout_s = 60;
  const auto t0 = std::chrono::steady_clock::now();
  JobAgent a0(o0);
  CHECK(a0.refuse_job("--out holds a run") == std::vector<int>{1, 2});
  CHECK(seconds_since(t0) < 10);
}

TEST_CASE(
    "JobAgent: launchers given another --nnodes or --max-restarts refuse each other at once") {
  // Each waited out its whole check-in for nodes that were not coming, then blamed a live
  // launcher ("node 1's launcher was lost"); a fixed and an elastic launcher never met at all.
  struct Case {
    const char* what;
    AgentOptions o0, o1;
    std::string want;
  };
  std::vector<Case> cases;
  {
    const int port = pick_free_port();
    AgentOptions a = elastic_options(0, port, 0, 2), b = elastic_options(1, port, 0, 3);
    cases.push_back({"fixed 2 against fixed 3", a, b,
                     "was started with --nnodes 3 --max-restarts 0, node 0 with --nnodes 2 "
                     "--max-restarts 0"});
  }
  {
    const int port = pick_free_port();
    AgentOptions a = elastic_options(0, port, 0, 2), b = elastic_options(1, port, 0, 2);
    b.max_restarts = 2;
    cases.push_back({"another --max-restarts", a, b, "--max-restarts 2"});
  }
  {
    const int port = pick_free_port();
    cases.push_back({"fixed node 0, elastic node 1", elastic_options(0, port, 0, 2),
                     elastic_options(1, port, 1, 2), "--nnodes 1:2"});
  }
  {
    const int port = pick_free_port();
    cases.push_back({"elastic node 0, fixed node 1", elastic_options(0, port, 1, 2),
                     elastic_options(1, port, 0, 2), "--nnodes 1:2"});
  }
  for (Case& c : cases) {
    CAPTURE(c.what);
    c.o0.join_timeout_s = c.o1.join_timeout_s = 60;
    const auto start = std::chrono::steady_clock::now();
    const auto check_in = [](const AgentOptions& o) {
      try {
        JobAgent a(o);
        if (o.min_nodes > 0)
          a.rendezvous(0, 2);
        else
          a.join(2);
      } catch (const UserError& e) {
        return std::string(e.what());
      } catch (const std::exception& e) {
        return std::string("not a user error: ") + e.what();
      }
      return std::string("<no error>");
    };
    auto f1 = std::async(std::launch::async, [&] { return check_in(c.o1); });
    const std::string e0 = check_in(c.o0);
    REQUIRE(f1.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
    const std::string e1 = f1.get();
    CHECK_MESSAGE(contains(e0, c.want), e0);
    CHECK_MESSAGE(contains(e1, "give every node's launcher the same --nnodes and --max-restarts"),
                  e1);
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(15));
  }
}

TEST_CASE("JobAgent elastic: a last call longer than the check-in starts with the nodes there") {
  // --nnodes 1:2 with --last-call 600 against the 300 s check-in ended in "only 1 node(s) (0)
  // checked in ..., at least 1 needed": the minimum was met, so the attempt starts.
  const int port = pick_free_port();
  AgentOptions o = elastic_options(0, port, 1, 2);
  o.join_timeout_s = 1;
  o.last_call_s = 5;
  JobAgent a(o);
  const auto start = std::chrono::steady_clock::now();
  const Membership m = a.rendezvous(0, 2);
  CHECK(m.nodes == std::vector<int>{0});
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(4));
}

TEST_CASE("JobAgent elastic: a node whose id is past node 0's MAX is refused on its own side") {
  // Node 0 (1:2) reads ids below 2 only; node 2 (1:3) reads node 0's check-in and refuses. It
  // ended with "checked in after node 0 had closed attempt 1's check-in", the wrong reason.
  const int port = pick_free_port();
  AgentOptions o0 = elastic_options(0, port, 1, 2), o2 = elastic_options(2, port, 1, 3);
  o0.last_call_s = 1;
  o2.join_timeout_s = 20;
  JobAgent a0(o0);
  auto f2 = std::async(std::launch::async, [&] {
    try {
      JobAgent a2(o2);
      a2.rendezvous(0, 2);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  });
  const Membership m = a0.rendezvous(0, 2);
  CHECK(m.nodes == std::vector<int>{0});
  REQUIRE(f2.wait_for(std::chrono::seconds(15)) == std::future_status::ready);
  const std::string e2 = f2.get();
  CHECK_MESSAGE(contains(e2, "node 0 ("), e2);
  CHECK_MESSAGE(contains(e2,
                         "was started with --nnodes 1:2 --max-restarts 0, this node with "
                         "--nnodes 1:3 --max-restarts 0"),
                e2);
}
