// The in-process transport: the ranks of a job are threads of one process (AiDotNet's
// InMemoryCommunicationBackend). A shared hub holds one mailbox (comm/mailbox.h) per ordered
// rank pair; send() copies the payload into the destination's mailbox, or straight into its
// posted receive, and returns; recv() waits for the keyed message and copies it out
// (recv_reduce reduces straight from the mailbox: one copy per hop, not two).
#pragma once

#include <memory>
#include <vector>

#include "comm/transport.h"

namespace dtrain {

// Creates the `world` connected transports of one in-process job; transport r is rank r. Each
// is used by its own thread. abort() on any of them fails the whole group (a rank that dies
// must not leave the others waiting for the deadline).
std::vector<std::unique_ptr<Transport>> make_inproc_group(int world);

}  // namespace dtrain
