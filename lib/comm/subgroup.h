// A group of ranks inside a job, as a Transport of its own: collectives over it involve only
// the group's members (a pipeline stage's data-parallel replicas). It forwards to the parent
// transport with ranks mapped to world ranks and channels tagged with the group id, so the
// group's messages never mix with the world's or another group's; the parent's byte counters
// include the group's traffic.
//
// Lifetime: the parent (owned by the world communicator) must outlive the group transport and
// any communicator built on it. Thread-safety as the parent's.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/transport.h"

namespace dtrain {

// members: world ranks, ascending, including the parent's own rank. group_id < 2^20, unique among
// the groups a rank belongs to.
std::unique_ptr<Transport> make_subgroup_transport(Transport& parent, std::vector<int> members,
                                                   uint32_t group_id);

}  // namespace dtrain
