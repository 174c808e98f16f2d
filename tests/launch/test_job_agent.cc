// The launchers' agreement (job_agent.h): two agents of one job on loopback, as threads.
#include <doctest/doctest.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <future>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "launch/check_in.h"
#include "launch/job_agent.h"
#include "launch/launcher.h"
#include "log_capture.h"
#include "test_util.h"
#include "util/check.h"

using namespace dtrain;
using dtrain::testing::contains;
using dtrain::testing::LogCapture;

namespace {

AgentOptions agent_options(int node, int port, const std::string& token = "agent-test") {
  AgentOptions o;
  o.nnodes = 2;
  o.node_rank = node;
  o.master_addr = "127.0.0.1";
  o.port = port;
  o.token = token;
  o.join_timeout_s = 10;
  o.report_timeout_s = 10;
  return o;
}

// Launchers lost after 1 s of silence, against a report timeout of 60 s.
AgentOptions quick_loss(int node, int port) {
  AgentOptions o = agent_options(node, port);
  o.lost_after_s = 1;
  o.report_timeout_s = 60;
  return o;
}

NodeOutcome failed(const std::string& cause, bool killed, int64_t when) {
  NodeOutcome o;
  o.kind = NodeOutcome::kFailed;
  o.rc = 1;
  o.killed = killed;
  o.when_ms = when;
  o.cause = cause;
  return o;
}

// Nodes 0 and 1 of a 2-node job join (each join waits for the other).
void join_both(JobAgent& a0, JobAgent& a1) {
  auto f0 = std::async(std::launch::async, [&] { a0.join(2); });
  a1.join(2);
  f0.get();
}

}  // namespace

TEST_CASE("decide_attempt: one decision for the whole job from every node's outcome") {
  const NodeOutcome ok;
  CHECK(decide_attempt({ok, ok}, 0, 3).rc == 0);
  CHECK_FALSE(decide_attempt({ok, ok}, 0, 3).restart);

  // The rank killed by a signal is named as the cause, even if a peer's failure came first.
  const NodeOutcome peer = failed("rank 0 on node 0 failed: exit status 1", false, 100);
  const NodeOutcome killed = failed("rank 3 on node 1 failed: killed by signal SIGKILL", true, 200);
  JobDecision d = decide_attempt({peer, killed}, 0, 1);
  CHECK(d.restart);
  CHECK(d.reason == killed.cause);
  // Restarts run out: exit 1 with the cause.
  d = decide_attempt({peer, killed}, 1, 1);
  CHECK_FALSE(d.restart);
  CHECK(d.rc == 1);
  CHECK(d.reason == killed.cause);
  // Otherwise the earliest failure.
  d = decide_attempt({failed("late", false, 300), failed("early", false, 50)}, 0, 0);
  CHECK(d.reason == "early");
  CHECK(d.rc == 1);

  // A user error anywhere: no restart, exit 2.
  NodeOutcome user = failed("rank 2 on node 1 failed: exit status 2", false, 10);
  user.kind = NodeOutcome::kUserError;
  user.rc = 2;
  d = decide_attempt({ok, user}, 0, 5);
  CHECK_FALSE(d.restart);
  CHECK(d.rc == 2);

  // A signal: no restart, the stopped node's code (the ranks' code) passes through.
  NodeOutcome stopped;
  stopped.kind = NodeOutcome::kStopped;
  stopped.rc = 143;
  stopped.cause = "stopped by SIGTERM";
  d = decide_attempt({ok, stopped, killed}, 0, 5);
  CHECK_FALSE(d.restart);
  CHECK(d.rc == 143);
  // A node that failed and then got a signal reports a stop with the failure's code: no
  // restart; bad input on another node still makes it 2.
  NodeOutcome failed_then_signal = failed("rank 1 failed; then SIGINT on node 0", false, 5);
  failed_then_signal.kind = NodeOutcome::kStopped;
  d = decide_attempt({failed_then_signal, killed}, 0, 5);
  CHECK_FALSE(d.restart);
  CHECK(d.rc == 1);
  CHECK(decide_attempt({failed_then_signal, user}, 0, 5).rc == 2);
}

TEST_CASE("JobAgent: two nodes check in, hear each other's failures and agree on restarts") {
  const int port = pick_free_port();
  JobAgent a0(agent_options(0, port));
  // Node 1 starts after node 0 in real life or before; here it joins from another thread.
  auto f1 = std::async(std::launch::async, [&] {
    JobAgent a1(agent_options(1, port));
    const auto hosts = a1.join(2);
    REQUIRE(hosts.size() == 2);
    // Attempt 0: node 1 reports its rank's failure; node 0 hears it (node 1 does not hear its
    // own).
    a1.report_failure(0, "rank 3 on node 1 (h1) failed: killed by signal SIGKILL");
    a1.report_failure(0, "rank 2 on node 1 (h1) failed: exit status 1");  // not the first
    CHECK(a1.poll(0).failures.empty());
    const JobDecision d0 =
        a1.finish(0, failed("rank 3 on node 1 (h1) failed: killed by signal SIGKILL", true, 1), 0);
    // Attempt 1: node 0 received a signal.
    RemoteNews n;
    for (int i = 0; i < 100 && n.stop_signal == 0; ++i) {
      n = a1.poll(1);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    CHECK(n.stop_signal == 15);
    NodeOutcome stopped;
    stopped.kind = NodeOutcome::kStopped;
    stopped.rc = 75;
    const JobDecision d1 = a1.finish(1, stopped, 0);
    return std::make_pair(d0, d1);
  });
  const auto hosts = a0.join(2);
  CHECK(hosts.size() == 2);
  RemoteNews n;
  for (int i = 0; i < 100 && n.failures.empty(); ++i) {
    n = a0.poll(0);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  REQUIRE(n.failures.size() == 1);
  CHECK(n.failures[0] == "rank 3 on node 1 (h1) failed: killed by signal SIGKILL");
  CHECK(n.lost.empty());
  CHECK(a0.poll(0).failures.empty());  // each news once
  // Node 0's budget (1 restart) decides, not node 1's (0).
  const JobDecision d0 =
      a0.finish(0, failed("rank 0 on node 0 (h0) failed: exit status 1", false, 2), 1);
  CHECK(d0.restart);
  CHECK(d0.reason == "rank 3 on node 1 (h1) failed: killed by signal SIGKILL");
  a0.report_stop(1, 15);
  NodeOutcome stopped;
  stopped.kind = NodeOutcome::kStopped;
  stopped.rc = 75;
  const JobDecision d1 = a0.finish(1, stopped, 1);
  CHECK_FALSE(d1.restart);
  CHECK(d1.rc == 75);
  const auto [r0, r1] = f1.get();
  CHECK(r0.restart);
  CHECK(r0.reason == d0.reason);
  CHECK_FALSE(r1.restart);
  CHECK(r1.rc == 75);
}

TEST_CASE("JobAgent: a disagreeing node, a wrong token and a missing node are refused in time") {
  const int port = pick_free_port();
  {
    JobAgent a0(agent_options(0, port));
    auto f1 = std::async(std::launch::async, [&] {
      JobAgent a1(agent_options(1, port));
      try {
        a1.join(3);
      } catch (const UserError& e) {
        return std::string(e.what());
      }
      return std::string("<no error>");
    });
    std::string e0 = "<no error>";
    try {
      a0.join(2);
    } catch (const UserError& e) {
      e0 = e.what();
    }
    CHECK(contains(e0, "runs 3 rank(s) per node, node 0 2"));
    CHECK(contains(f1.get(), "runs 2 rank(s) per node, this node 3"));
  }
  {
    const int port2 = pick_free_port();
    AgentOptions o0 = agent_options(0, port2);
    o0.join_timeout_s = 1;
    JobAgent a0(o0);
    AgentOptions wrong = agent_options(1, port2, "another-token");
    wrong.join_timeout_s = 2;
    JobAgent a1(wrong);
    std::string e = "<no error>", log;
    {
      const LogCapture cap;
      try {
        a1.join(2);
      } catch (const UserError& x) {  // exit 2: the token is the user's input (it was exit 1)
        e = x.what();
      }
      log = cap.text();
    }
    CHECK(contains(e,
                   "refused this node's job token: give every node's launcher the job's "
                   "DTRAIN_JOB_TOKEN"));
    // Node 0's own check-in times out naming the refused call (a node given another token).
    std::string e0 = "<no error>";
    try {
      a0.join(2);
    } catch (const std::runtime_error& x) {
      e0 = x.what();
    }
    CHECK_MESSAGE(contains(e0, "node(s) 1 did not check in within 1 s"), e0);
    CHECK_MESSAGE(contains(e0, "call(s) with a wrong or missing job token were refused"), e0);
    // Node 0's side names the launcher, not a rank that does not exist yet.
    INFO("log: ", log);
    CHECK(contains(log, "node 0's launcher: refused a rendezvous call"));
    CHECK(!contains(log, "rank 0: refused"));
  }
  {
    const int port3 = pick_free_port();
    AgentOptions o = agent_options(0, port3);
    o.join_timeout_s = 1;
    JobAgent a0(o);
    std::string e = "<no error>";
    try {
      a0.join(2);
    } catch (const std::runtime_error& x) {
      e = x.what();
    }
    CHECK(contains(e, "node(s) 1 did not check in within 1 s"));
  }
  {
    // Node 0's launcher never came up (it refused its input and exited): node 1 says so, not a
    // raw "DEADLINE_EXCEEDED: Deadline Exceeded" after the whole wait.
    AgentOptions o = agent_options(1, pick_free_port());
    o.join_timeout_s = 1;
    JobAgent a1(o);
    std::string e = "<no error>";
    try {
      a1.join(2);
    } catch (const std::runtime_error& x) {
      e = x.what();
    }
    CHECK(contains(e, "did not answer within 1 s: is it running there"));
  }
  {
    // Node 0's launcher is gone: node 1's polls report it, once lost_after_s has passed without
    // an answer, instead of hanging.
    const int port4 = pick_free_port();
    AgentOptions o = agent_options(1, port4);
    o.lost_after_s = 0.5;
    JobAgent a1(o);
    const auto t0 = std::chrono::steady_clock::now();
    RemoteNews n;
    for (int i = 0; i < 200 && n.lost.empty(); ++i) {
      n = a1.poll(0);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    CHECK_FALSE(n.lost.empty());
    CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(500));
  }
}

TEST_CASE("check-in: a launcher of another dtrain (launch protocol) is refused as such") {
  // A launcher before the protocol word wrote "--nnodes=2,--max-restarts=0" alone: launchers of
  // different dtrain builds waited on keys the other never wrote, or failed on what they read.
  AgentOptions o = agent_options(0, 1);
  const std::string shape = launch_detail::job_shape(o);
  CHECK(shape == "--nnodes=2,--max-restarts=0,launch-protocol=2");
  const launch_detail::CheckIn old{2, "--nnodes=2,--max-restarts=0", "host-b"};
  CHECK(launch_detail::check_in_problem(1, old, 2, shape, "node 0") ==
        "node 1 (host-b) runs another dtrain (its launch protocol 1, node 0's 2): run the same "
        "dtrain on every node");
  const launch_detail::CheckIn later{2, "--nnodes=2,--max-restarts=0,launch-protocol=3,--x=1", "h"};
  CHECK(launch_detail::check_in_problem(1, later, 2, shape, "this node") ==
        "node 1 (h) runs another dtrain (its launch protocol 3, this node's 2): run the same "
        "dtrain on every node");
  const launch_detail::CheckIn same{2, shape, "host-b"};
  CHECK(launch_detail::check_in_problem(1, same, 2, shape, "node 0").empty());
  // Other options are named without the protocol word.
  const launch_detail::CheckIn three{2, "--nnodes=3,--max-restarts=0,launch-protocol=2", "h"};
  CHECK(launch_detail::check_in_problem(1, three, 2, shape, "node 0") ==
        "node 1 (h) was started with --nnodes 3 --max-restarts 0, node 0 with --nnodes 2 "
        "--max-restarts 0: give every node's launcher the same --nnodes and --max-restarts");
}

TEST_CASE("JobAgent: a second launcher with a node rank already checked in is refused") {
  // Before, it overwrote the first one's check-in, started ranks of its own and ended the job.
  const int port = pick_free_port();
  JobAgent a0(agent_options(0, port));
  auto f1 = std::async(std::launch::async, [&] {
    JobAgent a1(agent_options(1, port));
    return a1.join(2).size();
  });
  a0.join(2);
  CHECK(f1.get() == 2u);
  JobAgent again(agent_options(1, port));
  std::string e = "<no error>";
  try {
    again.join(2);
  } catch (const UserError& x) {
    e = x.what();
  }
  CHECK_MESSAGE(contains(e,
                         "node rank 1 has already checked in to this job: another launcher "
                         "runs with --node-rank 1"),
                e);
  // Node 1's launcher trained (its polls beat alive/1), then was lost: its replacement is told
  // so, as a failure (it was told another launcher ran with its --node-rank, exit 2).
  {
    JobAgent beating(agent_options(1, port));
    beating.poll(0);
  }
  AgentOptions ro = agent_options(1, port);
  ro.lost_after_s = 1;
  JobAgent replacement(ro);
  e = "<no error>";
  bool user_error = false;
  try {
    replacement.join(2);
  } catch (const UserError& x) {
    user_error = true;
    e = x.what();
  } catch (const std::runtime_error& x) {
    e = x.what();
  }
  CHECK_FALSE(user_error);
  CHECK_MESSAGE(contains(e,
                         "node rank 1 checked in to this job before, and its launcher has not "
                         "been heard from for 1 s"),
                e);
}

TEST_CASE("JobAgent: a node refused by node 0, which then exits, learns why at once") {
  // Node 1 checks in first; node 0 refuses it and its process (the store's host) ends right
  // after: node 1 must have read the refusal before, not wait out its join timeout.
  const int port = pick_free_port();
  AgentOptions o1 = agent_options(1, port);
  o1.join_timeout_s = 60;
  const auto t0 = std::chrono::steady_clock::now();
  auto f1 = std::async(std::launch::async, [&] {
    JobAgent a1(o1);
    try {
      a1.join(3);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::string e0 = "<no error>";
  try {
    JobAgent a0(agent_options(0, port));
    a0.join(2);
  } catch (const UserError& e) {
    e0 = e.what();
  }
  CHECK(contains(e0, "runs 3 rank(s) per node, node 0 2"));
  REQUIRE(f1.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(contains(f1.get(), "runs 2 rank(s) per node, this node 3"));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
}

TEST_CASE("JobAgent: node 0's refusal of the whole job reaches every node at its check-in") {
  // Node 0 refused its own input (an --out that holds a run) and exited before it hosted the
  // store: the others waited out their join timeout (300 s) and exited 1.
  const int port = pick_free_port();
  AgentOptions o0 = agent_options(0, port);
  o0.nnodes = 3;
  o0.join_timeout_s = 60;
  const auto t0 = std::chrono::steady_clock::now();
  auto a0 = std::make_unique<JobAgent>(o0);
  auto refused =
      std::async(std::launch::async, [&] { return a0->refuse_job("--out holds a run"); });
  std::vector<std::future<std::string>> nodes;
  for (int n = 1; n <= 2; ++n)
    nodes.push_back(std::async(std::launch::async, [&, n] {
      if (n == 2) std::this_thread::sleep_for(std::chrono::milliseconds(500));  // a late node
      AgentOptions o = agent_options(n, port);
      o.nnodes = 3;
      o.join_timeout_s = 60;
      JobAgent a(o);
      try {
        a.join(2);
      } catch (const UserError& e) {
        return std::string(e.what());
      }
      return std::string("<no error>");
    }));
  REQUIRE(refused.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
  CHECK(refused.get().empty());  // every node read it
  a0.reset();                    // node 0 exits with its error
  for (auto& f : nodes) CHECK(f.get() == "node 0 refused this job: --out holds a run");
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));
}

TEST_CASE("JobAgent: node 0's refusal names the nodes that never checked in, after the timeout") {
  const int port = pick_free_port();
  AgentOptions o0 = agent_options(0, port);
  o0.join_timeout_s = 0.5;
  JobAgent a0(o0);
  CHECK(a0.refuse_job("--out holds a run") == std::vector<int>{1});
}

TEST_CASE("refuse_launch: node 0 tells the nodes that come and throws its reason, exit 2") {
  LaunchOptions o;
  o.nnodes = 2;
  o.node_rank = 0;
  o.master_port = pick_free_port() - 1;  // (the launchers' store is at master_port + 1)
  o.join_timeout_s = 0.5;
  const UserError why("--out holds a run");
  // Without the token (refused by every launcher itself): at once, the reason unchanged (it was an
  // internal error, exit 1).
  o.token = "";
  CHECK_THROWS_WITH_AS(refuse_launch(o, why), "--out holds a run", UserError);
  // With it: node 1 never comes; node 0 gives up after the join timeout with its reason.
  o.token = "agent-test";
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(refuse_launch(o, why), "--out holds a run", UserError);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
}

TEST_CASE("JobAgent: node 0 gone or started again during the check-in: found, not waited out") {
  const auto three = [](int node, int port) {
    AgentOptions o = quick_loss(node, port);
    o.nnodes = 3;
    o.join_timeout_s = 60;
    return o;
  };
  SUBCASE("node 0's launcher stopped (a signal): node 1 fails within lost_after_s, not 60 s") {
    const int port = pick_free_port();
    auto a0 = std::make_unique<JobAgent>(three(0, port));
    auto f1 = std::async(std::launch::async, [&] {
      JobAgent a1(three(1, port));
      std::string e = "<no error>";
      const auto t0 = std::chrono::steady_clock::now();
      try {
        a1.join(1);  // node 2 never comes
      } catch (const std::runtime_error& x) {
        e = x.what();
      }
      return std::make_pair(e, std::chrono::steady_clock::now() - t0);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // node 1 checked in, waiting
    a0.reset();
    const auto [e, took] = f1.get();
    CHECK_MESSAGE(contains(e, "was lost during the check-in: no answer for 1 s"), e);
    CHECK(took < std::chrono::seconds(15));
  }
  SUBCASE("node 0's launcher started again: node 1 checks in anew and all three join") {
    // Node 1 had checked in to the first node 0's store, then read node 0's and node 2's entries
    // from the second's: it went on, and the second node 0 and node 2 waited for it forever.
    const int port = pick_free_port();
    auto a0 = std::make_unique<JobAgent>(three(0, port));
    auto f1 = std::async(std::launch::async, [&] {
      JobAgent a1(three(1, port));
      return a1.join(1).size();
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    a0.reset();
    a0 = std::make_unique<JobAgent>(three(0, port));
    auto f2 = std::async(std::launch::async, [&] {
      JobAgent a2(three(2, port));
      return a2.join(1).size();
    });
    CHECK(a0->join(1).size() == 3);
    CHECK(f1.get() == 3);
    CHECK(f2.get() == 3);
  }
}

TEST_CASE(
    "JobAgent: a launcher that dies is found lost within lost_after_s, not the report timeout") {
  const auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  NodeOutcome remote = failed("", false, INT64_MAX - 1);
  SUBCASE("node 1's launcher: node 0 hears it lost and decides without it") {
    const int port = pick_free_port();
    const AgentOptions o0 = quick_loss(0, port), o1 = quick_loss(1, port);
    JobAgent a0(o0);
    auto f1 = std::async(std::launch::async, [&] {
      JobAgent a1(o1);  // joins, polls a few times, then is gone without a report (SIGKILL)
      a1.join(2);
      for (int i = 0; i < 3; ++i) a1.poll(0);
    });
    a0.join(2);
    f1.get();
    const auto t0 = std::chrono::steady_clock::now();
    RemoteNews n;
    for (int i = 0; i < 300 && n.failures.empty(); ++i) {
      n = a0.poll(0);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    REQUIRE(n.failures.size() == 1);
    CHECK(contains(n.failures[0], "node 1's launcher was lost"));
    remote.cause = n.failures[0];
    // Restarts left, but a job of fixed size cannot restart without node 1's launcher: its
    // restarted ranks waited out their rendezvous timeout for rank 1 (and a relaunched node 1
    // was refused as "already checked in").
    const JobDecision d = a0.finish(0, remote, 3);
    CHECK(since(t0) < 10);  // the report timeout is 60 s
    CHECK_FALSE(d.restart);
    CHECK(d.rc == 1);
    CHECK(contains(d.reason, "node 1's launcher was lost"));
    CHECK(contains(d.reason, "not restarting: a job of fixed size (--nnodes 2) needs every node"));
  }
  // Node 0's launcher gone, seen by a poll first or not: node 0's machine died with its ranks,
  // so node 1's ranks fail at once and its launcher may reach finish before any poll.
  for (const bool polled : {true, false}) {
    CAPTURE(polled);
    const int port = pick_free_port();
    const AgentOptions o0 = quick_loss(0, port), o1 = quick_loss(1, port);
    auto a0 = std::make_unique<JobAgent>(o0);
    JobAgent a1(o1);
    join_both(*a0, a1);
    a0.reset();  // node 0's launcher is gone
    const auto t0 = std::chrono::steady_clock::now();
    if (polled) {
      // Lost once node 0 has not answered for lost_after_s, not at the first unanswered poll
      // (a 1-s pause of node 0's launcher ended the whole job).
      RemoteNews n;
      for (int i = 0; i < 300 && n.lost.empty(); ++i) {
        n = a1.poll(0);
        if (n.lost.empty()) CHECK(since(t0) < 1.0 + 0.5);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      REQUIRE_FALSE(n.lost.empty());
      CHECK(since(t0) >= 1.0);
      CHECK(contains(n.lost, "no answer for "));
      CHECK_FALSE(contains(n.lost, "bad input"));  // (a check-in's hint, not a running job's)
    }
    CHECK_THROWS_WITH_AS(a1.finish(0, remote, 0), doctest::Contains("node 0's launcher"),
                         std::runtime_error);
    CHECK(since(t0) < 20);  // the report timeout is 60 s
  }
  SUBCASE("node 1 lost in attempt 1, back for attempt 2: node 0 waits for it again") {
    const NodeOutcome ok;
    // Its launcher stopped (SIGSTOP) past lost_after_s, then continued: node 0 restarted the job
    // with it. In attempt 2 node 0 gave it 200 ms to report and did not wait for it to read the
    // decision (still counted lost): node 0 exited 0 and node 1 failed to read the decision.
    const int port = pick_free_port();
    const AgentOptions o0 = quick_loss(0, port), o1 = quick_loss(1, port);
    auto a0 = std::make_unique<JobAgent>(o0);
    JobAgent a1(o1);
    join_both(*a0, a1);
    RemoteNews n;  // node 1 silent: lost
    for (int i = 0; i < 300 && n.failures.empty(); ++i) {
      n = a0->poll(0);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    REQUIRE(n.failures.size() == 1);
    auto g1 = std::async(std::launch::async, [&] { return a1.finish(0, remote, 1); });
    const JobDecision d0 = a0->finish(0, failed(n.failures[0], false, 1), 1);
    REQUIRE(d0.restart);
    CHECK(g1.get().restart);
    // Attempt 2: node 1 polls as a running launcher does, and reports after 1.5 s.
    auto h1 = std::async(std::launch::async, [&] {
      for (int i = 0; i < 15; ++i) {
        a1.poll(1);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      return a1.finish(1, ok, 1);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    a0->poll(1);
    const JobDecision e0 = a0->finish(1, ok, 1);
    a0.reset();  // node 0's launcher exits at once with its decision
    const JobDecision e1 = h1.get();
    CHECK(e0.rc == 0);
    CHECK_FALSE(e0.restart);
    CHECK(e1.rc == 0);
    CHECK_FALSE(e1.restart);
  }
  SUBCASE("node 1 done, waiting for the decision, is not lost while node 0's ranks run on") {
    // Its ranks finished, so its launcher stopped polling: node 0, whose rank 0 merged a trace
    // for 12 s, found it lost after 10 s, stopped its own rank and ended the finished job with 1.
    const NodeOutcome ok;
    const int port = pick_free_port();
    const AgentOptions o0 = quick_loss(0, port), o1 = quick_loss(1, port);
    JobAgent a0(o0);
    auto f1 = std::async(std::launch::async, [&] {
      JobAgent a1(o1);
      a1.join(2);
      a1.poll(0);
      return a1.finish(0, ok, 0);
    });
    a0.join(2);
    const auto t0 = std::chrono::steady_clock::now();
    while (since(t0) < 2.5) {  // node 0's ranks still running: its launcher polls
      const RemoteNews n = a0.poll(0);
      CHECK(n.failures.empty());
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    const JobDecision d0 = a0.finish(0, ok, 0);
    const JobDecision d1 = f1.get();
    CHECK(d0.rc == 0);
    CHECK(d0.reason == "");
    CHECK(d1.rc == 0);
    CHECK_FALSE(d1.restart);
  }
  SUBCASE("node 0 alive but deciding late: node 1 waits on past lost_after_s for its decision") {
    const int port = pick_free_port();
    const AgentOptions o0 = quick_loss(0, port), o1 = quick_loss(1, port);
    JobAgent a0(o0);
    auto f1 = std::async(std::launch::async, [&] {
      JobAgent a1(o1);
      a1.join(2);
      return a1.finish(0, remote, 0);
    });
    a0.join(2);
    std::this_thread::sleep_for(std::chrono::milliseconds(3500));  // 3 slices of node 1's wait
    const JobDecision d0 = a0.finish(0, failed("rank 0 on node 0 failed", false, 1), 0);
    const JobDecision d1 = f1.get();
    CHECK(d1.rc == d0.rc);
    CHECK(d1.reason == d0.reason);
    CHECK(d1.reason == "rank 0 on node 0 failed");
  }
}

TEST_CASE(
    "JobAgent: a member's silence counts afresh in each attempt (a slow decision is no loss)") {
  // Node 1 reported attempt 0 and waits for the decision, which node 0 gives 2.6 s later (its own
  // ranks took that long to end); a waiting member does not poll. Node 0's first poll of the
  // restart came before node 1's, and counted node 1's silence from attempt 0: lost after 2 s,
  // a failure of the restart that never happened.
  const int port = pick_free_port();
  // (lost after 2 s: the restart's first polls keep 1.8 s of slack on a loaded machine)
  const auto opts = [&](int node) {
    AgentOptions o = quick_loss(node, port);
    o.lost_after_s = 2;
    return o;
  };
  JobAgent a0(opts(0));
  auto f1 = std::async(std::launch::async, [&] {
    JobAgent a1(opts(1));
    a1.join(2);
    for (int i = 0; i < 3; ++i) {
      a1.poll(0);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    const JobDecision d =
        a1.finish(0, failed("rank 2 on node 1 (h1) failed: exit status 1", false, 1), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // its ranks start again
    for (int i = 0; i < 5; ++i) {
      CHECK(a1.poll(1).failures.empty());
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    a1.finish(1, NodeOutcome{}, 0);
    return d;
  });
  a0.join(2);
  for (int i = 0; i < 6; ++i) {  // (until node 1 has reported: its last alive count is seen)
    CHECK(a0.poll(0).failures.empty());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(2600));
  const JobDecision d0 =
      a0.finish(0, failed("rank 0 on node 0 (h0) failed: exit status 1", false, 2), 1);
  CHECK(d0.restart);
  for (int i = 0; i < 8; ++i) {
    const RemoteNews n = a0.poll(1);
    CHECK_MESSAGE(n.failures.empty(), n.failures.front());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const JobDecision d1 = a0.finish(1, NodeOutcome{}, 1);
  CHECK_FALSE(d1.restart);
  CHECK(d1.rc == 0);
  CHECK(f1.get().restart);
}
