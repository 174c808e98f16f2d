// Open MPI sets no master address: a multi-process Open MPI job must name rank 0's host itself
// (tests/engines runs the same through a real mpirun).
#include <doctest/doctest.h>

#include <map>
#include <string>

#include "launch/dist_env.h"
#include "test_util.h"
#include "util/check.h"

using dtrain::DistOverrides;
using dtrain::resolve_dist_env;
using dtrain::testing::contains;
using Env = std::map<std::string, std::string>;

namespace {

std::string error_of(const Env& env, const DistOverrides& flags = {}) {
  try {
    resolve_dist_env(env, 1, flags);
  } catch (const dtrain::UserError& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST_CASE("resolve_dist_env: an Open MPI job of 2+ processes needs MASTER_ADDR") {
  Env env = {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"MASTER_PORT", "6000"}};
  const std::string e = error_of(env);
  CHECK_MESSAGE(contains(e, "MASTER_ADDR is not set"), e);
  CHECK(contains(e, "the 2 processes"));
  CHECK(contains(e, "-x MASTER_ADDR="));
  // Without the port as well: still the address first, and the hint names both.
  env.erase("MASTER_PORT");
  CHECK(contains(error_of(env), "-x MASTER_PORT=<port>"));

  // Given by the variable or by the flag, it is used as is.
  env["MASTER_PORT"] = "6000";
  env["MASTER_ADDR"] = "head";
  CHECK(resolve_dist_env(env, 1, {}).master_addr == "head");
  env.erase("MASTER_ADDR");
  DistOverrides f;
  f.master_addr = "node7";
  CHECK(resolve_dist_env(env, 1, f).master_addr == "node7");

  // A 1-process Open MPI job has no peer to meet: no address needed.
  const Env one = {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}};
  CHECK(resolve_dist_env(one, 1, {}).world_size == 1);
  // Slurm and torchrun keep their defaults (the allocation's first host, 127.0.0.1).
  CHECK(resolve_dist_env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}}, 1, {})
            .master_addr == "127.0.0.1");
}
