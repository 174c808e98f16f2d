// Fault injection for tests and drills: DTRAIN_FAULT, off unless set. A comma-separated list of
// faults, each KIND followed by :KEY=VALUE fields:
//   kill:rank=R:step=S          the process of rank R dies by SIGKILL when it completes step S
//   kill_in_save:rank=R:step=S  rank R dies by SIGKILL after writing its shard of the sharded
//                               checkpoint of step S, before the manifest (a crash mid-save)
//   nan:rank=R:step=S           a NaN enters rank R's gradient while it computes step S
// A malformed value is a UserError naming the entry.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain {

struct Fault {
  std::string kind;   // kill | kill_in_save | nan
  int64_t rank = -1;  // which rank (required)
  int64_t step = -1;  // at which step (required)
};

std::vector<Fault> parse_faults(const std::string& spec);

// True when `faults` holds `kind` for this rank and step.
bool fault_due(const std::vector<Fault>& faults, const std::string& kind, int rank, int64_t step);

// Kills this process with SIGKILL (no cleanup, like a machine failure), after logging why.
[[noreturn]] void die_by_fault(const std::string& what);

}  // namespace dtrain
