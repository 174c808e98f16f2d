// Helpers of the training loop's checkpoint path (train/loop.cc): the background writer of
// train.checkpoint.async and the deadline of a preemption's save (train.preempt_save_timeout_s).
//
// Asynchronous checkpoints: a save copies what this rank writes (its part of the parameters and
// optimizer state, the metadata) on the training thread -- the collectives of a save (RNG states,
// compression state, the shards' ranges) run there too, in the order every rank issues them --
// and hands the writing to a BackgroundWriter. Training goes on meanwhile. At most one write is in
// flight: the next save, and the end of the run, first wait for the previous one. The write's
// error is kept and rethrown on the training thread (never lost). The files are the same as
// synchronous saves' and are committed the same way (atomic writes; `latest` moved only once the
// whole checkpoint is on disk), so a crash mid-write leaves the previous checkpoint the newest
// complete one.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace dtrain {

// Runs one job at a time on its own thread. Not thread-safe: one owner (a rank's training
// thread) calls every member.
class BackgroundWriter {
 public:
  BackgroundWriter() = default;
  // Waits for a job still running (a run unwinding from an error: the files stay consistent,
  // the job's own error is dropped because another one is already on its way).
  ~BackgroundWriter();
  BackgroundWriter(const BackgroundWriter&) = delete;
  BackgroundWriter& operator=(const BackgroundWriter&) = delete;

  // Starts `job` on a new thread. The previous job must have been waited for (checked).
  void start(std::function<void()> job);
  // Whether a job was started and not yet waited for.
  bool busy() const { return thread_.joinable(); }
  // Whether the started job has returned or thrown (false when none is busy).
  bool finished() const;
  // Waits for the job (no-op when none is busy) and rethrows what it threw.
  void wait();

 private:
  std::thread thread_;
  mutable std::mutex mu_;
  bool finished_ = false;
  std::exception_ptr error_;
};

// A deadline for the stop after a preemption signal: after `seconds`, unless cancelled, the
// process logs `message()` (one line, on the error log) and exits kExitPreempted at once
// (util/interrupt.h) -- whatever this rank's threads are doing, because a save stuck in I/O or
// in a collective cannot be interrupted otherwise. Writes are atomic and `latest` moves last, so
// the previous checkpoint stays the newest complete one. Exiting the process is the point: the
// scheduler's SIGKILL would come soon anyway, without a word.
class SaveDeadline {
 public:
  SaveDeadline() = default;
  ~SaveDeadline() { cancel(); }
  SaveDeadline(const SaveDeadline&) = delete;
  SaveDeadline& operator=(const SaveDeadline&) = delete;

  // Arms the deadline (seconds > 0; once per object).
  void start(double seconds, std::function<std::string()> message);
  // Disarms it and joins the watcher (no-op when not armed).
  void cancel();
  bool armed() const { return thread_.joinable(); }

 private:
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool cancelled_ = false;
};

}  // namespace dtrain
