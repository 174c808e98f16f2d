#include "launch/error_file.h"

#include <charconv>
#include <chrono>
#include <cstdlib>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "util/fs.h"

namespace dtrain {

namespace {

// A record holds at most 64 KiB of message (write_error_file): anything far larger is no record.
constexpr uint64_t kMaxRecordBytes = 1 << 20;

// Each occurrence of `before` in `text` followed by a rank number (digits only, in [0, world) when
// world > 0) and then `then` (when given): (where `before` starts, the rank), in order.
std::vector<std::pair<size_t, int>> ranks_after(std::string_view text, std::string_view before,
                                                int world, std::string_view then = {}) {
  std::vector<std::pair<size_t, int>> out;
  for (size_t at = text.find(before); at != std::string_view::npos;
       at = text.find(before, at + 1)) {
    const char* b = text.data() + at + before.size();
    const char* e = text.data() + text.size();
    int r = -1;
    const auto [p, ec] = std::from_chars(b, e, r);
    if (ec != std::errc() || p == b || r < 0 || (world > 0 && r >= world)) continue;
    if (!then.empty() &&
        std::string_view(p, static_cast<size_t>(e - p)).substr(0, then.size()) != then)
      continue;
    out.emplace_back(at, r);
  }
  return out;
}

}  // namespace

int rank_named_as_cause(const std::string& message, int self, int world) {
  const std::string_view text = std::string_view(message).substr(0, 8192);
  const auto other = [self](const std::vector<std::pair<size_t, int>>& v, bool last) {
    int found = -1;
    for (const auto& [at, r] : v)
      if (r != self) {
        found = r;
        if (!last) break;
      }
    return found;
  };
  // The transport's verdict on who went down first, then a relayed abort (the innermost other
  // rank's), then what this rank saw of another (the leftmost such phrase: dtrain's own
  // wordings, lib/comm and lib/train/loop_save.cc).
  if (const int r = other(ranks_after(text, "rank ", world, " went down first"), false); r >= 0)
    return r;
  const auto aborts = ranks_after(text, "rank ", world, " aborted: ");
  if (const int r = other(aborts, true); r >= 0) {
    // The abort's own reason, read as rank r's error: when it names this rank (r timed out
    // waiting for this one, say, and aborted the job), this rank is the cause, not r.
    size_t at = 0;
    for (const auto& [a, ar] : aborts)
      if (ar == r) at = a;
    const size_t reason = text.find(" aborted: ", at);
    if (reason != std::string_view::npos &&
        rank_named_as_cause(std::string(text.substr(reason + 10)), r, world) == self)
      return -1;
    return r;
  }
  int best = -1;
  size_t best_at = std::string_view::npos;
  const std::pair<std::string_view, std::string_view> phrases[] = {
      // The rendezvous's refusals (comm/rendezvous/rendezvous.cc join_refusal), which every rank
      // reports: the refused rank is the one unlike the job (another config, world size, build).
      {"rank ", " has config hash"},
      {"rank ", "'s run plan differs"},
      {"rank ", " says the world size is"},
      {"rank ", " speaks wire protocol"},
      {"rank ", " sent no listen address"},
      {"rank ", " sent TCP data port"},
      {"rank ", " failed to write its shard"},
      {"connection to rank ", " lost"},
      {"connection to rank ", " is closed"},
      {"rank ", " closed its connection"},
      {"rank ", " did not open their streams"},  // (one rank; several name no single cause)
      {"no heartbeat from rank ", ""},
      {"cannot connect to rank ", ""},
      {" from rank ", ""}};
  for (const auto& [before, then] : phrases)
    for (const auto& [at, r] : ranks_after(text, before, world, then))
      if (r != self && at < best_at) {
        best = r;
        best_at = at;
        break;  // (in order: the first of this phrase is its leftmost)
      }
  return best;
}

namespace {
void write_error_record(const std::string& path, const std::string& message, int exit_code,
                        int rank, int world) {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  nlohmann::json j;
  j["message"]["message"] = message;
  j["message"]["extraInfo"]["timestamp"] =
      std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now).count());
  // (no "py_callstack": torchrun's failure summary shows it in place of the message when present;
  // a message that is not UTF-8 is replaced, not thrown on)
  j["dtrain"] = {{"rank", rank},
                 {"exit_code", exit_code},
                 {"caused_by_rank", rank_named_as_cause(message, rank, world)}};
  write_file_atomic(path, j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}
}  // namespace

void write_error_file(const char* path, std::string_view message, int exit_code, int rank,
                      int world) noexcept {
  if (path == nullptr || *path == '\0') return;
  try {
    write_error_record(path, std::string(message.substr(0, 65536)), exit_code, rank, world);
  } catch (...) {  // (out of memory, a full disk: the error is on stderr already)
  }
}

std::optional<RankErrorRecord> read_error_file(const std::string& path) {
  try {
    const nlohmann::json j = nlohmann::json::parse(read_regular_file(path, kMaxRecordBytes));
    RankErrorRecord r;
    r.message = j.at("message").at("message").get<std::string>();
    if (j.contains("dtrain")) {
      r.exit_code = j["dtrain"].value("exit_code", 1);
      r.caused_by = j["dtrain"].value("caused_by_rank", -1);
    }
    return r;
  } catch (const std::exception&) {  // (missing, not a regular file, or not such a record)
    return std::nullopt;
  }
}

std::string rank_log_path(const std::string& log_dir, int rank) {
  return log_dir + "/rank-" + std::to_string(rank) + ".log";
}

std::string rank_error_path(const std::string& log_dir, int rank) {
  return log_dir + "/rank-" + std::to_string(rank) + ".error.json";
}

void publish_parent_error(const std::string& record) {
  const char* parent = std::getenv(kErrorFileEnv);
  if (parent == nullptr || *parent == '\0' || record.empty()) return;
  try {
    write_file_atomic(parent, read_regular_file(record, kMaxRecordBytes));
  } catch (const std::exception&) {  // (best effort: the launcher's own log has the cause)
  }
}

}  // namespace dtrain
