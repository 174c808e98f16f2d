// Chrome trace recorder: valid JSON that Perfetto reads, one track per thread, nesting, the
// disabled path, and merging per-rank files.
#include <doctest/doctest.h>

#include <chrono>
#include <map>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "log_capture.h"
#include "test_util.h"
#include "util/check.h"
#include "util/fs.h"
#include "util/trace.h"

using namespace dtrain;
using dtrain::testing::TempDir;

namespace {

// The non-metadata events of a trace file, checked for the fields every event must carry.
std::vector<nlohmann::json> events_of(const nlohmann::json& trace) {
  REQUIRE(trace.is_object());
  REQUIRE(trace.at("traceEvents").is_array());
  CHECK(trace.at("displayTimeUnit") == "ms");
  std::vector<nlohmann::json> out;
  for (const auto& e : trace["traceEvents"]) {
    REQUIRE(e.contains("ph"));
    REQUIRE(e.contains("pid"));
    REQUIRE(e.contains("tid"));
    REQUIRE(e["pid"].is_number_integer());
    REQUIRE(e["tid"].is_number_integer());
    if (e["ph"] == "M") continue;
    REQUIRE(e["ts"].is_number_integer());
    REQUIRE(e["name"].is_string());
    REQUIRE(e["cat"].is_string());
    if (e["ph"] == "X") {
      REQUIRE(e["dur"].is_number_integer());
      CHECK(e["dur"].get<int64_t>() >= 0);
    }
    out.push_back(e);
  }
  return out;
}

std::string thread_name(const nlohmann::json& trace, int pid, int tid) {
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name" && e["pid"] == pid && e["tid"] == tid)
      return e["args"]["name"];
  return "";
}

}  // namespace

TEST_CASE("trace: complete, instant and nested scope events in a valid file") {
  TempDir dir;
  Tracer t(true, 3);
  t.set_thread_name("train");
  const int64_t before = t.now_us();
  {
    TraceScope outer(t, "step", "train");
    {
      TraceScope inner(&t, "forward", "compute");
      inner.set_args({{"rows", 128}});
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    t.instant("checkpoint", "io", {{"step", 7}});
  }
  t.complete("allreduce", "comm", t.now_us(), 5, {{"bytes", 4096}});
  const int64_t after = t.now_us();
  CHECK(t.event_count() == 4);

  const std::string path = dir / "trace.json";
  t.write(path);
  const nlohmann::json j = nlohmann::json::parse(read_file(path));
  const auto ev = events_of(j);
  REQUIRE(ev.size() == 4);
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& e : ev) {
    by_name[e["name"]] = e;
    CHECK(e["pid"] == 3);
    CHECK(e["ts"].get<int64_t>() >= before);
    CHECK(e["ts"].get<int64_t>() <= after);
  }
  // Nesting: forward lies inside step, on the same thread, and took the 2 ms it slept.
  const auto& step = by_name.at("step");
  const auto& fwd = by_name.at("forward");
  CHECK(step["ph"] == "X");
  CHECK(fwd["tid"] == step["tid"]);
  CHECK(fwd["ts"].get<int64_t>() >= step["ts"].get<int64_t>());
  CHECK(fwd["ts"].get<int64_t>() + fwd["dur"].get<int64_t>() <=
        step["ts"].get<int64_t>() + step["dur"].get<int64_t>());
  CHECK(fwd["dur"].get<int64_t>() >= 2000);
  CHECK(fwd["args"]["rows"] == 128);
  CHECK(by_name.at("checkpoint")["ph"] == "i");
  CHECK(by_name.at("checkpoint")["s"] == "t");
  CHECK(by_name.at("allreduce")["dur"] == 5);
  CHECK(by_name.at("allreduce")["args"]["bytes"] == 4096);
  CHECK(thread_name(j, 3, step["tid"]) == "train");
  // Timestamps are microseconds since the Unix epoch: within a day of the system clock.
  const int64_t sys_us = std::chrono::duration_cast<std::chrono::microseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  CHECK(std::llabs(sys_us - step["ts"].get<int64_t>()) < int64_t{86400} * 1000000);
}

TEST_CASE("trace: events from several threads get one named track per thread") {
  Tracer t(true, 0);
  constexpr int kThreads = 4, kEach = 200;
  std::vector<std::thread> threads;
  for (int k = 0; k < kThreads; ++k)
    threads.emplace_back([&t, k] {
      if (k % 2 == 0) t.set_thread_name("worker-" + std::to_string(k));
      for (int i = 0; i < kEach; ++i) {
        TraceScope s(t, "work", "test");
        s.set_args({{"thread", k}, {"i", i}});
      }
    });
  for (auto& th : threads) th.join();
  const nlohmann::json j = t.to_json();
  const auto ev = events_of(nlohmann::json::parse(j.dump()));
  REQUIRE(ev.size() == kThreads * kEach);
  std::map<int, std::set<int64_t>> tids_of_thread;  // thread index -> tids seen
  for (const auto& e : ev)
    tids_of_thread[e["args"]["thread"].get<int>()].insert(e["tid"].get<int64_t>());
  std::set<int64_t> all_tids;
  for (int k = 0; k < kThreads; ++k) {
    REQUIRE(tids_of_thread[k].size() == 1);  // one track per thread
    const int64_t tid = *tids_of_thread[k].begin();
    all_tids.insert(tid);
    const std::string name = thread_name(j, 0, static_cast<int>(tid));
    if (k % 2 == 0)
      CHECK(name == "worker-" + std::to_string(k));
    else
      CHECK(name == "thread " + std::to_string(tid));
  }
  CHECK(all_tids.size() == kThreads);
}

TEST_CASE("trace: a disabled or null tracer records nothing") {
  Tracer off;
  CHECK_FALSE(off.enabled());
  {
    TraceScope s(off, "x", "y");
    s.set_args({{"a", 1}});
    TraceScope n(static_cast<Tracer*>(nullptr), "x", "y");
  }
  off.complete("a", "b", 0, 1);
  off.instant("a", "b");
  off.set_thread_name("nobody");
  CHECK(off.event_count() == 0);
  const nlohmann::json j = off.to_json();
  const auto ev = events_of(j);
  CHECK(ev.empty());
  for (const auto& e : j["traceEvents"]) CHECK(e["name"] != "thread_name");

  Tracer off2(false, 5);
  off2.instant("a", "b");
  CHECK(off2.event_count() == 0);
}

TEST_CASE("trace: events over max_events are counted as dropped, and said once") {
  Tracer t(true, 1, 10);
  const dtrain::testing::LogCapture log;
  for (int i = 0; i < 25; ++i) t.instant("e", "c");
  // (it was silent: a long run's trace ended early with nothing in the log)
  const std::string said = log.text();
  CHECK_MESSAGE(said.find("trace: rank 1 has recorded 10 events, the most a trace keeps") !=
                    std::string::npos,
                said);
  CHECK(said.find("trace:") == said.rfind("trace:"));
  CHECK(t.event_count() == 10);
  CHECK(t.dropped_count() == 15);
  CHECK(t.to_json()["otherData"]["dropped_events"] == 15);
}

TEST_CASE("trace: per-rank files merge into one with every rank's events") {
  TempDir dir;
  std::vector<std::string> files;
  for (int rank = 0; rank < 3; ++rank) {
    Tracer t(true, rank);
    for (int i = 0; i <= rank; ++i) {
      TraceScope s(t, "step", "train");
    }
    files.push_back(rank_trace_path(dir / "trace.json", rank));
    t.write(files.back());
  }
  CHECK(files[1] == dir / "trace.rank-1.json");
  CHECK(rank_trace_path("t", 2) == "t.rank-2.json");
  const std::string out = dir / "trace.json";
  merge_trace_files(files, out);
  const nlohmann::json j = nlohmann::json::parse(read_file(out));
  const auto ev = events_of(j);
  std::map<int, int> per_rank;
  for (const auto& e : ev) ++per_rank[e["pid"]];
  CHECK(per_rank == std::map<int, int>{{0, 1}, {1, 2}, {2, 3}});
  std::set<int> named;
  for (const auto& e : j["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "process_name") named.insert(e["pid"].get<int>());
  CHECK(named == std::set<int>{0, 1, 2});
  CHECK(j["otherData"]["ranks"] == nlohmann::json::array({0, 1, 2}));

  CHECK_THROWS_AS(merge_trace_files({dir / "none.json"}, out), UserError);
  const std::string bad = dir.write("bad.json", "{\"traceEvents\": [");
  CHECK_THROWS_AS(merge_trace_files({bad}, out), UserError);
  const std::string other = dir.write("other.json", "{\"events\": []}");
  CHECK_THROWS_AS(merge_trace_files({other}, out), UserError);
}

TEST_CASE("trace: write and merge stream exactly the bytes one dump of the whole tree gives") {
  // (streamed through a 1-MiB buffer: 20000 events with arguments pass it several times)
  TempDir dir;
  Tracer t(true, 3);
  for (int i = 0; i < 20000; ++i) {
    TraceScope s(t, "step", "train");
  }
  t.instant("marker", "train", {{"step", 7}});
  const std::string path = dir / "t.json";
  t.write(path);
  const nlohmann::json tree = t.to_json();
  CHECK(read_file(path) == tree.dump());
  CHECK(is_dtrain_trace_file(path));
  merge_trace_files({path, path}, dir / "m.json");
  nlohmann::json all = nlohmann::json::array();
  for (int k = 0; k < 2; ++k)
    for (const auto& e : tree["traceEvents"]) all.push_back(e);
  const nlohmann::json merged = {
      {"traceEvents", all},
      {"displayTimeUnit", "ms"},
      {"otherData", {{"producer", "dtrain"}, {"ranks", {3, 3}}, {"dropped_events", 0}}}};
  CHECK(read_file(dir / "m.json") == merged.dump());
}
