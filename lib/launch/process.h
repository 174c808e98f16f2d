// The launcher's process plumbing (launcher.cc's helpers): an owned descriptor, the signal
// handlers and their self-pipe, the set of started ranks, rank 0's output tee, and starting one
// rank. Internal to lib/launch.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::launch_detail {

using Clock = std::chrono::steady_clock;

// How long to wait for ranks to disappear after SIGKILL before giving up on them: only a process
// stuck in uninterruptible kernel sleep survives SIGKILL, and the launcher must not hang on it.
constexpr auto kAfterKill = std::chrono::seconds(5);

// "SIGKILL", or "signal N" for a number without a name.
std::string signal_name(int sig);

// std::runtime_error "what: strerror(errno)".
std::runtime_error sys_error(const std::string& what);

// Owns a file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.fd_;
      o.fd_ = -1;
    }
    return *this;
  }
  int get() const { return fd_; }
  bool open() const { return fd_ >= 0; }
  void reset();

 private:
  int fd_ = -1;
};

// Installs the handlers for the launcher's lifetime and restores the previous ones. Signals that
// were ignored on entry (nohup, `cmd &` in a script) stay ignored, here and in the ranks. The
// handlers write each signal's number to a self-pipe (whichever thread the kernel picks to run
// them); SIGCHLD is caught too, so a rank's exit wakes a poll on fd(), and SIGTSTP (Ctrl-Z), which
// the launcher passes on to its ranks before it stops. One at a time per process.
class SignalGuard {
 public:
  SignalGuard();
  ~SignalGuard();
  SignalGuard(const SignalGuard&) = delete;
  SignalGuard& operator=(const SignalGuard&) = delete;

  int fd() const { return read_.get(); }

  // The signals received since the last call, in order.
  std::vector<int> take();
  // For a launcher none of whose ranks runs (between attempts, waiting for other nodes): the stop
  // signals (SIGINT, SIGTERM, SIGHUP, SIGUSR1) received since the last call, in order; a Ctrl-Z
  // (SIGTSTP) among them stops this process there, as its default action would.
  std::vector<int> take_while_idle();

  // For a blocking wait while no rank runs (the nodes' check-in): SIGINT, SIGTERM, SIGHUP and
  // SIGUSR1 get the dispositions they had before the guard back, so one of them ends the
  // launcher at once, by the signal's default action, as nothing runs to stop softly; one such
  // signal received before (still in the pipe) is raised again now. catch_stop_signals() puts
  // the handlers back. Signals ignored on entry stay ignored throughout. `preempt_signal` (0:
  // none) ends it with kExitPreempted (75) instead, as a rank still joining does: nothing was
  // trained, the newest checkpoint is as it was, and a scheduler replaces the node (Kubernetes'
  // pod failure policy ignores 75; 143 would fail the Job). As PID 1 (a container's entry point,
  // whose default-action signals the kernel drops) every stop signal exits 128 + signal.
  void default_stop_signals(int preempt_signal = 0);
  void catch_stop_signals();

 private:
  void install(int sig, void (*handler)(int), bool even_if_ignored);

  Fd read_, write_;
  std::vector<std::pair<int, struct sigaction>> saved_;
};

struct Child {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
};

// The started ranks. Its destructor is the safety net for early exits (exceptions): whatever is
// still running is SIGKILLed and reaped, waiting at most kAfterKill.
class ChildSet {
 public:
  ChildSet() = default;
  ~ChildSet();
  ChildSet(const ChildSet&) = delete;
  ChildSet& operator=(const ChildSet&) = delete;

  void add(int rank, pid_t pid) { kids_.push_back({rank, pid, true}); }
  std::vector<Child>& all() { return kids_; }

  bool any_running() const;
  std::string running_ranks() const;  // "0, 2": the ranks still running
  // The running ranks the kernel holds stopped (process state T or t: SIGSTOP, a debugger, a
  // suspended job), read from /proc/<pid>/stat: a frozen rank, which its peers fail for
  // ("no heartbeat from rank R") while it never exits on its own.
  std::vector<int> stopped_ranks() const;

  // To the rank's whole process group; to the rank alone if it left its group. A stopped rank
  // (SIGSTOP, a debugger's ^Z) acts on SIGTERM or SIGINT only once continued, so it gets
  // SIGCONT after them (after any signal but SIGKILL and SIGSTOP): otherwise it would sit out
  // the whole grace period.
  static void signal_rank(pid_t pid, int sig);

  void signal_running(int sig);

  // Stops tracking ranks that did not die: the launcher returns and init inherits them.
  void abandon() {
    for (Child& c : kids_) c.running = false;
  }

 private:
  std::vector<Child> kids_;
};

// write(2) everything, tolerating EINTR and a briefly full non-blocking console. Returns false on
// any other failure (the caller stops writing there).
bool write_fully(int fd, const char* p, size_t n);

// Writes as much of [p, p + n) to a console that may be a blocking descriptor as it takes
// until `until`: pieces of at most PIPE_BUF bytes, each once poll(2) says the descriptor is
// writable (for a pipe that means a piece fits, so write(2) does not block). Returns the bytes
// written; fewer than n when the console stayed full (a pipe nobody reads: `| less` at a
// prompt) or failed (*failed set).
// wake_fd (>= 0): a descriptor whose readability ends the wait (the launcher's signal pipe).
size_t write_console(int fd, const char* p, size_t n, std::chrono::steady_clock::time_point until,
                     bool* failed, int wake_fd = -1);

// Copies one of rank 0's pipes to its log file and to the launcher's console. The log gets
// everything; the console what it takes without stalling the supervisor loop (write_console):
// a console that stays full loses rank 0's output meanwhile -- a line then says how much and
// where it is -- while the launcher goes on forwarding signals and reaping ranks.
struct Tee {
  Fd src;            // read end, non-blocking
  int log_fd = -1;   // rank-0.log
  int console = -1;  // STDOUT_FILENO or STDERR_FILENO
  bool log_ok = true, console_ok = true;
  uint64_t console_dropped = 0;  // bytes the full console did not take since it last took some
  std::string dropped_tail;      // the last of them (at most kDroppedTail bytes)
  std::string log_path;          // for the line about them
  static constexpr size_t kDroppedTail = 4096;

  // Reads what is available, at most max_reads chunks so a chatty rank cannot starve the
  // supervisor loop, and gives the console at most 200 ms in all (none while it is found full).
  // Closes the source at EOF.
  void pump(int max_reads);
  // At the end of an attempt: the line about output the console missed, if any, with the last
  // whole lines of it (rank 0's `done: ...` result), waiting until `until` for a console slow to
  // read (`| (sleep 40; cat)`: no rank runs any more), or until wake_fd is readable (a signal).
  void note_dropped(std::chrono::steady_clock::time_point until, int wake_fd);

 private:
  void write_to_console(const char* p, size_t n, std::chrono::steady_clock::time_point until);
  void keep_dropped(const char* p, size_t n);  // into dropped_tail
  // The line about the output the console missed and the last whole lines of it.
  bool write_note(std::chrono::steady_clock::time_point until, int wake_fd = -1);
};

// The program to start a rank with: `path` itself, unless it names this launcher's own binary
// and that file was removed since the launcher started (a package upgrade, a rebuilt or cleaned
// build folder, a job's copy deleted): then /proc/self/exe, which still runs it, and a warning.
// (A restart failed: "cannot start rank 0 ('...'): No such file or directory".)
std::string rank_program(const std::string& path);

// Starts one rank in its own process group with stdin from /dev/null and the given stdout and
// stderr, and keep_fd (when >= 0) as its descriptor 3; every other descriptor is closed. Returns
// errno on failure (posix_spawn reports exec failures too).
int spawn_rank(const std::vector<std::string>& argv_s, std::vector<std::string>& env_s, int out_fd,
               int err_fd, pid_t* pid, int keep_fd = -1);

}  // namespace dtrain::launch_detail
