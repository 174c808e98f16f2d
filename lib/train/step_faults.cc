#include "train/step_faults.h"

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include <spdlog/spdlog.h>

namespace dtrain {

void apply_step_faults(const std::vector<Fault>& faults, int rank, int64_t step,
                       Communicator& comm) {
  if (faults.empty()) return;
  const std::string where =
      "rank " + std::to_string(rank) + " reached step " + std::to_string(step);
  if (fault_due(faults, "kill", rank, step)) die_by_fault(where);
  if (fault_due(faults, "drop", rank, step)) {
    const std::string why = "DTRAIN_FAULT: drop: " + where + ": closing its connections";
    spdlog::error("{}", why);
    comm.abort(why);
    throw std::runtime_error(why);
  }
  if (const int64_t ms = fault_delay_ms(faults, rank); ms > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

}  // namespace dtrain
