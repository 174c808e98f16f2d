#include "train/distributed.h"

#include "comm/rendezvous/master_addr.h"

#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "comm/grpc_transport.h"
#include "config/config_diff.h"
#include "launch/launcher.h"
#include "tensor/blas.h"
#include "train/stop.h"
#include "util/check.h"
#include "util/exit_deadline.h"
#include "util/fs.h"

namespace dtrain {

bool is_multiprocess(const Config& cfg, const std::map<std::string, std::string>& env,
                     const DistOverrides& flags) {
  if (cfg.distributed.backend == Backend::kGrpc || flags.any()) return true;
  for (const char* v : {"RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                        "PET_NODE_RANK", "PET_NNODES"})
    if (env.count(v)) return true;
  return in_slurm_step(env);
}

Config effective_config(const Config& cfg, const DistEnv& de) {
  Config eff = cfg;
  eff.distributed.world_size = de.world_size;
  eff.distributed.backend = Backend::kGrpc;
  return eff;
}

namespace {

// The keys outside config_hash that decide which steps run collectives beyond the step's own
// (evaluation, train records, saves, their count), and the command-line flags that do too
// (--no-eval skips evaluations, --trace adds the parts' gather): "epochs 5, max_steps 0, ...".
std::string run_plan(const Config& c, const RunOptions& opts) {
  const TrainConfig& t = c.train;
  return fmt::format(
      "train.epochs {}, max_steps {}, log_every {}, eval_every {}, checkpoint.every_steps {}, "
      "checkpoint.async {}, --no-eval {}, --trace {}",
      t.epochs, t.max_steps, t.log_every, t.eval_every, t.checkpoint.every_steps,
      t.checkpoint.async, opts.evaluate ? "off" : "on", opts.trace.empty() ? "off" : "on");
}

// The same keys as JSON at their config paths (flags at the top: "--no-eval"), for the
// rendezvous's list of the keys that differ (it compares the hashed config's keys otherwise).
nlohmann::json run_plan_json(const Config& c, const RunOptions& opts) {
  const TrainConfig& t = c.train;
  return {{"train",
           {{"epochs", t.epochs},
            {"max_steps", t.max_steps},
            {"log_every", t.log_every},
            {"eval_every", t.eval_every},
            {"checkpoint",
             {{"every_steps", t.checkpoint.every_steps}, {"async", t.checkpoint.async}}}}},
          {"--no-eval", !opts.evaluate},
          {"--trace", !opts.trace.empty()}};
}

// This rank's transport options: where the job meets, what its ranks must agree on.
GrpcOptions rank_grpc_options(const Config& cfg, const Config& eff, const RunOptions& opts,
                              const DistEnv& de, const std::map<std::string, std::string>& env) {
  if (de.world_size > 1 && de.master_port == 0)
    throw UserError("rank " + std::to_string(de.rank) + " of " + std::to_string(de.world_size) +
                    ": no MASTER_PORT (set it, or start the ranks with `dtrain launch`)");
  GrpcOptions g;
  g.rank = de.rank;
  g.world_size = de.world_size;
  g.master_addr = de.master_addr;
  // One rank alone needs a port for its own rendezvous only: any free one will do.
  g.master_port = de.master_port != 0 ? de.master_port : pick_free_port();
  g.bind = !cfg.distributed.bind.empty()
               ? cfg.distributed.bind
               : (is_loopback_host(de.master_addr) ? "127.0.0.1" : "0.0.0.0");
  g.token = resolve_job_token(env, cfg.distributed.token_file);
  // config_hash leaves out how long the run is and when it logs, evaluates and saves (a resume
  // may change them); ranks must still agree on them, since each of those steps runs collectives
  // of its own: they join the rendezvous's comparison as text, which its refusal then shows.
  g.config_hash = config_hash(eff) + " (" + run_plan(eff, opts) + ")";
  // What a refusal names when the hashes differ: the keys (config_differences) of the ranks'
  // resolved configs.
  // (the hashed keys only: per-host settings -- bind, TLS files, threads -- may differ)
  nlohmann::json detail = hashed_config_json(eff);
  detail.merge_patch(run_plan_json(eff, opts));  // (the run plan's keys, as above)
  g.config_detail = detail.dump();
  g.config_difference = [ours = g.config_detail](const std::string& theirs) -> std::string {
    try {
      const std::vector<std::string> d =
          config_differences(nlohmann::json::parse(ours), nlohmann::json::parse(theirs));
      constexpr size_t kShown = 12;
      std::string out;
      for (size_t i = 0; i < d.size() && i < kShown; ++i) out += (i ? "; " : "") + d[i];
      if (d.size() > kShown) out += fmt::format("; and {} more", d.size() - kShown);
      return out;
    } catch (const std::exception&) {  // (a peer's detail is input: not JSON, say nothing)
      return "";
    }
  };
  g.rendezvous_timeout_s = cfg.distributed.rendezvous_timeout_s;
  g.tls_cert = cfg.distributed.tls.cert;
  g.tls_key = cfg.distributed.tls.key;
  g.tls_ca = cfg.distributed.tls.ca;
  g.shm = cfg.distributed.shm;
  g.tcp = cfg.distributed.tcp;
  g.heartbeat_s = cfg.distributed.heartbeat_s;
  // Connecting waits at most as long as a receive (a lost peer is found by its heartbeats).
  g.connect_timeout_s = cfg.distributed.timeout_s;
  g.faults = opts.faults;
  return g;
}

}  // namespace

void refuse_grpc_job(const Config& cfg, const RunOptions& opts,
                     const std::map<std::string, std::string>& env, const DistOverrides& flags,
                     const std::string& why) {
  const DistEnv de = resolve_dist_env(env, static_cast<int>(cfg.distributed.world_size), flags);
  DT_CHECK_EQ(de.rank, 0);
  GrpcOptions g = rank_grpc_options(cfg, effective_config(cfg, de), opts, de, env);
  g.refusal = why;
  // Said at once: the error itself comes when the ranks have heard it (at most
  // rendezvous_timeout_s).
  spdlog::warn("{}; telling the other {} rank(s) as they join {}:{}", why, de.world_size - 1,
               de.master_addr, g.master_port);
  try {
    connect_grpc(g);  // throws the refusal, or why the rendezvous ended first
  } catch (const std::exception& e) {
    // (a timeout, ranks that disagree: said, but rank 0's own reason is the error)
    if (std::string(e.what()).find(why) == std::string::npos)
      spdlog::warn("rank 0: the rendezvous ended first: {}", e.what());
  }
  throw UserError(why);
}

nlohmann::json run_grpc_rank(const Config& cfg, const RunOptions& opts,
                             const std::map<std::string, std::string>& env,
                             const DistOverrides& flags) {
  // Before this rank or its siblings on the machine allocate anything (the memory check).
  const int64_t machine_available = machine_memory_available_bytes();
  const DistEnv de = resolve_dist_env(env, static_cast<int>(cfg.distributed.world_size), flags);
  const Config eff = effective_config(cfg, de);
  const GrpcOptions g = rank_grpc_options(cfg, eff, opts, de, env);
  const int threads = cfg.runtime.threads > 0
                          ? static_cast<int>(cfg.runtime.threads)
                          : default_blas_threads(available_cores(), de.local_world_size);
  set_blas_threads(threads);
  spdlog::info("rank {} of {} (local {} of {}, from {}): joining {}:{}, listening on {}", de.rank,
               de.world_size, de.local_rank, de.local_world_size, de.source, de.master_addr,
               g.master_port, g.bind);
  // One rank alone still meets itself at MASTER_ADDR over gRPC (resolve_dist_env lets a lone
  // rank's malformed address pass, for the in-process backend never uses it): 'a b' waited out
  // the rendezvous timeout, then failed as a runtime error.
  if (const std::string why = dtrain::master_addr_problem(de.master_addr); !why.empty())
    throw UserError(de.master_addr_from + " '" + de.master_addr + "' " + why);
  // A name that does not resolve is said now, not only at the rendezvous timeout, which waits
  // for it (a Kubernetes Service's name resolves once its pods are ready).
  if (const std::string why = master_addr_problem(de.master_addr, /*serving=*/false); !why.empty())
    spdlog::warn(
        "{} now: the rendezvous waits for it up to distributed.rendezvous_timeout_s = {} s", why,
        cfg.distributed.rendezvous_timeout_s);
  if (g.token.empty())
    spdlog::warn(
        "no job token (DTRAIN_JOB_TOKEN or distributed.token_file): any process that "
        "reaches the rendezvous port can join this job");
  CommOptions copts;
  copts.timeout_s = cfg.distributed.timeout_s;
  // Joining can wait for peers up to rendezvous_timeout_s: a signal meanwhile ends the rank at
  // once (nothing to save yet) instead of after the wait.
  // (begin_at_once ends the process if a stop came while the rank started)
  std::unique_ptr<Transport> transport;
  {
    const AtOnceScope joining(opts.stop);
    transport = connect_grpc(g);
  }
  // Armed on a failure, before comm's teardown (declared first: destroyed after it).
  std::optional<ExitDeadline> bounded_teardown;
  Communicator comm(std::move(transport), copts);
  // (the teardown after a failure: a signal then ends the rank at once with the failure's code)
  const auto failing = [&](const std::exception& e, int code) {
    if (opts.stop != nullptr) opts.stop->failed_code.store(code);
    bounded_teardown.emplace(kFailedTeardownS, code, e.what());
  };
  try {
    RunOptions here = opts;
    here.processes_here = de.local_world_size;
    here.machine_available = machine_available;
    return train_rank(eff, here, comm);
  } catch (const AgreedError& e) {
    // every rank raises it at the same step (train/stop.h): nobody is left waiting
    failing(e, dynamic_cast<const AgreedInputError*>(&e) != nullptr ? 2 : 1);
    throw;
  } catch (const PreemptedError& e) {
    failing(e, kExitPreempted);
    throw;
  } catch (const std::exception& e) {
    // Tell the peers now rather than letting them wait for their deadline.
    comm.abort(abort_reason("rank " + std::to_string(de.rank), e));
    const bool input = dynamic_cast<const UserError*>(&e) != nullptr ||
                       dynamic_cast<const std::bad_alloc*>(&e) != nullptr;
    failing(e, input ? 2 : 1);
    throw;
  }
}

}  // namespace dtrain
