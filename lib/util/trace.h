// Chrome trace-event recorder (`dtrain run --trace FILE.json`): a timeline per rank, viewable in
// Perfetto (ui.perfetto.dev) or chrome://tracing.
//
// Contract:
//  - A Tracer is enabled or disabled for its whole life (constructor). A disabled Tracer, or a
//    null Tracer*, records nothing: complete() and instant() cost one test of the flag, a
//    TraceScope one test of the pointer and the flag, with no clock read and no allocation
//    (~0.4 ns a scope measured), so instrumented code needs no #ifdef and no checks of its own.
//  - Thread-safe: any thread may record at any time (one mutex per event; events are appended
//    to one in-memory list, so keep them coarse: a phase, a bucket, a collective, not a GEMM
//    row). At most `max_events` are kept; later ones are counted as dropped (written to
//    "otherData") so a long run cannot grow without bound.
//  - Time: microseconds (integers) since the Unix epoch, measured with the steady clock from
//    one (steady, system) pair taken when the Tracer is made. So traces of ranks in different
//    processes share one time axis (across machines up to their clock sync), and a time step of
//    the system clock during the run does not bend the timeline.
//  - pid = the rank given to the constructor (with a "rank N" process_name metadata event);
//    tid = a small number per thread, the same in every Tracer of the process, assigned on the
//    thread's first recorded event (1, 2, ...). A thread_name metadata event names each thread
//    that recorded: the name given with set_thread_name, else "thread N".
//  - write() produces {"traceEvents":[...], "displayTimeUnit":"ms", "otherData":{...}} with the
//    metadata events first, then events in recording order (the viewers sort by time), written
//    atomically (write_file_atomic), so a reader never sees half a file. It can be called more
//    than once (e.g. at the end and on failure); each call writes everything recorded so far.
//  - merge_trace_files concatenates the "traceEvents" of per-rank files into one file (pids are
//    kept: each rank stays its own process track).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace dtrain {

class Tracer {
 public:
  // Disabled: records nothing.
  Tracer() = default;
  // Enabled when `enabled`; `pid` is the rank shown as the process.
  Tracer(bool enabled, int pid, size_t max_events = 2'000'000);
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  bool enabled() const { return enabled_; }
  int pid() const { return pid_; }

  // Microseconds since the Unix epoch on this tracer's clock (see the contract above); usable
  // (and cheap) when disabled too.
  int64_t now_us() const;

  // A complete event ("ph":"X"): `name` in category `cat` began at `ts_us` (from now_us()) and
  // lasted `dur_us`. `args` (a JSON object, or null for none) is shown in the viewer's details.
  void complete(std::string_view name, std::string_view cat, int64_t ts_us, int64_t dur_us,
                nlohmann::json args = nullptr) {
    if (enabled_) record('X', name, cat, ts_us, dur_us, std::move(args));
  }
  // An instant event ("ph":"i", thread scope) at now_us().
  void instant(std::string_view name, std::string_view cat, nlohmann::json args = nullptr) {
    if (enabled_) record('i', name, cat, now_us(), 0, std::move(args));
  }
  // Names the calling thread in this trace (e.g. "train", "comm"); the last name given wins.
  void set_thread_name(std::string_view name);

  // Events recorded so far (metadata not counted) and events dropped over max_events.
  size_t event_count() const;
  size_t dropped_count() const;

  // The whole trace as JSON, and written atomically to `path` (std::runtime_error on I/O
  // failure). A disabled tracer gives a valid trace with only its process metadata.
  nlohmann::json to_json() const;
  // Streams the file (atomic): the same bytes as to_json().dump(), without building the tree
  // (a 2M-event trace's tree peaked at 2.4 GB; in-process ranks write at once).
  void write(const std::string& path) const;

 private:
  nlohmann::json other_data() const;  // {"producer", "rank", "dropped_events"}
  // Every event of the file in order (the process and thread names first), one at a time.
  void for_each_event(const std::function<void(const nlohmann::json&)>& f) const;

  // 48 bytes: names are interned (a run uses a few dozen), so memory per event stays small.
  struct Event {
    int64_t ts, dur;
    uint32_t name, cat;  // indices into strings_
    int tid;
    char ph;
    nlohmann::json args;
  };
  void record(char ph, std::string_view name, std::string_view cat, int64_t ts, int64_t dur,
              nlohmann::json args);
  uint32_t intern(std::string_view s);  // under mu_

  bool enabled_ = false;
  int pid_ = 0;
  size_t max_events_ = 0;
  std::chrono::steady_clock::time_point steady0_{};
  int64_t unix0_us_ = 0;
  mutable std::mutex mu_;
  std::deque<Event> events_;  // grows without moving what is recorded
  std::vector<std::string> strings_;
  std::unordered_map<std::string, uint32_t> string_ids_;
  std::vector<std::pair<int, std::string>> thread_names_;  // tid -> name, by first appearance
  size_t dropped_ = 0;
};

// Records a complete event covering its own lifetime (construction to destruction), on the
// constructing thread. With a null or disabled tracer it reads no clock and records nothing.
// `name` and `cat` must outlive the scope (string literals, usually).
class TraceScope {
 public:
  TraceScope(Tracer* t, std::string_view name, std::string_view cat)
      : t_(t != nullptr && t->enabled() ? t : nullptr), name_(name), cat_(cat) {
    if (t_) t0_ = t_->now_us();
  }
  TraceScope(Tracer& t, std::string_view name, std::string_view cat) : TraceScope(&t, name, cat) {}
  ~TraceScope() {
    if (t_) t_->complete(name_, cat_, t0_, t_->now_us() - t0_, args_ ? std::move(*args_) : nullptr);
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;
  // Details for the event (e.g. bytes, bucket index); ignored when disabled.
  void set_args(nlohmann::json args) {
    if (t_) args_ = std::move(args);
  }

 private:
  Tracer* t_;
  std::string_view name_, cat_;
  int64_t t0_ = 0;
  std::optional<nlohmann::json> args_;  // engaged only by set_args on an enabled tracer
};

// "run/trace.json" for rank r of a multi-process run: "run/trace.rank-<r>.json" (the files that
// merge_trace_files joins).
std::string rank_trace_path(const std::string& path, int rank);
// A failed run's part of rank r, named apart from a finished run's (which the next run's merge
// would take): "run/trace.failed.rank-<r>.json".
std::string failed_rank_trace_path(const std::string& path, int rank);
// Whether `name` (a file name, no folder) is one of the parts above of `path`, for any rank.
bool is_rank_trace_name(const std::string& path, const std::string& name);
// Whether the file at `path` is a trace Tracer::write or merge_trace_files wrote (its first 4 KiB
// hold the "producer": "dtrain" mark): a file a run may replace as its own part.
bool is_dtrain_trace_file(const std::string& path);

// Joins trace files (written by Tracer::write, or any {"traceEvents":[...]} file) into one at
// `out`, written atomically. Throws UserError naming the file that is missing or not a trace.
void merge_trace_files(const std::vector<std::string>& inputs, const std::string& out);

}  // namespace dtrain
