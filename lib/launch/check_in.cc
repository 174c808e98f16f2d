#include "launch/check_in.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "comm/grpc/common.h"
#include "comm/transport.h"

namespace dtrain::launch_detail {

using Clock = std::chrono::steady_clock;

namespace {

constexpr char kProtocolTag[] = ",launch-protocol=";

// A job shape's protocol ("1" when it names none) and its options without it.
std::string shape_protocol(const std::string& shape) {
  const auto at = shape.find(kProtocolTag);
  if (at == std::string::npos) return "1";
  const auto from = at + std::strlen(kProtocolTag);
  return shape.substr(from, shape.find(',', from) - from);  // (up to a later option, if any)
}
std::string shape_options(const std::string& shape) {
  return shape.substr(0, shape.find(kProtocolTag));
}

}  // namespace

std::string job_shape(const AgentOptions& o) {
  const std::string nodes = o.min_nodes > 0
                                ? std::to_string(o.min_nodes) + ":" + std::to_string(o.nnodes)
                                : std::to_string(o.nnodes);
  return "--nnodes=" + nodes + ",--max-restarts=" + std::to_string(o.max_restarts) + kProtocolTag +
         std::to_string(kLaunchProtocol);
}

CheckIn parse_check_in(const std::string& v) {
  CheckIn c;
  std::istringstream in(v);
  in >> c.per >> c.shape >> std::ws;
  std::getline(in, c.host);
  return c;
}

std::string check_in_problem(int n, const CheckIn& c, int nproc_per_node, const std::string& shape,
                             const std::string& self) {
  const auto shown = [](std::string s) {
    std::replace(s.begin(), s.end(), ',', ' ');
    std::replace(s.begin(), s.end(), '=', ' ');
    return s;
  };
  if (shape_protocol(c.shape) != shape_protocol(shape))
    return "node " + std::to_string(n) + " (" + c.host + ") runs another dtrain (its launch " +
           "protocol " + shape_protocol(c.shape) + ", " + self + "'s " + shape_protocol(shape) +
           "): run the same dtrain on every node";
  if (c.per != nproc_per_node)
    return "node " + std::to_string(n) + " (" + c.host + ") runs " + std::to_string(c.per) +
           " rank(s) per node, " + self + " " + std::to_string(nproc_per_node) +
           ": give every node the same --nproc-per-node";
  if (c.shape != shape)
    return "node " + std::to_string(n) + " (" + c.host + ") was started with " +
           shown(shape_options(c.shape)) + ", " + self + " with " + shown(shape_options(shape)) +
           ": give every node's launcher the same --nnodes and --max-restarts";
  return "";
}

std::string fmt_ids(const std::vector<int>& ids) {
  std::string s;
  for (int n : ids) s += (s.empty() ? "" : ", ") + std::to_string(n);
  return s;
}

std::map<int, std::string> gather_check_ins(Store& s, const AgentOptions& o, int attempt,
                                            const std::vector<int>& expected,
                                            Clock::time_point deadline,
                                            const std::function<std::string(int)>& join_key,
                                            const std::function<std::string()>& hint) {
  std::map<int, std::string> joined;
  std::optional<Clock::time_point> min_at;
  for (;;) {
    for (int n = 0; n < o.nnodes; ++n)
      if (!joined.count(n)) try {
          joined[n] = s.get(join_key(n), Clock::now());
        } catch (const CommError&) {
        }
    std::vector<int> ids;
    for (const auto& kv : joined) ids.push_back(kv.first);
    const auto now = Clock::now();
    if (!min_at && static_cast<int>(ids.size()) >= o.min_nodes) min_at = now;
    const double since_min = min_at ? std::chrono::duration<double>(now - *min_at).count() : -1.0;
    if (close_check_in(ids, expected, o.min_nodes, o.nnodes, since_min, o.last_call_s,
                       o.lost_after_s))
      return joined;
    // The check-in's time is up with enough nodes in: the attempt starts with them (a last call
    // longer than the join timeout ended in "only 1 node(s) checked in ..., at least 1 needed").
    if (now >= deadline && static_cast<int>(ids.size()) >= o.min_nodes && ids.size() > 0 &&
        ids.front() == 0)
      return joined;
    if (now >= deadline) {
      std::vector<int> missing;
      for (int n = 0; n < o.nnodes; ++n)
        if (!joined.count(n)) missing.push_back(n);
      throw std::runtime_error("only " + std::to_string(ids.size()) + " node(s) (" + fmt_ids(ids) +
                               ") checked in for attempt " + std::to_string(attempt + 1) +
                               " within " + grpc_detail::seconds_str(o.join_timeout_s) +
                               " s, at least " + std::to_string(o.min_nodes) +
                               " needed (missing: " + fmt_ids(missing) + ")" + hint());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace dtrain::launch_detail
