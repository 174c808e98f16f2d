#include "launch/error_file.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

namespace dtrain {

int rank_named_as_cause(const std::string& message, int self) {
  // A relayed abort first: its innermost relay is the rank that gave up on its own.
  static const std::regex aborted(R"(rank (\d+) aborted: )");
  int named = -1;
  for (auto it = std::sregex_iterator(message.begin(), message.end(), aborted);
       it != std::sregex_iterator(); ++it)
    named = std::stoi((*it)[1].str());
  if (named < 0) {
    // What this rank saw of another: the first such phrase (dtrain's own wording, lib/comm and
    // lib/train/loop_save.cc).
    static const std::regex peer(
        R"(rank (\d+) failed to write its shard|connection to rank (\d+) (?:lost|is closed))"
        R"(|rank (\d+) closed its connection|no heartbeat from rank (\d+))"
        R"(|cannot connect to rank (\d+)|waiting for .* from rank (\d+))");
    std::smatch m;
    if (std::regex_search(message, m, peer))
      for (size_t g = 1; g < m.size(); ++g)
        if (m[g].matched) {
          named = std::stoi(m[g].str());
          break;
        }
  }
  return named == self ? -1 : named;
}

void write_error_file(const std::string& path, const std::string& message, int exit_code,
                      int rank) {
  if (path.empty()) return;
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  nlohmann::json j;
  j["message"]["message"] = message;
  j["message"]["extraInfo"]["timestamp"] =
      std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now).count());
  j["message"]["extraInfo"]["py_callstack"] = "";
  j["dtrain"] = {{"rank", rank},
                 {"exit_code", exit_code},
                 {"caused_by_rank", rank_named_as_cause(message, rank)}};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::trunc);
    // (a message that is not UTF-8 is replaced, not thrown on: the record is best effort)
    f << j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    if (!f.flush()) {
      std::remove(tmp.c_str());
      return;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) std::remove(tmp.c_str());
}

std::optional<RankErrorRecord> read_error_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) return std::nullopt;
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    const nlohmann::json j = nlohmann::json::parse(ss.str());
    RankErrorRecord r;
    r.message = j.at("message").at("message").get<std::string>();
    if (j.contains("dtrain")) {
      r.exit_code = j["dtrain"].value("exit_code", 1);
      r.caused_by = j["dtrain"].value("caused_by_rank", -1);
    }
    return r;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

}  // namespace dtrain
