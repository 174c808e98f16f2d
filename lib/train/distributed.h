// Running one rank of a multi-process job: the rank's place comes from the launcher's
// environment (launch/dist_env.h), the ranks join over gRPC, then train_rank runs as in-process.
#pragma once

#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "launch/dist_env.h"
#include "train/trainer.h"

namespace dtrain {

// True when this process is one rank of a multi-process job: a launcher's environment is
// present (torchrun's, Open MPI's or Kubeflow's variables, or an srun step's), a rank flag was
// given, or the config asks for backend grpc.
bool is_multiprocess(const Config& cfg, const std::map<std::string, std::string>& env,
                     const DistOverrides& flags);

// The config as this rank runs it: world size from `de`, backend grpc. Its hash is what ranks
// compare at rendezvous.
Config effective_config(const Config& cfg, const DistEnv& de);

// Joins the job (connect_grpc with the job token from DTRAIN_JOB_TOKEN or
// distributed.token_file) and trains this rank. Returns rank 0's summary on rank 0.
nlohmann::json run_grpc_rank(const Config& cfg, const RunOptions& opts,
                             const std::map<std::string, std::string>& env,
                             const DistOverrides& flags);

// Rank 0 of a job of processes turning it away for input that rank 0 alone checks (its --out
// holds another run): it hosts the rendezvous as run_grpc_rank would and, once every rank has
// joined, refuses it with `why`, which every rank raises as a UserError (exit 2), rather than
// exiting at once and leaving the others to wait out distributed.rendezvous_timeout_s for a host
// that never came up. Always throws: that UserError, or why the rendezvous failed first.
[[noreturn]] void refuse_grpc_job(const Config& cfg, const RunOptions& opts,
                                  const std::map<std::string, std::string>& env,
                                  const DistOverrides& flags, const std::string& why);

}  // namespace dtrain
