// Safe interrupts: the first SIGINT, SIGTERM, SIGHUP or SIGUSR1 asks training to stop at a step
// every rank agrees on (train/stop.h), write a checkpoint and a summary, and exit 128 + the signal
// number; a second one ends the process at once, as the default action of that signal would.
//
// The handler only stores the signal number into an atomic the caller owns (a StopRequest); the
// training code is given a pointer to it (RunOptions::stop), so tests can request a stop without
// signals and in-process ranks share one request. Signals are per process, so at most one
// InterruptGuard may be alive at a time (checked).
//
// Preemption (train.preempt_signal): one of these signals, SIGTERM (the default; what Slurm,
// Kubernetes and `dtrain launch` send to stop a job) or SIGUSR1 (Slurm's `--signal=USR1@T`),
// is the scheduler's notice. It stops training the same way, and the run then exits
// kExitPreempted instead of 128 + the signal.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <csignal>
#include <cstdint>
#include <mutex>
#include <string>

namespace dtrain {

// The exit code of a run stopped by its preemption signal: every rank finished the same step and
// the checkpoint of that step is the newest complete one (or, when train.preempt_save_timeout_s
// ran out, the previous checkpoint is). 75 is EX_TEMPFAIL of sysexits.h, "a temporary failure:
// retry later", which is what a preempted job is. Slurm requeues a batch job by its exit code
// only where slurm.conf names it (RequeueExit=75), and a batch script can test for it and run
// `scontrol requeue`; Kubernetes' podFailurePolicy matches it with onExitCodes. A code of its
// own keeps a preemption apart from a failure (1), a bad input (2) and a plain interrupt
// (128 + signal: Ctrl-C, `scancel`), which must not be requeued. Launchers pass it through.
inline constexpr int kExitPreempted = 75;

// The exit code of a run that stopped after `stop_signal` (0: it was not stopped): 0, else
// kExitPreempted for an agreed preemption, else 128 + the signal.
inline int stop_exit_code(int stop_signal, bool preempted) {
  return stop_signal == 0 ? 0 : preempted ? kExitPreempted : 128 + stop_signal;
}

// Stop signals this close after the first are the same request (1 s, in ns), whichever they are:
// timeout(1) and shells signal a process and then its group, and a script that traps Ctrl-C and
// passes SIGTERM to its background ranks sends its copy after the terminal's SIGINT reached them
// (both the same moment's request; scripts/launch_local.sh waits as long for its own). A person
// asking again to end a run at once presses again after that second.
inline constexpr int64_t kSameRequestNs = 1'000'000'000;

// 0: no stop requested; else the signal number that asked for it (SIGINT, SIGTERM, SIGHUP,
// SIGUSR1).
// Lock-free, so the signal handler may store into it.
struct StopRequest {
  std::atomic<int> signal{0};
  // Its "received SIGx" is logged once per process (note_stop_received, util/stop_notice.h); a
  // second caller waits until the first has logged it.
  mutable std::once_flag noticed;
  // The stop came from launcher_gone_signal(): no person asked, so the next SIGINT or SIGTERM
  // counts as a first request (it does not end the process at once).
  std::atomic<bool> launcher_gone{false};
  std::atomic<bool> asked_after_launcher{false};
  // Set while there is nothing to save yet (a rank joining its job: the rendezvous may wait
  // minutes for peers): a signal then ends the process at once -- the preemption signal with
  // kExitPreempted (the newest checkpoint is as it was), another by its default action. Mutable:
  // the training side sets it through RunOptions' read-only pointer to the request.
  mutable std::atomic<bool> at_once{false};
  // -1 until the run's results are on disk (its final checkpoint, and summary.json on the rank
  // that writes it; set only for a process's final run, RunOptions::final_run); then the exit
  // code the run ends with (0, kExitPreempted or 128 + signal), which a second signal from then
  // on ends the process with at once, instead of the signal's own status: only the merge of a
  // --trace is left, and the code must stay what the run reports. (srun
  // --kill-on-bad-exit SIGTERMs a preempted job's ranks that are still tearing down when the
  // first exits 75; dying by that signal made srun exit 143, and the job was not requeued.)
  // Mutable, as at_once: the training side sets it through RunOptions' read-only pointer.
  mutable std::atomic<int> done_code{-1};
  // -1 unless the rank has failed and tears down (train/distributed.cc): then the exit code of
  // its failure, which a stop signal from then on ends the process with at once (not 75: srun
  // --kill-on-bad-exit SIGTERMs the ranks still failing, and a 75 requeued a failed job).
  mutable std::atomic<int> failed_code{-1};
  // When the first signal came (CLOCK_MONOTONIC, ns; 0 while unset): a stop signal within
  // same_request_ns of it is the same request, not a second one.
  std::atomic<int64_t> first_ns{0};
  int64_t same_request_ns = kSameRequestNs;  // (tests shorten or widen it)
  static_assert(std::atomic<int>::is_always_lock_free);
  static_assert(std::atomic<bool>::is_always_lock_free);
  static_assert(std::atomic<int64_t>::is_always_lock_free);
};

// The signal the kernel sends a rank of `dtrain launch` when its launcher dies (PR_SET_PDEATHSIG,
// lib/launch/dist_env.h end_with_launcher): SIGRTMIN + 4, which no library dtrain links uses.
// Not SIGTERM itself: the kernel sends the parent-death signal each time it re-parents the rank,
// first to the dying launcher's next live thread, then to init, so a multi-threaded launcher's
// SIGKILL delivers it two or more times within a millisecond, and a second SIGTERM would end the
// rank at once, without its checkpoint and summary. InterruptGuard takes this signal as the
// preemption signal, however often it comes.
int launcher_gone_signal();

// Installs the handlers for SIGINT, SIGTERM, SIGHUP and SIGUSR1 for its lifetime (`preempt_signal`,
// SIGTERM or SIGUSR1, is one of them: the run then exits kExitPreempted; the others give
// 128 + the signal). The previous dispositions are restored on destruction. SIGTERM, SIGHUP and
// SIGUSR1 ignored on entry (nohup) stay ignored; SIGINT is caught even so, as torchrun does: a
// non-interactive shell starts its background jobs with SIGINT ignored, so a Ctrl-C at the
// terminal of a script that started ranks with `&` would end the script and leave them training.
// The first signal sets `req` and is logged by the training loop; a second restores the default
// action and re-raises, so the process ends at once with the usual status (killed by
// SIGINT/SIGTERM). A stop signal within kSameRequestNs of the first is not a second one (see
// there; `dtrain launch` judges its own the same way). A guard destroyed after its run's results
// were saved (StopRequest::done_code) leaves a handler that ends the process with that code: a
// late copy of the stop signal during teardown ended ranks by the signal after their checkpoint.
// launcher_gone_signal() is handled too, as a request by `preempt_signal` that never escalates.
class InterruptGuard {
 public:
  explicit InterruptGuard(StopRequest& req, int preempt_signal = SIGTERM);
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

 private:
  struct sigaction old_int_ {
  }, old_term_{}, old_hup_{}, old_usr1_{}, old_gone_{};
  bool int_installed_ = false, term_installed_ = false, hup_installed_ = false,
       usr1_installed_ = false, gone_installed_ = false;
};

// "SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", or "a signal".
const char* interrupt_signal_name(int sig);

// What the handler runs before a signal ends the process at once (StopRequest::at_once, or a
// second signal), where no destructor runs: a lower layer's cleanup of what would otherwise
// outlive the process (the comm layer's shared-memory segments). `fn` must be async-signal-safe.
// One per process, set once (a later call replaces it); nullptr clears it.
void set_abrupt_exit_cleanup(void (*fn)());
// Runs that cleanup and removes the temp files of writes in progress (async-signal-safe), for
// other handlers that end the process at once (util/exit_deadline.h).
void run_abrupt_exit_cleanup();
// A folder this process created, removed by that cleanup if it is still empty then (rmdir: a
// run's output folder that a stop while it loads its data would leave behind, empty). "" clears.
// Set before the signals it covers can come; one per process.
void remove_if_empty_at_abrupt_exit(const std::string& dir);

// For commands that do not stop softly (no InterruptGuard: eval, predict, checkpoint
// consolidate, ...): SIGINT, SIGTERM and SIGHUP end the process by the signal as before, after
// unlinking the temp files of writes in progress (util/fs.h remove_temp_files_in_flight), which
// would otherwise stay behind. A signal ignored at start (nohup) stays ignored, but for SIGINT
// (InterruptGuard's reason). An InterruptGuard
// takes these signals over while it lives and gives them back.
void end_by_stop_signals_removing_temp_files();

// The process that forwards signals to this one (the `dtrain launch` that started it; 0: none).
// A signal it sends never escalates a stop already under way: it forwards copies (a peer's stop
// passed on, a signal reaching every rank twice) and ends ranks with SIGKILL when a person asks
// again, so only a second signal from anyone else ends the rank at once. Async-signal-safe read.
void set_signal_forwarder(pid_t pid);

// Sets req.at_once, then ends the process at once, as the handler would, when a stop was asked
// before (a signal that came while the rank was still starting: it only recorded the request,
// and the rendezvous would then wait out its timeout). Called where a rank starts to wait with
// nothing to save; clear at_once when that wait is over.
void begin_at_once(const StopRequest& req);

// begin_at_once for a scope (nullptr: nothing): at_once is cleared at end() or destruction.
// Ranks that are threads share one request: the first to end clears it for all (they end
// together past a barrier).
class AtOnceScope {
 public:
  explicit AtOnceScope(const StopRequest* req) : req_(req) {
    if (req_ != nullptr) begin_at_once(*req_);
  }
  ~AtOnceScope() { end(); }
  void end() {
    if (req_ != nullptr) req_->at_once.store(false);
    req_ = nullptr;
  }
  AtOnceScope(const AtOnceScope&) = delete;
  AtOnceScope& operator=(const AtOnceScope&) = delete;

 private:
  const StopRequest* req_;
};

}  // namespace dtrain
