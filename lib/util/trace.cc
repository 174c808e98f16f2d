#include "util/trace.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>

#include <spdlog/spdlog.h>

#include "util/check.h"
#include "util/fs.h"

namespace dtrain {

namespace {

// Small per-thread ids shared by all tracers of the process, so one thread is one track.
int this_thread_tid() {
  static std::atomic<int> next{1};
  thread_local const int tid = next.fetch_add(1, std::memory_order_relaxed);
  return tid;
}

nlohmann::json metadata(const char* what, int pid, int tid, nlohmann::json args) {
  return {{"ph", "M"}, {"name", what}, {"pid", pid}, {"tid", tid}, {"args", std::move(args)}};
}

}  // namespace

Tracer::Tracer(bool enabled, int pid, size_t max_events)
    : enabled_(enabled),
      pid_(pid),
      max_events_(max_events),
      steady0_(std::chrono::steady_clock::now()),
      unix0_us_(std::chrono::duration_cast<std::chrono::microseconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count()) {}

int64_t Tracer::now_us() const {
  return unix0_us_ + std::chrono::duration_cast<std::chrono::microseconds>(
                         std::chrono::steady_clock::now() - steady0_)
                         .count();
}

void Tracer::record(char ph, std::string_view name, std::string_view cat, int64_t ts, int64_t dur,
                    nlohmann::json args) {
  const int tid = this_thread_tid();
  std::lock_guard<std::mutex> lock(mu_);
  if (events_.size() >= max_events_) {
    // Said once, when it happens: the timeline stops here, the run goes on.
    if (dropped_++ == 0)
      spdlog::warn(
          "trace: rank {} has recorded {} events, the most a trace keeps per rank: later ones are "
          "counted (otherData.dropped_events), not kept, so its timeline ends here",
          pid_, max_events_);
    return;
  }
  bool known = false;
  for (const auto& tn : thread_names_) known = known || tn.first == tid;
  if (!known) thread_names_.emplace_back(tid, "thread " + std::to_string(tid));
  events_.push_back(Event{ts, dur, intern(name), intern(cat), tid, ph, std::move(args)});
}

uint32_t Tracer::intern(std::string_view s) {
  const auto [it, inserted] =
      string_ids_.try_emplace(std::string(s), static_cast<uint32_t>(strings_.size()));
  if (inserted) strings_.push_back(it->first);
  return it->second;
}

void Tracer::set_thread_name(std::string_view name) {
  if (!enabled_) return;
  const int tid = this_thread_tid();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& tn : thread_names_)
    if (tn.first == tid) {
      tn.second = std::string(name);
      return;
    }
  thread_names_.emplace_back(tid, std::string(name));
}

size_t Tracer::event_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.size();
}

size_t Tracer::dropped_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

namespace {

// Streams a trace file: the top-level object as nlohmann's dump() orders it (sorted keys:
// displayTimeUnit, otherData, traceEvents), so otherData's producer stays in the first bytes
// (is_dtrain_trace_file) and the file is byte for byte what one dump of the whole tree gives,
// without that tree: one event at a time, through a 1-MiB buffer.
class TraceStream {
 public:
  TraceStream(int fd, const nlohmann::json& other_data) : fd_(fd) {
    nlohmann::json head = {{"displayTimeUnit", "ms"},
                           {"otherData", other_data},
                           {"traceEvents", nlohmann::json::array()}};
    std::string text = head.dump();
    DT_CHECK(text.size() > 3 && text.compare(text.size() - 3, 3, "[]}") == 0);
    buf_ = text.substr(0, text.size() - 2);  // up to and with the events' '['
  }
  void event(const nlohmann::json& e) {
    if (!first_) buf_ += ',';
    first_ = false;
    buf_ += e.dump();
    if (buf_.size() >= (1u << 20)) flush();
  }
  void finish() {
    buf_ += "]}";
    flush();
  }
  // The bytes [begin, end) of `path`: events as event() writes them, joined by ',' (a dtrain
  // trace file's; see splice_trace). Copied through the buffer a MiB at a time.
  void raw_events(const std::string& path, uint64_t begin, uint64_t end) {
    if (begin == end) return;
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> in(std::fopen(path.c_str(), "rb"),
                                                       &std::fclose);
    if (!in || ::fseeko(in.get(), static_cast<off_t>(begin), SEEK_SET) != 0)
      throw UserError("cannot read trace '" + path + "': " + std::strerror(errno));
    if (!first_) buf_ += ',';
    first_ = false;
    std::string chunk(1 << 20, '\0');
    for (uint64_t at = begin; at < end;) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(chunk.size(), end - at));
      const size_t n = std::fread(chunk.data(), 1, want, in.get());
      if (n == 0)
        throw UserError("cannot read trace '" + path + "': " +
                        (std::ferror(in.get()) ? std::strerror(errno) : "it shrank while merged"));
      buf_.append(chunk.data(), n);
      at += n;
      if (buf_.size() >= (1u << 20)) flush();
    }
  }

 private:
  void flush() {
    write_all(fd_, buf_.data(), buf_.size(), "trace");
    buf_.clear();
  }
  int fd_;
  std::string buf_;
  bool first_ = true;
};

}  // namespace

nlohmann::json Tracer::to_json() const {
  nlohmann::json ev = nlohmann::json::array();
  for_each_event([&](const nlohmann::json& e) { ev.push_back(e); });
  return {{"traceEvents", std::move(ev)}, {"displayTimeUnit", "ms"}, {"otherData", other_data()}};
}

nlohmann::json Tracer::other_data() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {{"producer", "dtrain"}, {"rank", pid_}, {"dropped_events", dropped_}};
}

void Tracer::for_each_event(const std::function<void(const nlohmann::json&)>& f) const {
  std::lock_guard<std::mutex> lock(mu_);
  f(metadata("process_name", pid_, 0, {{"name", "rank " + std::to_string(pid_)}}));
  f(metadata("process_sort_index", pid_, 0, {{"sort_index", pid_}}));
  for (const auto& [tid, name] : thread_names_) {
    f(metadata("thread_name", pid_, tid, {{"name", name}}));
    f(metadata("thread_sort_index", pid_, tid, {{"sort_index", tid}}));
  }
  for (const Event& e : events_) {
    nlohmann::json j = {{"name", strings_[e.name]},
                        {"cat", strings_[e.cat]},
                        {"ph", std::string(1, e.ph)},
                        {"ts", e.ts},
                        {"pid", pid_},
                        {"tid", e.tid}};
    if (e.ph == 'X') j["dur"] = e.dur;
    if (e.ph == 'i') j["s"] = "t";
    if (!e.args.is_null()) j["args"] = e.args;
    f(j);
  }
}

void Tracer::write(const std::string& path) const {
  write_file_atomic_with(path, [&](int fd) {
    TraceStream out(fd, other_data());
    for_each_event([&](const nlohmann::json& e) { out.event(e); });
    out.finish();
  });
}

std::string rank_trace_path(const std::string& path, int rank) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  const std::string ext = p.has_extension() ? p.extension().string() : ".json";
  return (p.parent_path() / (p.stem().string() + ".rank-" + std::to_string(rank) + ext)).string();
}

std::string failed_rank_trace_path(const std::string& path, int rank) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  return rank_trace_path((p.parent_path() / (p.stem().string() + ".failed.json")).string(), rank);
}

bool is_rank_trace_name(const std::string& path, const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  const std::string stem = p.stem().string();
  const std::string ext = p.has_extension() ? p.extension().string() : ".json";
  // stem + infix + digits + suffix
  const auto matches = [&](const std::string& infix, const std::string& suffix) {
    const std::string head = stem + infix;
    if (name.size() <= head.size() + suffix.size() || name.compare(0, head.size(), head) != 0 ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      return false;
    for (size_t i = head.size(); i < name.size() - suffix.size(); ++i)
      if (name[i] < '0' || name[i] > '9') return false;
    return true;
  };
  return matches(".rank-", ext) || matches(".failed.rank-", ".json");
}

bool is_dtrain_trace_file(const std::string& path) {
  struct stat st {};
  // (a FIFO would block the open: only a regular file can be a trace)
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  char buf[4096];
  const size_t n = std::fread(buf, 1, sizeof buf, f);
  std::fclose(f);
  const std::string head(buf, n);
  return !head.empty() && head[0] == '{' &&
         head.find("\"producer\":\"dtrain\"") != std::string::npos;
}

namespace {

// One input of merge_trace_files, parsed (UserError when it is no trace).
nlohmann::json read_trace(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::parse_error& e) {
    throw UserError("'" + path + "' is not valid JSON: " + e.what());
  }
  // Chrome's format also allows a bare array of events.
  const bool events =
      j.is_array() || (j.is_object() && j.contains("traceEvents") && j["traceEvents"].is_array());
  if (!events) throw UserError("'" + path + "' is not a trace (no \"traceEvents\")");
  return j;
}

const nlohmann::json& trace_events(const nlohmann::json& j) {
  return j.is_array() ? j : j["traceEvents"];
}

}  // namespace

namespace {

// A rank's trace file as Tracer::write lays it out -- `{"displayTimeUnit":"ms","otherData":{..},
// "traceEvents":[` (the head), the events, `]}` -- read without parsing its events: the head's
// otherData, and where the events' bytes are. nullopt for a file laid out otherwise (another
// program's trace, an edited one), which the merge then parses whole.
struct SplicedTrace {
  nlohmann::json other;
  uint64_t begin = 0, end = 0;  // the events' bytes [begin, end): empty, or events joined by ','
};
std::optional<SplicedTrace> splice_trace(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return std::nullopt;
  std::string head(1 << 16, '\0');
  head.resize(std::fread(head.data(), 1, head.size(), f));
  std::fseek(f, 0, SEEK_END);
  const long size = std::ftell(f);
  char tail[2] = {0, 0};
  const bool tail_ok = size >= 2 && std::fseek(f, size - 2, SEEK_SET) == 0 &&
                       std::fread(tail, 1, 2, f) == 2 && tail[0] == ']' && tail[1] == '}';
  std::fclose(f);
  static constexpr char kPrefix[] = "{\"displayTimeUnit\":\"ms\",\"otherData\":";
  static constexpr char kEvents[] = ",\"traceEvents\":[";
  const size_t at = head.find(kEvents);
  if (!tail_ok || head.rfind(kPrefix, 0) != 0 || at == std::string::npos) return std::nullopt;
  SplicedTrace t;
  try {
    t.other = nlohmann::json::parse(head.substr(sizeof kPrefix - 1, at - (sizeof kPrefix - 1)));
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
  t.begin = at + sizeof kEvents - 1;
  t.end = static_cast<uint64_t>(size) - 2;
  // (a dtrain rank's part: another program's file of the same shape is parsed, not spliced)
  if (!t.other.is_object() || t.other.value("producer", "") != "dtrain" || t.begin > t.end)
    return std::nullopt;
  return t;
}

}  // namespace

void merge_trace_files(const std::vector<std::string>& inputs, const std::string& out) {
  // Each input once or twice, never whole in memory as a tree (a rank's 2M-event file of ~180 MB
  // is ~2 GB as one; parsing it to merge took a run's memory from 0.3 to 2 GB at its very end):
  // a dtrain rank's file is spliced -- its events' bytes copied as they are -- another program's
  // is parsed, one at a time. otherData, written first, is read first.
  nlohmann::json ranks = nlohmann::json::array();
  size_t dropped = 0;
  std::vector<std::optional<SplicedTrace>> spliced;
  const auto note = [&](const nlohmann::json& od) {
    if (od.contains("rank")) ranks.push_back(od["rank"]);
    if (od.contains("dropped_events") && od["dropped_events"].is_number_unsigned())
      dropped += od["dropped_events"].get<size_t>();
  };
  for (const auto& path : inputs) {
    spliced.push_back(splice_trace(path));
    if (spliced.back()) {
      note(spliced.back()->other);
      continue;
    }
    const nlohmann::json j = read_trace(path);
    if (j.is_object() && j.contains("otherData") && j["otherData"].is_object())
      note(j["otherData"]);
  }
  const nlohmann::json other = {
      {"producer", "dtrain"}, {"ranks", ranks}, {"dropped_events", dropped}};
  write_file_atomic_with(out, [&](int fd) {
    TraceStream stream(fd, other);
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (spliced[i]) {
        stream.raw_events(inputs[i], spliced[i]->begin, spliced[i]->end);
        continue;
      }
      const nlohmann::json j = read_trace(inputs[i]);
      for (const auto& e : trace_events(j)) stream.event(e);
    }
    stream.finish();
  });
}

}  // namespace dtrain
