#include "launch/check_in.h"

#include <algorithm>
#include <cstring>
#include <sstream>

namespace dtrain::launch_detail {

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

}  // namespace dtrain::launch_detail
