#include "launch/agent_keys.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "comm/grpc/common.h"
#include "comm/transport.h"

namespace dtrain::launch_detail {

using grpc_detail::Clock;

std::string attempt_key(int attempt, const std::string& rest) {
  return std::string(kAgentPrefix) + "a" + std::to_string(attempt) + "/" + rest;
}

bool key_set(Store& s, const std::string& k) {
  try {
    s.get(k, Clock::now());
    return true;
  } catch (const CommError&) {  // not (yet)
    return false;
  }
}

void refuse_after_read(Store& s, const std::vector<std::string>& read_keys, const UserError& e) {
  const auto until = Clock::now() + std::chrono::seconds(3);
  while (Clock::now() < until && std::none_of(read_keys.begin(), read_keys.end(),
                                              [&s](const std::string& k) { return key_set(s, k); }))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  throw e;
}

std::string fixed_read_key(int n) {
  return kAgentPrefix + ("join-read/" + std::to_string(n));
}

void refuse_node(Store& s, int attempt, int n, const UserError& e) {
  s.set(attempt_key(attempt, "members"), kRefused + std::string(e.what()));
  refuse_after_read(
      s, {fixed_read_key(n), attempt_key(attempt, "members-read/" + std::to_string(n))}, e);
}

void claim_node_rank(Store& s, const std::string& claim_key, int node, double lost_after_s) {
  if (s.add(claim_key, 1) == 1) return;
  // The claimant may be gone: a launcher that trained beats alive/<node> every poll (0.5 s); one
  // silent as long as node 0 takes to call it lost was lost (its pod or machine ended), and this
  // is its replacement, which a job of fixed nodes cannot take during an attempt. (It was told
  // another launcher ran with this --node-rank, exit 2, which a Kubernetes Job's pod failure
  // policy reads as bad input.) A claimant that never trained has no beats: a second launcher.
  const std::string alive = kAgentPrefix + ("alive/" + std::to_string(node));
  if (const int64_t before = s.add(alive, 0); before > 0) {
    const auto until = Clock::now() + std::chrono::duration<double>(lost_after_s);
    const std::string rank = "node rank " + std::to_string(node);
    bool beat = false;
    while (!beat && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
      try {
        beat = s.add(alive, 0) != before;
      } catch (const CommError& e) {
        // Node 0 found that launcher lost first and ended the job, its store with it (a bare
        // "CANCELLED: CANCELLED" was all this launcher said) -- or node 0 itself went away.
        throw std::runtime_error(
            rank +
            " checked in to this job before, and its launcher went silent (lost: its "
            "machine or pod ended?); meanwhile node 0's store went away (" +
            e.what() +
            "): node 0 ends a running attempt once it finds a launcher lost, and a running "
            "attempt cannot take a replacement; the job's next start (--resume auto) takes this "
            "node");
      }
    }
    if (!beat)
      throw std::runtime_error(
          rank + " checked in to this job before, and its launcher has not been heard from for " +
          grpc_detail::seconds_str(lost_after_s) +
          " s (lost: its machine or pod ended?); a running attempt cannot take a replacement: "
          "node 0 ends it once it finds that launcher lost, and the job's next start "
          "(--resume auto) takes this node");
  }
  throw UserError("node rank " + std::to_string(node) +
                  " has already checked in to this job: another launcher runs with --node-rank " +
                  std::to_string(node) + " (give each node its own --node-rank)");
}

}  // namespace dtrain::launch_detail
