// Small helpers of the gRPC transport's parts: addresses, deadlines, statuses, number formats.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::grpc_detail {

using Clock = std::chrono::steady_clock;

std::string strip_brackets(const std::string& host);
// "host:port", bracketing IPv6 literals.
std::string host_port(const std::string& host, int port);
bool is_wildcard(const std::string& host);
// Constant-time in the content of `got` (the time depends only on the lengths), so a client
// cannot find the token byte by byte.
bool token_equal(std::string_view expected, std::string_view got);
// True when ctx carries the job token; otherwise logs a warning "<who>: refused <what> from
// <peer>" (who: "rank 3", "node 0's launcher").
bool authorized(const grpc::CallbackServerContext* ctx, const std::string& token,
                std::string_view who, const char* what);
// gRPC takes system_clock deadlines only.
std::chrono::system_clock::time_point wall(Clock::time_point t);
Clock::duration secs_dur(double s);
// Three significant digits: a deadline computed a moment before the call reads "0.5", not
// "0.499993".
std::string seconds_str(double s);
// "rank 2" | "ranks 1, 3".
std::string ranks_str(const std::vector<int>& ranks);
// "UNAVAILABLE: failed to connect".
std::string status_str(const grpc::Status& s);

}  // namespace dtrain::grpc_detail
