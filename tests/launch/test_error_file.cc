// The error-file contract (torchrun's TORCHELASTIC_ERROR_FILE): which rank a failed rank's
// error names as its cause, and the record's round trip.
#include <doctest/doctest.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "launch/attempt_result.h"
#include "launch/error_file.h"
#include "test_util.h"

using dtrain::rank_named_as_cause;

TEST_CASE("error file: the rank an error names as its cause") {
  // dtrain's own wordings of another rank's failure.
  CHECK(rank_named_as_cause("rank 0: allreduce seq 3 failed: rank 1 aborted: DTRAIN_FAULT", 0) ==
        1);
  CHECK(rank_named_as_cause("rank 1 failed to write its shard of checkpoint step-20", 0) == 1);
  CHECK(rank_named_as_cause("connection to rank 3 lost (stream cancelled)", 0) == 3);
  CHECK(rank_named_as_cause("connection to rank 2 is closed", 0) == 2);
  CHECK(rank_named_as_cause("rank 2 closed its connection", 1) == 2);
  CHECK(rank_named_as_cause("no heartbeat from rank 4 for 10 s: frozen or unreachable", 0) == 4);
  CHECK(rank_named_as_cause("cannot connect to rank 1 at 10.0.0.2:4000 within 3 s", 0) == 1);
  // (the launch blamed rank 0, which waited, instead of rank 1, which hung)
  CHECK(rank_named_as_cause("rank 1 did not open their streams to rank 0 within 3 s "
                            "(distributed.timeout_s)",
                            0) == 1);
  CHECK(rank_named_as_cause(
            "recv timed out after 3 s waiting for allreduce seq 1 (4 bytes) from rank 1", 0) == 1);
  // The rendezvous refused one rank (another node started with another config): every rank
  // reports it, and it is the cause (the launchers blamed whichever rank they reaped first).
  const std::string refusal =
      "rank 3 has config hash d59c (train.epochs 1), rank 0 has 55b1 (train.epochs 1); the keys "
      "that differ (rank 0's -> rank 3's): optimizer.lr: 0.003 -> 0.01";
  CHECK(rank_named_as_cause(refusal, 1, 4) == 3);
  CHECK(rank_named_as_cause(refusal, 3, 4) == -1);  // its own
  CHECK(rank_named_as_cause("rank 2's run plan differs from rank 0's (the same config hash ab): "
                            "rank 2 has config hash ab (...)",
                            0, 4) == 2);
  CHECK(rank_named_as_cause("rank 1 says the world size is 3, rank 0 says 2", 0, 2) == 1);
  CHECK(rank_named_as_cause("rank 1 speaks wire protocol 4, rank 0 speaks 5", 0, 2) == 1);
  // The leftmost phrase, though a message begins with its own "rank N: " (it took rank 3 here).
  CHECK(rank_named_as_cause("rank 1: waiting for gradients from rank 2 timed out; rank 3 failed "
                            "to write its shard",
                            1, 4) == 2);
  // Nested relays: the innermost abort is the rank that gave up on its own.
  CHECK(rank_named_as_cause("rank 1 aborted: rank 1 failed: rank 2 aborted: disk full", 0) == 2);
  // Its own failure, or its own name only: no other cause.
  CHECK(rank_named_as_cause("data.train.path: no such file", 0) == -1);
  CHECK(rank_named_as_cause("rank 1 aborted: out of memory", 1) == -1);
  // Its own relayed abort names another rank further in.
  CHECK(rank_named_as_cause("rank 1 aborted: connection to rank 2 lost (reset)", 1) == 2);
  // An abort whose own reason names this rank: the slow rank hears that rank 0 timed out
  // waiting for it, and is the cause itself (the two named each other, and the launcher blamed
  // the rank that waited); a reason naming a third rank leaves the abort's rank as the lead.
  CHECK(rank_named_as_cause("rank 1: allreduce seq 5 failed: rank 0 aborted: recv timed out "
                            "after 0.2 s waiting for allreduce seq 5 (4 bytes) from rank 1",
                            1, 2) == -1);
  CHECK(rank_named_as_cause("rank 1: allreduce seq 5 failed: rank 0 aborted: recv timed out "
                            "after 0.2 s waiting for allreduce seq 5 (4 bytes) from rank 2",
                            1, 3) == 0);
  // The transport's verdict wins over the peer it happened to hear from.
  CHECK(rank_named_as_cause("connection to rank 3 lost (x); rank 2 went down first, 1.0 s "
                            "earlier: rank 3 probably failed because of it",
                            0) == 2);
  // Only ranks of the world count: a number from a user's own text is no rank (nor does it
  // overflow: std::stoi aborted the process on 99999999999).
  CHECK(rank_named_as_cause("rank 99999999999 aborted: x", 0) == -1);
  CHECK(rank_named_as_cause("rank 7 aborted: x", 0, 4) == -1);
  CHECK(rank_named_as_cause("rank 3 aborted: x", 0, 4) == 3);
  // A long message is no problem (a regex's recursion overflowed the stack at ~40 KB).
  CHECK(rank_named_as_cause("waiting for " + std::string(200000, 'x') + " from rank 1", 0) == -1);
  CHECK(rank_named_as_cause("waiting for x from rank 1" + std::string(200000, 'x'), 0) == 1);
}

TEST_CASE("error file: written as torchelastic's record, read back") {
  dtrain::testing::TempDir t;
  const std::string path = t / "rank-0.error.json";
  dtrain::write_error_file(path.c_str(), "rank 1 aborted: boom", 1, 0);
  const auto r = dtrain::read_error_file(path);
  REQUIRE(r);
  CHECK(r->message == "rank 1 aborted: boom");
  CHECK(r->exit_code == 1);
  CHECK(r->caused_by == 1);
  // The fields torchrun reads.
  std::ifstream f(path);
  const nlohmann::json j = nlohmann::json::parse(f);
  CHECK(j["message"]["message"] == "rank 1 aborted: boom");
  CHECK(j["message"]["extraInfo"]["timestamp"].is_string());
  // (no py_callstack: torchrun shows it in place of the message when present)
  CHECK_FALSE(j["message"]["extraInfo"].contains("py_callstack"));
  // Missing or foreign files read as none; a message that is not UTF-8 is still written.
  CHECK_FALSE(dtrain::read_error_file(t / "none.json"));
  t.write("junk.json", "{not json");
  CHECK_FALSE(dtrain::read_error_file(t / "junk.json"));
  dtrain::write_error_file(path.c_str(), std::string("bad \xff byte"), 2, 0);
  CHECK(dtrain::read_error_file(path));
}

TEST_CASE("follow_named_cause: the rank the failed ranks' error files point to") {
  using dtrain::launch_detail::AttemptResult;
  using dtrain::launch_detail::ReapedRanks;
  dtrain::testing::TempDir t;
  const auto record = [&](int rank, const std::string& message) {
    dtrain::write_error_file(dtrain::rank_error_path(t.path(), rank).c_str(), message, 1, rank, 4);
  };
  const int exit1 = 1 << 8;  // a wait status: exited with 1
  const auto judged = [&](const ReapedRanks& reaped) {
    AttemptResult res;
    res.failed = true;
    res.first_failed_rank = 0;
    res.first_failed_status = exit1;
    dtrain::launch_detail::follow_named_cause(res, reaped, 0, 2, t.path());
    return res;
  };
  ReapedRanks both;
  both.status = {{0, exit1}, {1, exit1}};
  record(0, "rank 0: allreduce failed: rank 1 aborted: disk full");
  record(1, "disk full");
  AttemptResult r = judged(both);
  CHECK(r.first_failed_rank == 1);
  CHECK(r.named_by == 0);
  CHECK_FALSE(r.named_hung);
  CHECK(r.failure_cause() == "rank 1 failed (exit status 1), named as the cause by rank 0's error");
  // Rank 1 hung: the launcher stopped it (SIGTERM), and it wrote nothing.
  std::filesystem::remove(dtrain::rank_error_path(t.path(), 1));
  ReapedRanks hung = both;
  hung.status[1] = SIGTERM;  // killed by the signal
  hung.stopped_here = {1};
  r = judged(hung);
  CHECK(r.first_failed_rank == 1);
  CHECK(r.named_hung);
  // A rank that exited 0 is no cause; ranks that name each other leave the first reaped.
  ReapedRanks ok = both;
  ok.status[1] = 0;  // exited 0
  CHECK(judged(ok).first_failed_rank == 0);
  record(1, "connection to rank 0 lost (reset)");
  r = judged(both);
  CHECK(r.first_failed_rank == 0);
  CHECK(r.named_by == -1);
  // A rank of another node: left to that node's report.
  record(0, "rank 0: no heartbeat from rank 3 for 10 s");
  r = judged(both);
  CHECK(r.first_failed_rank == 0);
  CHECK(r.remote_cause_rank == 3);
}
