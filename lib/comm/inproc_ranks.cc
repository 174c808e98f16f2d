#include "comm/inproc_ranks.h"

#include <memory>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <vector>

#include "comm/inproc.h"

namespace dtrain {

void run_inproc_ranks(int world, const CommOptions& opts,
                      const std::function<void(Communicator&)>& body, const std::string& advice) {
  auto transports = make_inproc_group(world);
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<std::thread> threads;
  // (reserved: a vector growing while ranks run could throw with joinable threads in it)
  comms.reserve(static_cast<size_t>(world));
  threads.reserve(static_cast<size_t>(world));
  auto stop_started = [&](int r) {
    for (auto& c : comms) c->abort("could not start rank " + std::to_string(r));
    for (auto& t : threads) t.join();
  };
  auto cannot_start = [&](int r, const std::exception& e) {
    stop_started(r);
    return std::runtime_error("cannot start " + std::to_string(world) + " in-process ranks: rank " +
                              std::to_string(r) + "'s thread could not be created (" + e.what() +
                              ": the address-space limit, ulimit -v, or the process limit, "
                              "ulimit -u, leaves no room for it); " +
                              advice);
  };
  for (int r = 0; r < world; ++r) {
    try {
      comms.push_back(
          std::make_unique<Communicator>(std::move(transports[static_cast<size_t>(r)]), opts));
    } catch (const std::system_error& e) {
      throw cannot_start(r, e);
    } catch (...) {  // (bad_alloc: as it is, which main reports as out of memory)
      stop_started(r);
      throw;
    }
  }
  for (int r = 0; r < world; ++r) {
    try {
      threads.emplace_back([&body, &comm = *comms[static_cast<size_t>(r)]] { body(comm); });
    } catch (const std::system_error& e) {
      throw cannot_start(r, e);
    } catch (...) {
      stop_started(r);
      throw;
    }
  }
  for (auto& t : threads) t.join();
}

}  // namespace dtrain
