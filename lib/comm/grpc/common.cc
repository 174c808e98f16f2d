#include "comm/grpc/common.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "comm/grpc_internal.h"
#include "util/duration.h"

namespace dtrain::grpc_detail {

std::string strip_brackets(const std::string& host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    return host.substr(1, host.size() - 2);
  return host;
}

std::string host_port(const std::string& host, int port) {
  const std::string h = strip_brackets(host);
  if (h.find(':') != std::string::npos) return fmt::format("[{}]:{}", h, port);
  return fmt::format("{}:{}", h, port);
}

bool is_wildcard(const std::string& host) {
  const std::string h = strip_brackets(host);
  return h.empty() || h == "0.0.0.0" || h == "::";
}

bool token_equal(std::string_view expected, std::string_view got) {
  unsigned char diff = expected.size() == got.size() ? 0 : 1;
  const volatile char* g = got.data();
  for (size_t i = 0; i < expected.size(); ++i) {
    const char c = i < got.size() ? g[i] : 0;
    diff |= static_cast<unsigned char>(expected[i] ^ c);
  }
  return diff == 0;
}

bool authorized(const grpc::CallbackServerContext* ctx, const std::string& token,
                std::string_view who, const char* what) {
  const auto& md = ctx->client_metadata();
  const auto it = md.find(kGrpcTokenKey);
  const std::string_view got =
      it == md.end() ? std::string_view() : std::string_view(it->second.data(), it->second.size());
  if (token_equal(token, got)) return true;
  spdlog::warn("{}: refused {} from {}: {} job token", who, what, ctx->peer(),
               it == md.end() ? "missing" : "wrong");
  return false;
}

std::chrono::system_clock::time_point wall(Clock::time_point t) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(t - Clock::now());
}

Clock::duration secs_dur(double s) {
  return seconds_duration(s);
}

std::string seconds_str(double s) {
  return fmt::format("{:.3g}", s);
}

std::string ranks_str(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

std::string status_str(const grpc::Status& s) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  const int code = static_cast<int>(s.error_code());
  const char* name = code >= 0 && code <= 16 ? kNames[code] : "UNKNOWN";
  return s.error_message().empty() ? name : fmt::format("{}: {}", name, s.error_message());
}

}  // namespace dtrain::grpc_detail
