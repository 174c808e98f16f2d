// `dtrain run` ranks started by Open MPI's mpirun (README's command): they take their places
// from OMPI_COMM_WORLD_*, train over gRPC and end bitwise equal to in-process ranks; without
// MASTER_ADDR they stop with one clear error. Skipped (77) where Open MPI is not installed.
#include <doctest/doctest.h>

#include <unistd.h>

#include <string>

#include <nlohmann/json.hpp>

#include "engines/engines_util.h"
#include "launch/launcher.h"

using dtrain::testing::check_same_state;
using dtrain::testing::contains;
using dtrain::testing::kCleanEnv;
using dtrain::testing::kSource;
using dtrain::testing::read_text;
using dtrain::testing::run_cmd;
using dtrain::testing::skip_test;
using dtrain::testing::TempDir;

namespace {

const std::string kBin = DTRAIN_BIN;

// mpirun for W local ranks with `vars` exported (-x NAME=VALUE ...); as root Open MPI wants
// --allow-run-as-root. --oversubscribe: more ranks than this machine's cores.
std::string mpirun(int world, const std::string& vars) {
  if (!dtrain::testing::have_program("mpirun"))
    skip_test("Open MPI is not installed (scripts/engines/openmpi.sh install installs it)");
  return kCleanEnv + "mpirun " + (geteuid() == 0 ? "--allow-run-as-root " : "") +
         "--oversubscribe -np " + std::to_string(world) + " " + vars + " ";
}

}  // namespace

TEST_CASE("mpirun -np 2 and -np 3: ranks over gRPC equal in-process ranks bitwise") {
  const std::string head = mpirun(2, "");  // skips before anything is made without Open MPI
  TempDir dir;
  // Adam and dropout (every rank's RNG), checkpoints at steps 10, 20, 30.
  const std::string cfg = dir.write("c.yaml", dtrain::testing::kRestartCfg);
  for (int world : {2, 3}) {
    const std::string w = std::to_string(world);
    const std::string mpi = dir / ("mpi" + w), inproc = dir / ("inproc" + w);
    const int port = dtrain::pick_free_port();
    const auto r =
        run_cmd(mpirun(world, "-x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=" + std::to_string(port) +
                                  " -x DTRAIN_JOB_TOKEN=mpi" + w) +
                kBin + " run " + cfg + " --out " + mpi);
    REQUIRE_MESSAGE(r.exit_code == 0, r.output);
    // Every rank read its place from Open MPI's variables.
    for (int rank = 0; rank < world; ++rank)
      CHECK_MESSAGE(contains(r.output, "rank " + std::to_string(rank) + " of " + w + " (local " +
                                           std::to_string(rank) + " of " + w + ", from openmpi)"),
                    r.output);
    const auto s = nlohmann::json::parse(read_text(mpi + "/summary.json"));
    CHECK(s["world_size"] == world);
    CHECK(s["backend"] == "grpc");
    CHECK(s["steps"] == 30);

    const auto r2 = run_cmd(kBin + " run " + cfg + " --set distributed.world_size=" + w +
                            " --out " + inproc + " --log-level warn");
    REQUIRE_MESSAGE(r2.exit_code == 0, r2.output);
    check_same_state(dtrain::read_safetensors(mpi + "/checkpoints/step-30.safetensors"),
                     dtrain::read_safetensors(inproc + "/checkpoints/step-30.safetensors"),
                     "mpirun -np " + w);
  }
}

TEST_CASE("mpirun without MASTER_ADDR: every rank stops with one clear error, exit 2") {
  const std::string head = mpirun(2, "-x MASTER_PORT=29999 -x DTRAIN_JOB_TOKEN=t");
  TempDir dir;
  const auto r =
      run_cmd(head + kBin + " run " + kSource + "/configs/smoke.yaml --out " + dir / "run");
  CHECK_MESSAGE(r.exit_code == 2, r.output);
  CHECK_MESSAGE(contains(r.output,
                         "error: MASTER_ADDR is not set: Open MPI does not tell the 2 "
                         "processes where rank 0 runs"),
                r.output);
  CHECK(contains(r.output, "-x MASTER_ADDR="));
  for (const char* crash : {"terminate called", "Aborted", "Segmentation", "core dumped"})
    CHECK_MESSAGE(!contains(r.output, crash), r.output);
  CHECK_FALSE(std::filesystem::exists(dir / "run/summary.json"));
}
