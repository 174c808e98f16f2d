#pragma once
// Why a rendezvous through MASTER_ADDR may not have come together, for the message of its
// timeout: the name does not resolve, or rank 0 -- which serves the rendezvous on its own host --
// was given an address of another host. Only a hint: behind a forwarding address (a Kubernetes
// service's cluster IP) rank 0 reaches itself through an address that is not its own.

#include <string>

namespace dtrain {

// "" when nothing looks wrong; else one clause ("MASTER_ADDR 'x' does not resolve (...)").
// `serving`: the caller is rank 0 (or node 0's launcher). Resolves the name (DNS): call it on a
// failure path, or once at a start.
std::string master_addr_problem(const std::string& master_addr, bool serving);

// Why rank 0 cannot listen on `host` (what it binds: a wildcard such as "0.0.0.0" or "::", an
// address, or a loopback name such as localhost, resolved here) port `port`, found by listening
// on each of its addresses once more as gRPC does (SO_REUSEADDR, dual-stack): "port 29500 is
// taken on this host by another process (...)", "... is not an address of this host", ...; ""
// when every such listen succeeds (the cause is gone, or is not the port).
std::string listen_problem(const std::string& host, int port);

// For a rank whose rendezvous timed out without rank 0 ever answering: whether anything listens
// at host:port (one TCP connect, at most 2 s): "nothing listens at h:p (...)" or "something
// listens at h:p but never answered as a dtrain rendezvous (...)"; "" when it cannot tell.
std::string rendezvous_port_problem(const std::string& host, int port);

}  // namespace dtrain
