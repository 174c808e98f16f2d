// Agreeing on where to stop after an interrupt (util/interrupt.h): every rank must leave the
// training loop after the same step, or the next collective of the ranks that went on would
// wait for the ones that left. Each step, every rank contributes whether it has seen a stop
// request, and the maximum over ranks -- the same on every rank -- decides.
//
// Collective contract: all ranks construct it with the same `req == nullptr`-ness (RunOptions is
// the same on every rank of a job) and call begin_step/end_step at the same points of every step.
// With a request and more than one rank, begin_step starts a one-float all-reduce (max) on the
// communication thread, so its latency hides behind the step's compute; end_step waits for it.
// Without a request (library callers and tests that do not interrupt) neither does anything.
//
// A preemption outranks an interrupt: when any rank has seen the preemption signal
// (train.preempt_signal), every rank agrees on that signal, so the run exits kExitPreempted and
// is requeued even if another rank saw a Ctrl-C first. Whether the agreed stop is a preemption
// is agreed too (preempted()): train.preempt_signal is per host, so ranks may name different
// signals, and the one that saw its own preemption signal decides for all (one exit code, 75).
#pragma once

#include <csignal>
#include <stdexcept>
#include <string>

#include "comm/communicator.h"
#include "config/enums.h"
#include "util/check.h"
#include "util/interrupt.h"

namespace dtrain {

inline int preempt_signal_number(PreemptSignal s) {
  return s == PreemptSignal::kUsr1 ? SIGUSR1 : SIGTERM;
}

// An error every rank raises at the same step by a verdict they share (a non-finite loss or
// gradient under train.nonfinite: abort). The loop completes the step's stop vote before passing
// it on (StopAgreement::settle), so no rank aborts the group on its way out: every rank reports
// this error, not a peer's abort.
class AgreedError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An agreed verdict on the job's input, which no restart changes (a loss or gradient that is not
// finite at step 1, before any update: the data or the model's initial weights overflow float32,
// or fp16 compression does in transit): exit 2, the code of bad input, so launchers do not
// restart it.
class AgreedInputError : public AgreedError {
 public:
  using AgreedError::AgreedError;
};

// A rank's own failure to write its shard of a sharded checkpoint, raised after the commit's
// all-reduce told every rank (so an AgreedError: every rank leaves at the same step).
class ShardWriteError : public AgreedError {
 public:
  using AgreedError::AgreedError;
};

// What a rank raises because a peer failed on its own (a shard write another rank could not
// make), by the same agreed verdict: the peer's error names the cause, so in-process runs report
// that one first.
class PeerFailedError : public AgreedError {
 public:
  using AgreedError::AgreedError;
};

// What a rank raises when it loses its job after the ranks agreed to stop for a preemption: a
// peer that ran out of train.preempt_save_timeout_s (and exited kExitPreempted, its deadline's
// way) or was already killed by the scheduler. The newest complete checkpoint is intact (latest
// moves last), so this rank exits kExitPreempted too, and the job's code stays the requeue code
// instead of a failure's.
class PreemptedError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// How a rank that refused its input (UserError) tells its peers, which relay it in their own
// errors ("... rank 0 aborted: rank 0 failed on bad input: ..."): they exit 2 as it does, so a
// scheduler sees bad input whichever rank's code it reads (they exited 1, a failure to retry).
inline constexpr char kInputAbort[] = " failed on bad input: ";
inline std::string abort_reason(const std::string& rank_name, const std::exception& e) {
  const bool input = dynamic_cast<const UserError*>(&e) != nullptr;
  return rank_name + (input ? kInputAbort : " failed: ") + e.what();
}
// Whether a peer's error relays such an abort.
inline bool relays_input_abort(const std::string& what) {
  const size_t at = what.find(" aborted: rank ");
  return at != std::string::npos && what.find(kInputAbort, at) != std::string::npos;
}

class StopAgreement {
 public:
  StopAgreement(const StopRequest* req, Communicator& comm, int preempt_signal = SIGTERM)
      : req_(req), comm_(comm), preempt_(preempt_signal) {}
  // Normal flow always ends a vote it began; one still in flight means the loop is unwinding from
  // an error, so the communicator is aborted (peers fail fast, as they would anyway) before the
  // vote's buffer goes away under the communication thread.
  ~StopAgreement() { abandon("a rank left training while its stop vote was in flight"); }
  StopAgreement(const StopAgreement&) = delete;
  StopAgreement& operator=(const StopAgreement&) = delete;

  // Starts this step's vote, with this rank's view of the request now. Idempotent until end_step
  // (a step that ends early still leaves exactly one vote in flight).
  void begin_step() {
    if (req_ == nullptr || pending_) return;
    const int sig = req_->signal.load();
    vote_ = static_cast<float>(sig == preempt_ && sig != 0 ? sig + kPreemptRank : sig);
    if (comm_.size() > 1) work_ = comm_.allreduce_async(&vote_, 1, ReduceOp::kMax);
    pending_ = true;
  }
  // Waits for the vote begun by begin_step and returns the agreed signal: 0 to go on, else the
  // signal after which every rank stops: the preemption signal when any rank saw it, else the
  // largest number among the ranks' requests.
  // On the way out of an AgreedError (every rank is here, at the same step, with the same vote
  // in flight): waits for the vote so the destructor need not abort the group. Never throws.
  void settle() noexcept {
    try {
      end_step();
    } catch (...) {  // the group failed meanwhile: the destructor has nothing left to do
      work_.reset();
    }
  }
  int end_step() {
    if (!pending_) return 0;
    pending_ = false;
    if (work_) {
      work_->wait();
      work_.reset();
    }
    const int v = static_cast<int>(vote_);
    preempted_ = v > kPreemptRank;
    return preempted_ ? v - kPreemptRank : v;
  }
  // On the way out of this rank's own error (not an agreed one: its peers go on into the
  // collectives it leaves): aborts the group with the error's text, which the peers then report
  // as this rank's cause, and waits for the vote in flight. Never throws.
  void abandon(const std::string& why) noexcept {
    if (!work_) return;
    comm_.abort(why);
    try {
      work_->wait();
    } catch (...) {  // the abort's failure: already reported by whoever failed first
    }
    work_.reset();
    pending_ = false;
  }
  // Whether the stop the last end_step agreed on is a preemption: some rank saw its own
  // preemption signal. The same on every rank.
  bool preempted() const { return preempted_; }

 private:
  static constexpr int kPreemptRank = 1000;  // above every signal number (small integers)
  const StopRequest* req_;
  Communicator& comm_;
  const int preempt_;
  float vote_ = 0.0f;  // written by the all-reduce until work_ completes
  WorkPtr work_;
  bool pending_ = false;
  bool preempted_ = false;
};

}  // namespace dtrain
