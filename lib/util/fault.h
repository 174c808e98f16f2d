// Fault injection for tests and drills: DTRAIN_FAULT, off unless set. A comma-separated list of
// faults, each KIND followed by :KEY=VALUE fields:
//   kill:rank=R:step=S          the process of rank R dies by SIGKILL when it completes step S
//   kill_in_save:rank=R:step=S  rank R dies by SIGKILL after writing its shard of the sharded
//                               checkpoint of step S, before the manifest (a crash mid-save)
//   nan:rank=R:step=S           a NaN enters rank R's gradient while it computes step S
//   grad_scale:rank=R:step=S    rank R's gradient contribution to step S is doubled before it
//                               is reduced (a silent numerical bug, for `dtrain verify`'s tests)
//   drop:rank=R:step=S          rank R closes its connections when it completes step S (aborts
//                               its communicator, so peers see a closed peer) and exits non-zero
//   delay:rank=R:ms=M           rank R sleeps M ms after every step (a straggler)
//   slow_save:rank=R:ms=M       rank R sleeps M ms in every checkpoint write, after its file or
//                               shard is written and before the checkpoint is committed (a slow
//                               filesystem: the window for a signal or a kill mid-save)
//   slow_load:rank=R:ms=M       rank R sleeps M ms once its data has loaded, before the run's
//                               folder is touched (a large data set: the window for a signal
//                               while a run starts)
//   fail_in_save:rank=R:step=S  rank R's write of the checkpoint of step S fails (an I/O error)
//   kill_in_connect:rank=R:at=P rank R dies by SIGKILL while it connects to its peers (gRPC), at
//                               point P: joined (the rendezvous answered, nothing else done),
//                               channels (heartbeats started, no stream open) or streams (its
//                               streams open, before it waits for its peers')
//   stall_in_connect:rank=R:at=P:ms=M  rank R sleeps M ms at point P of its gRPC setup (a slow
//                               or descheduled rank while its peers connect)
// Faults fire only in a job's first attempt: `dtrain launch --max-restarts` sets
// DTRAIN_RESTART_COUNT, and a restarted attempt parses the same spec to no faults, so a drill
// that kills a rank cannot kill every restart too. A malformed value is a UserError naming the
// entry, in every attempt.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain {

struct Fault {
  std::string kind;   // kill | kill_in_save | drop | delay | nan | grad_scale | kill_in_connect
                      // | stall_in_connect | slow_save | slow_load | fail_in_save
  int64_t rank = -1;  // which rank (required)
  std::string at;     // where (kill_in_connect, stall_in_connect: required)
  int64_t step = -1;  // at which step (kill, kill_in_save, drop: required)
  int64_t ms = -1;    // how long (delay, slow_save, slow_load, stall_in_connect: required)
};

// The faults of `spec` (DTRAIN_FAULT's value) for restart attempt `attempt` (0: the first):
// empty for attempt > 0, after checking the spec all the same.
std::vector<Fault> parse_faults(const std::string& spec, int64_t attempt);
// UserError when a fault names a rank the run does not have (it would never fire).
void check_fault_ranks(const std::vector<Fault>& faults, int64_t world_size);
// Why a fault can never fire in a run of `steps` steps (its step is past them), or "".
std::string fault_past(const std::vector<Fault>& faults, int64_t steps);
// Why a checkpoint-write fault (kill_in_save, fail_in_save, slow_save) can never fire: it names
// a rank other than 0 while the run's checkpoints are one file (`one_file`) that rank 0 writes
// alone; else "".
std::string fault_unfired_save(const std::vector<Fault>& faults, bool one_file);

// DTRAIN_RESTART_COUNT's value (nullptr when unset: 0). Throws UserError unless it is a
// non-negative integer.
// `name`: the variable it came from (DTRAIN_RESTART_COUNT, or torchrun's
// TORCHELASTIC_RESTART_COUNT), for the message.
int64_t parse_restart_count(const char* value, const char* name = "DTRAIN_RESTART_COUNT");

// True when `faults` holds `kind` for this rank and step.
bool fault_due(const std::vector<Fault>& faults, const std::string& kind, int rank, int64_t step);

// True when `faults` holds `kind` for this rank at the named point (kill_in_connect).
bool fault_due_at(const std::vector<Fault>& faults, const std::string& kind, int rank,
                  const std::string& at);

// The milliseconds this rank sleeps at the named point of its setup (stall_in_connect; 0: none).
int64_t fault_stall_ms(const std::vector<Fault>& faults, int rank, const std::string& at);

// The milliseconds this rank sleeps after every step (the sum of its delay faults; 0: none).
int64_t fault_delay_ms(const std::vector<Fault>& faults, int rank);
// The milliseconds this rank sleeps in every checkpoint write (its slow_save faults; 0: none).
int64_t fault_save_delay_ms(const std::vector<Fault>& faults, int rank);

// The milliseconds this rank sleeps once its data has loaded (its slow_load faults; 0: none).
int64_t fault_load_delay_ms(const std::vector<Fault>& faults, int rank);

// Kills this process with SIGKILL (no cleanup, like a machine failure), after logging why.
[[noreturn]] void die_by_fault(const std::string& what);

}  // namespace dtrain
