// The output folder of a run (--out): what makes it "hold a run", and clearing one. A new run
// into a folder that holds one is refused unless the user continues it (--resume) or replaces
// it (--overwrite), so two runs' metrics, checkpoints and summaries never mix.
#pragma once

#include <string>
#include <vector>

namespace dtrain {

// The files a run writes at the top of its output folder (besides checkpoints/ and logs/).
inline constexpr const char* kRunFiles[] = {"summary.json", "metrics.jsonl", "config.json"};

// The files of `out_dir` that belong to an earlier run, as shown to the user: "summary.json",
// "metrics.jsonl", "checkpoints/" (when it holds anything). config.json alone (a run that
// failed before training) and logs/ (launcher logs, appended per launch) do not count.
std::vector<std::string> run_files_in(const std::string& out_dir);

// An exclusive advisory lock (flock) on an output folder, held while one run (or launcher)
// writes to it: a second run started into the same folder before the first has written
// anything would pass the "holds a run" check, and the two would overwrite each other's
// checkpoints and metrics. The kernel releases it when the holder ends, even by SIGKILL, so a
// crashed run never leaves the folder locked. Move-only; the empty state holds nothing.
class OutDirLock {
 public:
  OutDirLock() = default;
  // Creates out_dir if needed and locks it; throws UserError when another process holds it. A
  // file system without flock support: a warning, and no lock.
  explicit OutDirLock(const std::string& out_dir);
  ~OutDirLock();
  OutDirLock(OutDirLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  OutDirLock& operator=(OutDirLock&& o) noexcept;
  OutDirLock(const OutDirLock&) = delete;
  OutDirLock& operator=(const OutDirLock&) = delete;
  // The locked folder's descriptor (-1: none). A process that inherits a copy holds the lock
  // with this one, until the last copy is closed (flock's rule).
  int fd() const { return fd_; }
  // Whether this process holds out_dir's lock through descriptor `fd`, inherited from the
  // launcher that took it (dtrain launch passes its lock as descriptor 3): `fd` is open on that
  // very folder and the lock is its (or free, and then taken by it). A rank that merely claims a
  // launcher (DTRAIN_LAUNCHER_PID set by hand) has no such descriptor and must lock the folder
  // itself. Never throws.
  static bool inherited(int fd, const std::string& out_dir);
  // A lock on the existing folder `dir` (through a symbolic link: on its target), taken by the
  // run that writes its checkpoints there: two output folders whose checkpoints/ link to one
  // folder (or one linked to another run's checkpoints/) would delete each other's checkpoints
  // (--overwrite, keep_last, the start's cleanup). UserError naming `what` when another process
  // holds it; an empty lock (nothing held) when dir is not a folder or cannot be locked.
  static OutDirLock checkpoints_folder(const std::string& dir, const std::string& what);

 private:
  int fd_ = -1;
};

// --overwrite's deletion: the run files out_dir holds (kRunFiles, checkpoints/, and with
// clear_logs logs/). UserError naming a file that cannot be removed.
// UserError (exit 2) when OUT/checkpoints holds anything but what dtrain writes there (`latest`,
// step-<N>.safetensors, step-<N>/, temp files of atomic writes): --overwrite, which deletes the
// folder, would delete the user's files with it. clear_run_files checks it first; --overwrite's
// callers check it up front too, before any data loads.
void check_checkpoints_are_ours(const std::string& out_dir);
void clear_run_files(const std::string& out_dir, bool clear_logs);

// The checks of out_dir that every process of a job makes (prepare_out_dir begins with them): a
// UTF-8 path, not a file, no config.json that no dtrain run wrote. UserError.
void check_out_dir_path(const std::string& out_dir);

// Prepares out_dir for a run before anything is written: with `overwrite`, removes an earlier
// run's summary.json, metrics.jsonl, config.json and checkpoints/ (and logs/ when clear_logs);
// otherwise, unless `resuming`, throws UserError naming the folder, what it holds and the two
// ways out when run_files_in(out_dir) is not empty. With `lock`, first takes the folder's
// OutDirLock into *lock (the one process that owns the run: a single process, rank 0 of a job
// started without `dtrain launch`, or the launcher of node 0), so the check and the clearing
// cannot race another run. Several ranks of one job may call it at start (they all see the same
// answer on a shared folder).
void prepare_out_dir(const std::string& out_dir, bool resuming, bool overwrite, bool clear_logs,
                     OutDirLock* lock = nullptr);

}  // namespace dtrain
