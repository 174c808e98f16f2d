#pragma once
// Why a rendezvous through MASTER_ADDR may not have come together, for the message of its
// timeout: the name does not resolve, or rank 0 -- which serves the rendezvous on its own host --
// was given an address of another host. Only a hint: behind a forwarding address (a Kubernetes
// service's cluster IP) rank 0 reaches itself through an address that is not its own.

#include <string>

namespace dtrain {

// "" when nothing looks wrong; else one clause ("MASTER_ADDR 'x' does not resolve (...)").
// `serving`: the caller is rank 0. Resolves the name (DNS): call it only on a failure path.
std::string master_addr_problem(const std::string& master_addr, bool serving);

}  // namespace dtrain
