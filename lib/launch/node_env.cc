#include "launch/node_env.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cctype>

#include "launch/dist_env.h"
#include "util/check.h"
#include "util/strings.h"

namespace dtrain {

namespace {

using Env = std::map<std::string, std::string>;

// A value and where it came from.
struct Src {
  int value = 0;
  std::string from;
};

// flag > each variable in order > fallback.
Src pick(const std::optional<int>& flag, const std::string& flag_name, const Env& env,
         std::initializer_list<const char*> vars, Src fallback) {
  if (flag) return {*flag, flag_name};
  for (const char* v : vars)
    if (const auto it = env.find(v); it != env.end()) return {parse_env_int(it->second, v), v};
  return fallback;
}

std::string show(const Src& s) {
  return s.from + "=" + std::to_string(s.value);
}

// Why the other nodes cannot dial `host` as node 0's address: "a loopback address" (localhost
// and *.localhost in any case, 127/8, ::1, ::ffff:127/104, in any spelling inet_aton and
// inet_pton read), "the wildcard address" (0.0.0.0, ::: a listener's "every interface", which a
// dialling node takes for itself), or "". (A name that resolves to loopback is not looked up.)
std::string not_node0_address(std::string host) {
  host = ascii_lower(host);
  if (host == "localhost" || host == "localhost." || host.ends_with(".localhost") ||
      host.ends_with(".localhost."))
    return "a loopback address";
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  // (a root's trailing dot: the resolver reads "127.0.0.1." as 127.0.0.1, inet_aton does not)
  if (host.size() >= 2 && host.back() == '.') host.pop_back();
  in_addr v4{};
  in6_addr v6{};
  // (inet_aton, not inet_pton: it reads every IPv4 spelling the resolver does -- 127.1, 0,
  // 2130706433, 0x7f.1)
  if (::inet_aton(host.c_str(), &v4) != 0) {
    const uint32_t a = ntohl(v4.s_addr);
    if (a == 0) return "the wildcard address";
    return (a >> 24) == 127 ? "a loopback address" : "";
  }
  if (::inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_UNSPECIFIED(&v6)) return "the wildcard address";
    if (IN6_IS_ADDR_LOOPBACK(&v6) || (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127))
      return "a loopback address";
  }
  return "";
}

}  // namespace

NodeEnv resolve_node_env(const Env& env, const NodeOverrides& flags, int default_nproc) {
  const Src nnodes = pick(flags.nnodes, "--nnodes", env, {"PET_NNODES"}, {1, "default"});
  // With one node the ranks meet on loopback and nothing in the environment about other nodes
  // applies: a MASTER_PORT of Kubernetes' service links ("tcp://10.96.0.12:29500") or an Indexed
  // Job's JOB_COMPLETION_INDEX (a sweep of one-node jobs) is not read, let alone refused.
  const bool one_node = nnodes.value == 1;
  const Env none;
  const Src node_rank =
      one_node ? pick(flags.node_rank, "--node-rank", env, {"PET_NODE_RANK"}, {0, "default"})
               : pick(flags.node_rank, "--node-rank", env,
                      {"PET_NODE_RANK", "JOB_COMPLETION_INDEX"}, {0, "default"});
  const Src per = pick(flags.nproc_per_node, "--nproc-per-node", env, {"PET_NPROC_PER_NODE"},
                       {default_nproc, "--nproc"});
  Src port = pick(flags.master_port, "--master-port", one_node ? none : env,
                  {"PET_MASTER_PORT", "MASTER_PORT"}, {0, "default"});
  std::string addr = "127.0.0.1", addr_from = "default";
  if (flags.master_addr) {
    addr = *flags.master_addr;
    addr_from = "--master-addr";
  } else if (!one_node) {
    for (const char* v : {"PET_MASTER_ADDR", "MASTER_ADDR"})
      if (const auto it = env.find(v); it != env.end()) {
        addr = it->second;
        addr_from = v;
        break;
      }
  }

  if (nnodes.value < 1 || nnodes.value > 1024)
    throw UserError(show(nnodes) + ": the node count must be in 1..1024");
  if (node_rank.value < 0 || node_rank.value >= nnodes.value)
    throw UserError(show(node_rank) + " is out of range: node ranks are 0.." +
                    std::to_string(nnodes.value - 1) + " for " +
                    (nnodes.from == "default" ? std::string("one node (the default; give --nnodes)")
                                              : show(nnodes)));
  if (per.value < 1 || per.value > 1024)
    throw UserError(show(per) + ": the ranks per node must be in 1..1024");
  if (port.from != "default" && (port.value < 1 || port.value > 65535))
    throw UserError(show(port) + " is not a TCP port (1..65535)");
  if (addr.empty()) throw UserError(addr_from + " is empty");
  if (const std::string why = master_addr_problem(addr);
      !why.empty() && nnodes.value * per.value > 1)  // (one rank meets nobody)
    throw UserError(addr_from + " '" + addr + "' " + why);
  if (nnodes.value > 1) {
    if (const std::string why = not_node0_address(addr); addr_from == "default" || !why.empty())
      throw UserError(
          show(nnodes) + ": give --master-addr, the host of node 0 as every node " + "reaches it" +
          (addr_from == "default" ? "" : " (" + addr_from + "='" + addr + "' is " + why + ")"));
    if (port.from == "default")
      throw UserError(show(nnodes) +
                      ": give --master-port, the port of rank 0's rendezvous on node 0 (the "
                      "launchers use it and the next one)");
    if (port.value > 65534)
      throw UserError(show(port) + ": the launchers use the next port too; give one below 65535");
  }

  NodeEnv n;
  if (nnodes.value == 1) {
    // One node: the ranks meet on loopback, as before multi-node existed; a MASTER_PORT left in
    // the environment (inside an srun, say) does not pin the port, only the flag does.
    addr = "127.0.0.1";
    if (!flags.master_port) port = {0, "default"};
  }
  n.nnodes = nnodes.value;
  n.node_rank = node_rank.value;
  n.nproc_per_node = per.value;
  n.master_addr = addr;
  n.master_port = port.from == "default" ? 0 : port.value;
  n.nnodes_from = nnodes.from;
  n.node_rank_from = node_rank.from;
  return n;
}

RankRange parse_rank_range(const std::string& text, const std::string& flag) {
  auto bad = [&](const std::string& why) { return UserError(flag + " '" + text + "': " + why); };
  const size_t colon = text.find(':');
  RankRange r;
  try {
    if (colon == std::string::npos) {
      r.min = r.max = parse_env_int(text, flag);
    } else {
      r.min = parse_env_int(text.substr(0, colon), flag + " (the minimum)");
      r.max = parse_env_int(text.substr(colon + 1), flag + " (the maximum)");
    }
  } catch (const UserError& e) {
    throw bad("not N or MIN:MAX (" + std::string(e.what()) + ")");
  }
  if (r.min < 1 || r.max > 1024 || r.min > r.max) throw bad("need 1 <= MIN <= MAX <= 1024");
  return r;
}

}  // namespace dtrain
