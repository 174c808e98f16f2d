#include "launch/process.h"

#include "util/fs.h"
#include "util/interrupt.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace dtrain::launch_detail {

namespace {

// Write end of the self-pipe: the signal handler's only way to talk to the supervisor loop, and
// it works whichever thread (e.g. an OpenBLAS worker) the kernel picks to run the handler.
volatile sig_atomic_t g_signal_pipe = -1;

void on_signal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  if (g_signal_pipe >= 0) {
    const ssize_t r = ::write(g_signal_pipe, &b, 1);  // full pipe: a wakeup is already pending
    (void)r;
  }
  errno = saved;
}

// Caught (not ignored) so a closed console makes write() return EPIPE instead of killing the
// launcher, while exec still resets it to the default for the ranks.
void on_sigpipe(int) {}

// The signals that stop a job (forwarded to the ranks).
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};
bool is_stop_signal(int sig) {
  return std::find(std::begin(kStopSignals), std::end(kStopSignals), sig) != std::end(kStopSignals);
}

}  // namespace

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

std::runtime_error sys_error(const std::string& what) {
  return std::runtime_error(what + ": " + strerror(errno));
}

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

SignalGuard::SignalGuard() {
  int p[2];
  if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) throw sys_error("pipe2");
  read_ = Fd(p[0]);
  write_ = Fd(p[1]);
  g_signal_pipe = p[1];
  install(SIGCHLD, on_signal, /*even_if_ignored=*/true);  // ignored SIGCHLD would auto-reap
  // (SIGINT even where ignored: a script's background job starts so, util/interrupt.h)
  for (int sig : kStopSignals) install(sig, on_signal, sig == SIGINT);
  install(SIGTSTP, on_signal, false);  // (job control: the launcher suspends its ranks with it)
  install(SIGPIPE, on_sigpipe, false);
}

SignalGuard::~SignalGuard() {
  for (auto it = saved_.rbegin(); it != saved_.rend(); ++it)
    ::sigaction(it->first, &it->second, nullptr);
  g_signal_pipe = -1;
}

std::vector<int> SignalGuard::take() {
  std::vector<int> out;
  unsigned char buf[64];
  ssize_t n;
  while ((n = ::read(read_.get(), buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR))
    for (ssize_t i = 0; i < n; ++i) out.push_back(buf[i]);
  return out;
}

std::vector<int> SignalGuard::take_while_idle() {
  std::vector<int> out;
  for (int sig : take()) {
    if (sig == SIGTSTP) ::raise(SIGSTOP);
    if (is_stop_signal(sig)) out.push_back(sig);
  }
  return out;
}

namespace {
// The default action of a stop signal for PID 1 (a container's entry point), whose default-action
// signals the kernel drops: the exit status a shell gives for the signal. Async-signal-safe.
void exit_by_signal(int sig) {
  ::_exit(128 + sig);
}
// The preemption signal while nothing runs: the requeue code. Async-signal-safe.
void exit_preempted(int) {
  ::_exit(kExitPreempted);
}
}  // namespace

void SignalGuard::default_stop_signals(int preempt_signal) {
  const bool init = ::getpid() == 1;
  for (const auto& [sig, old] : saved_) {
    if (sig == SIGTSTP) ::sigaction(sig, &old, nullptr);  // (Ctrl-Z stops a waiting launcher)
    if (!is_stop_signal(sig)) continue;
    struct sigaction sa = old;
    // (SIGINT is the user's even where a script's background job started with it ignored)
    if (sig == SIGINT && sa.sa_handler == SIG_IGN) sa.sa_handler = SIG_DFL;
    // (a handler put in place of the old takes one argument: SA_SIGINFO off with it)
    if (sig == preempt_signal && sa.sa_handler != SIG_IGN) {
      sa.sa_handler = exit_preempted;
      sa.sa_flags &= ~SA_SIGINFO;
    } else if (init && sa.sa_handler == SIG_DFL) {
      sa.sa_handler = exit_by_signal;
      sa.sa_flags &= ~SA_SIGINFO;
    }
    ::sigaction(sig, &sa, nullptr);
  }
  for (int sig : take_while_idle()) {
    if (sig == preempt_signal) ::_exit(kExitPreempted);
    ::raise(sig);  // the default action: ends the process here
    // (as PID 1, a container's entry point, the kernel drops it: 128 + sig, a shell's status)
    if (init) ::_exit(128 + sig);
  }
}

void SignalGuard::catch_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (const auto& [sig, old] : saved_)
    if (is_stop_signal(sig) || sig == SIGTSTP) ::sigaction(sig, &sa, nullptr);
}

void SignalGuard::install(int sig, void (*handler)(int), bool even_if_ignored) {
  struct sigaction old {};
  if (::sigaction(sig, nullptr, &old) != 0) throw sys_error("sigaction");
  if (old.sa_handler == SIG_IGN && !even_if_ignored) return;
  struct sigaction sa {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | (sig == SIGCHLD ? SA_NOCLDSTOP : 0);
  if (::sigaction(sig, &sa, nullptr) != 0) throw sys_error("sigaction");
  saved_.emplace_back(sig, old);
}

ChildSet::~ChildSet() {
  signal_running(SIGKILL);
  const auto deadline = Clock::now() + kAfterKill;
  while (any_running() && Clock::now() < deadline) {
    for (Child& c : kids_)
      if (c.running && ::waitpid(c.pid, nullptr, WNOHANG) == c.pid) c.running = false;
    if (any_running()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

bool ChildSet::any_running() const {
  return std::any_of(kids_.begin(), kids_.end(), [](const Child& c) { return c.running; });
}

std::string ChildSet::running_ranks() const {
  std::string s;
  for (const Child& c : kids_)
    if (c.running) s += (s.empty() ? "" : ", ") + std::to_string(c.rank);
  return s;
}

std::vector<int> ChildSet::stopped_ranks() const {
  std::vector<int> out;
  for (const Child& c : kids_) {
    if (!c.running) continue;
    std::ifstream in("/proc/" + std::to_string(c.pid) + "/stat");
    std::string stat;
    std::getline(in, stat);
    // "pid (comm) S ...": the state follows the last ')' (comm may hold spaces and parentheses).
    const size_t close = stat.rfind(')');
    if (close != std::string::npos && close + 2 < stat.size() &&
        (stat[close + 2] == 'T' || stat[close + 2] == 't'))
      out.push_back(c.rank);
  }
  return out;
}

void ChildSet::signal_rank(pid_t pid, int sig) {
  if (::kill(-pid, sig) != 0) ::kill(pid, sig);
  if (sig != SIGKILL && sig != SIGCONT && sig != SIGSTOP && ::kill(-pid, SIGCONT) != 0)
    ::kill(pid, SIGCONT);
}

void ChildSet::signal_running(int sig) {
  for (const Child& c : kids_)
    if (c.running) signal_rank(c.pid, sig);
}

// write(2) everything, tolerating EINTR and a briefly full non-blocking console. Returns false on
// any other failure (the caller stops writing there).
bool write_fully(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
    } else if (w < 0 && errno == EINTR) {
      continue;
    } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pf{fd, POLLOUT, 0};
      if (::poll(&pf, 1, 1000) <= 0) return false;
    } else {
      return false;
    }
  }
  return true;
}

size_t write_console(int fd, const char* p, size_t n, std::chrono::steady_clock::time_point until,
                     bool* failed, int wake_fd) {
  size_t done = 0;
  while (done < n) {
    const auto left =
        std::chrono::ceil<std::chrono::milliseconds>(until - std::chrono::steady_clock::now())
            .count();
    pollfd pfs[2] = {{fd, POLLOUT, 0}, {wake_fd, POLLIN, 0}};
    const int r =
        ::poll(pfs, wake_fd >= 0 ? 2 : 1, static_cast<int>(std::clamp<int64_t>(left, 0, 60000)));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return done;  // full (or poll failed): leave the rest
    if (wake_fd >= 0 && (pfs[1].revents & POLLIN) != 0 && (pfs[0].revents & POLLOUT) == 0)
      return done;  // (a signal came: the caller has more urgent things to do)
    const pollfd& pf = pfs[0];
    if (pf.revents & (POLLERR | POLLHUP | POLLNVAL)) {
      *failed = true;
      return done;
    }
    const ssize_t w = ::write(fd, p + done, std::min<size_t>(n - done, PIPE_BUF));
    if (w > 0) {
      done += static_cast<size_t>(w);
    } else if (w < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
      *failed = true;
      return done;
    }
  }
  return done;
}

bool Tee::write_note(std::chrono::steady_clock::time_point until, int wake_fd) {
  std::string note = fmt::format(
      "\n[dtrain launch] {} bytes of rank 0's output did not fit the console, which took none "
      "for a while; {} has them\n",
      console_dropped, log_path.empty() ? std::string("rank 0's log") : log_path);
  // And the last whole lines of them (rank 0's `done: ...` result, when it was among them): from
  // the first line break of what is kept, all of it when it holds none.
  std::string_view tail = dropped_tail;
  if (const size_t nl = tail.find('\n'); nl != std::string::npos && nl + 1 < tail.size())
    tail.remove_prefix(nl + 1);
  if (!tail.empty()) {
    note += "[dtrain launch] the last of it:\n";
    note += tail;
    if (note.back() != '\n') note += '\n';
  }
  bool failed = false;
  const size_t w = write_console(console, note.data(), note.size(), until, &failed, wake_fd);
  if (failed) console_ok = false;
  if (w < note.size()) return false;
  console_dropped = 0;
  dropped_tail.clear();
  return true;
}

void Tee::write_to_console(const char* p, size_t n, std::chrono::steady_clock::time_point until) {
  // A console found full waits no more until it takes something again.
  if (console_dropped > 0) {
    until = std::chrono::steady_clock::now();
    if (!write_note(until)) {
      console_dropped += n;
      keep_dropped(p, n);
      return;
    }
  }
  bool failed = false;
  const size_t w = write_console(console, p, n, until, &failed);
  console_dropped += n - w;
  keep_dropped(p + w, n - w);
  if (failed) console_ok = false;
}

void Tee::keep_dropped(const char* p, size_t n) {
  if (n >= kDroppedTail) {
    dropped_tail.assign(p + n - kDroppedTail, kDroppedTail);
    return;
  }
  dropped_tail.append(p, n);
  if (dropped_tail.size() > kDroppedTail) dropped_tail.erase(0, dropped_tail.size() - kDroppedTail);
}

void Tee::note_dropped(std::chrono::steady_clock::time_point until, int wake_fd) {
  if (console_ok && console_dropped > 0) write_note(until, wake_fd);
}

void Tee::pump(int max_reads) {
  char buf[65536];
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  for (int i = 0; src.open() && i < max_reads; ++i) {
    const ssize_t n = ::read(src.get(), buf, sizeof buf);
    if (n == 0) {
      src.reset();
    } else if (n < 0) {
      if (errno == EINTR) continue;
      return;  // EAGAIN: nothing more for now
    } else {
      const size_t len = static_cast<size_t>(n);
      if (log_ok && !write_fully(log_fd, buf, len)) {
        log_ok = false;
        spdlog::warn("writing rank 0's log failed ({}); its output is no longer logged",
                     strerror(errno));
      }
      if (console_ok) write_to_console(buf, len, until);
    }
  }
}

std::string rank_program(const std::string& path) {
  const OwnBinary self = own_binary();
  struct stat st {};
  if (!self.removed || self.path != path || ::stat(path.c_str(), &st) == 0) return path;
  spdlog::warn(
      "{} was removed since this launcher started: its ranks start from the launcher's "
      "own binary (/proc/self/exe)",
      path);
  return "/proc/self/exe";
}

int spawn_rank(const std::vector<std::string>& argv_s, std::vector<std::string>& env_s, int out_fd,
               int err_fd, pid_t* pid, int keep_fd) {
  std::vector<char*> argv, envp;
  for (const std::string& a : argv_s) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (std::string& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out_fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&fa, err_fd, STDERR_FILENO);
  // keep_fd becomes descriptor 3 (dup2 clears close-on-exec); one that is 0-3 itself is first
  // copied above them, so the dup2s before cannot replace it and dup2(3, 3) is never asked for.
  Fd high;
  if (keep_fd >= 0 && keep_fd <= 3) {
    high = Fd(::fcntl(keep_fd, F_DUPFD_CLOEXEC, 10));
    keep_fd = high.get();  // -1 if the copy failed: nothing is kept
  }
  if (keep_fd >= 0) posix_spawn_file_actions_adddup2(&fa, keep_fd, 3);
  posix_spawn_file_actions_addclosefrom_np(&fa, keep_fd >= 0 ? 4 : 3);
  // Own group: signals reach the rank's helpers too, and a terminal's Ctrl-C reaches only the
  // launcher, which forwards it exactly once.
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  const int rc = ::posix_spawnp(pid, argv[0], &fa, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  return rc;
}

}  // namespace dtrain::launch_detail
