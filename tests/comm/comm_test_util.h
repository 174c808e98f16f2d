// Running one communicator per rank on threads, over the in-process or the gRPC backend, for
// the comm suites.
#pragma once

#include <doctest/doctest.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "callback_queue.h"
#include "comm/communicator.h"
#include "comm/grpc_transport.h"
#include "comm/inproc.h"
#include "test_util.h"

namespace dtrain::testing {

// Runs fn(comm) on `world` threads, one rank each, over the in-process or the gRPC backend
// (every rank its own server on loopback, joined through a rendezvous): "grpc" moves data on
// the gRPC streams only, "tcp" on the TCP data path, "shm" through the same-host shared-memory
// path. Returns each rank's
// error text ("" when it succeeded).
inline std::vector<std::string> run_ranks(int world, const std::function<void(Communicator&)>& fn,
                                          CommOptions opts = {},
                                          const std::string& backend = "inproc",
                                          double heartbeat_s = 10) {
  std::vector<std::unique_ptr<Transport>> transports;
  if (backend == "inproc") transports = make_inproc_group(world);
  transports.resize(static_cast<size_t>(world));
  const bool grpc = backend == "grpc" || backend == "tcp" || backend == "shm";
  const int port = grpc ? free_port() : 0;
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  if (grpc) grpc_test::keep_callback_queue();
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        if (grpc) {
          GrpcOptions g;
          g.shm = backend == "shm";
          g.tcp = backend == "tcp";
          g.rank = r;
          g.world_size = world;
          g.master_port = port;
          g.token = "collectives-test";
          g.config_hash = "c0ffee";
          g.rendezvous_timeout_s = 60;
          g.heartbeat_s = heartbeat_s;
          transports[static_cast<size_t>(r)] = connect_grpc(g);
        }
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = std::string("connect: ") + e.what();
        return;
      }
      Communicator comm(std::move(transports[static_cast<size_t>(r)]), opts);
      try {
        fn(comm);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
        comm.abort(e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

inline void require_ok(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r)
    REQUIRE_MESSAGE(errors[r].empty(), "rank ", r, ": ", errors[r]);
}

}  // namespace dtrain::testing
